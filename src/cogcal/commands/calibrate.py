"""``cogcal calibrate``: a post-hoc calibrator for a model trained elsewhere, from its saved
scores (docs/method.md §2, "Calibrating saved logits").

The inputs are read by :func:`read_scores` (``.npz`` with ``logits`` or ``probs`` and
``labels``; or a CSV/TSV table with one score column per class and a label column), the
calibrator is chosen and fitted on the validation scores only by
:func:`cogcal.posthoc.calibrate`, and everything is written into a calibration folder
(:mod:`cogcal.runs.calibration`: its files, and :func:`cogcal.load_calibrator`, which reads
the calibrator back); :func:`calibrate_files` then writes its report
(:func:`cogcal.report.build_calibration_report`).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cogcal._constraints import CV_FOLDS, check
from cogcal._errors import ArgumentError
from cogcal._version import __version__
from cogcal.calibrators import auto_candidates
from cogcal.commands._common import on_free_cpus
from cogcal.conformal import (
    DEFAULT_METHOD,
    ConformalSets,
    coverage,
    coverage_by_set_size,
    mean_set_size,
)
from cogcal.data.tables import read_table
from cogcal.metrics import evaluate
from cogcal.posthoc import AUTO, CONFORMAL_SPLIT_SEED, POSTHOC_METHODS, Calibration, calibrate
from cogcal.report.calibration_report import build_calibration_report
from cogcal.runs.calibration import (
    CALIBRATION_FORMAT,
    CALIBRATION_MARK,
    CONFORMAL_KEY,
    CalibrationFolder,
)

__all__ = ["Scores", "calibrate_files", "read_scores", "run"]


#: Probabilities are turned into logits as ``log(max(p, PROB_FLOOR))``.
PROB_FLOOR = 1e-12
#: How far a row of probabilities may be from summing to 1: 0.005 per class (each value
#: rounded to two decimals), at least 0.01 and at most 0.05 (:func:`sum_tolerance`); each row
#: is divided by its sum before the log.
SUM_TOLERANCE = 0.01


def sum_tolerance(k: int) -> float:
    """How far a row of ``k`` probabilities may be from summing to 1 (:data:`SUM_TOLERANCE`).

    >>> sum_tolerance(2), sum_tolerance(3), sum_tolerance(100)
    (0.01, 0.015, 0.05)
    """
    return min(0.05, max(SUM_TOLERANCE, 0.005 * k))


SCORE_KINDS = ("logits", "probs")

#: ``--method auto`` on more than this many rows x classes² is announced up front, with
#: a rough estimate of its time and how to make it cheaper (docs/already-trained.md, "What
#: auto costs").
AUTO_ANNOUNCE = 5e7
#: Seconds per row x class² x fold of ``auto`` with the full maps (``ms``, ``dirichlet``,
#: ``sms``, while :func:`~cogcal.calibrators.auto_candidates` has them), and
#: without them (more classes); seconds per row x fold, which large row counts reach
#: (:func:`auto_seconds`).
_AUTO_SECONDS_FULL = 2e-8
_AUTO_SECONDS_VECTOR = 1.1e-9
_AUTO_SECONDS_ROW = 8e-5


def auto_seconds(rows: int, classes: int, cv: int) -> float:
    """A rough, conservative estimate of the seconds ``--method auto`` takes on ``rows`` x
    ``classes`` with ``cv`` folds, on one core of the 2-core machine of
    docs/already-trained.md ("What auto costs"): rows x classes² for the maps' products,
    rows alone for the many fits over long columns. Measured there: 3,000 x 1,000 in 17 s
    (estimate 18 s); 10^6 x 10 still running after 6 minutes (estimate 7 minutes).

    >>> round(auto_seconds(3000, 1000, 5)), round(auto_seconds(10**6, 10, 5))
    (18, 410)
    """
    full = "ms" in auto_candidates(classes)  # auto tries the full maps
    per_unit = _AUTO_SECONDS_FULL if full else _AUTO_SECONDS_VECTOR
    return (per_unit * rows * classes**2 + _AUTO_SECONDS_ROW * rows) * cv


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
    if labels.ndim != 1 or labels.dtype.kind not in "iuf":
        raise _err(
            path, f"`labels` has shape {labels.shape} and dtype {labels.dtype}; expected "
            "1-D integer class indices (N,)."
        )  # fmt: skip
    k = scores.shape[1]
    with np.errstate(invalid="ignore"):  # NaN and inf are named below, never cast
        bad = (labels < 0) | (labels >= k)
        if labels.dtype.kind == "f":
            bad |= ~np.isfinite(labels) | (labels != np.round(labels))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        value = labels[r].item()
        what = (
            f"is outside [0, {k - 1}] for {k} classes"
            if math.isfinite(value) and value == round(value)
            else "is not an integer class index"
        )
        raise _err(path, f"row {r}: label {value!r} {what}.")
    return scores.astype(np.float64), labels.astype(np.int64), kinds[0]


def _from_table(
    path: Path, kind: str, label_column: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
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
    return values, _table_labels(path, raw, table.lines, names, label_column), names


def _table_labels(path: Path, raw: list[str], lines: list[int], names: list[str],
                  label_column: str) -> np.ndarray:  # fmt: skip
    """The class index of each label as written: by name when every label is the name of a
    score column (columns named ``1,0`` are classes 1 and 0), else as an index (0-based
    column position), which is refused when the columns are named by other integers."""
    index = {n: i for i, n in enumerate(names)}
    if all(v in index for v in raw):
        return np.asarray([index[v] for v in raw], dtype=np.int64)
    line, v = next((ln, v) for v, ln in zip(raw, lines, strict=True) if v not in index)
    try:
        labels = np.asarray([int(v) for v in raw], dtype=np.int64)
    except (ValueError, OverflowError):
        raise _err(
            path, f"line {line}, column {label_column!r}: {v!r} is neither a class index "
            f"nor one of the class columns ({', '.join(names)})."
        ) from None  # fmt: skip
    if any(n.strip().lstrip("+-").isdigit() for n in names):
        raise _err(
            path, f"line {line}, column {label_column!r}: label {v!r} is not the name of a "
            f"score column, yet the columns are named by numbers ({', '.join(names)}): it is "
            "ambiguous whether labels are column names or positions; name the columns by the "
            "labels (a label k in a column named k)."
        )  # fmt: skip
    return labels


def read_scores(path: str | os.PathLike[str], *, kind: str = "logits",
                label_column: str = "label") -> Scores:  # fmt: skip
    """Read the scores and labels of one split, checked (any error names the file).

    ``.npz``: arrays ``labels`` (N,) and ``logits`` or ``probs`` (N, K); the key says what
    the scores are. Any other file is a table (comma-, or for ``.tsv`` tab-separated) with
    a header: the ``label_column`` (class indices, or class names equal to the score
    columns' names) and one score column per class, whose kind is ``kind`` (``"logits"``
    or ``"probs"``); labels equal to the score columns' names are matched by name (columns
    ``1,0``: label ``1`` is the first), other labels are indices, refused when the columns
    are named by other numbers. Probabilities must lie in [0, 1] with rows summing to 1
    (within 0.005 per class, at least 0.01, at most 0.05: rounded ones); they become logits
    ``log(max(p / sum, 1e-12))``.

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
        rows = np.flatnonzero(~in_unit.all(1) | (np.abs(sums - 1) > sum_tolerance(k)))
        if rows.size:
            r = int(rows[0])
            raise _err(
                path, f"row {r}: probabilities {np.round(scores[r], 4).tolist()} (sum "
                f"{sums[r]:.4g}) are not a distribution: each must lie in [0, 1] and a row "
                "must sum to 1; for logits use --scores logits (a table) or the key `logits`."
            )  # fmt: skip
        scores = np.log(np.maximum(scores / sums[:, None], PROB_FLOOR))
    elif in_unit.all() and np.allclose(sums, 1.0, rtol=0, atol=sum_tolerance(k)):
        raise _err(
            path, "every row lies in [0, 1] and sums to 1: these look like probabilities (rounded "
            "ones too), not logits; pass --scores probs (a table) or store them under `probs` (an .npz)."
        )  # fmt: skip
    digest = hashlib.sha256(raw).hexdigest()
    return Scores(path, scores, labels, names, kind, digest)


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


