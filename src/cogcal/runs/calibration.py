"""The calibration folder that ``cogcal calibrate`` writes, and :func:`load_calibrator`,
which reads its calibrator back in one call::

    calibration.json     what was fitted and how it was chosen; its "cogcal_calibration"
                         key marks the folder, "status": "complete" that it is finished
    calibrator.pt        the fitted calibrator's state (tensors only)
    metrics.json         validation and test metrics before and after calibration (and,
                         with --conformal, the test coverage and set sizes of the sets)
    conformal.json       with --conformal: the fitted conformal prediction sets
                         (:meth:`cogcal.conformal.ConformalSets.to_dict`)
    test_logits.npz      the test logits as given, calibrated, and the labels
    reliability.png      reliability diagrams of the test split before and after
    report.md, .html     the report (`cogcal report FOLDER` writes it again)

The folder is bound to its contents as a run folder is (:mod:`cogcal.runs.integrity`):
``calibration.json``, written last, records under ``"integrity"`` the sha256 of
``calibrator.pt``, ``metrics.json``, ``test_logits.npz`` and ``conformal.json`` and the digest of its own other
keys (:meth:`CalibrationFolder.seal`). :meth:`CalibrationFolder.check` (what
:func:`load_calibrator` and ``cogcal report`` call first) refuses, in one line naming the file
(and the key), a damaged or mistyped value, an edit, a file copied from another calibration,
a symbolic link, non-finite weights and a truncated file. A folder written before cogcal
bound calibrations (no ``"integrity"``) is refused with the advice to run ``cogcal
calibrate`` again (it takes seconds, and the scores it needs are the user's).

:class:`CalibrationFolder` is the only reader and writer of those files; writers hold its
lock (the run folders' lock file, :func:`cogcal.runs.lock_folder`) first. The calibrator is
loaded with ``torch.load(weights_only=True)``: nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cogcal import _io
from cogcal._constraints import CV_FOLDS, Integer
from cogcal._errors import ArgumentError
from cogcal.calibrators import make_calibrator
from cogcal.conformal import ConformalSets
from cogcal.posthoc import POSTHOC_METHODS, Calibration
from cogcal.runs.identity import file_digest
from cogcal.runs.layout import LOCK_NAME, lock_folder

__all__ = [
    "CALIBRATION_FILES",
    "CALIBRATION_FORMAT",
    "CALIBRATION_MARK",
    "BOUND_FILES",
    "CalibrationFolder",
    "check_calibration",
    "is_calibration_folder",
    "load_calibrator",
]

#: The key of ``calibration.json`` that marks a folder as written by ``cogcal calibrate``.
CALIBRATION_MARK = "cogcal_calibration"
CALIBRATION_FORMAT = 1
#: Every file ``cogcal calibrate`` writes into its folder (nothing else is ever deleted).
CALIBRATION_FILES = (
    "calibration.json",
    "calibrator.pt",
    "metrics.json",
    "test_logits.npz",
    "conformal.json",
    "reliability.png",
    "report.md",
    "report.html",
)
#: The files ``calibration.json`` binds by their sha256 (:meth:`CalibrationFolder.seal`).
BOUND_FILES = ("calibrator.pt", "metrics.json", "test_logits.npz", "conformal.json")
#: The splits of ``metrics.json`` (``test_before`` and ``test`` when a test split was given).
METRIC_SPLITS = ("val_before", "val", "test_before", "test")
_AGAIN = "run cogcal calibrate again with --overwrite"
#: The key of ``metrics.json`` (and ``calibration.json``) of ``--conformal``.
CONFORMAL_KEY = "conformal"


def _err(path: Path, what: str) -> ArgumentError:
    return ArgumentError(f"{path}: {what}")


def is_calibration_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a ``calibration.json`` with the mark of ``cogcal calibrate``, or
    a damaged one (not JSON) beside a ``calibrator.pt`` (:meth:`CalibrationFolder.check`
    names the damage)."""
    folder = CalibrationFolder(path)
    return folder.read_meta() is not None or (
        folder.unreadable_meta() is not None and (folder.path / "calibrator.pt").is_file()
    )


