"""The overview of a bench report and its failures section.

The overview states the suite, the training budgets per method family and protocol
(``bench.json``: epochs, schedule, step size, early stopping, stage-2 epochs, the epoch at
which every learning rate is below the 1e-8 floor), the run counts of the bench sessions
and of ``runs.csv``, the datasets, methods and seeds, and which files were not found.
The failures section lists every run of ``runs.csv`` that failed, diverged or was
interrupted, and every (dataset, protocol, method) cell with fewer seeds than planned.

``bench.json`` budgets are read from ``budgets`` (top level, or under ``suite``) in
either form: ``{protocol: {family: {field: value}}}`` or a list of
``{"protocol": ..., "family": ..., field: value}`` records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from cogcal.report._common import method_order
from cogcal.report.blocks import Link, Paragraph, Section, Table, Text, plain
from cogcal.report.frame import SeedPlan, aggregate, protocol_order, rows
from cogcal.report.tables import cell as _cell

__all__ = [
    "budget_table",
    "count_text",
    "coverage_rows",
    "failures_section",
    "overview_section",
    "plain",
]

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
    "early_stopping": "Early stopping",
    "stage2_epochs": "Stage-2 epochs",
    "floor_epoch": "All rates < 1e-8 from epoch",
    "lr_floor_epoch": "All rates < 1e-8 from epoch",
}
_COUNT_ORDER = (
    "trained",
    "reused",
    "copied",
    "skipped",
    "failed",
    "interrupted",
    "diverged",
    "blocked",
    "running",
)
FAILED_STATUSES = ("failed", "interrupted", "diverged")


def _budget_records(meta: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if not isinstance(meta, Mapping):
        return []
    budgets = meta.get("budgets")
    if budgets is None and isinstance(meta.get("suite"), Mapping):
        budgets = meta["suite"].get("budgets")
    records: list[dict[str, Any]] = []
    if isinstance(budgets, Mapping):
        for protocol, families in budgets.items():
            if not isinstance(families, Mapping):
                continue
            for family, fields in families.items():
                if isinstance(fields, Mapping):
                    records.append({"protocol": str(protocol), "family": str(family), **fields})
    elif isinstance(budgets, list):
        records = [dict(r) for r in budgets if isinstance(r, Mapping)]
    return records


def budget_table(meta: Mapping[str, Any] | None, runs: pd.DataFrame | None = None) -> Table | None:
    """The training budget per protocol and method family (``bench.json``; without its
    ``budgets``, the epochs and schedules recorded in ``runs.csv``)."""
    records = _budget_records(meta)
    source = "bench.json"
    if not records and runs is not None and not runs.empty:
        from cogcal.train.methods import METHODS

        source = "runs.csv (bench.json has no budgets)"
        fam = runs["method"].map(lambda m: METHODS[m].family if m in METHODS else "other")
        for (protocol, family), grp in runs.assign(family=fam).groupby(["protocol", "family"]):
            epochs = sorted({int(e) for e in grp["epochs"].dropna()})
            records.append(
                {
                    "protocol": protocol,
                    "family": family,
                    "epochs": epochs or None,
                    "schedule": sorted(set(grp["schedule"]) - {""}) or None,
                }
            )
    if not records:
        return None
    fields: list[str] = []
    for r in records:
        fields += [k for k in r if k not in ("protocol", "family") and k not in fields]
    order = {p: i for i, p in enumerate(protocol_order({str(r.get("protocol")) for r in records}))}
    records.sort(key=lambda r: (order.get(str(r.get("protocol")), 99), str(r.get("family"))))
    header = ["Protocol", "Family"] + [_BUDGET_LABELS.get(f, f.replace("_", " ")) for f in fields]
    body = [
        [_cell(plain(r.get("protocol"))), _cell(plain(r.get("family")))]
        + [_cell(plain(r.get(f))) for f in fields]
        for r in records
    ]
    notes: list[Text] = [
        f"From {source}. The step schedule divides every learning rate by 10 every step size "
        "epochs; a run stops once every rate is below 1e-8 (docs/method.md §1)."
    ]
    return Table("Training budgets per protocol and method family", header, body, notes, "budgets")


def count_text(counts: Mapping[str, Any]) -> str:
    """Run counts as words, known kinds first.

    >>> count_text({"failed": 1, "trained": 56, "copied": 3, "skipped": 0})
    'trained 56, reused 3, skipped 0, failed 1'
    """
    keys = [k for k in _COUNT_ORDER if k in counts] + sorted(
        k for k in counts if k not in _COUNT_ORDER
    )
    return ", ".join(f"{'reused' if k == 'copied' else k} {plain(counts[k])}" for k in keys)


def _runs_sentence(runs: pd.DataFrame) -> str:
    status = runs["status"].value_counts()
    reused = int(((runs["status"] == "complete") & (runs["copied_from"] != "")).sum())
    parts = [f"{int(status.get('complete', 0))} complete ({reused} of them reused)"]
    parts += [f"{int(status[s])} {s}" for s in FAILED_STATUSES if status.get(s, 0)]
    return f"runs.csv: {len(runs)} planned run(s) — " + ", ".join(parts) + "."


def coverage_rows(df: pd.DataFrame, plan: SeedPlan) -> list[tuple[str, str, str, list[int], int]]:
    """``(dataset, protocol, method, seeds present, planned)`` of every cell with fewer
    seeds than planned. A seed is present when its test split has a finite value of
    every metric the cell records; a planned method without any row has no seeds."""
    d = aggregate(df, split="test")
    out = []
    seen = set()
    for (dataset, protocol, method), grp in d.groupby(["dataset", "protocol", "method"]):
        seen.add((dataset, protocol, method))
        metrics = set(grp["metric"])
        finite = grp[grp["value"].notna()]
        per_seed = finite.groupby("seed")["metric"].nunique()
        seeds = sorted(int(s) for s, k in per_seed.items() if k == len(metrics))
        most = rows(d, dataset=dataset, protocol=protocol)["seed"].nunique()
        want = plan.planned(dataset, protocol, method) or most
        if len(seeds) < want:
            out.append((dataset, protocol, method, seeds, want))
    for (dataset, protocol, method), want in plan.cells.items():
        if (dataset, protocol, method) not in seen and want:
            out.append((dataset, protocol, method, [], want))
    return sorted(out, key=lambda r: (r[1], r[0], method_order([r[2]])[0]))


def overview_section(
    df: pd.DataFrame,
    meta: Mapping[str, Any] | None,
    runs: pd.DataFrame | None,
    found: Mapping[str, bool],
    *,
    short_cells: int = 0,
    failed_runs: int = 0,
) -> Section:
    """The overview: suite, budgets, run counts, datasets/methods/seeds, protocols."""
    items: list[Text] = []
    meta = meta if isinstance(meta, Mapping) else None
    if meta is not None:
        suite = meta.get("suite") if isinstance(meta.get("suite"), Mapping) else {}
        if suite.get("name"):
            desc = f" — {suite['description']}" if suite.get("description") else ""
            items.append(f"Suite: {suite['name']}{desc}.")
        sessions = [s for s in meta.get("sessions") or [] if isinstance(s, Mapping)]
        if sessions:
            wall = sum(float(s.get("wall_seconds") or 0) for s in sessions)
            last = sessions[-1]
            text = (
                f"cogcal bench ran {len(sessions)} time(s) into this folder, {wall:.0f} s of wall "
                "time in all"
            )
            if isinstance(last.get("counts"), Mapping) and last["counts"]:
                text += f"; the last session: {count_text(last['counts'])}"
            items.append(text + ".")
        machine = meta.get("machine")
        if isinstance(machine, Mapping) and machine:
            items.append(f"Machine: {plain(machine)}.")
        elif meta.get("torch") or meta.get("platform"):
            stamp = {k: meta[k] for k in ("cogcal", "torch", "python", "platform") if k in meta}
            items.append(f"Software: {plain(stamp)}.")
    if runs is not None and not runs.empty:
        items.append(
            [
                _runs_sentence(runs) + " Failures and cells with fewer seeds than planned: ",
                Link("failures", "failures"),
                ".",
            ]
        )
    datasets = sorted(set(df["dataset"]))
    protocols = protocol_order(set(df["protocol"]))
    seeds = sorted(int(s) for s in set(df["seed"]))
    items.append(
        f"Datasets: {', '.join(datasets) or '—'}; {df['method'].nunique()} method(s); seeds "
        f"{', '.join(map(str, seeds)) or '—'}."
    )
    for p in protocols:
        if p in PROTOCOL_TEXT:
            items.append(f"Protocol '{p}': {PROTOCOL_TEXT[p]}.")
    items.append(
        "All numbers are on the test split unless a table says otherwise; nothing is tuned, "
        "fitted or selected on the test split (checkpoints by validation Brier, learning "
        "rates by validation cross-entropy, post-hoc calibrators fitted on validation)."
    )
    if short_cells or failed_runs:
        items.append(
            [
                f"{short_cells} cell(s) with fewer seeds than planned, {failed_runs} run(s) "
                "failed, diverged or interrupted (",
                Link("failures", "failures"),
                ").",
            ]
        )
    absent = [name for name, ok in found.items() if not ok]
    if absent:
        items.append("Not found, sections skipped: " + ", ".join(absent) + ".")
    sec = Section("Overview", [Paragraph(items=items)], key="overview")
    budgets = budget_table(meta, runs)
    if budgets is not None:
        sec.blocks.append(budgets)
    return sec


def failures_section(
    runs: pd.DataFrame | None, coverage: list[tuple[str, str, str, list[int], int]]
) -> Section:
    """Runs that failed, diverged or were interrupted, and cells with fewer seeds."""
    sec = Section("Failures and missing seeds", key="failures")
    if runs is None:
        sec.blocks.append(Paragraph("No runs.csv: failed runs cannot be listed."))
    else:
        bad = runs[runs["status"].isin(FAILED_STATUSES)]
        if bad.empty:
            sec.blocks.append(Paragraph("No run failed, diverged or was interrupted."))
        else:
            body = [
                [
                    _cell(r["protocol"]),
                    _cell(r["dataset"]),
                    _cell(r["method"]),
                    _cell(int(r["seed"])),
                    _cell(r["status"], bold=True),
                    _cell(r["run_dir"]),
                    _cell(r["log"]),
                ]
                for _, r in bad.iterrows()
            ]
            sec.blocks.append(
                Table(
                    f"{len(body)} run(s) failed, diverged or were interrupted",
                    ["Protocol", "Dataset", "Method", "Seed", "Status", "Run folder", "Log"],
                    body,
                    [
                        "These runs are missing from every table; `cogcal bench` on the same "
                        "folder retries failed and interrupted runs."
                    ],
                    "failed-runs",
                )
            )
    if coverage:
        body = [
            [
                _cell(protocol),
                _cell(dataset),
                _cell(method),
                _cell(", ".join(map(str, seeds)) or "none"),
                _cell(f"{len(seeds)} of {want}", bold=True),
            ]
            for dataset, protocol, method, seeds, want in coverage
        ]
        sec.blocks.append(
            Table(
                "Cells with fewer seeds than planned",
                ["Protocol", "Dataset", "Method", "Seeds with results", "Seeds"],
                body,
                [
                    "Their table cells say '(k of n seeds)': the mean is over the seeds "
                    "present, not the planned ones."
                ],
                "coverage",
            )
        )
    else:
        sec.blocks.append(Paragraph("Every cell has all its planned seeds."))
    return sec
