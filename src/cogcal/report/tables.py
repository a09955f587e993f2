"""The report's tables, computed from the tidy ``results.csv`` (and the run metadata).

Each function returns a :class:`Table` (title, header, rows of :class:`Cell`, notes),
rendered to Markdown and HTML by :mod:`cogcal.report.render`. Means, standard deviations
and summary ranks come from :mod:`cogcal.report.aggregate`; nothing here is tuned or
fitted, and only the requested split (``test`` by default) is shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cogcal.report.aggregate import HIGHER_IS_BETTER, mean_std, summary_rank

__all__ = [
    "BINS",
    "Cell",
    "Table",
    "comparison_table",
    "complexity_table",
    "cog_pairs",
    "losses_table",
    "pairwise_calibration_table",
    "runtime_table",
    "shift_ood_table",
    "tuning_table",
]

#: Bin counts of the calibration-error sweep (SPEC §3).
BINS: tuple[int, ...] = (5, 10, 15, 20, 50, 100)

_LABELS = {
    "acc": "Acc ↑",
    "nll": "NLL ↓",
    "brier": "Brier ↓",
    "ece_15": "ECE-15 ↓",
    "rmsce_15": "RMSCE-15 ↓",
    "mce_15": "MCE-15 ↓",
    "auroc": "AUROC ↑",
    "fpr95": "FPR95 ↓",
}

#: COG variant -> the method it is compared with (paper §4.1, Tab. 1 and 9-11).
_EXTRA_PAIRS = {"cog-ls": "ls", "cog-focal": "focal"}


@dataclass
class Cell:
    """One table cell: text, bold when best."""

    text: str
    bold: bool = False


@dataclass
class Table:
    """A rendered-agnostic table."""

    title: str
    header: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)
    key: str = ""  # anchor / identifier


def _cell(v: Any, bold: bool = False) -> Cell:
    return Cell("" if v is None else str(v), bold)


def cog_pairs() -> dict[str, str]:
    """COG variant -> its post-hoc (or loss) counterpart, from the methods registry."""
    try:
        from cogcal.train.methods import COG_PAIRS
    except ImportError:
        COG_PAIRS = {  # noqa: N806
            "cog-fc": "ce",
            "cog-ts": "ts",
            "cog-vs": "vs",
            "cog-ms": "ms",
            "cog-tst": "tst",
        }
    return {**dict(COG_PAIRS), **_EXTRA_PAIRS}


def _method_order(methods: Sequence[str]) -> list[str]:
    try:
        from cogcal.train.methods import METHODS

        order = list(METHODS)
    except ImportError:
        order = []
    known = [m for m in order if m in methods]
    return known + sorted(m for m in methods if m not in order)


def fmt(mean: float, std: float | None = None, digits: int = 3) -> str:
    """``mean ± std`` with ``digits`` decimals (``nan`` for missing)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "nan"
    text = f"{mean:.{digits}f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        text += f" ± {std:.{digits}f}"
    return text


def _aggregate(df: pd.DataFrame, split: str) -> pd.DataFrame:
    """Aggregate rows (no per-task / per-condition rows) of one split."""
    d = df[df["split"] == split]
    for col in ("task",):
        if col in d.columns:
            d = d[d[col].isna() | d[col].astype(str).isin(["", "mean"])]
    for col in ("condition", "severity"):
        if col in d.columns:
            d = d[d[col].isna() | (d[col].astype(str) == "")]
    return d


# --------------------------------------------------------------------------- complexity


