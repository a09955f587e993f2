"""OOD detection and covariate shift sections of the report (paper Tab. 3/4).

From the ``ood`` and ``shift`` rows of ``results.csv``; the runner's summary conditions
``pooled`` (every OOD set scored together) and ``mean`` (shift, per severity) are shown
apart and never averaged with the individual ones. The paired COG comparisons on these
numbers are in the claims section.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from cogcal.report._common import is_cog, method_order, save_figure, sev_key, slug
from cogcal.report.blocks import Figure, Link, Paragraph, Section, Table
from cogcal.report.frame import AGGREGATE, protocol_order, rows, seed_values
from cogcal.report.tables import LABELS, ranked_table, stat_table, stats_of
from cogcal.runs import RunDir

#: OOD-detection metrics (docs/method.md §3), in table order.
OOD_METRICS: tuple[str, ...] = ("auroc", "fpr95")
#: Covariate-shift metrics of Tab. 4, in table order.
SHIFT_METRICS: tuple[str, ...] = ("acc", "nll", "brier", "ece_15")
_SUMMARY = ("mean", "pooled")


def _rows(df: pd.DataFrame, split: str, dataset: str, protocol: str) -> pd.DataFrame:
    d = rows(df, split=split, dataset=dataset, protocol=protocol, task=AGGREGATE)
    return d[d["value"].notna()]


def _pairs(df: pd.DataFrame, split: str) -> list[tuple[str, str]]:
    """(protocol, dataset) combinations with rows of ``split``, in report order."""
    d = rows(df, split=split)
    keys = {(str(p), str(ds)) for p, ds in zip(d["protocol"], d["dataset"], strict=True)}
    rank = {p: i for i, p in enumerate(protocol_order({p for p, _ in keys}))}
    return sorted(keys, key=lambda k: (rank[k[0]], k[1]))


def ood_table(df: pd.DataFrame, dataset: str, protocol: str) -> Table | None:
    """Tab. 3: AUROC and FPR95 per OOD set and ``pooled`` (mean ± std over seeds, best in
    bold), and a rank column (mean of the per-column ranks, 1 = best). None without rows."""
    d = rows(_rows(df, "ood", dataset, protocol), metric=OOD_METRICS)
    if d.empty:
        return None
    sets = sorted(c for c in d["condition"].unique() if c not in _SUMMARY and c)
    sets += ["pooled"] if "pooled" in set(d["condition"]) else []
    stats = stats_of(d, ("method", "condition", "metric"))
    columns = [((s, m), f"{s} {LABELS[m]}", m) for s in sets for m in OOD_METRICS]
    columns = [c for c in columns if any(k[1:] == c[0] for k in stats)]
    methods = method_order(d["method"].unique())
    ranks = pd.DataFrame({
        ck: pd.Series({me: stats[(me, *ck)].mean if (me, *ck) in stats else np.nan for me in methods})
        .rank(method="min", ascending=metric != "auroc")
        for ck, _, metric in columns
    })  # fmt: skip
    notes = [
        "Maximum-softmax-probability score, in-distribution test samples positive; mean ± "
        "sample std over seeds; best mean of each column in bold. Rank = mean of the "
        "per-column ranks (1 = best). 'pooled' scores every OOD set together."
    ]
    return stat_table(
        f"{dataset} — {protocol}: OOD detection (Tab. 3 style)",
        f"ood-{slug(protocol)}-{slug(dataset)}",
        ["Method"],
        [(me, [me]) for me in methods],
        columns,
        {(k[0], (k[1], k[2])): s for k, s in stats.items()},
        notes=notes,
        rank=ranks.mean(axis=1, skipna=False).to_dict(),
    )


def _shift(df: pd.DataFrame, dataset: str, protocol: str) -> tuple[pd.DataFrame, list[str]]:
    """Shift rows of the individual conditions (else the runner's ``mean``) with a severity."""
    d = rows(_rows(df, "shift", dataset, protocol), metric=SHIFT_METRICS)
    indiv = d[~d["condition"].isin(_SUMMARY)]
    d = indiv if not indiv.empty else rows(d, condition="mean")
    return d, sorted(d["condition"].unique())


def shift_table(df: pd.DataFrame, dataset: str, protocol: str) -> Table | None:
    """Tab. 4: accuracy, NLL, Brier and ECE-15 per seed averaged over every (condition,
    severity) recorded, mean ± std over seeds, summary rank (acc, NLL, Brier). None
    without shift rows."""
    d = seed_values(df, "shift", dataset=dataset, protocol=protocol, metric=list(SHIFT_METRICS))
    if d.empty:
        return None
    _, conds = _shift(df, dataset, protocol)
    notes = [
        f"Per seed the mean over {len(conds)} condition(s) ({', '.join(conds)}) and their "
        "severities, then mean ± sample std over seeds; best in bold."
    ]
    title = f"{dataset} — {protocol}: covariate shift, all conditions and severities (Tab. 4 style)"
    return ranked_table(d, title, f"shift-{slug(protocol)}-{slug(dataset)}", SHIFT_METRICS, notes)


def severity_figure(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    path: Path,
    metrics: Sequence[str] = ("acc", "ece_15"),
) -> Path | None:
    """Accuracy and ECE-15 against shift severity (0 = the clean test split), one line per
    method (COG solid with circles), mean over conditions, mean ± std over seeds. The PNG,
    or None with fewer than two severities or a metric missing."""
    from matplotlib import colormaps  # here: matplotlib (heavy) loads only to draw
    from matplotlib.figure import Figure as MplFigure

    d, _ = _shift(df, dataset, protocol)
    d = rows(d, metric=list(metrics))
    d = d[d["severity"] != ""].groupby(["method", "severity", "metric", "seed"], as_index=False)
    d = d["value"].mean()  # per seed the mean over conditions
    if d.empty or set(d["metric"]) != set(metrics) or d["severity"].nunique() < 2:
        return None
    clean = seed_values(df, "test", dataset=dataset, protocol=protocol, metric=list(metrics))
    d = pd.concat([d, clean.assign(severity="0")[d.columns]], ignore_index=True)
    stats = stats_of(d, ("method", "metric", "severity"))
    methods = method_order(d["method"].unique())
    fig = MplFigure(figsize=(5.2 * len(metrics), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    cmap = colormaps["tab10" if len(methods) <= 10 else "tab20"]
    for ax, metric in zip(axes, metrics, strict=True):
        for i, me in enumerate(methods):
            pts = sorted((sev_key(k[2])[0], s) for k, s in stats.items() if k[:2] == (me, metric))
            cog = is_cog(me)
            ax.errorbar(
                [x for x, _ in pts], [s.mean for _, s in pts], yerr=[np.nan_to_num(s.std) for _, s in pts],
                fmt="o-" if cog else "s--", color=cmap(i % cmap.N), label=me, lw=1.6 if cog else 1.1,
                ms=4, capsize=2,
            )  # fmt: skip
        ax.set_xlabel("shift severity (0 = clean test)")
        ax.set_ylabel(f"{LABELS.get(metric, metric)} (mean over conditions)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle(f"{dataset}, {protocol} protocol: covariate shift (solid: COG)")
    return save_figure(fig, path)


def unavailable_sets(run_dirs: Iterable[str | Path]) -> dict[str, dict[str, str]]:
    """``{"ood": {set: reason}, "shift": {condition: reason}}``: the sets the given
    finished runs recorded as not evaluated (read through RunDir)."""
    out: dict[str, dict[str, str]] = {"ood": {}, "shift": {}}
    for path in run_dirs:
        record = RunDir(path).read_record()
        if record is None or not isinstance(record.unavailable, Mapping):
            continue
        for kind in ("ood", "shift"):
            sets = record.unavailable.get(kind) or {}
            for name, reason in sets.items() if isinstance(sets, Mapping) else ():
                out[kind].setdefault(str(name), " ".join(str(reason).split()))
    return out


def robustness_section(
    df: pd.DataFrame,
    figdir: Path,
    unavailable: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
) -> Section | None:
    """OOD tables, shift tables and figures (into ``figdir``), and the sets the runs could
    not evaluate (``{dataset: unavailable_sets(...)}``); None without OOD or shift rows."""
    if not df["split"].isin(["ood", "shift"]).any():
        return None
    sec = Section("Robustness: OOD detection and covariate shift", key="robustness")
    sec.blocks.append(Paragraph([
        "Does in-distribution calibration transfer? OOD detection (paper Tab. 3) and covariate "
        "shift (Tab. 4), test split of each set. COG against its counterpart, paired: ",
        Link("claims", "claims"), ".",
    ]))  # fmt: skip
    ood = Section("OOD detection (Tab. 3 style)", key="ood")
    ood.blocks += [t for p, ds in _pairs(df, "ood") if (t := ood_table(df, ds, p)) is not None]
    shift = Section("Covariate shift (Tab. 4 style)", key="covariate-shift")
    for p, ds in _pairs(df, "shift"):
        shift.blocks += [t for t in [shift_table(df, ds, p)] if t is not None]
        name = f"shift_severity_{slug(p)}_{slug(ds)}.png"
        if severity_figure(df, ds, p, Path(figdir) / name):
            shift.blocks.append(Figure(
                f"figures/{name}",
                f"{ds}, {p}: accuracy and ECE-15 against shift severity, mean over conditions, "
                "mean ± std over seeds (severity 0: clean test split)",
            ))  # fmt: skip
    sec.blocks += [s for s in (ood, shift) if s.blocks]
    items = [
        f"{ds}: {what} {name!r} not evaluated — {reason[:297] + '...' if len(reason) > 300 else reason}"
        for ds, un in sorted((unavailable or {}).items())
        for kind, what in (("ood", "OOD set"), ("shift", "shift condition"))
        for name, reason in sorted((un.get(kind) or {}).items())
    ]
    if items:
        said = Paragraph("Recorded by the runs:", items=items)
        sec.blocks.append(Section("Sets not evaluated", [said], "rob-unavailable"))
    return sec
