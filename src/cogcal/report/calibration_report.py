"""The report of a ``cogcal calibrate`` folder: ``report.md`` and ``report.html`` in it.

Nothing is rendered before the folder is checked entirely
(:func:`cogcal.runs.calibration.check_calibration`: its values, its integrity and that its
calibrator loads).

Everything comes from the folder through :class:`cogcal.runs.calibration.CalibrationFolder`:
what was fitted and how it was chosen (``calibration.json``), the metrics before and after
(``metrics.json``) and the saved test logits, drawn as ``reliability.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cogcal import _io
from cogcal.report._common import save_figure
from cogcal.report.blocks import Cell, Figure, Paragraph, Section, Table, num
from cogcal.report.diagrams import plot_reliability
from cogcal.report.render import render_html, render_markdown
from cogcal.runs.calibration import CalibrationFolder, check_calibration
from cogcal.runs.columns import METRIC_LABELS as LABELS

__all__ = ["build_calibration_report"]

_METRICS = ("acc", "nll", "brier", "ece_15", "adaece_15", "cwece_15", "smece", "aurc")


def _metrics_table(metrics: dict[str, Any], method: str, meta: dict[str, Any]) -> Table:
    shown = [m for m in _METRICS if any(m in (metrics.get(s) or {}) for s in metrics)]
    names = {
        "val_before": "validation, as given",
        "val": f"validation, after {method} (in-sample: it was fitted here)",
        "test_before": "test, as given",
        "test": f"test, after {method}",
    }
    if meta.get("conformal"):
        names["val"] = (
            f"validation, after {method} (fitted on half; the other half fitted the sets)"
        )

    def value(m: dict[str, Any], key: str) -> str:
        low, high = m.get(f"{key}_low"), m.get(f"{key}_high")
        interval = f" [{num(low)}, {num(high)}]" if low is not None and high is not None else ""
        return num(m.get(key)) + interval

    rows = [
        [Cell(label)] + [Cell(value(metrics[split], m)) for m in shown]
        for split, label in names.items()
        if isinstance(metrics.get(split), dict)
    ]
    notes: list[Any] = [
        "The calibrator was chosen and fitted on the validation scores only; the test split "
        "played no part. Test ECE-15 with its 95% bootstrap interval (1,000 resamples of the "
        "test samples, seed 0; docs/metrics.md defines each metric)."
    ]
    return Table("Metrics", ["Split", *[LABELS.get(m, m) for m in shown]], rows, notes, "metrics")


def _choice(meta: dict[str, Any]) -> Table | Paragraph:
    scores = meta.get("cv_nll") or {}
    if not scores:
        return Paragraph(f"The method was given: {meta.get('method')} (no choice was made).")
    finite = {m: s for m, s in scores.items() if s is not None}
    best = min(finite.values()) if finite else None
    rows = [
        [Cell(m, bold=m == meta.get("method")), Cell(num(s), bold=s is not None and s == best)]
        for m, s in scores.items()
    ]
    notes: list[Any] = [
        f"Pooled held-out NLL of each candidate by {meta.get('folds')}-fold cross-validation "
        "inside the validation split (stratified, seed 0); the lowest is refitted on all of "
        "it (ties: the simpler map, listed first); — : the fit failed on a fold."
    ]
    return Table("How the calibrator was chosen", ["Calibrator", "CV NLL ↓"], rows, notes, "choice")


def _sets(meta: dict[str, Any], metrics: dict[str, Any]) -> list[Any]:
    """The conformal prediction sets of ``--conformal``: how they were fitted, their test
    coverage and mean size, and the coverage of the rows of each set size."""
    sets, how = metrics.get("conformal"), meta.get("conformal") or {}
    if not isinstance(sets, dict):
        return []
    alpha = sets.get("alpha")
    text = (
        f"Split conformal prediction sets ({sets.get('method')}) of level 1 − α = "
        f"{num(1 - alpha) if isinstance(alpha, (int, float)) else '—'}: the calibrator was "
        f"fitted on {how.get('calibrator_rows', '—')} validation rows and the threshold "
        f"({num(sets.get('threshold'))}) on the calibrated probabilities of the other "
        f"{sets.get('threshold_rows', '—')}, which the calibrator never saw (a stratified "
        "half, seed 0). Load them with cogcal.load_calibrator(FOLDER).conformal."
    )
    blocks: list[Any] = [Paragraph(text)]
    by_size = sets.get("test_coverage_by_set_size")
    if not isinstance(by_size, dict):
        return [*blocks, Paragraph("No test split was given: no coverage measured.")]
    blocks.append(Paragraph(
        f"Test coverage {num(sets.get('test_coverage'))} (target at least "
        f"{num(1 - alpha) if isinstance(alpha, (int, float)) else '—'}), mean set size "
        f"{num(sets.get('test_mean_set_size'))}."
    ))  # fmt: skip
    rows = [
        [Cell(size), Cell(str(row.get("count"))), Cell(num(row.get("fraction"))),
         Cell(num(row.get("coverage")))]
        for size, row in sorted(by_size.items(), key=lambda kv: int(kv[0]))
    ]  # fmt: skip
    notes: list[Any] = ["Coverage of the test rows grouped by the size of their set."]
    head = ["Set size", "Rows", "Fraction", "Coverage"]
    return [*blocks, Table("Coverage by set size", head, rows, notes, "sets")]


def _reliability(path: Path, test: dict[str, Any] | None, method: str) -> Figure | Paragraph:
    if test is None:
        return Paragraph("No test split was given: no reliability diagram.")
    fig = plot_reliability(
        {
            "as given": (test["logits"], test["labels"]),
            method: (test["calibrated"], test["labels"]),
        },
        title="test split",
    )
    save_figure(fig, path / "reliability.png", dpi=150)
    return Figure("reliability.png", "Reliability diagrams of the test split before and after "
                  "calibration, 15 equal-width bins")  # fmt: skip


def build_calibration_report(path: str | Path) -> Path:
    """Write ``report.md`` and ``report.html`` (and ``reliability.png``) into a finished
    ``cogcal calibrate`` folder and return the path of ``report.html``."""
    folder = CalibrationFolder(path)
    meta, metrics = check_calibration(folder.path)  # refuses what cannot be loaded
    method = str(meta.get("method"))
    test = metrics.get("test")
    who = f"post-hoc {method} on {meta['val']['path']} ({meta['val']['samples']} samples)"
    summary = f"Calibrator: {who}."
    if isinstance(test, dict):
        before = metrics.get("test_before", {})
        summary += (
            f" Test NLL {num(before.get('nll'))} → {num(test.get('nll'))}, ECE-15 "
            f"{num(before.get('ece_15'))} → {num(test.get('ece_15'))}, accuracy "
            f"{num(before.get('acc'))} → {num(test.get('acc'))}."
        )
    summary += " Load it with cogcal.load_calibrator(FOLDER)."
    sets = _sets(meta, metrics)
    sections = [
        Section("Summary", [Paragraph(summary)], "summary"),
        Section("Choice", [_choice(meta)], "choice-sec"),
        Section("Metrics", [_metrics_table(metrics, method, meta)], "metrics-sec"),
        *([Section("Prediction sets", sets, "sets-sec")] if sets else []),
        Section(
            "Reliability diagram",
            [_reliability(folder.path, folder.read_test(), method)],
            "reliability",
        ),  # fmt: skip
    ]
    title = f"cogcal calibration report: {method}"
    _io.write_text(folder.path / "report.md", render_markdown(title, sections))
    return _io.write_text(folder.path / "report.html", render_html(title, sections, folder.path))
