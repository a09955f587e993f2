"""The report's tables. :func:`stat_table` is the one "mean ± std over seeds, best in bold"
table (comparison, bin sweep, OOD, shift, multi-task, effect); a cell over fewer seeds
than planned (:class:`~cogcal.report.frame.SeedPlan`) says so: ``0.812 ± 0.010 (2 of 3
seeds)``. The others (complexity, run times) are plain lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from cogcal.report._common import counterparts, method_order, slug
from cogcal.report.blocks import Cell, Table, Text
from cogcal.report.frame import SeedPlan, seed_values
from cogcal.report.stats import HIGHER_IS_BETTER, Stat, summary_rank
from cogcal.runs.columns import METRIC_LABELS as LABELS
from cogcal.runs.methods import METHODS

#: Bin counts of the calibration-error sweep (docs/method.md §3).
BINS: tuple[int, ...] = (5, 10, 15, 20, 50, 100)

FEWER_SEEDS_NOTE = (
    "A cell marked (k of n seeds) holds fewer seeds than planned (a run failed, diverged or "
    "is missing): its mean is over the k seeds present."
)


def cell(v: Any, bold: bool = False) -> Cell:
    """A table cell showing ``v`` (``None``: empty)."""
    return Cell("" if v is None else str(v), bold)


def fmt(mean: float, std: float | None = None, digits: int = 3) -> str:
    """``mean ± std`` with ``digits`` decimals (``nan`` for a missing mean).

    >>> fmt(0.81234, 0.0104), fmt(0.5), fmt(float("nan"))
    ('0.812 ± 0.010', '0.500', 'nan')
    """
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "nan"
    text = f"{mean:.{digits}f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        text += f" ± {std:.{digits}f}"
    return text


def stat_text(mean: float, std: float, n: int, expected: int | None, digits: int = 3) -> str:
    """A cell's text: ``mean ± std``, the seed count when it is short of ``expected``;
    one seed has no spread, so no ``±`` is shown for it.

    >>> stat_text(0.8123, 0.01, 3, 3), stat_text(0.8123, 0.01, 2, 3)
    ('0.812 ± 0.010', '0.812 ± 0.010 (2 of 3 seeds)')
    >>> stat_text(0.8123, 0.0, 1, 3), stat_text(0.8123, 0.0, 1, 1), stat_text(1.0, 0.0, 0, 3)
    ('0.812 (1 of 3 seeds)', '0.812', '—')
    """
    if n == 0 or mean is None or not np.isfinite(mean):
        return "—"
    text = fmt(mean, std if n > 1 else None, digits)
    if expected is not None and n < expected:
        text += f" ({n} of {expected} seeds)"
    return text


def stats_of(values: pd.DataFrame, by: Sequence[str]) -> dict[Any, Stat]:
    """``{key: Stat}`` over seeds of a per-seed frame (``value`` column), one key per
    ``by`` group (a tuple when ``by`` has several columns)."""
    if values.empty:
        return {}
    grouped = values.groupby(list(by) if len(by) > 1 else by[0], sort=False)["value"]
    return {k: Stat.of(list(v)) for k, v in grouped}


def stat_table(
    title: str,
    key: str,
    head: Sequence[str],
    rows: Sequence[tuple[Hashable, Sequence[str]]],
    columns: Sequence[tuple[Hashable, str, str]],
    stats: Mapping[tuple[Hashable, Hashable], Stat],
    *,
    notes: Sequence[Text] = (),
    expected: Callable[[Hashable], int | None] | None = None,
    rank: Mapping[Hashable, float] | None = None,
    group: Callable[[Hashable], Hashable] | None = None,
) -> Table:
    """The report's one mean ± std table, titled ``title`` with anchor ``key``.

    ``head`` names the leading label columns; ``rows`` is ``(row key, labels)`` per row and
    ``columns`` ``(column key, header, metric)`` per value column (the metric orients
    "best"); ``stats[(row key, column key)]`` is a :class:`Stat` (missing: ``—``). The best
    mean of each column is bold, per ``group(row key)`` when given; ``expected(row key)``:
    the planned seeds (default: the most in the table); ``rank``: a ``Rank ↓`` column.
    """
    most = max((s.n for s in stats.values()), default=0)
    grouping = group or (lambda _: None)
    best: dict[tuple[Hashable, Hashable], float] = {}
    for ck, _, metric in columns:
        for rk, _ in rows:
            s = stats.get((rk, ck))
            if s is None or not np.isfinite(s.mean):
                continue
            g = (grouping(rk), ck)
            pick = max if metric in HIGHER_IS_BETTER else min
            best[g] = pick(best.get(g, s.mean), s.mean)
    finite = [r for r in (rank or {}).values() if not pd.isna(r)]
    top = min(finite) if finite else None
    body, short = [], False
    for rk, labels in rows:
        want = (expected(rk) if expected else None) or most
        row = [cell(t) for t in labels]
        for ck, _, _ in columns:
            s = stats.get((rk, ck))
            if s is None:
                row.append(cell("—"))
                continue
            short |= s.n < want
            b = best.get((grouping(rk), ck))
            bold = b is not None and np.isfinite(s.mean) and bool(np.isclose(s.mean, b))
            row.append(cell(stat_text(s.mean, s.std, s.n, want), bold))
        if rank is not None:
            r = rank.get(rk, np.nan)
            row.append(cell("—" if pd.isna(r) else f"{r:.2f}", not pd.isna(r) and r == top))
        body.append(row)
    header = [*head, *[h for _, h, _ in columns]] + (["Rank ↓"] if rank is not None else [])
    return Table(title, header, body, [*notes] + ([FEWER_SEEDS_NOTE] if short else []), key)


def _planned(plan: SeedPlan | None, dataset: str, protocol: str) -> Callable[[Any], int | None]:
    def expected(method: Any) -> int | None:
        return plan.planned(dataset, protocol, str(method)) if plan is not None else None

    return expected


# --------------------------------------------------------------------------- comparison


def comparison_key(dataset: str, protocol: str) -> str:
    """The anchor of :func:`comparison_table`."""
    return f"comparison-{slug(protocol)}-{slug(dataset)}"


def ranked_table(
    values: pd.DataFrame, title: str, key: str, metrics: Sequence[str], notes: list[Text], *,
    expected: Callable[[Hashable], int | None] | None = None,
) -> Table:  # fmt: skip
    """A :func:`stat_table` of per-seed ``values`` (one row per method) with the summary
    rank on accuracy, NLL and Brier (1 = best, ties share the best rank), sorted by it."""
    ranks = summary_rank(values, metrics=[m for m in ("acc", "nll", "brier") if m in set(values["metric"])], split=None)  # fmt: skip
    rank_of = dict(zip(ranks["method"], ranks["rank"], strict=True))
    methods = sorted(method_order(values["method"].unique()), key=lambda m: (pd.isna(rank_of.get(m, np.nan)), rank_of.get(m, 0)))  # fmt: skip
    finite = [r for r in rank_of.values() if not pd.isna(r)]
    top = ", ".join(m for m, r in rank_of.items() if finite and r == min(finite)) or "—"
    notes = [*notes, f"Rank = mean of the ranks on Acc, NLL and Brier (1 = best, ties share the best rank). Top ranked: {top}."]  # fmt: skip
    columns = [(m, LABELS.get(m, m), m) for m in metrics if m in set(values["metric"])]
    return stat_table(title, key, ["Method"], [(m, [m]) for m in methods], columns,
                      stats_of(values, ("method", "metric")), notes=notes, expected=expected, rank=rank_of)  # fmt: skip


def comparison_table(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    metrics: Sequence[str] = ("acc", "nll", "brier", "ece_15", "adaece_15", "aurc"),
    *,
    plan: SeedPlan | None = None,
) -> Table | None:
    """Tab. 2/12: test mean ± std over seeds, best in bold, summary rank, sorted by rank;
    adaptive (equal-mass) ECE next to ECE-15 and the AURC of selective prediction, when
    the results hold them."""
    d = seed_values(df, "test", dataset=dataset, protocol=protocol)
    if d.empty:
        return None
    n = d.groupby(["method", "metric"])["seed"].nunique().max()
    notes: list[Text] = [
        f"Test split, mean ± sample std over {n} seed(s); best mean in bold. adaECE-15: ECE "
        "over 15 equal-mass bins; AURC: area under the risk-coverage curve of predicting only "
        "the most confident samples (docs/metrics.md)."
    ]
    title = f"{dataset} — {protocol} protocol (Tab. 2 style)"
    return ranked_table(d, title, comparison_key(dataset, protocol), metrics, notes, expected=_planned(plan, dataset, protocol))  # fmt: skip


def present_pairs(methods: Sequence[str]) -> list[tuple[str, str]]:
    """(COG variant, counterpart) pairs with both methods in ``methods``, registry order."""
    present = set(methods)
    pairs = [(c, b) for c, b in counterparts().items() if c in present and b in present]
    order = method_order([c for c, _ in pairs])
    return sorted(pairs, key=lambda p: order.index(p[0]))


def pairwise_calibration_table(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    family: str,
    *,
    bins: Sequence[int] = BINS,
    plan: SeedPlan | None = None,
) -> Table | None:
    """Tab. 9-11: one calibration error (``ece``, ``rmsce`` or ``mce``) over the bin
    sweep, each COG variant under its counterpart; the lower error of each pair in bold."""
    d = seed_values(df, "test", dataset=dataset, protocol=protocol)
    pairs = present_pairs(list(d["method"].unique()))
    metrics = [f"{family}_{b}" for b in bins]
    stats = stats_of(d[d["metric"].isin(metrics)], ("method", "metric"))
    if not pairs or not stats:
        return None
    name = {"ece": "ECE", "rmsce": "RMSCE", "mce": "MCE"}.get(family, family)
    tab = {"ece": "9", "rmsce": "10", "mce": "11"}.get(family, "9-11")
    rows = [((cog, m), [m]) for cog, base in pairs for m in (base, cog)]
    return stat_table(
        f"{name} over bin counts, COG vs counterpart — {dataset}, {protocol} (Tab. {tab} style)",
        f"pairwise-{family}-{slug(protocol)}-{slug(dataset)}",
        ["Method"],
        rows,
        [(m, f"B={b}", m) for m, b in zip(metrics, bins, strict=True)],
        {(rk, m): stats[(rk[1], m)] for rk, _ in rows for m in metrics if (rk[1], m) in stats},
        notes=[
            "Test split, mean ± std over seeds; bold: the lower error of each pair. Post-hoc "
            "calibrators are fitted on the validation split; COG learns its calibrator on the "
            "training split."
        ],
        expected=lambda rk: _planned(plan, dataset, protocol)(rk[1]),
        group=lambda rk: rk[0],
    )


# --------------------------------------------------------------------------- plain lists


def complexity_table(methods: Sequence[str], datasets: dict[str, dict[str, Any]]) -> Table:
    """Tab. 1/7: extra parameters (per dataset with known K and d in ``bench.json``),
    calibration data, stages and extra hyperparameters of each method."""
    sized = {n: i for n, i in datasets.items() if i.get("num_classes") and i.get("feature_dim")}
    header = ["Method", "Family", "Extra parameters"]
    header += [f"{name} (K={i['num_classes']}, d={i['feature_dim']})" for name, i in sized.items()]
    header += ["Calibration data", "Stages", "Extra hyperparameters", "Description"]
    body = []
    for name in method_order(methods):
        m = METHODS.get(name)
        if m is None:
            body.append([cell(name)] + [cell("?")] * (len(header) - 1))
            continue
        row = [cell(name), cell(m.family), cell(m.extra_parameters_formula())]
        for i in sized.values():
            n = m.extra_parameters(
                i["num_classes"], i["feature_dim"], task=i.get("task") or "multiclass"
            )
            row.append(cell("data-dependent" if n is None else f"{n:,}"))
        row += [
            cell("yes (validation split)" if m.needs_calibration_data else "no"),
            cell(m.stages),
            cell(", ".join(m.extra_hyperparameters) or "—"),
            cell(m.description),
        ]
        body.append(row)
    notes: list[Text] = [
        "Generated from the methods registry (cogcal.runs.methods). K = classes, d = "
        "features entering the final layer. Every method also has the network learning "
        "rate; COG adds only the calibrator learning rate.",
    ]
    return Table("Complexity of the methods (Tab. 1/7)", header, body, notes, "complexity-table")


def runtime_table(runs: pd.DataFrame | None) -> Table | None:
    """Mean training and total seconds per run, per dataset/protocol/method; runs copied
    from an identical configuration report the source's times and count as reused."""
    if runs is None or runs.empty:
        return None
    r = runs[runs["status"] == "complete"]
    body = []
    for (dataset, protocol, method), grp in r.groupby(["dataset", "protocol", "method"]):
        train = grp["train_seconds"].dropna()
        spread = train.std(ddof=1) if len(train) > 1 else None
        seconds = fmt(train.mean(), spread, 1) if len(train) else "—"
        total, reused = fmt(grp["total_seconds"].mean(), None, 1), (grp["copied_from"] != "").sum()
        body.append([*map(cell, (dataset, protocol, method, len(grp), seconds, total, reused))])
    if not body:
        return None
    order = method_order([row[2].text for row in body])
    body.sort(key=lambda row: (row[0].text, row[1].text, order.index(row[2].text)))
    header = ["Dataset", "Protocol", "Method", "Runs", "Train s (mean ± std)", "Total s", "Reused"]
    notes: list[Text] = [
        "Seconds per run (training stages and post-hoc fit; total adds data loading and "
        "evaluation). 'Reused' runs had a configuration identical to another run (e.g. the "
        "tuning run of the chosen point) and were copied, not retrained; their times are the "
        "source's."
    ]
    return Table("Run times", header, body, notes, "runtimes")
