"""The run folder contract: its layout, its record, and when two runs are the same.

Every reader and writer of a run folder goes through this module: ``cogcal train`` (new
run, ``--resume``, ``--overwrite``), ``cogcal tune`` (reusing a grid point), ``cogcal
bench`` (skipping, reusing, clearing), the results collection and the report.

Layout of a run folder (everything cogcal writes there, and nothing else is ever
deleted)::

    config.json          the resolved configuration; its "cogcal_run" key marks the folder
    metrics.json         the record (RunRecord), written last: its presence with
                         "status": "complete" means the run finished
    val_logits.npz       calibrated logits and labels of the validation split
    test_logits.npz      ... of the test split
    calibrator.pt        the fitted post-hoc calibrator (post-hoc methods)
    reliability.png      the reliability diagram written by `cogcal train`
    report.md, .html     the one-run report (`cogcal report RUN_FOLDER`)
    run.log              stdout/stderr of the run when `cogcal bench` ran it
    checkpoints/         last.ckpt, best.ckpt, done.json (stage1/ for two-stage methods)
    logs/                stage1.csv, stage2.csv: one row per epoch
    .cogcal.lock         the lock (``flock``) a process holds while it uses the folder
    .NAME.*.cogcal-tmp   a file being written atomically (the only temporary files)

A folder is cogcal's only when its ``config.json`` carries the mark :data:`MARK` with
this version's format :data:`FORMAT`; nothing else in a folder is ever deleted or
replaced (``overwrite`` included). Every command takes the folder's lock
(:func:`lock_folder`) before it reads, clears or writes anything there.

Same configuration: two runs are the same when :func:`same_config` holds for their
resolved configurations, i.e. every field that can change results (after defaults) is
equal (:func:`cogcal.train.config.result_fields`).

Integrity: the record and its files are bound together. :func:`config_digest` hashes what
a configuration computes (every field that can change results, the model, the classes and
the input preprocessing; not where the run lies or how it was shown). Every checkpoint
carries the digest of the configuration it was trained with; ``metrics.json`` carries,
under ``"integrity"``, that digest and the sha256 of each checkpoint and of
``calibrator.pt`` (:meth:`RunDir.write_record` computes them, once every file is on the
disk). :meth:`RunDir.check_record` and :meth:`RunDir.check_file` refuse a ``config.json``
edited after the run, a checkpoint copied from another run, a replaced calibrator;
:meth:`RunDir.finished_with` (what ``cogcal bench`` and ``cogcal tune`` reuse) counts a
run whose record does not check as not finished, so it is trained again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import os
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import cogcal
from cogcal import _io
from cogcal._errors import ArgumentError
from cogcal.train.config import TrainConfig, result_fields
from cogcal.train.methods import get_method

__all__ = [
    "BENCH_MARK",
    "LOCK_NAME",
    "MARK",
    "RunDir",
    "RunRecord",
    "RunFolderError",
    "config_diff",
    "config_digest",
    "is_bench_folder",
    "lock_folder",
    "same_config",
    "write_bench_meta",
]

#: The key of ``config.json`` that marks a folder as a cogcal run (its value: the format).
MARK = "cogcal_run"
FORMAT = 2
#: The key of ``bench.json`` that marks a folder as written by ``cogcal bench``.
BENCH_MARK = "cogcal_bench"
BENCH_FORMAT = 1
#: The lock file of a run or bench folder.
LOCK_NAME = ".cogcal.lock"

#: Top-level files a run folder may hold (all written by cogcal).
RUN_FILES = (
    "config.json",
    "metrics.json",
    "val_logits.npz",
    "test_logits.npz",
    "calibrator.pt",
    "reliability.png",
    "report.md",
    "report.html",
    "run.log",
    ".cogcal.lock",
)
#: Folders of a run folder, and the file names cogcal writes inside them.
RUN_DIRS = {
    "checkpoints": ("last.ckpt", "best.ckpt", "done.json"),
    "logs": ("stage1.csv", "stage2.csv"),
}
_STAGE_DIR = "stage1"  # checkpoints/stage1/ of two-stage methods


class RunFolderError(ArgumentError):
    """A run folder cannot be used as asked (names the folder and the fix)."""


# --------------------------------------------------------------------------- integrity

#: Keys of a run's ``data`` record that say where the data lies, not what it is.
_DATA_PLACE = ("dataset", "path", "source_files")
#: Whether each :class:`TrainConfig` field can change results.
_RESULTS = {f.name: bool(f.metadata["results"]) for f in dataclasses.fields(TrainConfig)}
#: Keys of ``config.json`` that say where a run lies or how it was shown.
_UNBOUND = frozenset({MARK, "cogcal_version"} | {k for k, r in _RESULTS.items() if not r})
#: The files whose sha256 the record carries (relative to the run folder), in the order a
#: resumed run reads them.
BOUND_FILES = tuple(
    f"checkpoints/{stage}{name}"
    for stage in (f"{_STAGE_DIR}/", "")
    for name in ("last.ckpt", "best.ckpt")
) + ("calibrator.pt",)


def config_digest(config: Mapping[str, Any]) -> str:
    """The sha256 (hex) of what a resolved configuration (or ``config.json``) computes.

    It covers every field that can change results (:func:`cogcal.train.config.result_fields`:
    a ``csv:``/``folder:`` dataset by its content fingerprint) and everything else the run
    recorded (model, task, classes and their names, input shape and preprocessing, the
    data's sizes and statistics), but not where the run or its data lie, nor how it was
    shown (``out``, ``data_root``, ``progress``, ``extra``, ...), so a run moved, copied or
    resumed with another ``--no-progress`` keeps its digest.

    >>> a = TrainConfig(method="ce", out="a").resolved()
    >>> config_digest(a) == config_digest({**a, "out": "b", "progress": False})
    True
    >>> config_digest(a) == config_digest({**a, "lr": 0.5})
    False
    """
    config = dict(config)
    try:
        fields = result_fields(config)
    except (ValueError, TypeError, KeyError):  # an unknown method: a damaged record as it is
        fields = {k: v for k, v in config.items() if _RESULTS.get(k)}
    rest = {k: v for k, v in config.items() if k not in _RESULTS and k not in _UNBOUND}
    if isinstance(rest.get("data"), Mapping):
        rest["data"] = {k: v for k, v in rest["data"].items() if k not in _DATA_PLACE}
    text = json.dumps(
        _finite({"fields": fields, "record": rest}), sort_keys=True, separators=(",", ":"),
        default=repr,
    )  # fmt: skip
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _record_diff(
    recorded: Mapping[str, Any], now: Mapping[str, Any], skip: frozenset[str] = _UNBOUND
) -> list[str]:
    """The keys on which two recorded configurations differ, as ``"key: a -> b"``
    (nested keys as ``input.std``), except those that say where a run or its data lie."""
    out = []
    for key in sorted((set(recorded) | set(now)) - skip):
        a, b = recorded.get(key), now.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            inner = frozenset(_DATA_PLACE) if key == "data" else frozenset()
            out += [f"{key}.{d}" for d in _record_diff(a, b, inner)]
        elif not _equal(a, b):
            out.append(f"{key}: {_short(a)} -> {_short(b)}")
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- comparison


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return a == b


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The fields (that can change results) on which two resolved configurations differ,
    as ``"field: a -> b"`` lines; empty when :func:`same_config` holds."""
    both = _has_fingerprint(a) and _has_fingerprint(b)  # compare data by content then
    ka = result_fields(dict(a), fingerprint=both)
    kb = result_fields(dict(b), fingerprint=both)
    return [
        _data_change(a, b) if k == "dataset" and both else f"{k}: {ka.get(k)!r} -> {kb.get(k)!r}"
        for k in sorted(set(ka) | set(kb))
        if k not in ka or k not in kb or not _equal(ka[k], kb[k])
    ]


def _data_change(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """A ``csv:``/``folder:`` dataset whose content fingerprint differs, in words: the same
    file (or folder) whose content changed since the run started, or another one."""
    paths, digests = [], []
    for c in (before, now):
        data = c.get("data") or {}
        spec = str(c.get("dataset", ""))
        paths.append(data.get("path") or os.path.realpath(spec.partition(":")[2]))
        digests.append(str((data.get("fingerprint") or {}).get("sha256", ""))[:12])
    change = f"sha256 {digests[0]}... -> {digests[1]}..."
    if paths[0] == paths[1]:
        return f"dataset: the content of {paths[0]} changed since the run started ({change})"
    return (
        f"dataset: {before.get('dataset')!r} -> {now.get('dataset')!r}, another "
        f"{'folder' if str(now.get('dataset')).startswith('folder:') else 'file'} with other "
        f"content ({change})"
    )


def _has_fingerprint(c: Mapping[str, Any]) -> bool:
    data = c.get("data")
    return isinstance(data, Mapping) and isinstance(data.get("fingerprint"), Mapping)


def same_config(a: Mapping[str, Any] | TrainConfig, b: Mapping[str, Any] | TrainConfig) -> bool:
    """Whether two configurations compute the same run.

    Both are resolved first (every default filled in), so a field left to its default is
    compared too; only the fields documented as not changing results (display, paths,
    downloads) and fields the method does not use are ignored.

    >>> same_config(TrainConfig(method="ce", preset="paper"),
    ...             TrainConfig(method="ce", preset="paper", lr=1e-4, out="x"))
    True
    >>> same_config(TrainConfig(method="ce"), TrainConfig(method="ls"))
    False
    """
    return not config_diff(_resolved(a), _resolved(b))


def _resolved(c: Mapping[str, Any] | TrainConfig) -> dict[str, Any]:
    if isinstance(c, TrainConfig):
        return c.resolved()
    c = dict(c)
    if MARK in c or "task" in c or "data" in c:  # a recorded config.json: resolved already
        return c
    return TrainConfig.from_dict(c).resolved()


# --------------------------------------------------------------------------- the record


@dataclass
class RunRecord:
    """The content of ``metrics.json``: what a finished run reports.

    Attributes
    ----------
    config : dict
        The resolved configuration (as in ``config.json``).
    val, test : dict
        Metrics of the final (calibrated) model on the validation and test splits.
    val_uncalibrated : dict or None
        Post-hoc methods: validation metrics of the network before its calibrator was
        fitted (what their learning rate is chosen by).
    ood, shift, unavailable : dict
        Out-of-distribution and covariate-shift results, and the sets that were missing.
    timing : dict
        Seconds per stage and in total.
    status : str
        ``"complete"``, or ``"diverged"`` when the loss, the validation or the test logits
        became non-finite (then ``val``/``test`` hold what was measured, often nothing).
    copied_from : str or None
        Set when `cogcal bench` copied this run from an identical one.
    error : str or None
        Diverged runs: where the non-finite values appeared.
    health : dict or None
        The calibration health check of the validation split (:mod:`cogcal.health`,
        :meth:`cogcal.health.HealthReport.to_dict`).
    selection : dict or None
        When the learning rates were chosen by validation cross-entropy (no ``lr`` given):
        the grid trained, the choice and its cost (:mod:`cogcal.train.select`).
    integrity : dict or None
        ``{"config": digest, "files": {path: sha256}}``: the :func:`config_digest` of
        ``config`` and the sha256 of each checkpoint and of ``calibrator.pt``, written by
        :meth:`RunDir.write_record` (see the module docstring).
    """

    config: dict[str, Any]
    val: dict[str, Any]
    test: dict[str, Any]
    val_uncalibrated: dict[str, Any] | None = None
    ood: dict[str, Any] = field(default_factory=dict)
    shift: dict[str, Any] = field(default_factory=dict)
    unavailable: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    status: str = "complete"
    copied_from: str | None = None
    error: str | None = None
    health: dict[str, Any] | None = None
    selection: dict[str, Any] | None = None
    integrity: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "metrics.json") -> RunRecord:
        """Read a ``metrics.json`` mapping; a malformed one raises ``ValueError``."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source} is not a JSON object.")
        missing = [k for k in ("config", "val", "test", "status") if k not in data]
        if missing:
            raise ValueError(f"{source} lacks {', '.join(missing)}: not a cogcal run record.")
        for key in ("config", "val", "test"):
            if not isinstance(data[key], Mapping):
                raise ValueError(f"{source}: {key!r} is not a mapping.")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        out = {
            "config": self.config,
            "val": self.val,
            "test": self.test,
            "ood": self.ood,
            "shift": self.shift,
            "unavailable": self.unavailable,
            "timing": self.timing,
            "status": self.status,
        }
        if self.val_uncalibrated is not None:
            out["val_uncalibrated"] = self.val_uncalibrated
        if self.copied_from is not None:
            out["copied_from"] = self.copied_from
        if self.error is not None:
            out["error"] = self.error
        for key in ("health", "selection", "integrity"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return _finite(out)

    @property
    def selection_nll(self) -> float:
        """The validation NLL a learning rate is chosen by (docs/method.md §1-§2): of the
        network before calibration for post-hoc methods, of the final model otherwise.
        A diverged run (no finite value) gives ``inf``."""
        method = get_method(str(self.config.get("method")))
        section = self.val_uncalibrated if method.selects_before_calibration else self.val
        value = (section or {}).get("nll")
        if not isinstance(value, int | float) or isinstance(value, bool):
            return math.inf
        return float(value) if math.isfinite(value) else math.inf


def _finite(obj: Any) -> Any:
    """Non-finite floats become None, so that metrics.json stays valid JSON."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# --------------------------------------------------------------------------- the folder


class RunDir:
    """One run folder (see the module docstring for its layout).

    Parameters
    ----------
    path : str or Path
        The folder (it need not exist yet).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- paths ---------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def stage_dir(self, two_stage: bool) -> Path:
        """Where stage 1 keeps its checkpoints (``checkpoints/stage1`` for two-stage methods)."""
        return self.checkpoints / _STAGE_DIR if two_stage else self.checkpoints

    # -- reading -------------------------------------------------------------------------
    def read_config(self) -> dict[str, Any] | None:
        """The recorded configuration, or None when there is no ``config.json``.

        Raises
        ------
        RunFolderError
            ``config.json`` exists but is not readable JSON (names the file).
        """
        try:
            text = self.config_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as err:
            raise RunFolderError(f"cannot read {self.config_path}: {err.strerror}.") from None
        try:
            data = json.loads(text)
        except ValueError as err:
            raise RunFolderError(
                f"{self.config_path} is not valid JSON ({err}); the run folder is damaged: "
                "delete it or use another output folder."
            ) from None
        if not isinstance(data, dict):
            raise RunFolderError(f"{self.config_path} is not a JSON object: not a cogcal run.")
        return data

    def is_marked(self) -> bool:
        """Whether cogcal wrote this folder: its ``config.json`` carries the mark of this
        version's format (nothing that merely looks like a configuration counts)."""
        try:
            cfg = self.read_config()
        except RunFolderError:
            return False
        return cfg is not None and cfg.get(MARK) == FORMAT

    def read_outcome(self) -> dict[str, Any] | None:
        """The raw ``metrics.json`` (status ``"complete"`` or ``"diverged"``), or None."""
        try:
            data = json.loads(self.metrics_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def read_record(self) -> RunRecord | None:
        """The record of a finished run, or None when the run is not complete."""
        data = self.read_outcome()
        if data is None or data.get("status") != "complete":
            return None
        try:
            return RunRecord.from_dict(data, source=str(self.metrics_path))
        except ValueError:
            return None

    def read_logits(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The saved (calibrated) logits and labels of ``"val"`` or ``"test"``.

        Raises
        ------
        RunFolderError
            The file is missing, or damaged: unreadable, or not (N, K) float logits with N
            labels (names it, and says which).
        """
        path = self.path / f"{split}_logits.npz"
        if not path.is_file():
            raise RunFolderError(f"cannot read {path}: no such file; the run is incomplete.")
        try:
            with np.load(path, allow_pickle=False) as f:
                logits, labels = f["logits"], f["labels"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise RunFolderError(
                f"{path} is damaged ({type(err).__name__}: {str(err).split('. ')[0]}); it is "
                "not the .npz of logits and labels that cogcal wrote: train the run again "
                "(--overwrite)."
            ) from None
        if logits.ndim != 2 or len(labels) != len(logits) or logits.dtype.kind != "f":
            raise RunFolderError(
                f"{path} is damaged: logits of shape {logits.shape} ({logits.dtype}) and "
                f"labels of shape {labels.shape} are not the (N, K) logits and N labels that "
                "cogcal wrote: train the run again (--overwrite)."
            )
        return logits, labels

    def read_history(self, *, two_stage: bool = False) -> list[dict[str, float]]:
        """The per-epoch log rows of stage 1 (``epoch``, ``val_brier``, ``val_nll``, ...)
        saved in its ``last.ckpt``, the state a resumed run continues from (its CSV log may
        lag or lead it after a kill); ``[]`` when there is no checkpoint yet.

        Raises
        ------
        cogcal.train.checkpoints.CheckpointError
            ``last.ckpt`` is empty, truncated or not a cogcal checkpoint (names it).
        """
        from cogcal.train.checkpoints import load_checkpoint  # torch: only when asked

        path = self.stage_dir(two_stage) / "last.ckpt"
        if not path.is_file():
            return []
        return [dict(row) for row in load_checkpoint(path).get("history") or []]

    def is_complete(self) -> bool:
        """Whether the folder holds a finished run."""
        return self.read_record() is not None

    def has_state(self) -> bool:
        """Whether an unfinished run left checkpoints to resume from."""
        return self.checkpoints.is_dir() and any(self.checkpoints.rglob("*.ckpt"))

    def finished_with(self, config: Mapping[str, Any] | TrainConfig) -> bool:
        """Whether the folder holds a finished run of the same configuration, whose record
        checks (:meth:`check_record`: an edited ``config.json`` or ``metrics.json`` is never
        trusted; the checkpoints are checked by whoever loads them)."""
        record = self.read_record()
        if record is None or not same_config(record.config, config):
            return False
        try:
            self.check_record(record)
        except RunFolderError:
            return False
        return True

    # -- integrity -----------------------------------------------------------------------
    def check_record(self, record: RunRecord, saved: Mapping[str, Any] | None = None) -> None:
        """Check that ``config.json`` (``saved``, read if not given) and the record
        ``metrics.json`` describe the same run, the one the record's integrity names.

        Raises
        ------
        RunFolderError
            ``config.json`` is missing or differs from the record (the message names the
            fields), or either was edited after the run (its digest is not the recorded
            one), or the record carries no integrity (an older cogcal wrote it).
        """
        saved = self.read_config() if saved is None else saved
        if saved is None:
            raise RunFolderError(f"{self.path} has a metrics.json but no config.json.")
        fix = "restore the file or train the run again"
        diff = _record_diff(record.config, saved)
        if diff:
            raise RunFolderError(
                f"{self.config_path} differs from the run's record {self.metrics_path.name} "
                f"({'; '.join(diff[:4])}{' ...' if diff[4:] else ''}): it was edited after the "
                f"run, so it does not describe the checkpoints; {fix}."
            )
        integrity = record.integrity if isinstance(record.integrity, Mapping) else {}
        recorded = integrity.get("config")
        if not isinstance(recorded, str):
            raise RunFolderError(
                f"{self.metrics_path} carries no integrity record (the hashes binding it to "
                "config.json and the checkpoints): it was written by an older cogcal or "
                "edited; train the run again."
            )
        if config_digest(saved) != recorded:
            raise RunFolderError(
                f"{self.config_path} and {self.metrics_path.name} were edited after the run: "
                "they no longer hash to the configuration the checkpoints were trained with; "
                f"{fix}."
            )

    def check_file(self, name: str, record: RunRecord) -> None:
        """Check that the file ``name`` (relative to the folder, one of
        :data:`BOUND_FILES`) is the one the record was written with (its sha256).

        Raises
        ------
        RunFolderError
            The record does not list the file, or its content differs (e.g. a checkpoint
            copied from another run).
        """
        files = (record.integrity or {}).get("files")
        expected = files.get(name) if isinstance(files, Mapping) else None
        path = self.path / name
        if not isinstance(expected, str):
            raise RunFolderError(
                f"{path} is not part of the run's record ({self.metrics_path.name} lists no "
                "hash for it): it was added after the run; remove it or train the run again."
            )
        try:
            actual = file_digest(path)
        except FileNotFoundError:
            raise RunFolderError(f"{path} is missing; the run folder is incomplete.") from None
        if actual != expected:
            raise RunFolderError(
                f"{path} is not the file the run wrote (its sha256 differs from the one in "
                f"{self.metrics_path.name}): it was replaced, e.g. copied from another run; "
                "restore it or train the run again."
            )

    def _integrity(self, record: RunRecord) -> dict[str, Any]:
        files: dict[str, str] = {}
        seen: dict[tuple[int, int], str] = {}  # best.ckpt is often last.ckpt (a hard link)
        for name in BOUND_FILES:
            path = self.path / name
            if path.is_symlink() or not path.is_file():
                continue
            stat = path.stat()
            key = (stat.st_dev, stat.st_ino)
            if key not in seen:
                seen[key] = file_digest(path)
            files[name] = seen[key]
        return {"config": config_digest(record.config), "files": files}

    def foreign_entries(self) -> list[str]:
        """Entries of the folder that cogcal did not write (never deleted)."""
        if not self.path.is_dir():
            return []
        found = []
        for entry in sorted(self.path.iterdir()):
            name = entry.name
            if name in RUN_FILES or _is_own_temp(name, RUN_FILES):
                continue
            if name in RUN_DIRS and entry.is_dir() and not entry.is_symlink():
                found += [f"{name}/{p}" for p in _foreign_in(entry, RUN_DIRS[name])]
                continue
            found.append(name + ("/" if entry.is_dir() else ""))
        return found

    # -- writing -------------------------------------------------------------------------
    def write_config(self, resolved: Mapping[str, Any]) -> None:
        """Record the resolved configuration (and mark the folder as a cogcal run)."""
        _io.write_json(
            self.config_path,
            {MARK: FORMAT, "cogcal_version": cogcal.__version__, **dict(resolved)},
        )

    def write_record(self, record: RunRecord) -> None:
        """Write ``metrics.json`` (last, atomically, durably), with the integrity of the
        run (``record.integrity``: the digest of its configuration and the sha256 of the
        checkpoints and ``calibrator.pt`` now in the folder)."""
        record.integrity = self._integrity(record)
        _io.write_json(self.metrics_path, record.to_dict())

    def write_outcome(self, outcome: Mapping[str, Any]) -> None:
        """Write a ``metrics.json`` mapping (complete or diverged; checked first)."""
        if outcome.get("status") == "diverged":  # may have measured nothing
            outcome = {"val": {}, "test": {}, **outcome}
        record = RunRecord.from_dict(outcome, source=str(self.metrics_path))
        if record.status not in ("complete", "diverged"):
            raise ValueError(f"unknown run status {record.status!r}.")
        self.write_record(record)

    def check_clearable(self) -> None:
        """Check, before anything is deleted, that :meth:`clear` can empty this folder of
        cogcal's files and a run can then be written here.

        Raises
        ------
        RunFolderError
            The folder is a symbolic link or a file, is not a cogcal run folder but holds
            files, or a folder cogcal would clear (``checkpoints/``, ``logs/``) is a link.
        OSError
            The folder (or one of its subfolders) is not writable.
        """
        if self.path.is_symlink():
            raise RunFolderError(
                f"{self.path} is a symbolic link; cogcal never writes or deletes through "
                "links: remove the link or choose another output folder."
            )
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise RunFolderError(f"{self.path} is a file, not a run folder.")
        entries = [e for e in self.path.iterdir() if e.name != LOCK_NAME]
        if entries and not self.is_marked() and any(e.name != "run.log" for e in entries):
            shown = ", ".join(sorted(e.name for e in entries)[:5])
            raise RunFolderError(
                f"{self.path} is not a cogcal run folder (no config.json written by cogcal) and "
                f"holds {shown}: refusing to delete anything there; choose another output folder."
            )
        folders = [self.path]
        for name in RUN_DIRS:
            sub = self.path / name
            if sub.is_symlink():
                raise RunFolderError(
                    f"{sub} is a symbolic link; cogcal never deletes through links: remove "
                    "the link yourself or choose another output folder."
                )
            if sub.is_dir():
                folders.append(sub)
                if (sub / _STAGE_DIR).is_dir() and not (sub / _STAGE_DIR).is_symlink():
                    folders.append(sub / _STAGE_DIR)
        for folder in folders:
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "Permission denied", str(folder))

    def clear(self, *, keep_config: bool = False) -> None:
        """Delete what cogcal wrote here, and nothing else; never follow a link.

        Everything is checked first (:meth:`check_clearable`), so a refusal deletes
        nothing. ``keep_config`` keeps ``config.json`` (the folder's mark), so that a run
        can be written again into a folder that also holds the user's own files.

        Raises
        ------
        RunFolderError, OSError
            See :meth:`check_clearable`.
        """
        self.check_clearable()
        if not self.path.exists():
            return
        for name, inside in RUN_DIRS.items():
            sub = self.path / name
            if sub.is_dir():
                _remove_known(sub, inside)
        for name in RUN_FILES:
            if name == LOCK_NAME or (keep_config and name == "config.json"):
                continue
            target = self.path / name
            if target.is_symlink() or target.is_file():
                target.unlink()
        for tmp in self.path.iterdir():
            if _is_own_temp(tmp.name, RUN_FILES) and tmp.is_file() and not tmp.is_symlink():
                tmp.unlink()

    def prepare(self, config: TrainConfig, resolved: Mapping[str, Any], *, resume: bool,
                overwrite: bool) -> bool:  # fmt: skip
        """Check that a run of ``config`` may start (or resume) here; returns whether an
        unfinished run will be resumed.

        The rules: a folder holding a finished run is never overwritten without
        ``overwrite``; an unfinished one is continued only with ``resume`` and the same
        configuration; a folder cogcal did not write is never used if it holds anything
        (``overwrite`` does not change that); ``resume`` on a folder without a run to
        resume is an error; ``resume`` of a run that stopped before its first checkpoint
        (same configuration) starts it over, since nothing of it was kept.
        """
        if resume and overwrite:
            raise RunFolderError(
                "`resume` and `overwrite` contradict each other; pass one of them.",
                cli_message="--resume and --overwrite contradict each other; pass one of them.",
            )
        path = self.path
        self.check_path()
        if not self.entries():
            if resume:
                raise RunFolderError(
                    f"`resume`: {path} holds no run to resume; start it without `resume`.",
                    cli_message=f"--resume: {path} holds no run to resume; start it without "
                    "--resume.",
                )
            return False
        if self.config_path.is_file():
            self.read_config()  # a damaged config.json is reported as such (names the file)
        if not self.is_marked():
            foreign = [e for e in self.entries() if e != "run.log"]
            if self.has_state():
                why = (
                    "holds checkpoints but no config.json written by cogcal, so what they "
                    "were trained with cannot be checked"
                )
            else:
                why = f"is not a cogcal run folder and is not empty ({', '.join(foreign[:5])})"
            if foreign or resume:
                raise RunFolderError(
                    f"`out` {path} {why}; cogcal writes runs only into new or empty folders and "
                    "never deletes files it did not write: choose another `out`.",
                    cli_message=f"--out {path} {why}; cogcal writes runs only into new or empty "
                    "folders and never deletes files it did not write: choose another --out.",
                )
            return False
        if overwrite:
            self.clear()
            return False
        if self.is_complete():
            raise RunFolderError(
                f"`out` {path} already holds a finished run (metrics.json); choose another "
                "folder or pass `overwrite=True` to replace it.",
                cli_message=f"--out {path} already holds a finished run (metrics.json); choose "
                "another --out or pass --overwrite to replace it.",
            )
        saved = self.read_config()
        if not resume:
            if self.has_state():
                raise RunFolderError(
                    f"`out` {path} holds an unfinished run (checkpoints/); pass `resume=True` to "
                    "continue it or `overwrite=True` to start over.",
                    cli_message=f"--out {path} holds an unfinished run (checkpoints/); pass "
                    "--resume to continue it or --overwrite to start over.",
                )
            self.clear()  # a run that stopped before its first checkpoint: nothing to keep
            return False
        state = self.has_state()
        if state and (saved is None or saved.get(MARK) != FORMAT):
            raise RunFolderError(
                f"`resume`: {path} has checkpoints but no config.json of this cogcal version, "
                "so its configuration cannot be checked; start over with `overwrite=True`.",
                cli_message=f"--resume: {path} has checkpoints but no config.json of this "
                "cogcal version, so its configuration cannot be checked; start over with "
                "--overwrite.",
            )
        diff = config_diff(saved, resolved) if saved is not None else []
        if saved and saved.get("data") and resolved.get("data"):
            before = (saved["data"] or {}).get("fingerprint")
            now = (resolved["data"] or {}).get("fingerprint")
            if before != now and not any(d.startswith("dataset:") for d in diff):
                digests = [str((f or {}).get("sha256", ""))[:12] for f in (before, now)]
                diff.append(
                    f"data: the content of {resolved.get('dataset')} changed since the run "
                    f"started (sha256 {digests[0]}... -> {digests[1]}...)"
                )
        changed = [
            d.partition(": ")[2].replace("the run started", f"the run in {path} started")
            for d in diff
            if "changed since the run started" in d
        ]
        if diff and len(changed) == len(diff):  # only the data's content: say so in words
            raise RunFolderError(
                f"`resume`: {'; '.join(changed)}; resume with the data the run started with, "
                "or start over with `overwrite=True`.",
                cli_message=f"--resume: {'; '.join(changed)}; restore it to resume the run, or "
                "start over on the new data with --overwrite (or use another --out).",
            )
        if diff:
            raise RunFolderError(
                f"`resume`: the run in {path} was started with other settings "
                f"({'; '.join(diff)}); resume with the same settings, or use another folder.",
                cli_message=f"--resume: the run in {path} was started with other settings "
                f"({'; '.join(diff)}); resume with the same flags, or use another --out.",
            )
        if not state:  # stopped before its first checkpoint: resuming is starting over
            self.clear()
            return False
        self.check_checkpoints(saved or {})
        return True

    def damaged_checkpoints(self) -> list[str]:
        """One line per checkpoint of the folder that cannot be loaded: ``"<path> is empty
        (0 bytes)"`` or ``"<path> is truncated or corrupt"``."""
        from cogcal.train.checkpoints import CheckpointError, load_checkpoint

        found = []
        for name in BOUND_FILES:
            path = self.path / name
            if not name.endswith(".ckpt") or path.is_symlink() or not path.is_file():
                continue
            if path.stat().st_size == 0:
                found.append(f"{path} is empty (0 bytes)")
                continue
            try:
                load_checkpoint(path)
            except CheckpointError:
                found.append(f"{path} is truncated or corrupt")
        return found

    def check_checkpoints(self, saved: Mapping[str, Any]) -> None:
        """Check, before a run resumes, that each of its checkpoints loads and was trained
        with the configuration ``saved`` (its ``config.json``).

        Raises
        ------
        cogcal.train.checkpoints.CheckpointError
            A checkpoint is empty, truncated or not a cogcal checkpoint (names it).
        RunFolderError
            A checkpoint was trained with another configuration (copied from another run)
            or written by an older cogcal.
        """
        from cogcal.train.checkpoints import load_checkpoint  # torch: only when resuming

        digest = config_digest(saved)
        for name in BOUND_FILES:
            path = self.path / name
            if not name.endswith(".ckpt") or not path.is_file():
                continue
            if load_checkpoint(path).get("config_sha256") != digest:
                raise RunFolderError(
                    f"`resume`: {path} was not trained with the configuration in "
                    f"{self.config_path} (it was copied from another run, or written by an "
                    "older cogcal); start over with `overwrite=True`.",
                    cli_message=f"--resume: {path} was not trained with the configuration in "
                    f"{self.config_path} (it was copied from another run, or written by an "
                    "older cogcal); start over with --overwrite.",
                )

    def entries(self) -> list[str]:
        """The names in the folder, sorted, except its lock file (a lock left by a killed
        process does not make a folder non-empty)."""
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir() if p.name != LOCK_NAME)

    def check_path(self) -> None:
        """Refuse an output path that is a link, a file, or lies below a file."""
        path = self.path
        if path.is_symlink():
            raise RunFolderError(
                f"output folder {path} is a symbolic link; cogcal never writes through links: "
                "pass the real folder."
            )
        if path.exists() and not path.is_dir():
            raise RunFolderError(f"output folder {path} is an existing file; choose a folder path.")
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise RunFolderError(
                        f"output folder {path} lies below {parent}, which is a file; choose "
                        "another path."
                    )
                break

    @contextlib.contextmanager
    def read_lock(self) -> Iterator[None]:
        """Hold the folder shared while reading a finished run (:func:`cogcal.load_run`,
        ``cogcal predict``): readers at once, but a process that would clear or write the
        folder (:meth:`lock`) is refused meanwhile, and a folder being written is refused
        to the reader (:class:`cogcal._io.LockedError`). A missing folder is not locked."""
        if not self.path.is_dir():
            yield
            return
        with _io.shared_lock(self.path / LOCK_NAME, what=f"run folder {self.path}"):
            yield

    @contextlib.contextmanager
    def lock(self, *, create: bool = True) -> Iterator[None]:
        """Hold the folder for this process (:func:`lock_folder`); take it before reading,
        clearing or writing anything in the folder."""
        self.check_path()
        with lock_folder(self.path, what=f"run folder {self.path}", create=create):
            yield


@contextlib.contextmanager
def lock_folder(path: str | os.PathLike[str], *, what: str, create: bool = True) -> Iterator[None]:
    """Hold ``path/.cogcal.lock`` (an ``flock``: released by the system when the process
    ends, so a lock left by a killed process, a reused PID or a garbage lock file never
    blocks). A second process gets a ``ValueError`` naming ``what`` and the holder.

    ``create`` makes the folder (and removes it again on release if it is still empty,
    i.e. the command was refused before it wrote anything); without it a missing folder
    is left alone and nothing is locked.

    Raises
    ------
    cogcal._io.LockedError
        Another process holds the folder.
    OSError
        The folder cannot be created or is not writable.
    """
    path = Path(path)
    created: list[Path] = []  # the folders made here, deepest first
    if not path.is_dir():
        if not create:
            yield
            return
        _parent_writable(path)
        created = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
    try:
        with _io.file_lock(path / LOCK_NAME, what=what):
            yield
    finally:
        for folder in created:  # only empty ones: refused before anything was written
            try:
                folder.rmdir()
            except OSError:
                break


def _parent_writable(path: Path) -> None:
    for parent in path.parents:
        if parent.exists():
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "Permission denied", str(parent))
            return


def is_bench_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a ``bench.json`` with the mark of ``cogcal bench``."""
    try:
        data = json.loads((Path(path) / "bench.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get(BENCH_MARK) == BENCH_FORMAT


def write_bench_meta(path: str | os.PathLike[str], meta: Mapping[str, Any]) -> None:
    """Write ``bench.json`` (the bench's record of its sessions) with the bench mark."""
    _io.write_json(Path(path) / "bench.json", {BENCH_MARK: BENCH_FORMAT, **dict(meta)})


def _is_own_temp(name: str, known: tuple[str, ...]) -> bool:
    """A temporary file cogcal writes for one of the files ``known``."""
    return _io.temp_target(name) in known


def _foreign_in(folder: Path, known: tuple[str, ...]) -> list[str]:
    out = []
    for entry in sorted(folder.iterdir()):
        if entry.name == _STAGE_DIR and entry.is_dir() and not entry.is_symlink():
            out += [f"{_STAGE_DIR}/{p}" for p in _foreign_in(entry, known)]
        elif entry.name not in known and not _is_own_temp(entry.name, known):
            out.append(entry.name)
    return out


def _remove_known(folder: Path, known: tuple[str, ...]) -> None:
    """Remove cogcal's files from ``folder`` (and its stage1/), then the folder if empty."""
    for entry in list(folder.iterdir()):
        if entry.is_symlink():
            continue
        if entry.name == _STAGE_DIR and entry.is_dir():
            _remove_known(entry, known)
        elif entry.is_file() and (entry.name in known or _is_own_temp(entry.name, known)):
            entry.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # only when empty: anything foreign stays