def complexity_table(methods: Sequence[str], datasets: dict[str, dict[str, Any]]) -> Table:
    """Tab. 1/7: extra parameters, calibration data, stages, extra hyperparameters.

    Parameters
    ----------
    methods : sequence of str
        Methods to list (registry order).
    datasets : dict
        ``{dataset: {"num_classes": K, "feature_dim": d, "task": ...}}`` from ``bench.json``;
        one "extra parameters" column per dataset with known ``K`` and ``d``.
    """
    from cogcal.train.methods import METHODS

    sized = {
        name: i
        for name, i in datasets.items()
        if isinstance(i, dict) and i.get("num_classes") and i.get("feature_dim")
    }
    header = ["Method", "Family", "Extra parameters"]
    header += [f"{name} (K={i['num_classes']}, d={i['feature_dim']})" for name, i in sized.items()]
    header += ["Calibration data", "Stages", "Extra hyperparameters", "Description"]
    rows = []
    missing: set[str] = set()
    for name in _method_order(methods):
        m = METHODS.get(name)
        if m is None:
            rows.append([_cell(name)] + [_cell("?")] * (len(header) - 1))
            continue

        def attr(a: str, m: Any = m) -> Any:
            if not hasattr(m, a):
                missing.add(a)
                return "?"
            return getattr(m, a)

        formula = m.extra_parameters_formula() if hasattr(m, "extra_parameters_formula") else "?"
        row = [_cell(name), _cell(attr("family")), _cell(formula)]
        for info in sized.values():
            try:
                n = m.extra_parameters(
                    int(info["num_classes"]),
                    int(info["feature_dim"]),
                    task=info.get("task") or "multiclass",
                )
                row.append(_cell(f"{n:,}" if isinstance(n, int) else n))
            except (TypeError, ValueError):
                row.append(_cell("?"))
        needs = attr("needs_calibration_data")
        hyper = attr("extra_hyperparameters")
        row += [
            _cell("yes (validation split)" if needs is True else "no" if needs is False else "?"),
            _cell(attr("stages")),
            _cell(", ".join(hyper) if isinstance(hyper, tuple | list) and hyper else "—"),
            _cell(attr("description")),
        ]
        rows.append(row)
    notes = [
        "Generated from the methods registry (cogcal.train.methods). K = classes, d = "
        "features entering the final layer. Every method also has the network learning "
        "rate; COG adds only the calibrator learning rate.",
    ]
    if missing:
        notes.append(f"Registry attributes missing: {', '.join(sorted(missing))}.")
    return Table("Complexity of the methods (Tab. 1/7)", header, rows, notes, "complexity")


# --------------------------------------------------------------------------- comparison


def comparison_table(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    metrics: Sequence[str] = ("acc", "nll", "brier", "ece_15"),
    *,
    split: str = "test",
) -> Table | None:
    """Tab. 2/12: mean ± std over seeds, best in bold, summary rank (acc, nll, brier).

    Rows are sorted by summary rank (1 = best; ties share the best rank).
    """
    d = _aggregate(df, split)
    d = d[(d["dataset"] == dataset) & (d["protocol"] == protocol)]
    if d.empty:
        return None
    stats = mean_std(d, by=("method", "metric"))
    ranks = summary_rank(d, split=None)
    rank_of = dict(zip(ranks["method"], ranks["rank"], strict=True))
    methods = list(ranks["method"]) + [
        m for m in _method_order(d["method"].unique()) if m not in set(ranks["method"])
    ]
    best: dict[str, float] = {}
    for metric in metrics:
        s = stats[stats["metric"] == metric]["mean"].dropna()
        if not s.empty:
            best[metric] = s.max() if metric in HIGHER_IS_BETTER else s.min()
    n_seeds = int(stats["n"].max()) if not stats.empty else 0
    header = ["Method", *[_LABELS.get(m, m) for m in metrics], "Rank ↓"]
    rows = []
    finite_ranks = [r for r in rank_of.values() if not pd.isna(r)]
    best_rank = min(finite_ranks) if finite_ranks else np.nan
    for method in methods:
        row = [_cell(method)]
        for metric in metrics:
            s = stats[(stats["method"] == method) & (stats["metric"] == metric)]
            if s.empty:
                row.append(_cell("—"))
                continue
            mean, std = float(s["mean"].iloc[0]), float(s["std"].iloc[0])
            row.append(
                _cell(fmt(mean, std), bold=metric in best and np.isclose(mean, best[metric]))
            )
        r = rank_of.get(method, np.nan)
        row.append(_cell("—" if pd.isna(r) else f"{r:.2f}", bold=not pd.isna(r) and r == best_rank))
        rows.append(row)
    top = [m for m, r in rank_of.items() if r == best_rank]
    notes = [
        f"{split} split, mean ± sample std over {n_seeds} seed(s); best mean in bold. Rank = "
        "mean of the per-dataset ranks on Acc, NLL and Brier (1 = best, ties share the best "
        f"rank). Top ranked: {', '.join(top)}."
    ]
    return Table(
        f"{dataset} — {protocol} protocol (Tab. 2 style)",
        header,
        rows,
        notes,
        f"comparison-{protocol}-{dataset}",
    )


