"""Statistics of the tidy ``results.csv`` format (docs/method.md §6): mean ± std over
seeds, the seed-spread rule, summary rank, pairwise win counts and the accuracy /
calibration Pareto front.

Every function takes a pandas DataFrame with (some of) the columns ``dataset, method,
protocol, seed, split, metric, value, task, condition, severity`` and never needs
matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cogcal.report._common import check_results_frame
from cogcal.report.frame import aggregate, rows

__all__ = [
    "SPREAD_RULE",
    "Stat",
    "compare",
    "format_wins",
    "mean_std",
    "pairwise_wins",
    "pareto_front",
    "summary_rank",
]

#: Metrics where larger is better; every other metric is an error (smaller is better).
HIGHER_IS_BETTER = frozenset({"acc", "auroc"})
_CONTEXT = ("dataset", "protocol", "split", "task", "condition", "severity")
_NAMES = {"acc": "accuracy", "nll": "NLL", "brier": "Brier", "auroc": "AUROC", "fpr95": "FPR95"}


#: The rule every "within / beyond the seed spread" statement of the report follows.
SPREAD_RULE = (
    "two means differ beyond the seed spread when the absolute difference of their means "
    "is larger than the larger of their two sample standard deviations over seeds (ddof = "
    "1); otherwise they are within the spread. With fewer than 2 seeds on either side the "
    "spread is unknown and no difference is claimed."
)


@dataclass(frozen=True)
class Stat:
    """Mean, sample standard deviation (ddof = 1) and number of seeds of one cell."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        """The statistics of finite ``values`` (NaN are not seeds).

        >>> Stat.of([0.1, 0.3, float("nan")])
        Stat(mean=0.2, std=0.1414213562373095, n=2)
        """
        v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
        if v.size == 0:
            return cls(math.nan, math.nan, 0)
        return cls(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan, int(v.size))


def compare(a: Stat, b: Stat, *, higher_is_better: bool) -> str:
    """Compare ``a`` with ``b`` under :data:`SPREAD_RULE`.

    Returns
    -------
    str
        ``"better"`` / ``"worse"`` (``a`` better or worse than ``b`` beyond the seed
        spread), ``"within"`` (the difference is within the spread) or ``"unknown"``
        (a mean is missing, or fewer than 2 seeds on either side).

    Examples
    --------
    >>> compare(Stat(0.30, 0.01, 3), Stat(0.40, 0.02, 3), higher_is_better=False)
    'better'
    >>> compare(Stat(0.30, 0.05, 3), Stat(0.34, 0.02, 3), higher_is_better=False)
    'within'
    >>> compare(Stat(0.30, float("nan"), 1), Stat(0.40, 0.02, 3), higher_is_better=False)
    'unknown'
    """
    if not (math.isfinite(a.mean) and math.isfinite(b.mean)) or min(a.n, b.n) < 2:
        return "unknown"
    spread = max(a.std, b.std)
    diff = a.mean - b.mean
    if abs(diff) <= spread:
        return "within"
    return "better" if (diff > 0) == higher_is_better else "worse"


def _aggregate_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The aggregate rows: empty or ``mean`` task, no shift/OOD condition or severity."""
    return aggregate(df)