class CalibrationFolder:
    """The folder ``cogcal calibrate`` writes (the module docstring lists its files): the
    only reader and writer of those files. Writers hold :meth:`lock` first."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read_meta(self) -> dict[str, Any] | None:
        """``calibration.json`` if it carries the mark, else ``None``."""
        try:
            data = _io.read_json(self.path / "calibration.json")
        except (OSError, ValueError):
            return None
        return (
            data
            if isinstance(data, dict) and data.get(CALIBRATION_MARK) == CALIBRATION_FORMAT
            else None
        )

    def unreadable_meta(self) -> str | None:
        """Why ``calibration.json`` cannot be read as JSON (``None``: it can, or is absent)."""
        try:
            _io.read_json(self.path / "calibration.json")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            return type(err).__name__
        return None

    def read_metrics(self) -> dict[str, Any]:
        """``metrics.json``, checked: a JSON object of splits, each a mapping of metric names
        to numbers (the message names the file and the key)."""
        path = self.path / "metrics.json"
        try:
            data = _io.read_json(path)
        except (OSError, ValueError) as err:
            raise _err(path, f"cannot be read ({type(err).__name__}); {_AGAIN}.") from None
        if not isinstance(data, dict):
            raise _err(path, "is not a JSON object; run cogcal calibrate again.")
        for split, values in data.items():
            if split == CONFORMAL_KEY:
                _check_conformal_metrics(path, values)
                continue
            if split not in METRIC_SPLITS or not isinstance(values, dict):
                raise _err(path, f"key {split!r} is not a split of metrics; {_AGAIN}.")
            for key, value in values.items():
                if value is not None and not _is_number(value):
                    raise _err(path, f"key {split}.{key}: {value!r} is not a number; {_AGAIN}.")
        return data

    def read_test(self) -> dict[str, np.ndarray] | None:
        """The saved test logits (``logits``, ``calibrated``, ``labels``), if any."""
        path = self.path / "test_logits.npz"
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in ("logits", "calibrated", "labels")}
        except (ValueError, OSError, KeyError, zipfile.BadZipFile, EOFError) as err:
            raise _err(
                path, f"is damaged ({type(err).__name__}); run cogcal calibrate again."
            ) from None

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder (``.cogcal.lock``) for this process."""
        if self.path.is_symlink():
            raise ArgumentError(
                f"output folder {self.path} is a symbolic link; pass the real folder."
            )
        if self.path.exists() and not self.path.is_dir():
            raise ArgumentError(
                f"output folder {self.path} is an existing file; choose a folder path."
            )
        with lock_folder(self.path, what=f"calibration folder {self.path}"):
            yield

    def prepare(self, *, overwrite: bool, remove: bool = True) -> None:
        """Make the folder ready for a new calibration (hold :meth:`lock`): refuse one that
        holds anything not written by ``cogcal calibrate``, and one that holds a calibration
        unless ``overwrite`` (then only the files of :data:`CALIBRATION_FILES` are removed; with
        ``remove=False`` nothing is, the folder is only checked)."""
        entries = sorted(p.name for p in self.path.iterdir() if p.name != LOCK_NAME)
        if not entries:
            return
        if not is_calibration_folder(self.path):  # a damaged calibration.json is one of ours
            shown = ", ".join(entries[:6]) + (" ..." if len(entries) > 6 else "")
            raise ArgumentError(
                f"output folder {self.path} holds files not written by cogcal calibrate "
                f"({shown}); nothing was changed: choose a new or empty folder."
            )
        foreign = [
            e
            for e in entries
            if e not in CALIBRATION_FILES and _io.temp_target(e) not in CALIBRATION_FILES
        ]
        if not overwrite:
            raise ArgumentError(
                f"output folder {self.path} holds a calibration already; pass --overwrite to "
                "replace it, or choose another --out."
            )
        for name in entries if remove else ():
            p = self.path / name
            if name not in foreign and p.is_file() and not p.is_symlink():
                p.unlink()

    def write(self, name: str, obj: Any) -> None:
        """Write one of :data:`CALIBRATION_FILES` atomically (JSON for ``.json``, a state dict for
        ``.pt``, arrays for ``.npz``)."""
        if name not in CALIBRATION_FILES:  # pragma: no cover - a bug in cogcal
            raise ValueError(f"{name} is not a file of a calibration folder")
        path = self.path / name
        if name.endswith(".json"):
            _io.write_json(path, obj)
        elif name.endswith(".pt"):
            _io.save_torch(path, obj)
        else:
            _io.save_npz(path, **obj)

    def seal(self, meta: dict[str, Any]) -> dict[str, Any]:
        """``meta`` with its ``"integrity"``: the sha256 of each of :data:`BOUND_FILES` now in
        the folder and the digest of ``meta``'s other keys (write it last)."""
        body = {key: value for key, value in meta.items() if key != "integrity"}
        files = {
            name: file_digest(self.path / name)
            for name in BOUND_FILES
            if (self.path / name).is_file() and not (self.path / name).is_symlink()
        }
        return {**body, "integrity": {"calibration": _meta_digest(body), "files": files}}

    def check(self) -> dict[str, Any]:
        """``calibration.json`` of a finished calibration whose files are the ones it was
        written with (the module docstring says what is refused).

        Raises
        ------
        cogcal._errors.ArgumentError
            One line naming the file (and the key) and the fix: a damaged value, no
            integrity record (an older cogcal), an edit (the digest of its other keys).
        """
        for name in ("calibration.json", *BOUND_FILES):
            if (self.path / name).is_symlink():
                raise _err(
                    self.path / name, "is a symbolic link, not a file cogcal calibrate wrote; "
                    f"{_AGAIN}."
                )  # fmt: skip
        meta, damage = self.read_meta(), self.unreadable_meta()
        if meta is None and damage is not None:
            raise _err(
                self.path / "calibration.json", f"cannot be read ({damage}): it is damaged or "
                f"truncated; {_AGAIN}."
            )  # fmt: skip
        if meta is None:
            raise ArgumentError(
                f"{self.path} is not a folder written by cogcal calibrate (no calibration.json "
                "with its mark); pass the --out folder of `cogcal calibrate`."
            )
        if meta.get("status") != "complete":
            raise ArgumentError(
                f"{self.path}: the calibration did not finish (calibration.json status "
                f"{meta.get('status')!r}); run cogcal calibrate again with --overwrite."
            )
        path = self.path / "calibration.json"
        _check_meta(path, meta)
        integrity = meta.get("integrity")
        if not isinstance(integrity, dict) or not isinstance(integrity.get("files"), dict):
            raise _err(
                path, "carries no integrity record (the sha256 binding it to calibrator.pt and "
                "metrics.json): an older cogcal wrote it, or it was edited; run cogcal "
                "calibrate again (with --overwrite) to use this folder."
            )  # fmt: skip
        body = {key: value for key, value in meta.items() if key != "integrity"}
        if integrity.get("calibration") != _meta_digest(body):
            raise _err(path, f"was edited after the calibration (its digest differs); {_AGAIN}.")
        return meta

    def check_files(self, meta: dict[str, Any]) -> None:
        """Refuse a folder whose bound files (:data:`BOUND_FILES`) are not the ones its
        checked ``calibration.json`` (:meth:`check`) was written with."""
        files = meta["integrity"]["files"]
        for name in BOUND_FILES:
            expected, file = files.get(name), self.path / name
            if expected is None and not file.exists():
                continue
            if not isinstance(expected, str):
                raise _err(file, f"is not part of the calibration (added after it); {_AGAIN}.")
            if not file.is_file():
                raise _err(file, f"is missing; the calibration folder is incomplete; {_AGAIN}.")
            if file_digest(file) != expected:
                raise _err(
                    file, "is not the file this calibration wrote (its sha256 differs from the "
                    "one in calibration.json): it was edited, truncated or copied from another "
                    f"calibration; {_AGAIN}."
                )  # fmt: skip