# --------------------------------------------------------------------------- pairwise


def pairwise_calibration_table(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    family: str,
    *,
    bins: Sequence[int] = BINS,
    split: str = "test",
) -> Table | None:
    """Tab. 9-11: one calibration error over the bin sweep, COG vs its counterpart.

    Cells are ``mean ± std [rank]``; the rank is over all methods of the table, per bin
    count (1 = lowest error). In each pair the lower mean is bold, and the last column
    counts the bin counts where the COG variant has the lower mean.
    """
    d = _aggregate(df, split)
    d = d[(d["dataset"] == dataset) & (d["protocol"] == protocol)]
    present = set(d["method"])
    pairs = [(cog, base) for cog, base in cog_pairs().items() if cog in present and base in present]
    pairs.sort(key=lambda p: _method_order([p[0], p[1], *present]).index(p[0]))
    if not pairs:
        return None
    metrics = [f"{family}_{b}" for b in bins]
    methods = [m for pair in pairs for m in (pair[1], pair[0])]
    stats = mean_std(
        d[d["method"].isin(methods) & d["metric"].isin(metrics)], by=("method", "metric")
    )
    table: dict[tuple[str, str], tuple[float, float]] = {
        (r.method, r.metric): (r.mean, r.std) for r in stats.itertuples()
    }
    ranks: dict[tuple[str, str], float] = {}
    for metric in metrics:
        vals = pd.Series(
            {m: table.get((m, metric), (np.nan, np.nan))[0] for m in dict.fromkeys(methods)}
        )
        for m, r in vals.rank(method="min").items():
            ranks[(m, metric)] = r
    header = ["Method", *[f"B={b}" for b in bins], "COG lower in"]
    rows = []
    for cog, base in pairs:
        for method, other in ((base, cog), (cog, base)):
            row = [_cell(method)]
            wins = 0
            for metric in metrics:
                mean, std = table.get((method, metric), (np.nan, np.nan))
                omean = table.get((other, metric), (np.nan, np.nan))[0]
                r = ranks.get((method, metric), np.nan)
                text = fmt(mean, std) + ("" if pd.isna(r) else f" [{int(r)}]")
                better = not pd.isna(mean) and not pd.isna(omean) and mean < omean
                if method == cog and better:
                    wins += 1
                row.append(_cell(text, bold=better))
            row.append(_cell(f"{wins}/{len(metrics)}" if method == cog else ""))
            rows.append(row)
    name = {"ece": "ECE", "rmsce": "RMSCE", "mce": "MCE"}.get(family, family)
    tab = {"ece": "9", "rmsce": "10", "mce": "11"}.get(family, "9-11")
    notes = [
        f"{split} split, mean ± std over seeds [rank among the methods of this table, per "
        "bin count; 1 = lowest]. Bold: the lower error of each pair. Post-hoc calibrators "
        "are fitted on the validation split; COG learns its calibrator on the training split."
    ]
    return Table(
        f"{name} over bin counts, COG vs counterpart — {dataset}, {protocol} (Tab. {tab} style)",
        header,
        rows,
        notes,
        f"pairwise-{family}-{protocol}-{dataset}",
    )


