"""Multi-task sections of the report (paper §4.3: Tab. 6, Fig. 6, pairwise win counts).

Multi-task rows of ``results.csv`` (docs/method.md §6) carry ``task`` = a task name, plus
``task = "mean"`` rows with the unweighted mean over tasks. The Tab. 6 table uses those
means (computing them from the per-task rows when a run wrote none); the per-task figure
and the win counts use the per-task rows. Tasks are ordered by difficulty: the mean
accuracy over methods (each method's mean over seeds), ascending, so the hardest task is
first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from cogcal.report._common import is_cog, method_order, slug
from cogcal.report.blocks import Figure, Paragraph, Section, Table
from cogcal.report.frame import INDIVIDUAL, SeedPlan, protocol_order, rows
from cogcal.report.stats import HIGHER_IS_BETTER, format_wins, mean_std, pairwise_wins
from cogcal.report.tables import LABELS, cell, comparison_table, stat_table, stats_of

__all__ = [
    "MTL_METRICS",
    "multitask_datasets",
    "multitask_section",
    "multitask_table",
    "per_task_figure",
    "per_task_rows",
    "per_task_table",
    "task_difficulty",
    "wins_table",
]

#: Metrics of Tab. 6, in table order.
MTL_METRICS: tuple[str, ...] = ("acc", "nll", "brier", "ece_15")


def multitask_datasets(df: pd.DataFrame) -> list[str]:
    """Datasets with per-task rows, sorted."""
    return sorted(map(str, rows(df, task=INDIVIDUAL)["dataset"].unique()))


def per_task_rows(
    df: pd.DataFrame, dataset: str, protocol: str, *, split: str = "test"
) -> pd.DataFrame:
    """The per-task rows of one dataset, protocol and split (no shift / OOD rows)."""
    return rows(
        df, dataset=dataset, protocol=protocol, split=split, task=INDIVIDUAL, condition="",
        severity="",
    )  # fmt: skip


def task_difficulty(
    df: pd.DataFrame, dataset: str, protocol: str, *, metric: str = "acc", split: str = "test"
) -> list[str]:
    """Task names from hardest to easiest: mean ``metric`` over methods, ascending.

    Each method counts once (its mean over seeds); ties are broken by task name. For an
    error metric (anything but accuracy / AUROC) the order is descending instead, so the
    hardest task still comes first.

    Raises
    ------
    ValueError
        When there are no per-task rows of ``metric``.
    """
    d = per_task_rows(df, dataset, protocol, split=split)
    d = rows(d, metric=metric)
    if d.empty:
        raise ValueError(
            f"no per-task {metric!r} rows for dataset {dataset!r}, protocol {protocol!r}, "
            f"split {split!r}; is it a multi-task dataset?"
        )
    by_method = d.groupby(["task", "method"])["value"].mean()
    per_task = by_method.groupby(level="task").mean()
    sign = 1.0 if metric in HIGHER_IS_BETTER else -1.0
    return sorted(per_task.index.astype(str), key=lambda t: (sign * per_task[t], t))


def _mean_rows(df: pd.DataFrame, dataset: str, protocol: str, split: str) -> pd.DataFrame:
    """``task == "mean"`` rows, completed from the per-task rows where a run lacks them."""
    d = rows(df, dataset=dataset, protocol=protocol, split=split, condition="", severity="")
    have = rows(d, task="mean")
    tasks = rows(d, task=INDIVIDUAL)
    if tasks.empty:
        return have
    computed = (
        tasks.groupby(["dataset", "method", "protocol", "seed", "split", "metric"], as_index=False)[
            "value"
        ]
        .mean()
        .assign(task="mean", condition="", severity="")
    )
    key = ["method", "seed", "metric"]
    present = set(map(tuple, have[key].astype(str).to_numpy()))
    missing = [tuple(r) not in present for r in computed[key].astype(str).to_numpy()]
    return pd.concat([have, computed[missing]], ignore_index=True)


def multitask_table(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    metrics: Sequence[str] = MTL_METRICS,
    *,
    split: str = "test",
    plan: SeedPlan | None = None,
) -> Table | None:
    """Tab. 6: accuracy, NLL, Brier, ECE-15 as unweighted means over tasks.

    Mean ± sample std over seeds, best in bold, summary rank (acc, NLL, Brier; ties share
    the best rank), sorted by rank. ``None`` when the dataset has no per-task rows.
    """
    tasks = per_task_rows(df, dataset, protocol, split=split)
    if tasks.empty:
        return None
    t = comparison_table(
        _mean_rows(df, dataset, protocol, split), dataset, protocol, metrics, plan=plan
    )
    if t is None:
        return None
    n_tasks = tasks["task"].nunique()
    t.title = f"{dataset} — {protocol} protocol: multi-task, mean over {n_tasks} tasks (Tab. 6)"
    t.notes.insert(
        0,
        f"Every metric is the unweighted mean over the {n_tasks} binary tasks (each task "
        "a 2-class problem, docs/method.md §3), computed per seed.",
    )
    t.key = f"mtl-{slug(protocol)}-{slug(dataset)}"
    return t


def per_task_table(
    df: pd.DataFrame, dataset: str, protocol: str, metric: str = "acc", *, split: str = "test"
) -> Table | None:
    """One metric per task (rows, hardest first) and method (columns), best of each row
    bold; None without per-task rows of ``metric``."""
    d = rows(per_task_rows(df, dataset, protocol, split=split), metric=metric)
    if d.empty:
        return None
    order = task_difficulty(df, dataset, protocol, split=split)
    order += sorted(set(map(str, d["task"])) - set(order))
    methods = method_order(d["method"].unique())
    return stat_table(
        f"{dataset} — {protocol}: {LABELS.get(metric, metric)} per task ({split} split)",
        f"mtl-task-{metric}-{slug(protocol)}-{slug(dataset)}",
        ["Task (hardest first)"],
        [(t, [t]) for t in order],
        [(m, m, metric) for m in methods],
        stats_of(d.assign(task=d["task"].astype(str)), ("task", "method")),
        notes=[
            "Tasks ordered by difficulty (mean accuracy over methods, ascending); mean ± "
            "sample std over seeds; best of each task in bold."
        ],
        group=lambda t: t,
    )


def per_task_figure(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    path: Path,
    metrics: Sequence[str] = ("acc", "brier"),
    *,
    split: str = "test",
) -> Path | None:
    """Fig. 6: each task's accuracy and Brier score, one line per method.

    Tasks on the x-axis from hardest to easiest (:func:`task_difficulty`); points are
    means over seeds. COG variants are solid with circles, the others dashed with squares.

    Returns
    -------
    Path or None
        The PNG written atomically, or ``None`` without per-task rows of every metric.
    """
    import io

    from matplotlib import colormaps
    from matplotlib.figure import Figure as MplFigure

    from cogcal import _io

    d = per_task_rows(df, dataset, protocol, split=split)
    d = rows(d, metric=list(metrics))
    if d.empty or set(d["metric"]) != set(metrics):
        return None
    order = task_difficulty(df, dataset, protocol, split=split)
    pos = {t: i for i, t in enumerate(order)}
    stats = mean_std(d.assign(task=d["task"].astype(str)), by=("task", "method", "metric"))
    methods = method_order(list(stats["method"].unique()))
    cmap = colormaps["tab10" if len(methods) <= 10 else "tab20"]
    width = max(7.0, 0.32 * len(order) + 3.0)
    fig = MplFigure(figsize=(width, 3.3 * len(metrics) + 0.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(metrics), 1, sharex=True))
    for ax, metric in zip(axes, metrics, strict=True):
        for i, me in enumerate(methods):
            s = stats[(stats["method"] == me) & (stats["metric"] == metric)]
            s = s[s["task"].isin(pos)].sort_values("task", key=lambda c: c.map(pos))
            cog = is_cog(me)
            ax.plot(
                [pos[t] for t in s["task"]], s["mean"], "o-" if cog else "s--",
                color=cmap(i % cmap.N), label=me, lw=1.5 if cog else 1.0, ms=4,
            )  # fmt: skip
        ax.set_ylabel(LABELS.get(metric, metric))
        ax.grid(alpha=0.3)
    axes[-1].set_xticks(range(len(order)))
    axes[-1].set_xticklabels(order, rotation=60, ha="right", fontsize=8)
    axes[-1].set_xlabel("task, hardest (lowest mean accuracy over methods) first")
    axes[0].legend(fontsize=8, loc="best", ncols=2)
    fig.suptitle(f"{dataset}, {protocol} protocol: per-task {split} metrics (solid: COG)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return _io.write_bytes(Path(path), buf.getvalue())


def wins_table(
    df: pd.DataFrame,
    dataset: str,
    protocol: str,
    better_on: Sequence[str] = ("acc", "brier"),
    *,
    split: str = "test",
) -> tuple[Table, list[str]] | None:
    """Pairwise win counts over tasks: each COG variant against each baseline present.

    A COG variant wins a task when its mean over seeds is strictly better on every metric
    of ``better_on`` (:func:`cogcal.report.aggregate.pairwise_wins`); the reverse count
    (the baseline better on all of them) is shown too, so losses are visible.

    Returns
    -------
    (Table, list of str) or None
        The table and one :func:`~cogcal.report.aggregate.format_wins` sentence per pair;
        ``None`` without per-task rows or without both a COG variant and a baseline.
    """
    d = per_task_rows(df, dataset, protocol, split=split)
    d = rows(d, metric=list(better_on))
    if d.empty:
        return None
    methods = method_order(list(d["method"].unique()))
    cogs = [m for m in methods if is_cog(m)]
    bases = [m for m in methods if not is_cog(m)]
    if not cogs or not bases:
        return None
    table_rows, sentences = [], []
    names = " and ".join(LABELS.get(m, m) for m in better_on)
    for cog in cogs:
        for base in bases:
            wins, total = pairwise_wins(d, cog, base, better_on)
            losses, _ = pairwise_wins(d, base, cog, better_on)
            sentences.append(format_wins(cog, base, wins, total, better_on))
            share = f"{100 * wins / total:.0f}%" if total else "—"
            table_rows.append(
                [
                    cell(cog),
                    cell(base),
                    cell(f"{wins} of {total}", wins > losses),
                    cell(share),
                    cell(f"{losses} of {total}", losses > wins),
                    cell(total - wins - losses),
                ]
            )
    header = ["COG", "Baseline", "COG better on all", "Share", "Baseline better on all", "Mixed"]
    notes = [
        f"Tasks of {dataset} ({split} split, means over seeds) where one method is strictly "
        f"better on all of {names}; 'Mixed' counts the others. The larger count is bold."
    ]
    table = Table(
        f"{dataset} — {protocol}: pairwise wins over tasks ({names})",
        header,
        table_rows,
        notes,
        f"mtl-wins-{slug(protocol)}-{slug(dataset)}",
    )
    return table, sentences


def multitask_section(
    df: pd.DataFrame, figdir: Path, *, plan: SeedPlan | None = None
) -> Section | None:
    """The report's multi-task section, or ``None`` without per-task rows.

    Parameters
    ----------
    df : DataFrame
        Tidy ``results.csv`` rows.
    figdir : Path
        Where the per-task figures are written (``root/figures``).
    """
    datasets = multitask_datasets(df)
    if not datasets:
        return None
    sec = Section("Multi-task learning", key="multitask")
    sec.blocks.append(
        Paragraph(
            "Paper §4.3: T binary tasks trained with the sum of the task losses; post-hoc "
            "baselines calibrate each task separately on validation, COG trains its per-task "
            "calibrators jointly in the one run. Test split."
        )
    )
    for dataset in datasets:
        d = rows(df, dataset=dataset)
        for protocol in protocol_order(set(map(str, d["protocol"]))):
            if per_task_rows(df, dataset, protocol).empty:
                continue
            sub = Section(
                f"{dataset} — {protocol} protocol",
                key=f"multitask-{slug(protocol)}-{slug(dataset)}",
            )
            table = multitask_table(df, dataset, protocol, plan=plan)
            if table is not None:
                sub.blocks.append(table)
            name = f"per_task_{slug(protocol)}_{slug(dataset)}.png"
            if per_task_figure(df, dataset, protocol, Path(figdir) / name):
                sub.blocks.append(
                    Figure(
                        f"figures/{name}",
                        f"{dataset}, {protocol}: per-task accuracy (top) and Brier score "
                        "(bottom), tasks from hardest to easiest, means over seeds (Fig. 6 "
                        "style)",
                    )
                )
            wins = wins_table(df, dataset, protocol)
            if wins is not None:
                sub.blocks.append(wins[0])
                sub.blocks.append(Paragraph(items=wins[1]))
            for metric in ("acc", "brier"):
                t = per_task_table(df, dataset, protocol, metric)
                if t is not None:
                    sub.blocks.append(t)
            sec.blocks.append(sub)
    return sec