def _check_conformal_metrics(path: Path, values: Any) -> None:
    """The ``"conformal"`` entry of ``metrics.json``: numbers, the score's name, and the
    coverage by set size (a mapping of sizes to numbers)."""
    if not isinstance(values, dict):
        raise _err(path, f"key 'conformal' is not a mapping of metrics; {_AGAIN}.")
    for key, value in values.items():
        if key == "method" and isinstance(value, str):
            continue
        rows = value.items() if key.endswith("by_set_size") and isinstance(value, dict) else None
        if rows is None and (value is None or _is_number(value)):
            continue
        ok = rows is not None and all(
            str(size).isdigit() and isinstance(row, dict) and all(map(_is_number, row.values()))
            for size, row in rows
        )
        if not ok:
            raise _err(path, f"key conformal.{key}: {value!r} is not a metric; {_AGAIN}.")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: ``num_classes`` of a multiclass calibration.
_CLASSES = Integer(2)


def _meta_digest(body: dict[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_meta(path: Path, meta: dict[str, Any]) -> None:
    """The values of a finished ``calibration.json`` have the types cogcal wrote."""

    def bad(key: str, what: str) -> ArgumentError:
        return _err(path, f"key {key!r}: {meta.get(key)!r} is not {what}; {_AGAIN}.")

    method, k = meta.get("method"), meta.get("num_classes")
    if method not in POSTHOC_METHODS:
        raise bad("method", f"a calibration method of this version ({', '.join(POSTHOC_METHODS)})")
    if _CLASSES.problem(k) is not None:
        raise bad("num_classes", "a number of classes (an integer >= 2)")
    cv = meta.get("cv_nll")
    if cv is not None and not isinstance(cv, dict):
        raise bad("cv_nll", "a mapping of methods to cross-validated NLL")
    for m, v in (cv or {}).items():
        if m not in POSTHOC_METHODS or (v is not None and not _is_number(v)):
            raise _err(path, f"key 'cv_nll': {m!r}: {v!r} is not the NLL of a method; {_AGAIN}.")
    conformal = meta.get(CONFORMAL_KEY)
    if conformal is not None and not (
        isinstance(conformal, dict) and _is_number(conformal.get("alpha"))
    ):
        raise bad(CONFORMAL_KEY, "the description of conformal sets (null without them)")
    folds = meta.get("folds")
    if folds is not None and CV_FOLDS.problem(folds) is not None:
        raise bad("folds", "a number of folds (an integer >= 2, or null)")
    for key in ("nll_before", "nll_after"):
        if key in meta and not _is_number(meta[key]):
            raise bad(key, "a number")
    for key in ("val", "test"):
        value = meta.get(key)
        if key == "val" or value is not None:
            if not isinstance(value, dict) or not isinstance(value.get("path"), str):
                raise bad(key, "the description of an input split")
            if Integer().problem(value.get("samples")) is not None:
                raise _err(path, f"key '{key}.samples' is not a number of samples; {_AGAIN}.")


def check_calibration(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``calibration.json`` and ``metrics.json`` of the finished calibration in ``path``,
    checked entirely (values, integrity, and that its calibrator loads: :func:`load_calibrator`);
    what ``cogcal report`` calls before it renders anything."""
    folder = CalibrationFolder(path)
    meta, metrics = folder.check(), folder.read_metrics()
    needed = ("val_before", "val") + (("test_before", "test") if meta.get("test") else ())
    for split in needed:
        if not isinstance(metrics.get(split), dict):
            raise _err(folder.path / "metrics.json", f"key {split!r} is missing; {_AGAIN}.")
    load_calibrator(folder.path)  # and the integrity of every bound file
    return meta, metrics


def _load_state(path: Path, cal: torch.nn.Module) -> None:
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
        cal.load_state_dict(state)
    except pickle.UnpicklingError:  # weights-only loading refused it: never unpickled
        raise _err(
            path, "cannot be loaded: it is damaged or holds more than tensors (cogcal never "
            f"unpickles objects); {_AGAIN}."
        ) from None  # fmt: skip
    except (RuntimeError, KeyError, OSError, EOFError, ValueError, TypeError, IndexError) as err:
        reason = (str(err).splitlines() or ["the file ends early"])[0][:160]
        raise _err(
            path, f"cannot be loaded ({type(err).__name__}: {reason}); {_AGAIN}."
        ) from None  # fmt: skip
    for name, tensor in cal.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise _err(path, f"holds non-finite values (NaN or inf) in {name!r}; {_AGAIN}.")


def _load_conformal(folder: CalibrationFolder, meta: dict[str, Any]) -> ConformalSets | None:
    """The conformal sets of ``conformal.json`` when ``calibration.json`` records them."""
    if meta.get(CONFORMAL_KEY) is None:
        return None
    path = folder.path / "conformal.json"
    try:
        sets = ConformalSets.from_dict(_io.read_json(path))
    except FileNotFoundError:
        raise _err(path, f"is missing; the calibration folder is incomplete; {_AGAIN}.") from None
    except (OSError, ValueError, TypeError, AttributeError) as err:
        reason = (str(err).splitlines() or [""])[0][:160]
        raise _err(path, f"cannot be loaded ({type(err).__name__}: {reason}); {_AGAIN}.") from None
    if getattr(sets, "n_classes_", None) != meta["num_classes"]:
        raise _err(
            path, f"holds no fitted sets for the {meta['num_classes']} classes of this "
            f"calibration; {_AGAIN}."
        )  # fmt: skip
    return sets


def load_calibrator(path: str | os.PathLike[str]) -> Calibration:
    """The calibrator that ``cogcal calibrate --out PATH`` fitted, ready to use.

    With ``cogcal calibrate --conformal ALPHA`` the fitted prediction sets are its
    ``conformal`` attribute (:meth:`~cogcal.posthoc.Calibration.predict_sets`), else
    ``None``. Only tensors are loaded (``torch.load(weights_only=True)``). The folder is checked
    first (:meth:`CalibrationFolder.check`, then its integrity): an edited, swapped, linked,
    truncated or damaged file is refused in one line naming it.

    >>> import numpy as np, tempfile, cogcal
    >>> from cogcal.commands.calibrate import calibrate_files
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 300)
    >>> d = tempfile.mkdtemp()
    >>> np.savez(f"{d}/val.npz", logits=3 * np.eye(3)[y] + rng.normal(size=(300, 3)), labels=y)
    >>> _ = calibrate_files(f"{d}/val.npz", None, method="ts", out=f"{d}/cal", report=False)
    >>> cal = cogcal.load_calibrator(f"{d}/cal")
    >>> cal.method, cal.num_classes, cal.predict_proba(np.zeros((1, 3))).round(3).tolist()
    ('ts', 3, [[0.333, 0.333, 0.333]])
    """
    folder = CalibrationFolder(path)
    meta = folder.check()
    method, k = meta["method"], meta["num_classes"]
    cal = make_calibrator(method, num_outputs=None if method == "ts" else k)
    _load_state(folder.path / "calibrator.pt", cal)
    folder.check_files(meta)
    conformal = _load_conformal(folder, meta)
    cal.requires_grad_(False)
    cv = meta.get("cv_nll") or {}
    return Calibration(
        method=method, calibrator=cal, num_classes=k,
        cv_nll={m: math.inf if v is None else float(v) for m, v in cv.items()},
        folds=meta.get("folds"), nll_before=float(meta.get("nll_before", math.nan)),
        nll_after=float(meta.get("nll_after", math.nan)), conformal=conformal,
    )  # fmt: skip