def losses_table(
    df: pd.DataFrame,
    metrics: Sequence[str] = ("acc", "nll", "brier", "ece_15"),
    *,
    split: str = "test",
) -> Table | None:
    """Every (dataset, protocol, pair, metric) where the COG variant's mean is worse.

    The ``within 1 std`` column says whether the gap is smaller than the larger of the
    two standard deviations over seeds (i.e. likely noise).
    """
    d = _aggregate(df, split)
    if d.empty:
        return None
    stats = mean_std(d, by=("dataset", "protocol", "method", "metric"))
    idx = {(r.dataset, r.protocol, r.method, r.metric): (r.mean, r.std) for r in stats.itertuples()}
    rows = []
    compared = 0
    for (dataset, protocol), _ in stats.groupby(["dataset", "protocol"]):
        for cog, base in cog_pairs().items():
            for metric in metrics:
                a = idx.get((dataset, protocol, cog, metric))
                b = idx.get((dataset, protocol, base, metric))
                if a is None or b is None or pd.isna(a[0]) or pd.isna(b[0]):
                    continue
                compared += 1
                worse = a[0] < b[0] if metric in HIGHER_IS_BETTER else a[0] > b[0]
                if not worse:
                    continue
                gap = abs(a[0] - b[0])
                noise = gap <= max(a[1], b[1])
                rows.append(
                    [
                        _cell(dataset),
                        _cell(protocol),
                        _cell(f"{cog} vs {base}"),
                        _cell(_LABELS.get(metric, metric)),
                        _cell(fmt(a[0], a[1])),
                        _cell(fmt(b[0], b[1])),
                        _cell(f"{gap:.3f}"),
                        _cell("yes" if noise else "no", bold=not noise),
                    ]
                )
    if not compared:
        return None
    header = ["Dataset", "Protocol", "Pair", "Metric", "COG", "Counterpart", "Gap", "Within 1 std"]
    notes = [
        f"{len(rows)} of {compared} pairwise comparisons (COG variant vs its counterpart, "
        f"{split} split, means over seeds) where COG is worse. 'no' in the last column (bold) "
        "marks gaps larger than the seed-to-seed spread."
    ]
    if not rows:
        notes.append("COG is never worse than its counterpart here.")
    return Table("Where COG loses", header, rows, notes, "losses")


# --------------------------------------------------------------------------- extras


def runtime_table(runs: pd.DataFrame) -> Table | None:
    """Mean training and total seconds per run, per protocol/dataset/method.

    Runs copied from an identical configuration report the source's times.
    """
    if runs is None or runs.empty or "train_seconds" not in runs.columns:
        return None
    r = runs[runs["status"] == "complete"].copy()
    if r.empty:
        return None
    for col in ("train_seconds", "total_seconds"):
        r[col] = pd.to_numeric(r[col], errors="coerce")
    g = r.groupby(["dataset", "protocol", "method"], sort=False)
    rows = []
    for (dataset, protocol, method), grp in g:
        rows.append(
            [
                _cell(dataset),
                _cell(protocol),
                _cell(method),
                _cell(len(grp)),
                _cell(
                    fmt(
                        grp["train_seconds"].mean(),
                        grp["train_seconds"].std(ddof=1) if len(grp) > 1 else None,
                        1,
                    )
                ),
                _cell(fmt(grp["total_seconds"].mean(), None, 1)),
                _cell(
                    int((grp["copied_from"].astype(str).str.len() > 0).sum())
                    if "copied_from" in grp
                    else 0
                ),
            ]
        )
    order = _method_order([row[2].text for row in rows])
    rows.sort(key=lambda row: (row[0].text, row[1].text, order.index(row[2].text)))
    header = ["Dataset", "Protocol", "Method", "Runs", "Train s (mean ± std)", "Total s", "Reused"]
    notes = [
        "Seconds per run in its worker process (training stages and post-hoc fit; total adds "
        "data loading and evaluation). 'Reused' runs had a configuration identical to another "
        "run (e.g. the seed-0 tuning run) and were copied, not retrained; their times are the "
        "source's."
    ]
    return Table("Run times", header, rows, notes, "runtimes")


