"""The overview of a bench report and its failures section.

The overview states the suite, the training budgets per protocol and method family
(``bench.json`` ``budgets``), the run counts, the datasets, methods and seeds, and which
files were not found. The failures section lists every run that failed, diverged or was
interrupted, and every cell with fewer seeds than planned. :func:`unfinished_notice` is what
a report of an unfinished bench (interrupted, or runs not started) says first: which
datasets and methods have no results yet, and that the verdict covers only what finished.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from cogcal.report._common import method_order
from cogcal.report.blocks import Link, Paragraph, Section, Table, Text, plain
from cogcal.report.frame import SeedPlan, aggregate, protocol_order, rows
from cogcal.report.tables import cell
from cogcal.runs.bench import NOT_STARTED

PROTOCOL_TEXT = {
    "paper": "baselines at lr 1e-4 without a schedule as in the paper, COG learning rates "
    "tuned by validation cross-entropy",
    "fair": "every method's learning rate(s) tuned by validation cross-entropy on the same "
    "kind of grid, extended outward until the choice is interior, every method on the same "
    "schedule",
}
_BUDGET_LABELS = {
    "epochs": "Epochs",
    "schedule": "Schedule",
    "step_size": "Step size (epochs)",
    "patience": "Early stopping (patience)",
    "stage2_epochs": "Stage-2 epochs",
    "floor_epoch": "All rates < 1e-8 from epoch",
}
FAILED_STATUSES = ("failed", "interrupted", "diverged")
#: ``runs.csv`` statuses of planned runs without a result yet: the bench is unfinished.
UNFINISHED_STATUSES = ("interrupted", NOT_STARTED)


def budget_table(meta: Mapping[str, Any] | None) -> Table | None:
    """The training budget per protocol and method family (``bench.json``)."""
    budgets = (meta or {}).get("budgets") or {}
    records = [
        {"protocol": p, "family": f, **v} for p, fam in budgets.items() for f, v in fam.items()
    ]
    if not records:
        return None
    fields = list(dict.fromkeys(k for r in records for k in r if k not in ("protocol", "family")))
    order = {p: i for i, p in enumerate(protocol_order({str(r.get("protocol")) for r in records}))}
    records.sort(key=lambda r: (order.get(str(r.get("protocol")), 99), str(r.get("family"))))
    header = ["Protocol", "Family"] + [_BUDGET_LABELS.get(f, f.replace("_", " ")) for f in fields]
    body = [[cell(plain(r.get(f))) for f in ("protocol", "family", *fields)] for r in records]
    notes: list[Text] = [
        [
            "From bench.json. The step schedule divides every learning rate by 10 every step "
            "size epochs; a run stops once every rate is below 1e-8 (docs/method.md §1). The "
            "epoch each run's checkpoint came from: ",
            Link("checkpoint epochs", "checkpoints"),
            ".",
        ]
    ]
    return Table("Training budgets per protocol and method family", header, body, notes, "budgets")


def coverage_rows(df: pd.DataFrame, plan: SeedPlan) -> list[tuple[str, str, str, list[int], int]]:
    """``(dataset, protocol, method, seeds present, planned)`` of every cell with fewer
    seeds than planned. A seed is present when its test split has a finite value of
    every metric the cell records; a planned method without any row has no seeds."""
    d = aggregate(df, split="test")
    out, seen = [], set()
    for (dataset, protocol, method), grp in d.groupby(["dataset", "protocol", "method"]):
        seen.add((dataset, protocol, method))
        per_seed = grp[grp["value"].notna()].groupby("seed")["metric"].nunique()
        seeds = sorted(int(s) for s, k in per_seed.items() if k == grp["metric"].nunique())
        most = rows(d, dataset=dataset, protocol=protocol)["seed"].nunique()
        want = plan.planned(dataset, protocol, method) or most
        if len(seeds) < want:
            out.append((dataset, protocol, method, seeds, want))
    out += [(*k, [], n) for k, n in plan.cells.items() if k not in seen and n]
    return sorted(out, key=lambda r: (r[1], r[0], method_order([r[2]])[0]))


def _session_items(meta: Mapping[str, Any]) -> list[Text]:
    items: list[Text] = []
    suite = meta.get("suite") or {}
    if suite.get("name"):
        desc = f" — {suite['description']}" if suite.get("description") else ""
        items.append(f"Suite: {suite['name']}{desc}.")
    sessions = meta.get("sessions") or []
    if sessions:
        wall = sum(float(s.get("wall_seconds") or 0) for s in sessions)
        text = f"cogcal bench ran {len(sessions)} time(s) into this folder, {wall:.0f} s of wall time in all"
        counts = sessions[-1].get("counts") or {}  # in the bench's order; copied = reused
        words = ", ".join(f"{'reused' if k == 'copied' else k} {v}" for k, v in counts.items())
        text += f"; the last session: {words}" if words else ""
        items.append(text + ".")
    stamp = {k: meta[k] for k in ("cogcal", "torch", "python", "platform") if k in meta}
    items += [f"Software: {plain(stamp)}."] if stamp else []
    return items


def overview_section(
    df: pd.DataFrame,
    meta: Mapping[str, Any] | None,
    runs: pd.DataFrame | None,
    found: Mapping[str, bool],
) -> Section:
    """The overview: suite, budgets, run counts, datasets/methods/seeds, protocols."""
    items = _session_items(meta) if meta else []
    if runs is not None and not runs.empty:
        status = runs["status"].value_counts()
        reused = int(((runs["status"] == "complete") & (runs["copied_from"] != "")).sum())
        parts = [f"{int(status.get('complete', 0))} complete ({reused} of them reused)"]
        parts += [
            f"{int(status[s])} {s}" for s in (*FAILED_STATUSES, NOT_STARTED) if status.get(s, 0)
        ]
        text = f"runs.csv: {len(runs)} planned run(s) — " + ", ".join(parts) + ". Failures: "
        items.append([text, Link("failures", "failures"), "."])
    seeds = ", ".join(map(str, sorted(int(s) for s in set(df["seed"])))) or "—"
    items.append(
        f"Datasets: {', '.join(sorted(set(df['dataset']))) or '—'}; {df['method'].nunique()} "
        f"method(s); seeds {seeds}."
    )
    for p in protocol_order(set(df["protocol"])):
        if p in PROTOCOL_TEXT:
            items.append(f"Protocol '{p}': {PROTOCOL_TEXT[p]}.")
    items.append(
        "All numbers are on the test split unless a table says otherwise; nothing is tuned, "
        "fitted or selected on the test split (checkpoints by validation Brier, learning "
        "rates by validation cross-entropy, post-hoc calibrators fitted on validation)."
    )
    absent = [name for name, ok in found.items() if not ok]
    if absent:
        items.append("Not found, sections skipped: " + ", ".join(absent) + ".")
    sec = Section("Overview", [Paragraph(items=items)], key="overview")
    budgets = budget_table(meta)
    if budgets is not None:
        sec.blocks.append(budgets)
    return sec


def _without_results(runs: pd.DataFrame) -> tuple[list[str], list[str]]:
    """``protocol/dataset: methods`` with no finished run, and with some runs unfinished."""
    done = runs[runs["status"].isin(("complete", "diverged"))]
    finished = set(zip(done["protocol"], done["dataset"], done["method"], strict=True))
    pending = runs[runs["status"].isin(UNFINISHED_STATUSES)]
    none: dict[str, list[str]] = {}
    some: dict[str, list[str]] = {}
    for p, ds, m in dict.fromkeys(zip(pending["protocol"], pending["dataset"], pending["method"], strict=True)):  # fmt: skip
        (some if (p, ds, m) in finished else none).setdefault(f"{ds} ({p})", []).append(str(m))
    return [f"{k}: {', '.join(v)}" for k, v in none.items()], [
        f"{k}: {', '.join(v)}" for k, v in some.items()
    ]


def unfinished_notice(
    runs: pd.DataFrame | None, meta: Mapping[str, Any] | None
) -> Paragraph | None:
    """What a report of an unfinished bench says first (``None`` when it finished): that it
    was stopped, which datasets and methods have no results yet (``runs.csv`` lists the
    runs not started), and that the verdict covers only what finished."""
    sessions = (meta or {}).get("sessions") or []
    last = sessions[-1] if sessions and isinstance(sessions[-1], Mapping) else {}
    stopped = last.get("interrupted")
    pending = runs[runs["status"].isin(UNFINISHED_STATUSES)] if runs is not None else None
    if not stopped and not last.get("not_started") and (pending is None or pending.empty):
        return None
    items: list[Text] = []
    head = "This bench is unfinished" + (f": it was stopped by {stopped}" if stopped else "")
    if pending is not None and not pending.empty:
        counts = pending["status"].value_counts()
        head += (
            f"; {len(pending)} of its {len(runs)} planned runs have no result yet ("
            + ", ".join(f"{int(counts[s])} {s}" for s in UNFINISHED_STATUSES if counts.get(s, 0))
            + ")"
        )
    items.append(head + ".")
    none, some = _without_results(runs) if runs is not None else ([], [])
    items += [f"No results yet: {'; '.join(none)}."] if none else []
    items += [f"Some seeds without results: {'; '.join(some)}."] if some else []
    items.append(
        "The verdict and every table below cover only the runs that finished; `cogcal bench` "
        "on the same folder runs the rest."
    )
    return Paragraph(items=items)


def failures_section(
    runs: pd.DataFrame | None, coverage: list[tuple[str, str, str, list[int], int]]
) -> Section:
    """Runs that failed, diverged or were interrupted, and cells with fewer seeds."""
    sec = Section("Failures and missing seeds", key="failures")
    bad = runs[runs["status"].isin(FAILED_STATUSES)] if runs is not None else None
    if bad is None:
        sec.blocks.append(Paragraph("No runs.csv: failed runs cannot be listed."))
    elif bad.empty:
        sec.blocks.append(Paragraph("No run failed, diverged or was interrupted."))
    else:
        columns = ("protocol", "dataset", "method", "seed", "status", "run_dir", "log")
        body = [[cell(r[c], bold=c == "status") for c in columns] for _, r in bad.iterrows()]
        header = ["Protocol", "Dataset", "Method", "Seed", "Status", "Run folder", "Log"]
        note = "These runs are missing from every table; `cogcal bench` on the same folder retries failed and interrupted runs."
        title = f"{len(body)} run(s) failed, diverged or were interrupted"
        sec.blocks.append(Table(title, header, body, [note], "failed-runs"))
    if not coverage:
        sec.blocks.append(Paragraph("Every cell has all its planned seeds."))
        return sec
    body = [
        [*map(cell, (p, ds, m, ", ".join(map(str, s)) or "none")), cell(f"{len(s)} of {n}", True)]
        for ds, p, m, s, n in coverage
    ]
    header = ["Protocol", "Dataset", "Method", "Seeds with results", "Seeds"]
    note = "Their table cells say '(k of n seeds)': the mean is over the seeds present, not the planned ones."
    title = "Cells with fewer seeds than planned"
    sec.blocks.append(Table(title, header, body, [note], "coverage"))
    return sec