def mean_std(
    df: pd.DataFrame,
    by: Sequence[str] = ("dataset", "method", "protocol", "split", "metric"),
) -> pd.DataFrame:
    """Mean, sample standard deviation and count of ``value`` over seeds.

    Parameters
    ----------
    df : DataFrame
        Tidy results with a ``value`` column and the ``by`` columns.
    by : sequence of str
        Columns identifying one cell; the rows inside a cell are the seeds.

    Returns
    -------
    DataFrame
        The ``by`` columns and ``mean``, ``std`` (sample std, ``ddof=1``; 0.0 when a
        cell has a single seed, where the sample std is undefined) and ``n``.

    Raises
    ------
    ValueError
        When a cell holds the same seed twice, i.e. ``by`` mixes rows that are not
        repeats (typically per-task, per-corruption or per-severity rows): add ``task`` /
        ``condition`` / ``severity`` to ``by`` or filter the table first.

    Examples
    --------
    >>> df = pd.DataFrame({"dataset": "d", "method": "ce", "protocol": "paper",
    ...                    "split": "test", "metric": "acc", "seed": [0, 1, 2],
    ...                    "value": [0.90, 0.92, 0.94]})
    >>> mean_std(df).round(4).to_dict("records")
    [{'dataset': 'd', 'method': 'ce', 'protocol': 'paper', 'split': 'test', 'metric': 'acc', 'mean': 0.92, 'std': 0.02, 'n': 3}]
    """
    by = list(by)
    check_results_frame(df, [*by, "value"])
    if "seed" in df.columns:
        dup = df.duplicated([*by, "seed"], keep=False)
        if dup.any():
            row = df[dup].iloc[0]
            extra = [
                c for c in ("task", "condition", "severity") if c in df.columns and c not in by
            ]
            raise ValueError(
                f"the cell {dict(row[by])} holds seed {row['seed']!r} more than once, so `by` "
                f"mixes rows that are not repeats; add {extra or 'the distinguishing columns'} "
                "to `by` or filter the table first."
            )
    g = df.groupby(by, dropna=False, sort=True)["value"]
    out = g.agg(mean="mean", std=lambda v: v.std(ddof=1), n="count").reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out


def _cell_means(
    df: pd.DataFrame, keys: Sequence[str], metrics: Collection[str] | None
) -> pd.DataFrame:
    """Wide table: one row per ``keys`` + method, one column per metric (mean over seeds)."""
    if metrics is not None:
        df = rows(df, metric=list(metrics))
    wide = df.pivot_table(
        index=[*keys, "method"], columns="metric", values="value", aggfunc="mean", dropna=False
    )
    wide.columns.name = None
    return wide.reset_index()


def _rank_keys(df: pd.DataFrame, split: str | None) -> tuple[pd.DataFrame, list[str]]:
    if split is not None and "split" in df.columns:
        df = rows(df, split=split)
    keys = [c for c in ("dataset", "protocol") if c in df.columns]
    return df, keys


def summary_rank(
    df: pd.DataFrame,
    metrics: Sequence[str] = ("acc", "nll", "brier"),
    higher_is_better: Collection[str] = HIGHER_IS_BETTER,
    *,
    split: str | None = "test",
) -> pd.DataFrame:
    """Per-dataset rank of every method on each metric, and their mean (docs/method.md §3).

    Values are first averaged over seeds. Within each dataset (and protocol, when the
    column exists) methods are ranked per metric, 1 = best; tied methods share the best
    of their ranks (``method="min"``: values 0.9, 0.9, 0.8 rank 1, 1, 3). The summary
    ``rank`` is the unweighted mean of the per-metric ranks; it is NaN for a method that
    lacks one of the metrics.

    Parameters
    ----------
    df : DataFrame
        Tidy results (``dataset, method, metric, value`` and optionally ``seed``,
        ``protocol``, ``split``, ``task``, ``condition``, ``severity``). Per-task and
        per-condition rows are ignored; only the aggregate (``task`` "mean" or empty) rows
        count.
    metrics : sequence of str
        Metrics to rank on.
    higher_is_better : collection of str
        Metrics where larger is better (default ``{"acc", "auroc"}``); others are errors.
    split : str or None
        Keep only this split (default ``"test"``); ``None`` keeps all rows.

    Returns
    -------
    DataFrame
        ``dataset`` [, ``protocol``], ``method``, ``rank_<metric>`` for each metric and
        ``rank``, sorted by dataset and rank.

    Examples
    --------
    >>> df = pd.DataFrame({"dataset": "d", "method": ["a", "a", "b", "b", "c", "c"],
    ...                    "metric": ["acc", "nll"] * 3, "value": [0.9, 0.3, 0.9, 0.2, 0.8, 0.4]})
    >>> summary_rank(df, metrics=("acc", "nll"))[["method", "rank_acc", "rank_nll", "rank"]]
      method  rank_acc  rank_nll  rank
    0      b       1.0       1.0   1.0
    1      a       1.0       2.0   1.5
    2      c       3.0       3.0   3.0
    """
    check_results_frame(df, ["dataset", "method", "metric", "value"])
    if not metrics:
        raise ValueError("`metrics` is empty; pass the metrics to rank on, e.g. ('acc', 'nll').")
    data, keys = _rank_keys(_aggregate_rows(df), split)
    if data.empty:
        raise ValueError(f"no aggregate rows left to rank (split={split!r}); check `split`.")
    wide = _cell_means(data, keys, metrics)
    for m in metrics:
        if m not in wide.columns:
            wide[m] = np.nan
    cols = []
    for m in metrics:
        col = f"rank_{m}"
        grouped = wide.groupby(keys, dropna=False)[m]
        wide[col] = grouped.rank(method="min", ascending=m not in higher_is_better)
        cols.append(col)
    wide["rank"] = wide[cols].mean(axis=1, skipna=False)
    out = wide[[*keys, "method", *cols, "rank"]]
    return out.sort_values([*keys, "rank", "method"], na_position="last").reset_index(drop=True)