def tuning_table(tunes: list[dict[str, Any]]) -> Table | None:
    """The chosen learning rates (Tab. 8 analogue) from the ``tune.json`` files."""
    if not tunes:
        return None
    rows = []
    for t in sorted(
        tunes, key=lambda t: (t.get("dataset", ""), t.get("protocol", ""), t.get("method", ""))
    ):
        best = t.get("best") or {}
        table = t.get("table") or []
        tried = "; ".join(
            ", ".join(
                f"{k} {r[k]:g}"
                for k in ("lr", "calibrator_lr")
                if isinstance(r.get(k), int | float)
            )
            + (
                f" → {r['val_nll']:.3f}"
                if isinstance(r.get("val_nll"), int | float)
                else " → failed"
            )
            for r in table
        )
        rows.append(
            [
                _cell(t.get("dataset", "")),
                _cell(t.get("protocol", "")),
                _cell(t.get("method", "")),
                _cell(", ".join(t.get("used_by") or [])),
                _cell(f"{best['lr']:g}" if "lr" in best else "—"),
                _cell(f"{best['calibrator_lr']:g}" if "calibrator_lr" in best else "—"),
                _cell(tried),
            ]
        )
    header = ["Dataset", "Protocol", "Tuned as", "Used by", "λ_f (lr)", "λ_c", "Grid: val NLL"]
    notes = [
        "Chosen by the lowest validation cross-entropy (NLL) of the best-validation-Brier "
        "checkpoint, at the tuning seed; the test split plays no part. Post-hoc methods use "
        "the learning rate chosen for ce (cross-entropy before calibration)."
    ]
    return Table("Selected learning rates (Tab. 8 analogue)", header, rows, notes, "tuning")


def shift_ood_table(df: pd.DataFrame, split: str, dataset: str, protocol: str) -> Table | None:
    """Shift or OOD results averaged over conditions (and severities), per method."""
    d = df[(df["split"] == split) & (df["dataset"] == dataset) & (df["protocol"] == protocol)]
    if "task" in d.columns:
        d = d[d["task"].isna() | d["task"].astype(str).isin(["", "mean"])]
    # "mean" (shift, per severity) and "pooled" (OOD) are summaries the runner adds:
    # average the individual conditions only, so nothing is counted twice.
    d = d[~d["condition"].astype(str).isin(["mean", "pooled"])]
    if d.empty:
        return None
    per_seed = d.groupby(["method", "metric", "seed"], as_index=False)["value"].mean()
    stats = mean_std(per_seed, by=("method", "metric"))
    metrics = [
        m for m in ("acc", "nll", "brier", "ece_15", "auroc", "fpr95") if m in set(stats["metric"])
    ]
    if not metrics:
        return None
    header = ["Method", *[_LABELS.get(m, m) for m in metrics]]
    rows = []
    for method in _method_order(stats["method"].unique()):
        row = [_cell(method)]
        for metric in metrics:
            s = stats[(stats["method"] == method) & (stats["metric"] == metric)]
            row.append(
                _cell(
                    fmt(float(s["mean"].iloc[0]), float(s["std"].iloc[0])) if not s.empty else "—"
                )
            )
        rows.append(row)
    conds = sorted(map(str, d["condition"].dropna().unique()))
    what = (
        "covariate shift (mean over conditions and severities)"
        if split == "shift"
        else "OOD detection (mean over OOD sets)"
    )
    return Table(
        f"{dataset} — {protocol}: {what}",
        header,
        rows,
        [f"Conditions: {', '.join(conds)}."],
        f"{split}-{protocol}-{dataset}",
    )
