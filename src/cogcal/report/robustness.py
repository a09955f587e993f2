"""Robustness sections of the report: OOD detection and covariate shift (paper Tab. 3/4).

Everything is computed from the ``split == "ood"`` and ``split == "shift"`` rows of
``results.csv`` (docs/method.md §6): ``condition`` names the OOD set or the corruption, ``severity``
is 1-5 for shift rows. The runner also writes summary conditions, ``pooled`` (all OOD sets
scored together) and ``mean`` (shift, averaged over conditions per severity); the tables
show ``pooled`` as its own column and never average ``mean`` together with the individual
conditions, so nothing is counted twice. Which sets a run could not evaluate is only in
its record (``metrics.json``, ``"unavailable"``); :func:`unavailable_sets` reads it through
:class:`cogcal.train.rundir.RunDir`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cogcal.report._common import check_results_frame, counterparts, is_cog, slug
from cogcal.report.aggregate import HIGHER_IS_BETTER, Stat, compare, mean_std, summary_rank
from cogcal.report.blocks import Figure, Paragraph, Section, Table
from cogcal.report.frame import AGGREGATE, blank, protocol_order, rows
from cogcal.report.tables import (
    _LABELS,
    SPREAD_WORDS,
    _cell,
    _method_order,
    fmt,
    seed_notes,
    stat_text,
)

__all__ = [
    "OOD_METRICS",
    "SHIFT_METRICS",
    "has_robustness",
    "ood_table",
    "robustness_losses_table",
    "robustness_section",
    "severity_figure",
    "shift_severity_table",
    "shift_table",
    "unavailable_sets",
]

#: OOD-detection metrics (docs/method.md §3), in table order.
OOD_METRICS: tuple[str, ...] = ("auroc", "fpr95")
#: Covariate-shift metrics of Tab. 4, in table order.
SHIFT_METRICS: tuple[str, ...] = ("acc", "nll", "brier", "ece_15")
_SUMMARY = ("mean", "pooled")  # conditions the runner adds on top of the individual ones
_REQUIRED = ("dataset", "method", "protocol", "seed", "split", "metric", "value", "condition")


_blank = blank


def _text(s: pd.Series) -> pd.Series:
    return s.where(~blank(s), "").astype(str).str.strip()


def _rows(df: pd.DataFrame, split: str, dataset: str, protocol: str) -> pd.DataFrame:
    """The aggregate rows (no per-task rows) of one split, dataset and protocol."""
    d = rows(df, split=split, dataset=dataset, protocol=protocol, task=AGGREGATE)
    d = d.assign(condition=_text(d["condition"]))
    if "severity" in d.columns:
        d = d.assign(severity=_text(d["severity"]))
    return d[d["value"].notna()]


def has_robustness(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds any OOD or covariate-shift row."""
    check_results_frame(df, _REQUIRED)
    return bool(df["split"].isin(["ood", "shift"]).any())


def _pairs(df: pd.DataFrame, split: str) -> list[tuple[str, str]]:
    """(protocol, dataset) combinations with rows of ``split``, in report order."""
    d = rows(df, split=split)
    keys = {(str(p), str(ds)) for p, ds in zip(d["protocol"], d["dataset"], strict=True)}
    rank = {p: i for i, p in enumerate(protocol_order({p for p, _ in keys}))}
    return sorted(keys, key=lambda k: (rank[k[0]], k[1]))


def _best(values: dict[str, float], metric: str) -> float | None:
    vals = [v for v in values.values() if v is not None and np.isfinite(v)]
    if not vals:
        return None
    return max(vals) if metric in HIGHER_IS_BETTER else min(vals)


def _n_seeds(stats: pd.DataFrame) -> int:
    return int(stats["n"].max()) if not stats.empty else 0


# --------------------------------------------------------------------------- OOD


def _ood_sets(d: pd.DataFrame) -> list[str]:
    conds = sorted(c for c in d["condition"].unique() if c not in _SUMMARY and c)
    return conds + (["pooled"] if "pooled" in set(d["condition"]) else [])