def pairwise_wins(
    per_task_df: pd.DataFrame,
    a: str,
    b: str,
    better_on: Sequence[str] = ("acc", "brier"),
    higher_is_better: Collection[str] = HIGHER_IS_BETTER,
) -> tuple[int, int]:
    """Count the tasks on which method ``a`` beats method ``b`` on every metric at once.

    A *task* is one combination of the context columns present among ``dataset,
    protocol, split, task, condition, severity`` (rows with ``task == "mean"`` are
    dropped, so a multi-task table compares its individual tasks). Values are averaged
    over seeds first. ``a`` wins a task when it is strictly better than ``b`` on each
    metric of ``better_on``; ties are not wins.

    Parameters
    ----------
    per_task_df : DataFrame
        Tidy results with ``method, metric, value`` and the context columns.
    a, b : str
        The two method names.
    better_on : sequence of str
        Metrics that must all be better (default accuracy and Brier).
    higher_is_better : collection of str
        Metrics where larger is better.

    Returns
    -------
    (wins, total) : tuple of int
        ``total`` counts the tasks where both methods have every metric of ``better_on``.

    Examples
    --------
    >>> df = pd.DataFrame({"task": ["x", "x", "y", "y"] * 2, "method": ["a"] * 4 + ["b"] * 4,
    ...                    "metric": ["acc", "brier"] * 4,
    ...                    "value": [0.9, 0.1, 0.8, 0.3, 0.8, 0.2, 0.9, 0.2]})
    >>> pairwise_wins(df, "a", "b")
    (1, 2)
    """
    check_results_frame(per_task_df, ["method", "metric", "value"])
    if not better_on:
        raise ValueError("`better_on` is empty; name at least one metric, e.g. ('acc',).")
    df = per_task_df
    if "task" in df.columns:
        df = df[df["task"].astype(str) != "mean"]
    for name in (a, b):
        if name not in set(df["method"]):
            raise ValueError(
                f"method {name!r} is not in the table; methods present: "
                f"{sorted(map(str, set(df['method'])))}."
            )
    keys = [c for c in _CONTEXT if c in df.columns] + ["_unit"]
    df = df[df["method"].isin([a, b])].assign(_unit="")
    for k in keys:  # NaN keys would be dropped by the pivot
        df[k] = df[k].astype(object).where(df[k].notna(), "")
    wide = _cell_means(df, keys, better_on).set_index([*keys, "method"])
    wa = wide.xs(a, level="method")
    wb = wide.xs(b, level="method")
    missing = [m for m in better_on if m not in wide.columns]
    if missing:
        raise ValueError(f"metric(s) {missing} are not in the table.")
    wa, wb = wa.align(wb, join="inner")
    both = wa[list(better_on)].notna().all(axis=1) & wb[list(better_on)].notna().all(axis=1)
    wa, wb = wa[both], wb[both]
    win = pd.Series(True, index=wa.index)
    for m in better_on:
        win &= (wa[m] > wb[m]) if m in higher_is_better else (wa[m] < wb[m])
    return int(win.sum()), int(len(wa))


