"""``cogcal calibrate``: a post-hoc calibrator for a model trained elsewhere, from its saved
scores (docs/method.md §2, "Calibrating saved logits").

The inputs are read by :func:`read_scores` (``.npz`` with ``logits`` or ``probs`` and
``labels``; or a CSV/TSV table with one score column per class and a label column), the
calibrator is chosen and fitted on the validation scores only by
:func:`cogcal.posthoc.calibrate`, and everything is written into a calibration folder,
whose only reader and writer is :class:`CalibrationFolder`::

    calibration.json     what was fitted and how it was chosen; its "cogcal_calibration"
                         key marks the folder, "status": "complete" that it is finished
    calibrator.pt        the fitted calibrator's state (tensors only)
    metrics.json         validation and test metrics before and after calibration
    test_logits.npz      the test logits as given, calibrated, and the labels
    reliability.png      reliability diagrams of the test split before and after
    report.md, .html     the report (`cogcal report FOLDER` writes it again)

:func:`load_calibrator` reads the calibrator back in one call (``torch.load`` with
``weights_only=True``: nothing is unpickled).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import pickle
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import cogcal
from cogcal import _io
from cogcal._errors import ArgumentError
from cogcal.calibrators import make_calibrator
from cogcal.metrics import evaluate
from cogcal.posthoc import AUTO, POSTHOC_METHODS, Calibration, calibrate
from cogcal.train.rundir import LOCK_NAME, lock_folder

__all__ = [
    "CalibrationFolder",
    "Scores",
    "calibrate_files",
    "is_calibration_folder",
    "load_calibrator",
    "read_scores",
]

#: The key of ``calibration.json`` that marks a folder as written by ``cogcal calibrate``.
MARK = "cogcal_calibration"
FORMAT = 1
#: Every file ``cogcal calibrate`` writes into its folder (nothing else is ever deleted).
FILES = (
    "calibration.json",
    "calibrator.pt",
    "metrics.json",
    "test_logits.npz",
    "reliability.png",
    "report.md",
    "report.html",
)
#: Probabilities are turned into logits as ``log(max(p, PROB_FLOOR))``.
PROB_FLOOR = 1e-12
#: How far a row of probabilities may be from summing to 1.
SUM_TOLERANCE = 1e-3
SCORE_KINDS = ("logits", "probs")


@dataclass
class Scores:
    """Scores of one split as read by :func:`read_scores`.

    ``logits``: (N, K) float64, finite (probabilities already turned into ``log p``);
    ``labels``: (N,) int64 in ``[0, K)``; ``class_names``: the score columns of a table
    (``None`` for ``.npz``); ``kind``: ``"logits"`` or ``"probs"`` (what the file held);
    ``sha256``: of the file's bytes.
    """

    path: Path
    logits: np.ndarray
    labels: np.ndarray
    class_names: list[str] | None
    kind: str
    sha256: str


def _err(path: Path, what: str) -> ArgumentError:
    return ArgumentError(f"{path}: {what}")


def _from_npz(path: Path, raw: bytes) -> tuple[np.ndarray, np.ndarray, str]:
    import io

    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise _err(path, f"not a readable .npz file ({type(err).__name__}: {err}).") from None
    kinds = [k for k in SCORE_KINDS if k in arrays]
    if len(kinds) != 1 or "labels" not in arrays:
        raise _err(
            path,
            f"holds the arrays {', '.join(sorted(arrays)) or 'none'}; expected `labels` and "
            "exactly one of `logits` (N, K) or `probs` (N, K), e.g. "
            "np.savez(path, logits=z, labels=y).",
        )
    scores, labels = arrays[kinds[0]], arrays["labels"]
    if scores.dtype.kind not in "fiu" or scores.ndim != 2:
        raise _err(
            path, f"`{kinds[0]}` has shape {scores.shape} and dtype {scores.dtype}; expected "
            "a 2-D float array (N, K)."
        )  # fmt: skip
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        if labels.dtype.kind == "f" and labels.ndim == 1 and np.array_equal(labels, labels.round()):
            labels = labels.astype(np.int64)
        else:
            raise _err(
                path, f"`labels` has shape {labels.shape} and dtype {labels.dtype}; expected "
                "1-D integer class indices (N,)."
            )  # fmt: skip
    return scores.astype(np.float64), labels.astype(np.int64), kinds[0]


def _from_table(
    path: Path, kind: str, label_column: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    from cogcal.data.tables import read_table

    table = read_table(path, what=str(path), error=lambda m: ArgumentError(m))
    if not table.header:
        raise _err(path, "the table is empty; expected a header row and one row per sample.")
    if label_column not in table.header:
        raise _err(
            path, f"has no column {label_column!r} (columns: {', '.join(table.header)}); name "
            "the label column with --label-column."
        )  # fmt: skip
    if not table.rows:
        raise _err(path, "the table has a header but no rows.")
    j = table.header.index(label_column)
    names = [c for i, c in enumerate(table.header) if i != j]
    values = np.empty((len(table.rows), len(names)))
    for r, (row, line) in enumerate(zip(table.rows, table.lines, strict=True)):
        cells = [c for i, c in enumerate(row) if i != j]
        for c, (name, cell) in enumerate(zip(names, cells, strict=True)):
            try:
                values[r, c] = float(cell)
            except ValueError:
                raise _err(
                    path, f"line {line}, column {name!r}: {cell!r} is not a number; every "
                    f"column but {label_column!r} holds the {kind} of one class."
                ) from None  # fmt: skip
    raw = [row[j] for row in table.rows]
    try:
        labels = np.asarray([int(v) for v in raw], dtype=np.int64)
    except (ValueError, OverflowError):
        index = {n: i for i, n in enumerate(names)}
        bad = [(line, v) for v, line in zip(raw, table.lines, strict=True) if v not in index]
        if bad:
            line, v = bad[0]
            raise _err(
                path, f"line {line}, column {label_column!r}: {v!r} is neither a class index "
                f"nor one of the class columns ({', '.join(names)})."
            ) from None  # fmt: skip
        labels = np.asarray([index[v] for v in raw], dtype=np.int64)
    return values, labels, names


def read_scores(path: str | os.PathLike[str], *, kind: str = "logits",
                label_column: str = "label") -> Scores:  # fmt: skip
    """Read the scores and labels of one split, checked (any error names the file).

    ``.npz``: arrays ``labels`` (N,) and ``logits`` or ``probs`` (N, K); the key says what
    the scores are. Any other file is a table (comma-, or for ``.tsv`` tab-separated) with
    a header: the ``label_column`` (class indices, or class names equal to the score
    columns' names) and one score column per class, whose kind is ``kind`` (``"logits"``
    or ``"probs"``). Probabilities must lie in [0, 1] with rows summing to 1 (within
    1e-3); they become logits ``log(max(p, 1e-12))``.

    Raises
    ------
    cogcal._errors.ArgumentError
        A missing or unreadable file, wrong arrays or columns, a non-finite value, labels
        outside ``[0, K)``, probabilities that are not probabilities, or logits that look
        like probabilities (every row in [0, 1] summing to 1).
    """
    path = Path(path)
    if kind not in SCORE_KINDS:
        raise ArgumentError(
            f"the score kind must be one of {', '.join(SCORE_KINDS)}; got {kind!r}."
        )
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ArgumentError(
            f"{path} does not exist; expected an .npz or a CSV of scores."
        ) from None
    except IsADirectoryError:
        raise ArgumentError(f"{path} is a folder; expected an .npz or a CSV of scores.") from None
    if path.suffix.lower() == ".npz":
        scores, labels, kind = _from_npz(path, raw)
        names = None
    else:
        scores, labels, names = _from_table(path, kind, label_column)
    n, k = scores.shape
    if n == 0 or k < 2:
        raise _err(path, f"has {n} samples of {k} classes; expected N >= 1 rows and K >= 2.")
    if labels.shape[0] != n:
        raise _err(path, f"has {labels.shape[0]} labels for {n} rows of scores.")
    bad = np.argwhere(~np.isfinite(scores))
    if bad.size:
        r, c = (int(v) for v in bad[0])
        raise _err(path, f"row {r}, class {c}: {scores[r, c]} is not a finite number.")
    out = np.flatnonzero((labels < 0) | (labels >= k))
    if out.size:
        raise _err(
            path, f"row {int(out[0])}: label {int(labels[out[0]])} is outside [0, {k - 1}] "
            f"for {k} classes."
        )  # fmt: skip
    sums = scores.sum(1)
    in_unit = (scores >= 0) & (scores <= 1)
    if kind == "probs":
        rows = np.flatnonzero(~in_unit.all(1) | (np.abs(sums - 1) > SUM_TOLERANCE))
        if rows.size:
            r = int(rows[0])
            raise _err(
                path, f"row {r}: probabilities {np.round(scores[r], 4).tolist()} (sum "
                f"{sums[r]:.4g}) are not a distribution: each must lie in [0, 1] and a row "
                "must sum to 1; for logits use --scores logits (a table) or the key `logits`."
            )  # fmt: skip
        scores = np.log(np.maximum(scores, PROB_FLOOR))
    elif in_unit.all() and np.allclose(sums, 1.0, atol=SUM_TOLERANCE):
        raise _err(
            path, "every row lies in [0, 1] and sums to 1: these look like probabilities, not "
            "logits; pass --scores probs (a table) or store them under `probs` (an .npz)."
        )  # fmt: skip
    digest = hashlib.sha256(raw).hexdigest()
    return Scores(path, scores, labels, names, kind, digest)


def is_calibration_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a ``calibration.json`` with the mark of ``cogcal calibrate``."""
    return CalibrationFolder(path).read_meta() is not None


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
        return data if isinstance(data, dict) and data.get(MARK) == FORMAT else None

    def read_metrics(self) -> dict[str, Any]:
        data = _io.read_json(self.path / "metrics.json")
        if not isinstance(data, dict):
            raise _err(
                self.path / "metrics.json", "is not a JSON object; run cogcal calibrate again."
            )
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
        unless ``overwrite`` (then only the files of :data:`FILES` are removed; with
        ``remove=False`` nothing is, the folder is only checked)."""
        entries = sorted(p.name for p in self.path.iterdir() if p.name != LOCK_NAME)
        if not entries:
            return
        if self.read_meta() is None:
            shown = ", ".join(entries[:6]) + (" ..." if len(entries) > 6 else "")
            raise ArgumentError(
                f"output folder {self.path} holds files not written by cogcal calibrate "
                f"({shown}); nothing was changed: choose a new or empty folder."
            )
        foreign = [e for e in entries if e not in FILES and _io.temp_target(e) not in FILES]
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
        """Write one of :data:`FILES` atomically (JSON for ``.json``, a state dict for
        ``.pt``, arrays for ``.npz``)."""
        if name not in FILES:  # pragma: no cover - a bug in cogcal
            raise ValueError(f"{name} is not a file of a calibration folder")
        path = self.path / name
        if name.endswith(".json"):
            _io.write_json(path, obj)
        elif name.endswith(".pt"):
            _io.save_torch(path, obj)
        else:
            _io.save_npz(path, **obj)


def load_calibrator(path: str | os.PathLike[str]) -> Calibration:
    """The calibrator that ``cogcal calibrate --out PATH`` fitted, ready to use.

    Only tensors are loaded (``torch.load(weights_only=True)``).

    >>> import numpy as np, tempfile, cogcal
    >>> from cogcal.train.calibration import calibrate_files
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
    meta = folder.read_meta()
    if meta is None:
        raise ArgumentError(
            f"{folder.path} is not a folder written by cogcal calibrate (no calibration.json "
            "with its mark); pass the --out folder of `cogcal calibrate`."
        )
    if meta.get("status") != "complete":
        raise ArgumentError(
            f"{folder.path}: the calibration did not finish (calibration.json status "
            f"{meta.get('status')!r}); run cogcal calibrate again with --overwrite."
        )
    method, k = meta.get("method"), meta.get("num_classes")
    if method not in POSTHOC_METHODS or not isinstance(k, int) or k < 2:
        raise _err(folder.path / "calibration.json", f"method {method!r} / num_classes {k!r} are "
                   "not a calibration this version can load; run cogcal calibrate again.")  # fmt: skip
    cal = make_calibrator(method, num_outputs=None if method == "ts" else k)
    try:
        state = torch.load(folder.path / "calibrator.pt", weights_only=True, map_location="cpu")
        cal.load_state_dict(state)
    except pickle.UnpicklingError:  # weights-only loading refused it: never unpickled
        raise _err(
            folder.path / "calibrator.pt", "cannot be loaded: it is damaged or holds more than "
            "tensors (cogcal never unpickles objects); run cogcal calibrate again with --overwrite."
        ) from None  # fmt: skip
    except (RuntimeError, KeyError, OSError, EOFError) as err:  # damaged, or another shape
        raise _err(
            folder.path / "calibrator.pt", f"cannot be loaded ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:160]}); run cogcal calibrate again with --overwrite."
        ) from None  # fmt: skip
    cal.requires_grad_(False)
    cv = meta.get("cv_nll") or {}
    return Calibration(
        method=method, calibrator=cal, num_classes=k,
        cv_nll={m: math.inf if v is None else float(v) for m, v in cv.items()}, folds=meta.get("folds"),
        nll_before=float(meta.get("nll_before", math.nan)),
        nll_after=float(meta.get("nll_after", math.nan)),
    )  # fmt: skip


