"""The report's tables, computed from the normalised ``results.csv`` (and ``runs.csv``).

Each function returns a :class:`~cogcal.report.blocks.Table` (title, header, rows of
:class:`~cogcal.report.blocks.Cell`, notes), rendered to Markdown and HTML by
:mod:`cogcal.report.render`. Means, standard deviations, summary ranks and the seed-spread
rule come from :mod:`cogcal.report.aggregate`; rows are selected with
:func:`cogcal.report.frame.rows`. Nothing here is tuned or fitted, and only the requested
split (``test`` by default) is shown.

A cell whose mean is over fewer seeds than planned says so (``0.812 ± 0.010 (2 of 3
seeds)``): the plan comes from ``runs.csv`` (:class:`~cogcal.report.frame.SeedPlan`), or,
without it, from the largest seed count in the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from cogcal.report._common import counterparts, method_order, slug
from cogcal.report.aggregate import HIGHER_IS_BETTER, Stat, compare, mean_std, summary_rank
from cogcal.report.blocks import Cell, Table
from cogcal.report.frame import SeedPlan, aggregate, rows
from cogcal.report.schema import METRIC_LABELS

__all__ = [
    "BINS",
    "Cell",
    "LABELS",
    "Table",
    "comparison_table",
    "complexity_table",
    "fmt",
    "losses_table",
    "pairwise_calibration_table",
    "runtime_table",
    "seed_notes",
    "stat_text",
]

#: Bin counts of the calibration-error sweep (docs/method.md §3).
BINS: tuple[int, ...] = (5, 10, 15, 20, 50, 100)

#: Column labels of the metrics (:data:`cogcal.report.schema.METRIC_LABELS`).
LABELS = METRIC_LABELS
_LABELS = LABELS  # the name the robustness and multi-task modules import
#: Metric names in sentences.
NAMES = {
    "acc": "accuracy",
    "nll": "NLL",
    "brier": "Brier",
    "ece_15": "ECE-15",
    "auroc": "AUROC",
    "fpr95": "FPR95",
}

FEWER_SEEDS_NOTE = (
    "A cell marked (k of n seeds) holds fewer seeds than planned (a run failed, diverged or "
    "is missing): its mean is over the k seeds present."
)


def seed_notes(notes: list[str], counts: pd.Series, most: int) -> list[str]:
    """``notes``, plus :data:`FEWER_SEEDS_NOTE` when a cell's seed ``counts`` fall short of
    ``most``."""
    return [*notes, FEWER_SEEDS_NOTE] if bool((counts < most).any()) else list(notes)


def _cell(v: Any, bold: bool = False) -> Cell:
    return Cell("" if v is None else str(v), bold)


def _method_order(methods: Sequence[str]) -> list[str]:
    return method_order(methods)


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
    """A cell's text: ``mean ± std``, the seed count when it is short of ``expected``.

    One seed has no spread, so no ``±`` is shown for it.

    >>> stat_text(0.8123, 0.01, 3, 3)
    '0.812 ± 0.010'
    >>> stat_text(0.8123, 0.01, 2, 3)
    '0.812 ± 0.010 (2 of 3 seeds)'
    >>> stat_text(0.8123, 0.0, 1, 3), stat_text(0.8123, 0.0, 1, 1), stat_text(1.0, 0.0, 0, 3)
    ('0.812 (1 of 3 seeds)', '0.812', '—')
    """
    if n == 0 or mean is None or not np.isfinite(mean):
        return "—"
    text = fmt(mean, std if n > 1 else None, digits)
    if expected is not None and n < expected:
        text += f" ({n} of {expected} seeds)"
    return text


def _expected(
    plan: SeedPlan | None, dataset: str, protocol: str, method: str, fallback: int
) -> int:
    got = plan.planned(dataset, protocol, method) if plan is not None else None
    return got if got is not None else fallback


# --------------------------------------------------------------------------- complexity


def complexity_table(methods: Sequence[str], datasets: dict[str, dict[str, Any]]) -> Table:
    """Tab. 1/7: extra parameters, calibration data, stages, extra hyperparameters.

    Parameters
    ----------
    methods : sequence of str
        Methods to list (registry order; unknown names are listed with ``?``).
    datasets : dict
        ``{dataset: {"num_classes": K, "feature_dim": d, "task": ...}}`` from ``bench.json``;
        one "extra parameters" column per dataset with known ``K`` and ``d``.
    """
    from cogcal.train.methods import METHODS

    sized = {
        name: i
        for name, i in (datasets or {}).items()
        if isinstance(i, dict) and i.get("num_classes") and i.get("feature_dim")
    }
    header = ["Method", "Family", "Extra parameters"]
    header += [f"{name} (K={i['num_classes']}, d={i['feature_dim']})" for name, i in sized.items()]
    header += ["Calibration data", "Stages", "Extra hyperparameters", "Description"]
    body = []
    for name in method_order(methods):
        m = METHODS.get(name)
        if m is None:
            body.append([_cell(name)] + [_cell("?")] * (len(header) - 1))
            continue
        row = [_cell(name), _cell(m.family), _cell(m.extra_parameters_formula())]
        for info in sized.values():
            try:
                n = m.extra_parameters(
                    int(info["num_classes"]),
                    int(info["feature_dim"]),
                    task=info.get("task") or "multiclass",
                )
                row.append(_cell(f"{n:,}"))
            except (TypeError, ValueError):
                row.append(_cell("?"))
        row += [
            _cell("yes (validation split)" if m.needs_calibration_data else "no"),
            _cell(m.stages),
            _cell(", ".join(m.extra_hyperparameters) or "—"),
            _cell(m.description),
        ]
        body.append(row)
    notes: list[Any] = [
        "Generated from the methods registry (cogcal.train.methods). K = classes, d = "
        "features entering the final layer. Every method also has the network learning "
        "rate; COG adds only the calibrator learning rate.",
    ]
    return Table("Complexity of the methods (Tab. 1/7)", header, body, notes, "complexity-table")


# --------------------------------------------------------------------------- comparison


def comparison_key(dataset: str, protocol: str) -> str:
    """The anchor of :func:`comparison_table`."""
    return f"comparison-{slug(protocol)}-{slug(dataset)}"


def comparison_table(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    metrics: Sequence[str] = ("acc", "nll", "brier", "ece_15"),
    *,
    split: str = "test",
    plan: SeedPlan | None = None,
) -> Table | None:
    """Tab. 2/12: mean ± std over seeds, best in bold, summary rank (acc, nll, brier).

    Rows are sorted by summary rank (1 = best; ties share the best rank). A cell over
    fewer seeds than planned (``plan``; else the table's largest seed count) says so.
    """
    d = aggregate(df, split=split, dataset=dataset, protocol=protocol)
    if d.empty:
        return None
    stats = mean_std(d, by=("method", "metric"))
    ranks = summary_rank(d, split=None)
    rank_of = dict(zip(ranks["method"], ranks["rank"], strict=True))
    methods = list(ranks["method"]) + [
        m for m in method_order(d["method"].unique()) if m not in set(ranks["method"])
    ]
    best: dict[str, float] = {}
    for metric in metrics:
        s = stats[stats["metric"] == metric]["mean"].dropna()
        if not s.empty:
            best[metric] = s.max() if metric in HIGHER_IS_BETTER else s.min()
    most = int(stats["n"].max()) if not stats.empty else 0
    recorded = set(stats["metric"])
    header = ["Method", *[LABELS.get(m, m) for m in metrics], "Rank ↓"]
    body = []
    finite_ranks = [r for r in rank_of.values() if not pd.isna(r)]
    best_rank = min(finite_ranks) if finite_ranks else np.nan
    flagged = False
    for method in methods:
        row = [_cell(method)]
        want = _expected(plan, dataset, protocol, method, most)
        for metric in metrics:
            s = stats[(stats["method"] == method) & (stats["metric"] == metric)]
            if s.empty:  # flagged only when other methods of the table have the metric
                missing = bool(want) and metric in recorded
                row.append(_cell(f"— (0 of {want} seeds)" if missing else "—"))
                flagged |= missing
                continue
            mean, std, n = float(s["mean"].iloc[0]), float(s["std"].iloc[0]), int(s["n"].iloc[0])
            flagged |= n < want
            bold = metric in best and np.isfinite(mean) and np.isclose(mean, best[metric])
            row.append(_cell(stat_text(mean, std, n, want), bold=bool(bold)))
        r = rank_of.get(method, np.nan)
        row.append(_cell("—" if pd.isna(r) else f"{r:.2f}", bold=not pd.isna(r) and r == best_rank))
        body.append(row)
    top = [m for m, r in rank_of.items() if r == best_rank]
    notes: list[Any] = [
        f"{split} split, mean ± sample std over {most} seed(s); best mean in bold. Rank = "
        "mean of the per-dataset ranks on Acc, NLL and Brier (1 = best, ties share the best "
        f"rank). Top ranked: {', '.join(top) or '—'}."
    ]
    if flagged:
        notes.append(FEWER_SEEDS_NOTE)
    return Table(
        f"{dataset} — {protocol} protocol (Tab. 2 style)",
        header,
        body,
        notes,
        comparison_key(dataset, protocol),
    )


# --------------------------------------------------------------------------- pairwise


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
    split: str = "test",
    plan: SeedPlan | None = None,
) -> Table | None:
    """Tab. 9-11: one calibration error over the bin sweep, COG vs its counterpart.

    Cells are ``mean ± std [rank]``; the rank is over all methods of the table, per bin
    count (1 = lowest error). In each pair the lower mean is bold, and the last column
    counts the bin counts where the COG variant has the lower mean.
    """
    d = aggregate(df, split=split, dataset=dataset, protocol=protocol)
    pairs = present_pairs(list(d["method"].unique()))
    if not pairs:
        return None
    metrics = [f"{family}_{b}" for b in bins]
    methods = [m for pair in pairs for m in (pair[1], pair[0])]
    sel = rows(d, method=methods, metric=metrics)
    if sel.empty:
        return None
    stats = mean_std(sel, by=("method", "metric"))
    most = int(stats["n"].max())
    recorded = set(stats["metric"])
    table: dict[tuple[str, str], tuple[float, float, int]] = {
        (r.method, r.metric): (r.mean, r.std, r.n) for r in stats.itertuples()
    }
    ranks: dict[tuple[str, str], float] = {}
    for metric in metrics:
        vals = pd.Series(
            {m: table.get((m, metric), (np.nan, np.nan, 0))[0] for m in dict.fromkeys(methods)}
        )
        for m, r in vals.rank(method="min").items():
            ranks[(m, metric)] = r
    header = ["Method", *[f"B={b}" for b in bins], "COG lower in"]
    body = []
    flagged = False
    for cog, base in pairs:
        for method, other in ((base, cog), (cog, base)):
            row = [_cell(method)]
            want = _expected(plan, dataset, protocol, method, most)
            wins = 0
            for metric in metrics:
                mean, std, n = table.get((method, metric), (np.nan, np.nan, 0))
                omean = table.get((other, metric), (np.nan, np.nan, 0))[0]
                r = ranks.get((method, metric), np.nan)
                flagged |= metric in recorded and n < want
                text = stat_text(mean, std, n, want) + ("" if pd.isna(r) else f" [{int(r)}]")
                better = not pd.isna(mean) and not pd.isna(omean) and mean < omean
                if method == cog and better:
                    wins += 1
                row.append(_cell(text, bold=better))
            row.append(_cell(f"{wins}/{len(metrics)}" if method == cog else ""))
            body.append(row)
    name = {"ece": "ECE", "rmsce": "RMSCE", "mce": "MCE"}.get(family, family)
    tab = {"ece": "9", "rmsce": "10", "mce": "11"}.get(family, "9-11")
    notes: list[Any] = [
        f"{split} split, mean ± std over seeds [rank among the methods of this table, per "
        "bin count; 1 = lowest]. Bold: the lower error of each pair. Post-hoc calibrators "
        "are fitted on the validation split; COG learns its calibrator on the training split."
    ]
    if flagged:
        notes.append(FEWER_SEEDS_NOTE)
    return Table(
        f"{name} over bin counts, COG vs counterpart — {dataset}, {protocol} (Tab. {tab} style)",
        header,
        body,
        notes,
        f"pairwise-{family}-{slug(protocol)}-{slug(dataset)}",
    )


# --------------------------------------------------------------------------- losses

#: How :func:`losses_table` and the verdict show a comparison under the spread rule.
SPREAD_WORDS = {
    "better": "beyond",
    "worse": "beyond",
    "within": "within",
    "unknown": "unknown (< 2 seeds)",
}


def pair_stats(
    df: pd.DataFrame, metrics: Sequence[str], *, split: str = "test"
) -> dict[tuple[str, str, str, str], Stat]:
    """``{(dataset, protocol, method, metric): Stat}`` of the aggregate rows of ``split``."""
    d = aggregate(df, split=split)
    d = rows(d, metric=list(metrics))
    if d.empty:
        return {}
    stats = mean_std(d, by=("dataset", "protocol", "method", "metric"))
    return {
        (r.dataset, r.protocol, r.method, r.metric): Stat(r.mean, r.std if r.n > 1 else np.nan, r.n)
        for r in stats.itertuples()
    }


def losses_table(
    df: pd.DataFrame,
    metrics: Sequence[str] = ("acc", "nll", "brier", "ece_15"),
    *,
    split: str = "test",
) -> Table | None:
    """Every (dataset, protocol, pair, metric) where the COG variant's mean is worse.

    The ``Seed spread`` column applies :data:`~cogcal.report.aggregate.SPREAD_RULE`:
    ``beyond`` (bold) when the gap is larger than the larger of the two standard
    deviations over seeds, ``within`` otherwise, ``unknown`` with fewer than 2 seeds.
    """
    idx = pair_stats(df, metrics, split=split)
    if not idx:
        return None
    body = []
    compared = 0
    keys = sorted({(k[0], k[1]) for k in idx})
    for dataset, protocol in keys:
        methods = [k[2] for k in idx if k[0] == dataset and k[1] == protocol]
        for cog, base in present_pairs(methods):
            for metric in metrics:
                a = idx.get((dataset, protocol, cog, metric))
                b = idx.get((dataset, protocol, base, metric))
                if a is None or b is None or not np.isfinite(a.mean) or not np.isfinite(b.mean):
                    continue
                compared += 1
                hib = metric in HIGHER_IS_BETTER
                worse = a.mean < b.mean if hib else a.mean > b.mean
                if not worse:
                    continue
                verdict = compare(a, b, higher_is_better=hib)
                body.append(
                    [
                        _cell(dataset),
                        _cell(protocol),
                        _cell(f"{cog} vs {base}"),
                        _cell(LABELS.get(metric, metric)),
                        _cell(stat_text(a.mean, a.std, a.n, None)),
                        _cell(stat_text(b.mean, b.std, b.n, None)),
                        _cell(f"{abs(a.mean - b.mean):.3f}"),
                        _cell(SPREAD_WORDS[verdict], bold=verdict == "worse"),
                    ]
                )
    if not compared:
        return None
    header = ["Dataset", "Protocol", "Pair", "Metric", "COG", "Counterpart", "Gap", "Seed spread"]
    notes: list[Any] = [
        f"{len(body)} of {compared} pairwise comparisons (COG variant vs its counterpart, "
        f"{split} split, means over seeds) where COG's mean is worse. 'beyond' (bold) marks "
        "gaps larger than the larger of the two standard deviations over seeds."
    ]
    if not body:
        notes.append("COG is never worse than its counterpart here.")
    return Table("Where COG loses", header, body, notes, "losses")


# --------------------------------------------------------------------------- run times


def runtime_table(runs: pd.DataFrame | None) -> Table | None:
    """Mean training and total seconds per run, per protocol/dataset/method.

    Runs copied from an identical configuration (``copied_from`` set) report the
    source's times and are counted as reused.
    """
    if runs is None or runs.empty:
        return None
    r = runs[runs["status"] == "complete"].copy()
    if r.empty:
        return None
    for col in ("train_seconds", "total_seconds"):
        r[col] = pd.to_numeric(r[col], errors="coerce")
    body = []
    for (dataset, protocol, method), grp in r.groupby(
        ["dataset", "protocol", "method"], sort=False
    ):
        train = grp["train_seconds"].dropna()
        body.append(
            [
                _cell(dataset),
                _cell(protocol),
                _cell(method),
                _cell(len(grp)),
                _cell(
                    fmt(train.mean(), train.std(ddof=1) if len(train) > 1 else None, 1)
                    if len(train)
                    else "—"
                ),
                _cell(fmt(grp["total_seconds"].mean(), None, 1)),
                _cell(int((grp["copied_from"].astype(str).str.len() > 0).sum())),
            ]
        )
    order = method_order([row[2].text for row in body])
    body.sort(key=lambda row: (row[0].text, row[1].text, order.index(row[2].text)))
    header = ["Dataset", "Protocol", "Method", "Runs", "Train s (mean ± std)", "Total s", "Reused"]
    notes: list[Any] = [
        "Seconds per run (training stages and post-hoc fit; total adds data loading and "
        "evaluation). 'Reused' runs had a configuration identical to another run (e.g. the "
        "tuning run of the chosen point) and were copied, not retrained; their times are the "
        "source's."
    ]
    return Table("Run times", header, body, notes, "runtimes")