def ood_table(df: pd.DataFrame, dataset: str, protocol: str) -> Table | None:
    """Tab. 3: AUROC and FPR95 per OOD set (and pooled), mean ± std over seeds.

    Parameters
    ----------
    df : DataFrame
        Tidy ``results.csv`` rows.
    dataset, protocol : str
        The cell of the report.

    Returns
    -------
    Table or None
        One row per method (registry order); for each OOD set, then ``pooled``, an
        ``AUROC ↑`` and an ``FPR95 ↓`` column, the best mean of each column in bold, and a
        rank column (mean of the per-column ranks, 1 = best). ``None`` without OOD rows.
    """
    check_results_frame(df, _REQUIRED)
    d = _rows(df, "ood", dataset, protocol)
    d = rows(d, metric=OOD_METRICS)
    if d.empty:
        return None
    sets = _ood_sets(d)
    stats = mean_std(d, by=("method", "condition", "metric"))
    cell = {(r.method, r.condition, r.metric): (r.mean, r.std, r.n) for r in stats.itertuples()}
    most = _n_seeds(stats)
    methods = _method_order(list(d["method"].unique()))
    columns = [
        (s, m)
        for s in sets
        for m in OOD_METRICS
        if ((d["condition"] == s) & (d["metric"] == m)).any()
    ]
    best = {
        col: _best({me: cell.get((me, *col), (np.nan, 0))[0] for me in methods}, col[1])
        for col in columns
    }
    ranks = pd.DataFrame(
        {
            col: pd.Series({me: cell.get((me, *col), (np.nan, 0))[0] for me in methods}).rank(
                method="min", ascending=col[1] not in HIGHER_IS_BETTER
            )
            for col in columns
        }
    )
    mean_rank = ranks.mean(axis=1, skipna=False)
    best_rank = mean_rank.min()
    header = ["Method"] + [f"{s} {_LABELS.get(m, m)}" for s, m in columns] + ["Rank ↓"]
    body = []
    for me in methods:
        row = [_cell(me)]
        for col in columns:
            mean, std, n = cell.get((me, *col), (np.nan, np.nan, 0))
            bold = best[col] is not None and np.isfinite(mean) and np.isclose(mean, best[col])
            row.append(_cell(stat_text(mean, std, n, most), bold))
        r = mean_rank.get(me, np.nan)
        row.append(_cell("—" if pd.isna(r) else f"{r:.2f}", not pd.isna(r) and r == best_rank))
        body.append(row)
    notes = [
        f"Maximum-softmax-probability score, in-distribution test samples positive; mean ± "
        f"sample std over {_n_seeds(stats)} seed(s); best mean of each column in bold. Rank = "
        "mean of the per-column ranks (1 = best, ties share the best rank)."
    ]
    if "pooled" in sets:
        notes.append("'pooled' scores every OOD set together against the in-distribution test set.")
    return Table(
        f"{dataset} — {protocol}: OOD detection (Tab. 3 style)",
        header,
        body,
        seed_notes(notes, stats["n"], most),
        f"ood-{slug(protocol)}-{slug(dataset)}",
    )


# --------------------------------------------------------------------------- shift