def _metrics(z: np.ndarray, y: np.ndarray, *, intervals: bool = False) -> dict[str, float]:
    """:func:`~cogcal.metrics.evaluate`; ``intervals``: with the seeded bootstrap 95% interval
    of ECE-15 (``ece_15_low``, ``ece_15_high``)."""
    return evaluate(torch.from_numpy(z), torch.from_numpy(y), intervals=intervals)


def _inputs(s: Scores) -> dict[str, Any]:
    return {
        "path": str(s.path),
        "sha256": s.sha256,
        "samples": int(s.labels.shape[0]),
        "kind": s.kind,
    }


def calibrate_files(
    val: str | os.PathLike[str],
    test: str | os.PathLike[str] | None,
    *,
    method: str = AUTO,
    out: str | os.PathLike[str],
    cv: int = 5,
    kind: str = "logits",
    label_column: str = "label",
    overwrite: bool = False,
    report: bool = True,
    log: Any = None,
) -> dict[str, Any]:
    """``cogcal calibrate``: read the scores, fit on ``val`` only, write the folder ``out``
    (the module docstring lists its files) and return its ``metrics.json``.

    ``log``: a function called with each line worth telling the user (the choice, a
    conversion of probabilities); nothing is printed without it.
    """
    say = log or (lambda line: None)
    if method not in (AUTO, *POSTHOC_METHODS):
        raise ArgumentError(
            f"--method {method!r} is unknown; choose one of: {', '.join((AUTO, *POSTHOC_METHODS))}."
        )
    v = read_scores(val, kind=kind, label_column=label_column)
    t = read_scores(test, kind=kind, label_column=label_column) if test is not None else None
    k = v.logits.shape[1]
    if t is not None and t.logits.shape[1] != k:
        raise ArgumentError(
            f"{t.path} has {t.logits.shape[1]} classes and {v.path} {k}; both splits must "
            "come from the same model."
        )
    if t is not None and v.class_names != t.class_names:
        raise ArgumentError(
            f"the class columns differ: {v.path} has {v.class_names}, {t.path} {t.class_names}."
        )
    probs = [str(s.path) for s in (v, t) if s is not None and s.kind == "probs"]
    if probs:
        say(
            f"{' and '.join(probs)} hold probabilities: calibrated as logits log(p) (p clipped at {PROB_FLOOR:g})"
        )
    if np.unique(v.labels).size < 2:
        raise ArgumentError(
            f"{v.path}: every label is {int(v.labels[0])}; a calibrator needs validation "
            "samples of at least two classes."
        )
    if method == AUTO and v.labels.shape[0] < 10 * cv:
        raise ArgumentError(
            f"{v.path} has {v.labels.shape[0]} samples; --method auto with --cv {cv} needs at "
            f"least {10 * cv} (10 per fold): lower --cv or name a --method."
        )
    folder = CalibrationFolder(out)
    with folder.lock():
        folder.prepare(overwrite=overwrite, remove=False)  # refusals before the fit
        try:  # fitted before anything is removed: a refusal of the data loses nothing
            cal = calibrate(v.logits, v.labels, method, cv=cv)
        except ValueError as err:  # calibrate's documented refusals of the data
            raise _err(v.path, str(err)) from None
        folder.prepare(overwrite=overwrite)
        meta: dict[str, Any] = {
            MARK: FORMAT, "status": "writing", "cogcal": cogcal.__version__,
            "val": _inputs(v), "test": _inputs(t) if t is not None else None,
        }  # fmt: skip
        folder.write("calibration.json", meta)
        if cal.cv_nll:
            scores = ", ".join(f"{m} {s:.4f}" for m, s in cal.cv_nll.items())
            say(f"chose {cal.method} by {cv}-fold cross-validated validation NLL ({scores})")
        folder.write("calibrator.pt", cal.calibrator.state_dict())
        metrics: dict[str, Any] = {
            "val_before": _metrics(v.logits, v.labels),
            "val": _metrics(cal(v.logits), v.labels),
        }
        if t is not None:
            after = cal(t.logits)
            metrics["test_before"] = _metrics(t.logits, t.labels, intervals=True)
            metrics["test"] = _metrics(after, t.labels, intervals=True)
            folder.write(
                "test_logits.npz", {"logits": t.logits, "calibrated": after, "labels": t.labels}
            )
        folder.write("metrics.json", metrics)
        meta.update(
            status="complete", method=cal.method, num_classes=k, class_names=v.class_names,
            folds=cal.folds,
            cv_nll={m: (x if math.isfinite(x) else None) for m, x in cal.cv_nll.items()}, nll_before=cal.nll_before, nll_after=cal.nll_after,
        )  # fmt: skip
        folder.write("calibration.json", meta)
        if report:
            from cogcal.report.calibration_report import build_calibration_report

            build_calibration_report(folder.path)
    return metrics