def _announce_auto(n: int, k: int, cv: int, say: Any) -> None:
    """One line before a large ``auto`` fit: how long, roughly, and how to make it cheaper."""
    if n * k * k <= AUTO_ANNOUNCE:
        return
    seconds = auto_seconds(n, k, cv)
    when = f"{seconds / 60:.0f} minutes" if seconds >= 90 else f"{seconds:.0f} s"
    say(
        f"--method auto on {n} rows x {k} classes may take about {when} (a rough estimate); "
        f"--method ts takes seconds, and --cv 3 or a smaller --val cut the time "
        "(docs/already-trained.md, 'What auto costs')"
    )


def _checked_inputs(val: Any, test: Any, *, kind: str, label_column: str, say: Any
                    ) -> tuple[Scores, Scores | None]:  # fmt: skip
    """Both splits read and checked against each other."""
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
            f"{' and '.join(probs)} hold probabilities: calibrated as logits log(p) (each row divided by its sum, p clipped at {PROB_FLOOR:g})"
        )
    if np.unique(v.labels).size < 2:
        raise ArgumentError(
            f"{v.path}: every label is {int(v.labels[0])}; a calibrator needs validation "
            "samples of at least two classes."
        )
    return v, t


def _conformal_metrics(cal: Calibration, t: Scores | None) -> dict[str, Any]:
    """``metrics.json``'s ``"conformal"``: the sets, and their test coverage and sizes."""
    sets = cal.conformal
    assert sets is not None
    out: dict[str, Any] = {
        "method": sets.method, "alpha": sets.alpha, "threshold": sets.threshold_,
        "threshold_rows": sets.n_calibration_,
    }  # fmt: skip
    if t is not None:
        mask = cal.predict_sets(t.logits)
        by_size = coverage_by_set_size(mask, t.labels)
        out.update(
            test_coverage=coverage(mask, t.labels), test_mean_set_size=mean_set_size(mask),
            test_coverage_by_set_size={str(size): row for size, row in by_size.items()},
        )  # fmt: skip
    return out


