"""The report of one ``cogcal train`` run folder: ``report.md`` and ``report.html`` in it.

Everything comes from the folder through :class:`cogcal.runs.RunDir`: the record
(``metrics.json``: configuration, metrics, OOD, shift, timing, health check) and the saved
test logits, drawn as ``reliability.png``. No pandas; matplotlib only for the diagram.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from cogcal import _io
from cogcal._errors import ArgumentError
from cogcal.report._common import save_figure, sev_key
from cogcal.report.blocks import Cell, Figure, Paragraph, Section, Table, num, plain
from cogcal.report.diagrams import plot_reliability
from cogcal.report.render import render_html, render_markdown
from cogcal.runs import RunDir, RunFolderError
from cogcal.runs.calibration import is_calibration_folder
from cogcal.runs.columns import METRIC_LABELS as LABELS

__all__ = ["build_run_report", "choice_line", "report_kind"]

_METRICS = (
    "acc",
    "nll",
    "brier",
    "ece_15",
    "rmsce_15",
    "mce_15",
    "adaece_15",
    "cwece_15",
    "smece",
    "aurc",
)
_SHIFT = ("acc", "nll", "brier", "ece_15")
_BIN_KEY = re.compile(r"^(ece|rmsce|mce)_(\d+)$")


def _row(label: Any, values: Mapping[str, Any], metrics: tuple[str, ...]) -> list[Cell]:
    return [Cell(str(label))] + [Cell(num(values.get(m))) for m in metrics]


def _config_table(config: Mapping[str, Any]) -> Table:
    rows = []  # in the recorded order: TrainConfig's, dataset and method first
    for k, v in config.items():
        if k == "cogcal_run":
            continue
        if isinstance(v, Mapping) and v:
            rows += [[Cell(f"{k}.{kk}"), Cell(plain(vv))] for kk, vv in v.items()]
        else:
            rows.append([Cell(k), Cell(plain(v))])
    notes: list[Any] = ["The resolved configuration recorded with the run (defaults filled in)."]
    return Table("Configuration", ["Setting", "Value"], rows, notes, "configuration")


def _metric_tables(record: Any) -> list[Table]:
    """Metrics per split, the bin sweep and the per-task metrics (those the record has)."""
    splits = [("validation", record.val)]
    if record.val_uncalibrated:
        splits.append(("validation, before post-hoc calibration", record.val_uncalibrated))
    notes: list[Any] = [
        "Top-label calibration errors over 15 equal-width bins (docs/method.md §3); "
        "adaECE over 15 equal-mass bins, cwECE class-wise, smECE smooth, AURC of selective "
        "prediction (docs/metrics.md). The "
        "validation split chose the checkpoint (Brier) and fitted any post-hoc calibrator; "
        "the test split played no part."
    ]
    shown = tuple(k for k in _METRICS if any(k in m for _, m in [*splits, ("test", record.test)]))
    header = ["Split", *[LABELS[k] for k in shown]]
    rows = [_row(name, m, shown) for name, m in [*splits, ("test", record.test)]]
    out = [Table("Metrics", header, rows, notes, "metrics")]
    keys = [*record.val, *record.test]
    bins = sorted({int(m.group(2)) for k in keys if (m := _BIN_KEY.match(str(k)))})
    if bins:
        families = ("ece", "rmsce", "mce")
        header = ["Bins"] + [f"{s} {f.upper()}" for s in ("val", "test") for f in families]
        rows = [
            [Cell(str(b))]
            + [Cell(num(s.get(f"{f}_{b}"))) for s in (record.val, record.test) for f in families]
            for b in bins
        ]
        notes = ["ECE, RMSCE and MCE of the calibrated model over the bin sweep."]
        out.append(Table("Calibration errors over bin counts", header, rows, notes, "bins"))
    tasks: dict[str, dict[str, Any]] = {}
    for key, value in record.test.items():
        if "/" in str(key):
            metric, task = str(key).split("/", 1)
            tasks.setdefault(task, {})[metric] = value
    if tasks:
        shown = tuple(m for m in _SHIFT if any(m in t for t in tasks.values()))
        notes = [
            f"Test split, each of the {len(tasks)} binary tasks on its own (docs/method.md §3); "
            "the metrics table shows their unweighted mean."
        ]
        header = ["Task", *[LABELS[m] for m in shown]]
        rows = [_row(t, v, shown) for t, v in tasks.items()]
        out.append(Table("Per-task metrics", header, rows, notes, "tasks"))
    return out


def _robustness(record: Any) -> Section:
    """OOD sets (AUROC, FPR95), shift conditions by severity, and the sets not evaluated."""
    sec = Section("OOD detection and covariate shift", key="robustness")
    sets = {k: v for k, v in (record.ood or {}).items() if isinstance(v, Mapping)}
    if sets:
        order = sorted(k for k in sets if k != "pooled") + (["pooled"] if "pooled" in sets else [])
        rows = [_row(s, sets[s], ("auroc", "fpr95")) for s in order]
        notes: list[Any] = [
            "Maximum-softmax-probability score, in-distribution test samples positive; "
            "'pooled' scores every OOD set together."
        ]
        header = ["OOD set", "AUROC ↑", "FPR95 ↓"]
        sec.blocks.append(Table("OOD detection", header, rows, notes, "ood"))
    shift = {k: v for k, v in (record.shift or {}).items() if isinstance(v, Mapping)}
    rows = []
    for cond in sorted(shift, key=lambda c: (c == "mean", c)):
        by_sev = shift[cond]
        if all(not isinstance(v, Mapping) for v in by_sev.values()):
            by_sev = {"": by_sev}  # a condition without severities
        for sev in sorted(by_sev, key=sev_key):
            values = by_sev[sev] if isinstance(by_sev[sev], Mapping) else {}
            rows.append([Cell(cond), *_row(sev, values, _SHIFT)])
    if rows:
        notes = ["Test split of each shifted set; 'mean' averages the conditions per severity."]
        header = ["Condition", "Severity", *[LABELS[m] for m in _SHIFT]]
        sec.blocks.append(Table("Covariate shift", header, rows, notes, "shift"))
    missing = [
        f"{kind} {name}: {' '.join(str(reason).split())}"
        for kind in ("ood", "shift")
        for name, reason in sorted(((record.unavailable or {}).get(kind) or {}).items())
    ]
    if missing:
        sec.blocks.append(Paragraph("Not evaluated:", items=missing))
    return sec


def choice_line(selection: Mapping[str, Any] | None) -> str | None:
    """One line saying which side the default path chose (COG-FC or cross-entropy +
    post-hoc calibration, docs/method.md §1) and the validation figures of both; None for
    a run that made no such choice (``selection["choice"]`` in ``metrics.json``)."""
    choice = (selection or {}).get("choice")
    if not choice:
        return None
    cog, post = choice["cog"], choice.get("posthoc")
    if not post:  # not weighed (too few validation samples)
        return f"default path: COG-FC, validation NLL {num(cog['val_nll'])} ({choice['reason']})"
    name = f"cross-entropy + {post['method']}"
    won = "COG-FC" if choice["side"] == "cog" else name
    lr = f" at lr {post['lr']:g}" if isinstance(post.get("lr"), (int, float)) else ""
    cog_ece, post_ece = cog.get("val_ece_15"), post.get("val_ece_15_in_sample")
    return (
        f"default path: chose {won} by validation NLL (COG-FC {num(cog['val_nll'])}"
        + (f", ECE-15 {num(cog_ece)}" if cog_ece is not None else "")
        + f"; cross-entropy{lr} + {post['method']} {num(post['val_nll_cv'])} cross-validated"
        + (f", ECE-15 {num(post_ece)} in-sample" if post_ece is not None else "")
        + ")"
    )


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
            f"Validation ECE-15 {num(health.get('ece'))}, mean confidence minus accuracy "
            f"{num(health.get('confidence_gap'))}; a temperature fitted on validation "
            f"({num(health.get('temperature'), 3)}, a diagnostic only: not applied) would "
            f"change the validation NLL from {num(health.get('nll'))} to "
            f"{num(health.get('nll_temperature'))}; {health.get('steps')} optimizer steps."
        )
        said = "Warnings:" if findings else "No warning: calibrated and trained."
        section.blocks.append(Paragraph(f"{facts} {said}", items=findings))
    if selection:
        rows = [
            [Cell(num(r.get("lr"))), Cell(num(r.get("ratio"), 3)), Cell(_selection_nll(r))]
            for r in selection.get("table") or []
        ]
        edge = " (at the edge of the grid)" if selection.get("at_edge") else ""
        cost = f"{selection.get('runs')} runs of the same budget"
        if selection.get("rungs"):  # successive halving (docs/method.md §1)
            cost = (
                f"{selection.get('runs')} points by successive halving, "
                f"{selection.get('epochs_trained')} epochs in all "
                f"({num(selection.get('run_equivalents'), 2)} runs of the budget)"
            )
        notes = [
            f"Chosen by validation cross-entropy: {plain(selection.get('best_config'))}{edge}; "
            f"{cost}, {num(selection.get('seconds'), 0)} s; points in "
            f"{selection.get('folder')}."
        ]
        header = ["λ_f", "λ_c/λ_f", "validation NLL"]
        section.blocks.append(Table("Learning rates tried", header, rows, notes, "selection"))
        if line := choice_line(selection):
            rule = selection["choice"].get("rule", "")
            rate = (selection["choice"].get("posthoc") or {}).get("rate") or {}
            rule += f"; {rate['rule']}" if rate.get("rule") else ""
            section.blocks.append(Paragraph(f"{line[0].upper()}{line[1:]}; rule: {rule}."))
    return section


def _selection_nll(row: dict[str, Any]) -> str:
    """A point of the learning-rate selection: its final validation NLL, or where it was
    stopped (successive halving) with the NLL that stopped it, or "diverged"."""
    if row.get("status") == "stopped":
        rung = max(
            (k for k in row if k.startswith("rung") and k.endswith("_val_nll")), default=None
        )
        nll = row.get(rung) if rung else None
        return f"stopped after {row.get('stopped_at_epoch')} epochs ({num(nll)})"
    return "diverged" if row.get("val_nll") is None else num(row["val_nll"])


def _reliability(folder: Any, record: Any) -> Figure | Paragraph:
    try:
        logits, labels = folder.read_logits("test")
    except RunFolderError as err:
        if (folder.path / "test_logits.npz").exists():  # damaged: never a report without it
            raise ArgumentError(f"cannot report on {folder.path}: {err}") from None
        return Paragraph(f"No reliability diagram: {err}")
    task = str(record.config.get("task") or "multiclass")
    task = task if task in ("binary", "multilabel") else "multiclass"
    title = f"{record.config.get('method', '?')} on {record.config.get('dataset', '?')} (test)"
    method = str(record.config.get("method", "?"))
    fig = plot_reliability({method: (logits, labels)}, None, task=task, title=title)
    save_figure(fig, folder.path / "reliability.png", dpi=150)
    pooled = " (pooled over tasks)" if task == "multilabel" else ""
    caption = f"Reliability diagram of the saved test logits, 15 equal-width bins{pooled}"
    return Figure("reliability.png", caption)


_EXPECTED = (
    "expected a bench folder (results.csv, written by `cogcal bench`), a finished run "
    "folder (config.json and metrics.json with status complete, written by `cogcal train`) "
    "or a calibration folder (calibration.json, written by `cogcal calibrate`)"
)


def report_kind(path: str | Path) -> Literal["bench", "run", "calibration"]:
    """Which report ``path`` gets: ``"bench"`` (it holds ``results.csv``), ``"run"`` (a
    finished ``cogcal train`` run folder) or ``"calibration"`` (a ``cogcal calibrate``
    folder); ``ValueError`` naming what was found otherwise (nothing, a file, an
    unfinished or diverged run, another folder)."""
    path = Path(path)
    if not path.exists():
        raise ArgumentError(f"{path} does not exist; {_EXPECTED}.")
    if not path.is_dir():
        raise ArgumentError(f"{path} is a file, not a folder; {_EXPECTED}.")
    if (path / "results.csv").is_file():
        return "bench"
    if is_calibration_folder(path):
        return "calibration"
    folder = RunDir(path)
    try:
        marked = folder.is_marked() or folder.read_config() is not None
    except RunFolderError as err:
        raise ArgumentError(f"{err} ({_EXPECTED}).") from None
    if marked:
        outcome = folder.read_outcome()
        if outcome is None:
            state = "checkpoints/ to resume from" if folder.has_state() else "no checkpoint"
            raise ArgumentError(
                f"{path} holds an unfinished cogcal run (config.json, {state}, no "
                f"metrics.json): finish it with `cogcal train ... --resume` first; {_EXPECTED}."
            )
        status = outcome.get("status")
        if status == "diverged":
            why = outcome.get("error") or "a non-finite loss"
            raise ArgumentError(
                f"{path} holds a run that diverged ({why}): it has no metrics to report; "
                f"{_EXPECTED}."
            )
        if folder.read_record() is not None:
            return "run"
        raise ArgumentError(
            f"{path}/metrics.json has status {status!r} or lacks config/val/test; {_EXPECTED}."
        )
    entries = sorted(  # the lock `cogcal report` holds is not the folder's content
        e.name + ("/" if e.is_dir() else "") for e in path.iterdir() if e.name != ".cogcal.lock"
    )
    shown = ", ".join(entries[:8]) + (f" and {len(entries) - 8} more" if len(entries) > 8 else "")
    raise ArgumentError(f"{path} holds {shown or 'nothing'}; {_EXPECTED}.")


def build_run_report(run_dir: str | Path) -> Path:
    """Write ``report.md`` and ``report.html`` into a finished ``cogcal train`` run folder
    and return the path of ``report.html``; ``ValueError`` when the folder is not a
    finished run (:func:`report_kind` says what was found and what is expected)."""
    path = Path(run_dir)
    if report_kind(path) != "run":
        raise ArgumentError(
            f"{path} is a bench folder (it holds results.csv), not a run folder; build its "
            "report with build_report."
        )
    folder = RunDir(path)
    record = folder.read_record()
    if record is None:  # report_kind checked it; the folder changed since
        raise ArgumentError(f"{path} no longer holds a finished run (metrics.json).")
    cfg, test = record.config, record.test
    who = f"{cfg.get('method', '?')} on {cfg.get('dataset', '?')}"
    summary = (
        f"{who} ({cfg.get('model', '?')}), seed {cfg.get('seed', '?')}: test accuracy "
        f"{num(test.get('acc'))}, NLL {num(test.get('nll'))}, Brier "
        f"{num(test.get('brier'))}, ECE-15 {num(test.get('ece_15'))}."
    )
    if record.copied_from:
        summary += f" Copied from the identical run {record.copied_from}."
    timing = record.timing or {}
    rows = [
        [Cell(k), Cell(num(v, 1) if isinstance(v, float) else plain(v))] for k, v in timing.items()
    ]
    timing_table = Table(
        "Timing", ["Stage", "Value"], rows, ["Seconds; stages as recorded."], "timing"
    )
    sections = [
        Section("Summary", [Paragraph(summary)], "summary"),
        Section("Configuration", [_config_table(cfg)], "configuration-sec"),
        Section("Metrics", _metric_tables(record), "metrics-sec"),
        Section("Reliability diagram", [_reliability(folder, record)], "reliability"),
        health_section(record),
        _robustness(record),
        Section("Timing", [timing_table], "timing-sec") if timing else None,
    ]
    sections = [s for s in sections if s is not None and s.blocks]
    title = f"cogcal run report: {who}, seed {cfg.get('seed', '?')}"
    _io.write_text(path / "report.md", render_markdown(title, sections))
    return _io.write_text(path / "report.html", render_html(title, sections, path))
