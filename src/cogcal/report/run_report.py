"""The report of one ``cogcal train`` run folder: ``report.md`` and ``report.html`` in it.

Everything comes from the folder through :class:`cogcal.train.rundir.RunDir`: the record
(``metrics.json``: configuration, validation and test metrics, OOD, shift, timing) and the
saved test logits, from which the reliability diagram is drawn (written to
``reliability.png``). Sections: configuration, metrics
(accuracy, NLL, Brier, ECE/RMSCE/MCE at 15 bins), the bin sweep, the reliability
diagram, per-task metrics (multi-task runs), OOD detection and covariate shift when the
run recorded them, and timing. No pandas; matplotlib only for the diagram.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from cogcal import _io
from cogcal.report.blocks import Cell, Figure, Paragraph, Section, Table, plain
from cogcal.report.render import render_html, render_markdown
from cogcal.report.schema import METRIC_LABELS

__all__ = ["build_run_report", "report_kind"]

_METRICS = ("acc", "nll", "brier", "ece_15", "rmsce_15", "mce_15")
_LABELS = METRIC_LABELS
_FIRST = (
    "method",
    "dataset",
    "model",
    "task",
    "seed",
    "preset",
    "epochs",
    "stage2_epochs",
    "batch_size",
    "lr",
    "calibrator_lr",
    "schedule",
    "step_size",
    "patience",
    "precision",
    "accelerator",
    "devices",
)
_BIN_KEY = re.compile(r"^(ece|rmsce|mce)_(\d+)$")


def _num(v: Any, digits: int = 4) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return "—"
    return f"{v:.{digits}f}" if math.isfinite(v) else "nan"


def _config_table(config: Mapping[str, Any]) -> Table:
    keys = [k for k in _FIRST if k in config] + sorted(
        k for k in config if k not in _FIRST and k not in ("cogcal_run",)
    )
    rows = []
    for k in keys:
        v = config[k]
        if isinstance(v, Mapping) and v:
            rows += [[Cell(f"{k}.{kk}"), Cell(plain(vv))] for kk, vv in v.items()]
        else:
            rows.append([Cell(k), Cell(plain(v))])
    notes: list[Any] = ["The resolved configuration recorded with the run (defaults filled in)."]
    return Table("Configuration", ["Setting", "Value"], rows, notes, "configuration")


def _metric_rows(record: Any) -> list[tuple[str, Mapping[str, Any]]]:
    out = [("validation", record.val)]
    if record.val_uncalibrated:
        out.append(("validation, before post-hoc calibration", record.val_uncalibrated))
    out.append(("test", record.test))
    return out


def _metrics_table(record: Any) -> Table:
    rows = [
        [Cell(name)] + [Cell(_num(m.get(k))) for k in _METRICS] for name, m in _metric_rows(record)
    ]
    notes: list[Any] = [
        "Top-label calibration errors over 15 equal-width bins (docs/method.md §3). The "
        "validation split chose the checkpoint (Brier) and fitted any post-hoc calibrator; "
        "the test split played no part."
    ]
    return Table("Metrics", ["Split", *[_LABELS[k] for k in _METRICS]], rows, notes, "metrics")


def _bins_table(record: Any) -> Table | None:
    bins = sorted(
        {int(m.group(2)) for k in record.test if (m := _BIN_KEY.match(str(k)))}
        | {int(m.group(2)) for k in record.val if (m := _BIN_KEY.match(str(k)))}
    )
    if not bins:
        return None
    header = ["Bins"]
    for split in ("val", "test"):
        header += [f"{split} {f.upper()}" for f in ("ece", "rmsce", "mce")]
    rows = []
    for b in bins:
        row = [Cell(str(b))]
        for split in (record.val, record.test):
            row += [Cell(_num(split.get(f"{f}_{b}"))) for f in ("ece", "rmsce", "mce")]
        rows.append(row)
    notes: list[Any] = ["ECE, RMSCE and MCE of the calibrated model over the bin sweep."]
    return Table("Calibration errors over bin counts", header, rows, notes, "bins")


def _per_task_table(record: Any) -> Table | None:
    tasks: dict[str, dict[str, Any]] = {}
    for key, value in record.test.items():
        if "/" in str(key):
            metric, task = str(key).split("/", 1)
            tasks.setdefault(task, {})[metric] = value
    if not tasks:
        return None
    shown = [m for m in ("acc", "nll", "brier", "ece_15") if any(m in t for t in tasks.values())]
    rows = [[Cell(t)] + [Cell(_num(v.get(m))) for m in shown] for t, v in tasks.items()]
    notes: list[Any] = [
        f"Test split, each of the {len(tasks)} binary tasks on its own (docs/method.md §3); "
        "the metrics table shows their unweighted mean."
    ]
    return Table("Per-task metrics", ["Task", *[_LABELS[m] for m in shown]], rows, notes, "tasks")


def _ood_table(record: Any) -> Table | None:
    sets = {k: v for k, v in (record.ood or {}).items() if isinstance(v, Mapping)}
    if not sets:
        return None
    order = sorted(k for k in sets if k != "pooled") + (["pooled"] if "pooled" in sets else [])
    rows = [[Cell(s), Cell(_num(sets[s].get("auroc"))), Cell(_num(sets[s].get("fpr95")))]
            for s in order]  # fmt: skip
    notes: list[Any] = [
        "Maximum-softmax-probability score, in-distribution test samples positive; 'pooled' "
        "scores every OOD set together."
    ]
    return Table("OOD detection", ["OOD set", "AUROC ↑", "FPR95 ↓"], rows, notes, "ood")


def _sev_key(s: str) -> tuple[float, str]:
    try:
        return float(s), s
    except ValueError:
        return math.inf, s


def _shift_table(record: Any) -> Table | None:
    shift = {k: v for k, v in (record.shift or {}).items() if isinstance(v, Mapping)}
    if not shift:
        return None
    order = sorted(k for k in shift if k != "mean") + (["mean"] if "mean" in shift else [])
    metrics = ("acc", "nll", "brier", "ece_15")
    rows = []
    for cond in order:
        by_sev = shift[cond]
        if by_sev and all(not isinstance(v, Mapping) for v in by_sev.values()):
            by_sev = {"": by_sev}  # a condition without severities
        for sev in sorted(by_sev, key=_sev_key):
            values = by_sev[sev] if isinstance(by_sev[sev], Mapping) else {}
            rows.append([Cell(cond), Cell(str(sev))] + [Cell(_num(values.get(m))) for m in metrics])
    notes: list[Any] = [
        "Test split of each shifted set; 'mean' averages the conditions per severity."
    ]
    header = ["Condition", "Severity", *[_LABELS[m] for m in metrics]]
    return Table("Covariate shift", header, rows, notes, "shift")


def _timing_table(record: Any) -> Table | None:
    timing = record.timing or {}
    if not timing:
        return None
    rows = []
    for key, value in timing.items():
        if isinstance(value, Mapping):
            rows.append([Cell(key), Cell(plain(value))])
        else:
            rows.append(
                [Cell(key), Cell(_num(value, 1) if isinstance(value, float) else plain(value))]
            )
    return Table("Timing", ["Stage", "Value"], rows, ["Seconds; stages as recorded."], "timing")


def health_section(record: Any) -> Section | None:
    """The run's calibration health check (validation only; ``health`` in ``metrics.json``)
    and, when its learning rates were chosen by validation cross-entropy, that choice;
    None for a record that has neither (written before the check existed)."""
    health = getattr(record, "health", None)
    selection = getattr(record, "selection", None)
    if not health and not selection:
        return None
    section = Section("Health check", key="health")
    if health:
        findings = [str(f.get("message", "")) for f in health.get("findings") or []]
        facts = (
            f"Validation ECE-15 {_num(health.get('ece'))}, mean confidence minus accuracy "
            f"{_num(health.get('confidence_gap'))}; a temperature fitted on validation "
            f"({_num(health.get('temperature'), 3)}, a diagnostic only: not applied) would "
            f"change the validation NLL from {_num(health.get('nll'))} to "
            f"{_num(health.get('nll_temperature'))}; {health.get('steps')} optimizer steps."
        )
        if findings:
            section.blocks.append(Paragraph(f"{facts} Warnings:", items=findings))
        else:
            section.blocks.append(Paragraph(f"{facts} No warning: calibrated and trained."))
    if selection:
        rows = [
            [
                Cell(_num(r.get("lr"), 4)),
                Cell(_num(r.get("ratio"), 3) if r.get("ratio") is not None else "-"),
                Cell("diverged" if r.get("val_nll") is None else _num(r.get("val_nll"))),
            ]
            for r in selection.get("table") or []
        ]
        edge = " (at the edge of the grid)" if selection.get("at_edge") else ""
        notes = [
            f"Chosen by validation cross-entropy: {plain(selection.get('best_config'))}{edge}; "
            f"{selection.get('runs')} runs of the same budget, "
            f"{_num(selection.get('seconds'), 0)} s; points in {selection.get('folder')}."
        ]
        section.blocks.append(
            Table(
                "Learning rates tried",
                ["λ_f", "λ_c/λ_f", "validation NLL"],
                rows,
                notes,
                "selection",
            )  # fmt: skip
        )
    return section


def _reliability(folder: Any, record: Any) -> Figure | Paragraph:
    from cogcal.report.diagrams import plot_reliability
    from cogcal.train.rundir import RunFolderError

    try:
        logits, labels = folder.read_logits("test")
    except RunFolderError as err:
        return Paragraph(f"No reliability diagram: {err}")
    task = str(record.config.get("task") or "multiclass")
    if task not in ("multiclass", "binary", "multilabel"):
        task = "multiclass"
    method = str(record.config.get("method", "?"))
    dataset = str(record.config.get("dataset", "?"))
    fig = plot_reliability(
        {method: (logits, labels)},
        None,
        task=task,
        title=f"{method} on {dataset} (test)",
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=150)
    _io.write_bytes(folder.path / "reliability.png", buf.getvalue())
    pooled = " (pooled over tasks)" if task == "multilabel" else ""
    return Figure(
        "reliability.png",
        f"Reliability diagram of the saved test logits, 15 equal-width bins{pooled}",
    )


_EXPECTED = (
    "expected a bench folder (results.csv, written by `cogcal bench`) or a finished run "
    "folder (config.json and metrics.json with status complete, written by `cogcal train`)"
)


def report_kind(path: str | Path) -> Literal["bench", "run"]:
    """Which report ``path`` gets: ``"bench"`` (it holds ``results.csv``) or ``"run"`` (a
    finished ``cogcal train`` run folder).

    Raises
    ------
    ValueError
        The path does not exist, is a file, holds an unfinished or diverged run, or is
        neither kind of folder; the message names what was found and what is expected.
    """
    from cogcal.train.rundir import RunDir, RunFolderError

    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist; {_EXPECTED}.")
    if not path.is_dir():
        raise ValueError(f"{path} is a file, not a folder; {_EXPECTED}.")
    if (path / "results.csv").is_file():
        return "bench"
    folder = RunDir(path)
    try:
        marked = folder.is_marked() or folder.read_config() is not None
    except RunFolderError as err:
        raise ValueError(f"{err} ({_EXPECTED}).") from None
    if marked:
        outcome = folder.read_outcome()
        if outcome is None:
            state = "checkpoints/ to resume from" if folder.has_state() else "no checkpoint"
            raise ValueError(
                f"{path} holds an unfinished cogcal run (config.json, {state}, no "
                f"metrics.json): finish it with `cogcal train ... --resume` first; {_EXPECTED}."
            )
        status = outcome.get("status")
        if status == "diverged":
            why = outcome.get("error") or "a non-finite loss"
            raise ValueError(
                f"{path} holds a run that diverged ({why}): it has no metrics to report; "
                f"{_EXPECTED}."
            )
        if folder.read_record() is not None:
            return "run"
        raise ValueError(
            f"{path}/metrics.json has status {status!r} or lacks config/val/test; {_EXPECTED}."
        )
    entries = sorted(  # the lock `cogcal report` holds is not the folder's content
        e.name + ("/" if e.is_dir() else "") for e in path.iterdir() if e.name != ".cogcal.lock"
    )
    shown = ", ".join(entries[:8]) + (f" and {len(entries) - 8} more" if len(entries) > 8 else "")
    raise ValueError(f"{path} holds {shown or 'nothing'}; {_EXPECTED}.")


def build_run_report(run_dir: str | Path) -> Path:
    """Write ``report.md`` and ``report.html`` into a finished ``cogcal train`` run folder.

    Parameters
    ----------
    run_dir : str or Path
        The run folder (``cogcal train --out``).

    Returns
    -------
    Path
        The path of ``report.html``.

    Raises
    ------
    ValueError
        The folder is not a finished run (:func:`report_kind` names
        what was found and what is expected), e.g. a bench folder or an unfinished run.
    """
    from cogcal.train.rundir import RunDir

    path = Path(run_dir)
    if report_kind(path) != "run":
        raise ValueError(
            f"{path} is a bench folder (it holds results.csv), not a run folder; build its "
            "report with build_report."
        )
    folder = RunDir(path)
    record = folder.read_record()
    if record is None:  # report_kind checked it; the folder changed since
        raise ValueError(f"{path} no longer holds a finished run (metrics.json).")
    cfg = record.config
    method, dataset = str(cfg.get("method", "?")), str(cfg.get("dataset", "?"))
    test = record.test
    summary = [
        f"{method} on {dataset} ({cfg.get('model', '?')}), seed {cfg.get('seed', '?')}: test "
        f"accuracy {_num(test.get('acc'))}, NLL {_num(test.get('nll'))}, Brier "
        f"{_num(test.get('brier'))}, ECE-15 {_num(test.get('ece_15'))}."
    ]
    if record.copied_from:
        summary.append(f"Copied from the identical run {record.copied_from}.")
    sections = [
        Section("Summary", [Paragraph(" ".join(summary))], "summary"),
        Section("Configuration", [_config_table(cfg)], "configuration-sec"),
    ]
    results = Section("Metrics", [_metrics_table(record)], "metrics-sec")
    bins = _bins_table(record)
    if bins is not None:
        results.blocks.append(bins)
    tasks = _per_task_table(record)
    if tasks is not None:
        results.blocks.append(tasks)
    sections.append(results)
    sections.append(Section("Reliability diagram", [_reliability(folder, record)], "reliability"))
    health = health_section(record)
    if health is not None:
        sections.append(health)
    robust = Section("OOD detection and covariate shift", key="robustness")
    for table in (_ood_table(record), _shift_table(record)):
        if table is not None:
            robust.blocks.append(table)
    missing = [
        f"{kind} {name}: {' '.join(str(reason).split())}"
        for kind in ("ood", "shift")
        for name, reason in sorted(((record.unavailable or {}).get(kind) or {}).items())
    ]
    if missing:
        robust.blocks.append(Paragraph("Not evaluated:", items=missing))
    if robust.blocks:
        sections.append(robust)
    timing = _timing_table(record)
    if timing is not None:
        sections.append(Section("Timing", [timing], "timing-sec"))
    title = f"cogcal run report: {method} on {dataset}, seed {cfg.get('seed', '?')}"
    _io.write_text(path / "report.md", render_markdown(title, sections))
    return _io.write_text(path / "report.html", render_html(title, sections, path))