def _fit(v: Scores, method: str, cv: int, conformal: float | None, conformal_method: str,
         progress: Any) -> Calibration:  # fmt: skip
    """:func:`cogcal.posthoc.calibrate` on the validation scores (its refusals name the file)."""
    n = v.labels.shape[0] // 2 if conformal is not None else v.labels.shape[0]
    if method == AUTO and n < 10 * cv:
        half = " (half of it with --conformal)" if conformal is not None else ""
        raise ArgumentError(
            f"{v.path} has {v.labels.shape[0]} samples; --method auto with --cv {cv} needs at "
            f"least {10 * cv} (10 per fold){half}: lower --cv or name a --method."
        )
    try:
        return calibrate(
            v.logits, v.labels, method, cv=cv, conformal=conformal,
            conformal_method=conformal_method, progress=progress,
        )  # fmt: skip
    except ValueError as err:  # calibrate's documented refusals of the data
        raise _err(v.path, str(err)) from None


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
    conformal: float | None = None,
    conformal_method: str = DEFAULT_METHOD,
    progress: Any = None,
) -> dict[str, Any]:
    """``cogcal calibrate``: read the scores, fit on ``val`` only, write the folder ``out``
    (the module docstring lists its files) and return its ``metrics.json``.

    ``log``: a function called with each line worth telling the user (the choice, a
    conversion of probabilities); nothing is printed without it. ``conformal``: a level
    alpha of conformal prediction sets (``conformal_method``), whose threshold is fitted on
    a stratified half of ``val`` that the calibrator, fitted on the other half, never saw
    (:func:`cogcal.posthoc.calibrate`); written to ``conformal.json``. ``progress``: given
    to :func:`cogcal.posthoc.calibrate`.
    """
    say = log or (lambda line: None)
    if method not in (AUTO, *POSTHOC_METHODS):
        raise ArgumentError(
            f"--method {method!r} is unknown; choose one of: {', '.join((AUTO, *POSTHOC_METHODS))}."
        )
    if conformal is not None:  # the level and the score, before anything is read
        try:
            ConformalSets(method=conformal_method, alpha=conformal)
        except (ValueError, TypeError) as err:
            raise ArgumentError(f"--conformal {conformal!r}: {err}") from None
    v, t = _checked_inputs(val, test, kind=kind, label_column=label_column, say=say)
    k = v.logits.shape[1]
    if method == AUTO:
        _announce_auto(v.labels.shape[0], k, cv, say)
    folder = CalibrationFolder(out)
    with folder.lock():
        folder.prepare(overwrite=overwrite, remove=False)  # refusals before the fit
        # fitted before anything is removed: a refusal of the data loses nothing
        cal = _fit(v, method, cv, conformal, conformal_method, progress)
        folder.prepare(overwrite=overwrite)
        meta: dict[str, Any] = {
            CALIBRATION_MARK: CALIBRATION_FORMAT, "status": "writing", "cogcal": __version__,
            "val": _inputs(v), "test": _inputs(t) if t is not None else None,
        }  # fmt: skip
        folder.write("calibration.json", meta)
        if cal.cv_nll:
            scores = ", ".join(f"{m} {s:.4f}" for m, s in cal.cv_nll.items())
            say(f"chose {cal.method} by {cv}-fold cross-validated validation NLL ({scores})")
        folder.write("calibrator.pt", cal.calibrator.state_dict())
        metrics = _write_metrics(folder, cal, v, t)
        meta.update(
            status="complete", method=cal.method, num_classes=k, class_names=v.class_names,
            folds=cal.folds,
            cv_nll={m: (x if math.isfinite(x) else None) for m, x in cal.cv_nll.items()}, nll_before=cal.nll_before, nll_after=cal.nll_after,
        )  # fmt: skip
        if cal.conformal is not None:
            sets = cal.conformal
            meta[CONFORMAL_KEY] = {
                "method": sets.method, "alpha": sets.alpha, "split_seed": CONFORMAL_SPLIT_SEED,
                "calibrator_rows": v.labels.shape[0] - sets.n_calibration_,
                "threshold_rows": sets.n_calibration_,
            }  # fmt: skip
        folder.write("calibration.json", folder.seal(meta))  # last: binds the files above
        if report:
            build_calibration_report(folder.path)
    return metrics


