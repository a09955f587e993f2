"""The multi-task section of the report (paper §4.3: Tab. 6, Fig. 6, win counts).

Tab. 6 uses the ``task = "mean"`` rows (computed from the per-task rows when a run wrote
none); the figure and the win counts use the per-task rows, hardest task first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from cogcal.report._common import is_cog, method_order, save_figure, slug
from cogcal.report.blocks import Figure, Paragraph, Section, Table
from cogcal.report.frame import INDIVIDUAL, SeedPlan, protocol_order, rows
from cogcal.report.stats import HIGHER_IS_BETTER, format_wins, pairwise_wins
from cogcal.report.tables import LABELS, cell, comparison_table

#: Metrics of Tab. 6, in table order.
MTL_METRICS: tuple[str, ...] = ("acc", "nll", "brier", "ece_15")


def per_task_rows(df: pd.DataFrame, dataset: str, protocol: str) -> pd.DataFrame:
    """The per-task test rows of one dataset and protocol (no shift / OOD rows)."""
    sel = {"dataset": dataset, "protocol": protocol, "condition": "", "severity": ""}
    d = rows(df, split="test", task=INDIVIDUAL, **sel)
    return d.assign(task=d["task"].astype(str))


def task_difficulty(
    df: pd.DataFrame, dataset: str, protocol: str, metric: str = "acc"
) -> list[str]:
    """Task names from hardest to easiest: the mean over methods of each method's mean
    ``metric`` over seeds, ascending (descending for an error metric); ties by name;
    ``ValueError`` without per-task rows of ``metric``."""
    d = rows(per_task_rows(df, dataset, protocol), metric=metric)
    if d.empty:
        raise ValueError(
            f"no per-task {metric!r} rows for dataset {dataset!r}, protocol {protocol!r}; is "
            "it a multi-task dataset?"
        )
    per_task = d.groupby(["task", "method"])["value"].mean().groupby(level="task").mean()
    sign = 1.0 if metric in HIGHER_IS_BETTER else -1.0
    return sorted(per_task.index, key=lambda t: (sign * per_task[t], t))


def multitask_table(
    df: pd.DataFrame, dataset: str, protocol: str, *, plan: SeedPlan | None = None
) -> Table | None:
    """Tab. 6: test accuracy, NLL, Brier and ECE-15 as unweighted means over tasks (the
    comparison table of those means); None without per-task rows."""
    tasks = per_task_rows(df, dataset, protocol)
    if tasks.empty:
        return None
    have = rows(df, dataset=dataset, protocol=protocol, split="test", task="mean", condition="")
    keys = ["dataset", "method", "protocol", "seed", "split", "metric"]
    computed = tasks.groupby(keys, as_index=False)["value"].mean().assign(task="mean")
    done = set(map(tuple, have[["method", "seed", "metric"]].to_numpy()))
    missing = [tuple(r) not in done for r in computed[["method", "seed", "metric"]].to_numpy()]
    means = pd.concat([have, computed[missing].assign(condition="", severity="")])
    t = comparison_table(means, dataset, protocol, MTL_METRICS, plan=plan)
    if t is None:
        return None
    n = tasks["task"].nunique()
    t.title = f"{dataset} — {protocol} protocol: multi-task, mean over {n} tasks (Tab. 6)"
    t.notes.insert(0, f"Every metric is the unweighted mean over the {n} binary tasks, per seed.")
    t.key = f"mtl-{slug(protocol)}-{slug(dataset)}"
    return t


def per_task_figure(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    path: Path,
    metrics: Sequence[str] = ("acc", "brier"),
) -> Path | None:
    """Fig. 6: each task's accuracy and Brier score (means over seeds), tasks hardest
    first, one line per method (COG solid with circles). None without every metric."""
    from matplotlib import colormaps  # here: matplotlib (heavy) loads only to draw
    from matplotlib.figure import Figure as MplFigure

    d = rows(per_task_rows(df, dataset, protocol), metric=list(metrics))
    if d.empty or set(d["metric"]) != set(metrics):
        return None
    order = task_difficulty(df, dataset, protocol)
    means = d.groupby(["method", "metric", "task"])["value"].mean()
    methods = method_order(d["method"].unique())
    cmap = colormaps["tab10" if len(methods) <= 10 else "tab20"]
    fig = MplFigure(
        figsize=(max(7.0, 0.32 * len(order) + 3.0), 3.3 * len(metrics) + 0.8), layout="constrained"
    )
    axes = np.atleast_1d(fig.subplots(len(metrics), 1, sharex=True))
    for ax, metric in zip(axes, metrics, strict=True):
        for i, me in enumerate(methods):
            ys = [means.get((me, metric, t), np.nan) for t in order]
            fmt, lw = ("o-", 1.5) if is_cog(me) else ("s--", 1.0)
            ax.plot(range(len(order)), ys, fmt, color=cmap(i % cmap.N), label=me, ms=4, lw=lw)
        ax.set_ylabel(LABELS.get(metric, metric))
        ax.grid(alpha=0.3)
    axes[-1].set_xticks(range(len(order)))
    axes[-1].set_xticklabels(order, rotation=60, ha="right", fontsize=8)
    axes[-1].set_xlabel("task, hardest (lowest mean accuracy over methods) first")
    axes[0].legend(fontsize=8, loc="best", ncols=2)
    fig.suptitle(f"{dataset}, {protocol} protocol: per-task test metrics (solid: COG)")
    return save_figure(fig, path)


def wins_table(
    df: pd.DataFrame, dataset: str, protocol: str, better_on: Sequence[str] = ("acc", "brier")
) -> tuple[Table, list[str]] | None:
    """Each COG variant against each baseline: the tasks where its mean over seeds is
    strictly better on every metric of ``better_on`` (:func:`~cogcal.report.stats.pairwise_wins`),
    the reverse count, and one sentence per pair; None without both kinds of method."""
    d = rows(per_task_rows(df, dataset, protocol), metric=list(better_on))
    methods = method_order(d["method"].unique())
    cogs, bases = [m for m in methods if is_cog(m)], [m for m in methods if not is_cog(m)]
    if not cogs or not bases:
        return None
    body, sentences = [], []
    for cog in cogs:
        for base in bases:
            wins, total = pairwise_wins(d, cog, base, better_on)
            losses, _ = pairwise_wins(d, base, cog, better_on)
            sentences.append(format_wins(cog, base, wins, total, better_on))
            share = f"{100 * wins / total:.0f}%" if total else "—"
            body.append(
                [cell(cog), cell(base), cell(f"{wins} of {total}", wins > losses), cell(share)]
                + [cell(f"{losses} of {total}", losses > wins), cell(total - wins - losses)]
            )
    names = " and ".join(LABELS.get(m, m) for m in better_on)
    header = ["COG", "Baseline", "COG better on all", "Share", "Baseline better on all", "Mixed"]
    notes = [
        f"Tasks of {dataset} (test split, means over seeds) where one method is strictly "
        f"better on all of {names}; 'Mixed' counts the others. The larger count is bold."
    ]
    title = f"{dataset} — {protocol}: pairwise wins over tasks ({names})"
    table = Table(title, header, body, notes, f"mtl-wins-{slug(protocol)}-{slug(dataset)}")
    return table, sentences


def multitask_section(
    df: pd.DataFrame, figdir: Path, *, plan: SeedPlan | None = None
) -> Section | None:
    """Tab. 6, Fig. 6, win counts and per-task tables of every multi-task dataset (figures
    into ``figdir``); None without per-task rows."""
    datasets = sorted(map(str, rows(df, task=INDIVIDUAL)["dataset"].unique()))
    if not datasets:
        return None
    sec = Section("Multi-task learning", key="multitask")
    sec.blocks.append(Paragraph(
        "Paper §4.3: T binary tasks trained with the sum of the task losses; post-hoc "
        "baselines calibrate each task separately on validation, COG trains its per-task "
        "calibrators jointly in the one run. Test split."
    ))  # fmt: skip
    for dataset in datasets:
        for protocol in protocol_order(set(rows(df, dataset=dataset)["protocol"])):
            if per_task_rows(df, dataset, protocol).empty:
                continue
            key = f"multitask-{slug(protocol)}-{slug(dataset)}"
            sub = Section(f"{dataset} — {protocol} protocol", key=key)
            sub.blocks += [t for t in [multitask_table(df, dataset, protocol, plan=plan)] if t]
            name = f"per_task_{slug(protocol)}_{slug(dataset)}.png"
            if per_task_figure(df, dataset, protocol, Path(figdir) / name):
                caption = f"{dataset}, {protocol}: per-task accuracy (top) and Brier score (bottom), hardest task first, means over seeds (Fig. 6 style)"
                sub.blocks.append(Figure(f"figures/{name}", caption))
            wins = wins_table(df, dataset, protocol)
            if wins is not None:
                sub.blocks += [wins[0], Paragraph(items=wins[1])]
            sec.blocks.append(sub)
    return sec