def _shift_rows(d: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Individual conditions when present, else the runner's ``mean`` condition."""
    indiv = d[~d["condition"].isin(_SUMMARY)]
    if indiv.empty:
        indiv = rows(d, condition="mean")
    return indiv, sorted(indiv["condition"].unique())


def _per_seed(d: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Unweighted mean over the remaining (condition, severity) rows, per seed."""
    return d.groupby([*by, "seed"], as_index=False)["value"].mean()


def shift_table(
    df: pd.DataFrame, dataset: str, protocol: str, metrics: Sequence[str] = SHIFT_METRICS
) -> Table | None:
    """Tab. 4: accuracy, NLL, Brier and ECE-15 averaged over conditions and severities.

    Each seed's value is the unweighted mean over every (condition, severity) it
    recorded; cells are mean ± sample std over seeds, best in bold; the rank is the
    summary rank on accuracy, NLL and Brier (docs/method.md §3) of these shift averages.

    Returns
    -------
    Table or None
        ``None`` without shift rows for ``dataset`` and ``protocol``.
    """
    check_results_frame(df, _REQUIRED)
    d = _rows(df, "shift", dataset, protocol)
    d, conds = _shift_rows(rows(d, metric=list(metrics)))
    if d.empty:
        return None
    per_seed = _per_seed(d, ("method", "metric"))
    stats = mean_std(per_seed, by=("method", "metric"))
    shown = [m for m in metrics if m in set(stats["metric"])]
    rank_metrics = [m for m in ("acc", "nll", "brier") if m in shown]
    rank_of: dict[str, float] = {}
    if rank_metrics:
        ranks = summary_rank(per_seed.assign(dataset=dataset), metrics=rank_metrics, split=None)
        rank_of = dict(zip(ranks["method"], ranks["rank"], strict=True))
    methods = _method_order(list(stats["method"].unique()))
    if rank_of:
        methods.sort(key=lambda m: np.inf if pd.isna(rank_of.get(m)) else rank_of[m])
    cell = {(r.method, r.metric): (r.mean, r.std, r.n) for r in stats.itertuples()}
    most = _n_seeds(stats)
    best = {m: _best({me: cell.get((me, m), (np.nan, 0))[0] for me in methods}, m) for m in shown}
    best_rank = min((v for v in rank_of.values() if not pd.isna(v)), default=np.nan)
    header = ["Method", *[_LABELS.get(m, m) for m in shown]] + (["Rank ↓"] if rank_of else [])
    body = []
    for me in methods:
        row = [_cell(me)]
        for m in shown:
            mean, std, n = cell.get((me, m), (np.nan, np.nan, 0))
            bold = best[m] is not None and np.isfinite(mean) and np.isclose(mean, best[m])
            row.append(_cell(stat_text(mean, std, n, most), bold))
        if rank_of:
            r = rank_of.get(me, np.nan)
            row.append(_cell("—" if pd.isna(r) else f"{r:.2f}", not pd.isna(r) and r == best_rank))
        body.append(row)
    sevs = sorted(d["severity"].unique(), key=lambda s: (len(s), s)) if "severity" in d else []
    notes = [
        f"Mean over {len(conds)} condition(s) ({', '.join(conds)}) and severities "
        f"{', '.join(s for s in sevs if s) or '—'} per seed, then mean ± sample std over "
        f"{_n_seeds(stats)} seed(s); best in bold. Rank = summary rank on these averages "
        "(Acc, NLL, Brier; 1 = best). Sorted by rank."
    ]
    return Table(
        f"{dataset} — {protocol}: covariate shift, all conditions and severities (Tab. 4 style)",
        header,
        body,
        seed_notes(notes, stats["n"], most),
        f"shift-{slug(protocol)}-{slug(dataset)}",
    )


def _severity_stats(d: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds of the per-seed mean over conditions, per method/severity."""
    per_seed = _per_seed(d, ("method", "severity", "metric"))
    return mean_std(per_seed, by=("method", "severity", "metric"))


def _sev_key(s: str) -> tuple[float, str]:
    try:
        return float(s), s
    except ValueError:
        return np.inf, s


def shift_severity_table(
    df: pd.DataFrame, dataset: str, protocol: str, metrics: Sequence[str] = SHIFT_METRICS
) -> Table | None:
    """Tab. 4 per severity: the shift metrics averaged over conditions, per severity.

    Rows are (severity, method); within each severity the best mean of each metric is
    bold. ``None`` without shift rows that carry a severity.
    """
    check_results_frame(df, _REQUIRED)
    if "severity" not in df.columns:
        return None
    d = _rows(df, "shift", dataset, protocol)
    d, conds = _shift_rows(rows(d, metric=list(metrics)))
    d = d[~_blank(d["severity"])]
    if d.empty:
        return None
    stats = _severity_stats(d)
    shown = [m for m in metrics if m in set(stats["metric"])]
    cell = {(r.method, r.severity, r.metric): (r.mean, r.std, r.n) for r in stats.itertuples()}
    most = _n_seeds(stats)
    methods = _method_order(list(stats["method"].unique()))
    body = []
    for sev in sorted(stats["severity"].unique(), key=_sev_key):
        best = {
            m: _best({me: cell.get((me, sev, m), (np.nan, 0))[0] for me in methods}, m)
            for m in shown
        }
        for me in methods:
            row = [_cell(sev), _cell(me)]
            for m in shown:
                mean, std, n = cell.get((me, sev, m), (np.nan, np.nan, 0))
                bold = best[m] is not None and np.isfinite(mean) and np.isclose(mean, best[m])
                row.append(_cell(stat_text(mean, std, n, most), bold))
            body.append(row)
    notes = [
        f"Per severity: mean over the condition(s) {', '.join(conds)} per seed, then mean ± "
        f"sample std over {_n_seeds(stats)} seed(s); best of each severity in bold."
    ]
    return Table(
        f"{dataset} — {protocol}: covariate shift per severity",
        ["Severity", "Method", *[_LABELS.get(m, m) for m in shown]],
        body,
        seed_notes(notes, stats["n"], most),
        f"shift-severity-{slug(protocol)}-{slug(dataset)}",
    )


def severity_figure(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    path: Path,
    metrics: Sequence[str] = ("acc", "ece_15"),
) -> Path | None:
    """Accuracy and ECE-15 against shift severity, one line per method, one panel each.

    Severity 0 is the clean test split (from the ``test`` rows). Points are the mean over
    seeds of the per-seed mean over conditions; error bars are the sample std over seeds.
    COG variants are solid lines with circles, the other methods dashed with squares.

    Returns
    -------
    Path or None
        The PNG written atomically, or ``None`` when fewer than two severities are
        recorded (a line needs two points) or a metric is missing.
    """
    from matplotlib.figure import Figure as MplFigure

    from cogcal import _io

    check_results_frame(df, _REQUIRED)
    if "severity" not in df.columns:
        return None
    d = _rows(df, "shift", dataset, protocol)
    d, _ = _shift_rows(rows(d, metric=list(metrics)))
    d = d[~_blank(d["severity"])]
    if d.empty or set(d["metric"]) != set(metrics) or d["severity"].nunique() < 2:
        return None
    stats = _severity_stats(d)
    clean = _rows(df, "test", dataset, protocol)
    clean = clean[clean["metric"].isin(list(metrics)) & _blank(clean["condition"])]
    clean_stats = mean_std(clean, by=("method", "metric")) if not clean.empty else None
    methods = _method_order(list(stats["method"].unique()))
    fig = MplFigure(figsize=(5.2 * len(metrics), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    cmap = _colors(len(methods))
    for ax, metric in zip(axes, metrics, strict=True):
        for i, me in enumerate(methods):
            s = stats[(stats["method"] == me) & (stats["metric"] == metric)].copy()
            s["x"] = [_sev_key(v)[0] for v in s["severity"]]
            s = s[np.isfinite(s["x"])].sort_values("x")
            xs, ys, es = list(s["x"]), list(s["mean"]), list(s["std"])
            if clean_stats is not None:
                c = clean_stats[(clean_stats["method"] == me) & (clean_stats["metric"] == metric)]
                if not c.empty:
                    xs, ys = [0.0, *xs], [float(c["mean"].iloc[0]), *ys]
                    es = [float(c["std"].iloc[0]), *es]
            cog = is_cog(me)
            ax.errorbar(
                xs, ys, yerr=es, fmt="o-" if cog else "s--", color=cmap[i], label=me,
                lw=1.6 if cog else 1.1, ms=4, capsize=2,
            )  # fmt: skip
        ax.set_xlabel("shift severity (0 = clean test)")
        ax.set_ylabel(f"{_LABELS.get(metric, metric)} (mean over conditions)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle(f"{dataset}, {protocol} protocol: covariate shift (solid: COG)")
    return _save(fig, path, _io)


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _save(fig: Any, path: Path, io_module: Any) -> Path:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return io_module.write_bytes(Path(path), buf.getvalue())


# --------------------------------------------------------------------------- losses


def _summaries(df: pd.DataFrame, dataset: str, protocol: str) -> dict[str, pd.DataFrame]:
    """``{label: stats}`` of the headline robustness numbers, per method."""
    out: dict[str, pd.DataFrame] = {}
    d = _rows(df, "ood", dataset, protocol)
    d = rows(d, metric=OOD_METRICS)
    if not d.empty:
        if (d["condition"] == "pooled").any():
            label, d = "OOD pooled", rows(d, condition="pooled")
        else:
            label, d = "OOD mean over sets", _per_seed(d, ("method", "metric"))
        out[label] = mean_std(d, by=("method", "metric"))
    s = _rows(df, "shift", dataset, protocol)
    s, _ = _shift_rows(s[s["metric"].isin(SHIFT_METRICS)])
    if not s.empty:
        out["shift mean"] = mean_std(_per_seed(s, ("method", "metric")), by=("method", "metric"))
    return out


def robustness_losses_table(df: pd.DataFrame) -> Table | None:
    """Where a COG variant is worse than its counterpart or the best baseline, OOD/shift.

    For every dataset, protocol and COG variant, the headline numbers (pooled OOD AUROC and
    FPR95 -- the mean over OOD sets when no pooled value exists -- and the shift averages
    of accuracy, NLL, Brier and ECE-15) are compared with the COG variant's counterpart
    (:func:`cogcal.report._common.counterparts`) and with the best non-COG method on that
    metric. Each comparison where the COG mean is worse is a row; ``Seed spread`` applies
    :data:`cogcal.report.aggregate.SPREAD_RULE` (``beyond``, in bold: the gap is larger
    than the larger of the two standard deviations over seeds; ``unknown`` with fewer than
    2 seeds).

    Returns
    -------
    Table or None
        ``None`` when there is nothing to compare (no COG variant next to a baseline).
    """
    check_results_frame(df, _REQUIRED)
    pairs = counterparts()
    out_rows = []
    compared = 0
    keys = sorted(set(_pairs(df, "ood")) | set(_pairs(df, "shift")))
    for protocol, dataset in keys:
        for label, stats in _summaries(df, dataset, protocol).items():
            cell = {
                (r.method, r.metric): Stat(r.mean, r.std if r.n > 1 else np.nan, r.n)
                for r in stats.itertuples()
            }
            methods = _method_order(list(stats["method"].unique()))
            cogs = [m for m in methods if is_cog(m)]
            bases = [m for m in methods if not is_cog(m)]
            for metric in [*OOD_METRICS, *SHIFT_METRICS]:
                vals = {m: cell[(m, metric)] for m in bases if (m, metric) in cell}
                vals = {m: v for m, v in vals.items() if np.isfinite(v.mean)}
                if not vals:
                    continue
                hib = metric in HIGHER_IS_BETTER
                top = (max if hib else min)(vals, key=lambda m: vals[m].mean)
                for cog in cogs:
                    a = cell.get((cog, metric))
                    if a is None or not np.isfinite(a.mean):
                        continue
                    others = dict.fromkeys(
                        [o for o in (pairs.get(cog), top) if o is not None and o in vals]
                    )
                    for other in others:
                        b = vals[other]
                        compared += 1
                        worse = a.mean < b.mean if hib else a.mean > b.mean
                        if not worse:
                            continue
                        role = "counterpart" if other == pairs.get(cog) else "best baseline"
                        if other == pairs.get(cog) and other == top:
                            role = "counterpart, best baseline"
                        verdict = compare(a, b, higher_is_better=hib)
                        out_rows.append(
                            [
                                _cell(dataset),
                                _cell(protocol),
                                _cell(label),
                                _cell(_LABELS.get(metric, metric)),
                                _cell(f"{cog} vs {other} ({role})"),
                                _cell(fmt(a.mean, a.std if a.n > 1 else None)),
                                _cell(fmt(b.mean, b.std if b.n > 1 else None)),
                                _cell(f"{abs(a.mean - b.mean):.3f}"),
                                _cell(SPREAD_WORDS[verdict], verdict == "worse"),
                            ]
                        )
    if not compared:
        return None
    header = ["Dataset", "Protocol", "Set", "Metric", "Comparison", "COG", "Other", "Gap"]
    header.append("Seed spread")
    notes = [
        f"{len(out_rows)} of {compared} comparisons (each COG variant against its counterpart "
        "and against the best non-COG method of each metric; means over seeds) where COG is "
        "worse. 'beyond' (bold) marks gaps larger than the larger of the two standard "
        "deviations over seeds."
    ]
    if not out_rows:
        notes.append("COG is never worse here.")
    return Table(
        "Where COG loses under OOD / covariate shift", header, out_rows, notes, "rob-losses"
    )


# --------------------------------------------------------------------------- unavailable


def unavailable_sets(run_dirs: Iterable[str | Path]) -> dict[str, dict[str, str]]:
    """Sets the given finished runs could not evaluate, from their records.

    Parameters
    ----------
    run_dirs : iterable of path
        Run folders (read through :class:`cogcal.train.rundir.RunDir`; unfinished ones
        are skipped).

    Returns
    -------
    dict
        ``{"ood": {set: reason}, "shift": {condition: reason}}``; empty dicts when the
        runs recorded nothing.
    """
    from cogcal.train.rundir import RunDir

    out: dict[str, dict[str, str]] = {"ood": {}, "shift": {}}
    for path in run_dirs:
        record = RunDir(path).read_record()
        if record is None or not isinstance(record.unavailable, Mapping):
            continue
        for kind in ("ood", "shift"):
            sets = record.unavailable.get(kind) or {}
            if not isinstance(sets, Mapping):
                continue
            for name, reason in sets.items():
                out[kind].setdefault(str(name), " ".join(str(reason).split()))
    return out


# --------------------------------------------------------------------------- section


def robustness_section(
    df: pd.DataFrame,
    figdir: Path,
    unavailable: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
) -> Section | None:
    """The report's robustness section, or ``None`` without OOD or shift rows.

    Parameters
    ----------
    df : DataFrame
        Tidy ``results.csv`` rows.
    figdir : Path
        Where the severity figures are written (``root/figures``).
    unavailable : dict, optional
        ``{dataset: unavailable_sets(...)}``: the sets the runs could not evaluate.
    """
    check_results_frame(df, _REQUIRED)
    if not has_robustness(df):
        return None
    sec = Section("Robustness: OOD detection and covariate shift", key="robustness")
    sec.blocks.append(
        Paragraph(
            "Does in-distribution calibration transfer? OOD detection (paper Tab. 3) and "
            "covariate shift (Tab. 4), test split of each set, every number from the "
            "split = ood / shift rows of results.csv."
        )
    )
    ood = Section("OOD detection (Tab. 3 style)", key="ood")
    for protocol, dataset in _pairs(df, "ood"):
        t = ood_table(df, dataset, protocol)
        if t is not None:
            ood.blocks.append(t)
    if ood.blocks:
        sec.blocks.append(ood)
    shift = Section("Covariate shift (Tab. 4 style)", key="covariate-shift")
    for protocol, dataset in _pairs(df, "shift"):
        for t in (shift_table(df, dataset, protocol), shift_severity_table(df, dataset, protocol)):
            if t is not None:
                shift.blocks.append(t)
        name = f"shift_severity_{slug(protocol)}_{slug(dataset)}.png"
        if severity_figure(df, dataset, protocol, Path(figdir) / name):
            shift.blocks.append(
                Figure(
                    f"figures/{name}",
                    f"{dataset}, {protocol}: accuracy and ECE-15 against shift severity, mean "
                    "over conditions, mean ± std over seeds (severity 0: clean test split)",
                )
            )
    if shift.blocks:
        sec.blocks.append(shift)
    losses = robustness_losses_table(df)
    if losses is not None:
        # An empty table renders as a table without rows: say it in words instead.
        block = losses if losses.rows else Paragraph(" ".join(map(str, losses.notes)))
        sec.blocks.append(Section("Where COG loses under shift / OOD", [block], "rob-losses-sec"))
    items = []
    for dataset, un in sorted((unavailable or {}).items()):
        for kind, what in (("ood", "OOD set"), ("shift", "shift condition")):
            for name, reason in sorted((un.get(kind) or {}).items()):
                short = reason if len(reason) <= 300 else reason[:297] + "..."
                items.append(f"{dataset}: {what} {name!r} not evaluated — {short}")
    if items:
        sec.blocks.append(
            Section(
                "Sets not evaluated",
                [Paragraph("Recorded by the runs as unavailable:", items=items)],
                "rob-unavailable",
            )
        )
    return sec