def _write_metrics(folder: CalibrationFolder, cal: Calibration, v: Scores,
                   t: Scores | None) -> dict[str, Any]:  # fmt: skip
    """Write ``metrics.json`` (and ``test_logits.npz``, ``conformal.json``); return it."""
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
    if cal.conformal is not None:
        folder.write("conformal.json", cal.conformal.to_dict())
        metrics[CONFORMAL_KEY] = _conformal_metrics(cal, t)
    folder.write("metrics.json", metrics)
    return metrics


class StatusLine:
    """A one-line status on a terminal's stderr (``cogcal: ms, fold 3/5 (12 s)``), rewritten
    in place as each step starts and cleared by :meth:`close`: the ``progress`` of
    :func:`calibrate_files` when stderr is a terminal (nothing is written to a file or pipe,
    so logs and tests stay clean)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()
        self.shown = False

    def __call__(self, step: str) -> None:
        elapsed = time.monotonic() - self.start
        self.stream.write(f"\r\033[Kcogcal: {step} ({elapsed:.0f} s)")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


@on_free_cpus
def run(args: Any) -> int:
    """``cogcal calibrate``: fit, write the folder and its report, print the metrics."""
    check(args.cv, CV_FOLDS, "cv", flag="--cv")
    status = StatusLine() if sys.stderr.isatty() else None
    try:
        metrics = calibrate_files(
            args.val, args.test, method=args.method.lower(), out=args.out, cv=args.cv,
            kind=args.scores, label_column=args.label_column, overwrite=args.overwrite,
            log=lambda line: print(f"cogcal: {line}", file=sys.stderr),
            conformal=args.conformal, conformal_method=args.conformal_method, progress=status,
        )  # fmt: skip
    finally:
        if status is not None:
            status.close()
    keys = ("acc", "nll", "brier", "ece_15")
    print(f"{'split':22s}" + "".join(f"{k:>10s}" for k in keys))
    names = {"val_before": "val, as given", "val": "val, calibrated (fit)",
             "test_before": "test, as given", "test": "test, calibrated"}  # fmt: skip
    for split, name in names.items():
        if split in metrics:
            print(f"{name:22s}" + "".join(f"{metrics[split][k]:10.4f}" for k in keys))
    sets = metrics.get(CONFORMAL_KEY)
    if sets is not None and "test_coverage" in sets:
        print(
            f"conformal sets ({sets['method']}, alpha {sets['alpha']:g}): test coverage "
            f"{sets['test_coverage']:.4f}, mean set size {sets['test_mean_set_size']:.3f}"
        )
    print(f"wrote {args.out}/calibrator.pt (cogcal.load_calibrator({str(args.out)!r})), "
          f"metrics.json and report.html")  # fmt: skip
    return 0