def format_wins(
    a: str,
    b: str,
    wins: int,
    total: int,
    better_on: Sequence[str] = ("acc", "brier"),
    *,
    unit: str = "tasks",
) -> str:
    """One sentence for a :func:`pairwise_wins` count.

    Examples
    --------
    >>> format_wins("cog-fc", "ts", 32, 40)
    'cog-fc beats ts on both accuracy and Brier on 32 of 40 tasks (80%).'
    >>> format_wins("cog-fc", "ls", 40, 40, ("acc",))
    'cog-fc beats ls on accuracy on 40 of 40 tasks (100%).'
    """
    names = [_NAMES.get(m, m) for m in better_on]
    if len(names) == 1:
        what = names[0]
    elif len(names) == 2:
        what = f"both {names[0]} and {names[1]}"
    else:
        what = "all of " + ", ".join(names[:-1]) + f" and {names[-1]}"
    share = f" ({100 * wins / total:.0f}%)" if total else ""
    return f"{a} beats {b} on {what} on {wins} of {total} {unit}{share}."


def pareto_front(
    df: pd.DataFrame,
    x: str = "ece_15",
    y: str = "acc",
    *,
    split: str | None = "test",
) -> pd.DataFrame:
    """Methods not dominated in (lower ``x``, higher ``y``), per dataset.

    Values are averaged over seeds (aggregate rows only, as in :func:`summary_rank`). A
    method is dominated when another method of the same dataset (and protocol) has
    ``x' <= x`` and ``y' >= y`` with at least one strict inequality; methods with
    identical points are all kept.

    Parameters
    ----------
    df : DataFrame
        Tidy results.
    x : str
        Calibration metric, lower is better (default ``ece_15``).
    y : str
        Accuracy-like metric, higher is better (default ``acc``).
    split : str or None
        Keep only this split (default ``"test"``).

    Returns
    -------
    DataFrame
        ``dataset`` [, ``protocol``], ``method``, ``x``, ``y`` of the front, sorted by
        ``x`` within each dataset.

    Examples
    --------
    >>> df = pd.DataFrame({"dataset": "d", "method": ["a", "a", "b", "b", "c", "c"],
    ...                    "metric": ["acc", "ece_15"] * 3,
    ...                    "value": [0.9, 0.05, 0.8, 0.02, 0.7, 0.03]})
    >>> pareto_front(df)["method"].tolist()
    ['b', 'a']
    """
    check_results_frame(df, ["dataset", "method", "metric", "value"])
    data, keys = _rank_keys(_aggregate_rows(df), split)
    for m in (x, y):
        if m not in set(data["metric"]):
            raise ValueError(f"metric {m!r} is not in the table (split={split!r}).")
    wide = _cell_means(data, keys, (x, y)).dropna(subset=[x, y])
    keep = []
    for _, grp in wide.groupby(keys, dropna=False):
        xs, ys = grp[x].to_numpy(), grp[y].to_numpy()
        dominated = (
            (xs[None, :] <= xs[:, None])
            & (ys[None, :] >= ys[:, None])
            & ((xs[None, :] < xs[:, None]) | (ys[None, :] > ys[:, None]))
        ).any(axis=1)
        keep.extend(grp.index[~dominated])
    out = wide.loc[keep, [*keys, "method", x, y]]
    return out.sort_values([*keys, x, y], ascending=[True] * len(keys) + [True, False]).reset_index(
        drop=True
    )
