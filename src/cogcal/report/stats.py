"""The report's statistics: summary ranks, win counts, the Pareto front, and the paired
tests every "better" / "worse" statement rests on (:data:`PAIRED_RULE`).

Methods of a (dataset, protocol) cell share each seed's data split and initialisation,
so they are compared per seed (:func:`paired`), Holm-corrected over a family
(:func:`holm`). Nothing here needs matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from cogcal.report.frame import aggregate, rows
from cogcal.runs.columns import METRIC_NAMES

#: Metrics where larger is better; every other metric is an error (smaller is better).
HIGHER_IS_BETTER = frozenset({"acc", "auroc"})
#: The significance level of the report's statements.
ALPHA = 0.05

#: The rule every "better / worse" statement of the report follows (stated in the report).
PAIRED_RULE = (
    "Methods of one dataset share each seed's data split and initialisation, so they are "
    "compared per seed: Δ = mean over seeds of the per-seed difference, with its 95% "
    "Student-t interval (n − 1 degrees of freedom). A difference is stated only when the "
    "paired t-test's p-value, Holm-adjusted over the m comparisons of its family (named "
    "with m), is below 0.05; such an interval excludes 0. With fewer than 2 paired seeds a "
    "comparison is undecided."
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


@dataclass(frozen=True)
class Paired:
    """A paired comparison of ``a`` with ``b``: ``diff`` = mean of the per-seed ``a - b``,
    ``low``/``high`` its 95% Student-t interval, ``p`` the two-sided paired t-test p-value,
    ``p_adj`` the Holm-adjusted one (:func:`holm`; NaN before)."""

    diff: float
    low: float
    high: float
    p: float
    n: int
    higher_is_better: bool = False
    p_adj: float = math.nan
    diffs: tuple[float, ...] = ()

    @property
    def verdict(self) -> str:
        """``"better"`` / ``"worse"`` (``a`` than ``b``, decided after the correction) or
        ``"undecided"``."""
        if not (self.p_adj < ALPHA) or self.diff == 0:
            return "undecided"
        return "better" if (self.diff > 0) == self.higher_is_better else "worse"

    def text(self, digits: int = 3) -> str:
        """``Δ +0.012 [+0.004, +0.020]`` (n < 2: ``Δ +0.012, n = 1``).

        >>> Paired(0.0123, 0.004, 0.0206, 0.01, 5).text()
        'Δ +0.012 [+0.004, +0.021]'
        """
        if self.n < 2 or not math.isfinite(self.low):
            return f"Δ {self.diff:+.{digits}f}, n = {self.n}"
        return f"Δ {self.diff:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def paired(a: pd.Series, b: pd.Series, *, higher_is_better: bool) -> Paired | None:
    """Paired comparison of two per-seed series (indexed by seed; NaN dropped): the mean
    of the differences ``a - b`` with ``mean ± t(0.975, n-1) · sd / √n``; None without a
    common seed. Identical differences (sd = 0) give a point interval and p = 0 (1 when
    the mean is 0).

    >>> r = paired(pd.Series([0.3, 0.4, 0.5]), pd.Series([0.2, 0.2, 0.4]), higher_is_better=True)
    >>> round(r.diff, 4), round(r.low, 4), round(r.high, 4), round(r.p, 4)
    (0.1333, -0.0101, 0.2768, 0.0572)
    """
    from scipy.stats import t as student_t  # here: SciPy (heavy) loads only for the paired tests

    both = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    d = (both["a"] - both["b"]).to_numpy(float)
    n = int(d.size)
    if n == 0:
        return None
    mean, diffs = float(d.mean()), tuple(map(float, d))
    if n < 2:
        return Paired(mean, math.nan, math.nan, math.nan, n, higher_is_better, diffs=diffs)
    se = float(d.std(ddof=1)) / math.sqrt(n)
    if se == 0:
        p = 1.0 if mean == 0 else 0.0
        return Paired(mean, mean, mean, p, n, higher_is_better, diffs=diffs)
    half = float(student_t.ppf(1 - ALPHA / 2, n - 1)) * se
    p = float(2 * student_t.sf(abs(mean) / se, n - 1))
    return Paired(mean, mean - half, mean + half, p, n, higher_is_better, diffs=diffs)


def holm(tests: Sequence[Paired | None]) -> list[Paired | None]:
    """The ``tests`` with ``p_adj`` set: Holm's step-down adjustment over the tests that
    have a p-value (one family; None and undecidable tests are not counted).

    ``p_adj`` of the i-th smallest of m p-values is ``max_{j<=i} min(1, (m-j+1) p_(j))``.

    >>> [round(t.p_adj, 3) for t in holm([Paired(1, 0, 2, p, 3) for p in (0.01, 0.04, 0.03)])]
    [0.03, 0.06, 0.06]
    """
    idx = [i for i, t in enumerate(tests) if t is not None and math.isfinite(t.p)]
    m = len(idx)
    out = list(tests)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: tests[i].p)):  # type: ignore[union-attr]
        running = max(running, min(1.0, (m - rank) * tests[i].p))  # type: ignore[union-attr]
        out[i] = replace(tests[i], p_adj=running)  # type: ignore[arg-type]
    return out


def paired_family(
    values: pd.DataFrame, by: str | Sequence[str], tests: Sequence[tuple[str, Any, Any]]
) -> list[Paired | None]:
    """One family of paired comparisons of per-seed ``values`` (columns ``seed``, ``metric``,
    ``value`` and ``by``), Holm-corrected together: per ``(metric, a, b)`` the comparison of
    the rows whose ``by`` is ``a`` with those whose ``by`` is ``b`` (None: no common seed)."""
    keys = ["metric", *([by] if isinstance(by, str) else by)]
    series = {k: g.set_index("seed")["value"] for k, g in values.groupby(keys)}

    def of(metric: str, key: Any) -> pd.Series:
        return series.get((metric, *(key if isinstance(key, tuple) else (key,))), pd.Series())

    return holm(
        [paired(of(m, a), of(m, b), higher_is_better=m in HIGHER_IS_BETTER) for m, a, b in tests]
    )


def _wide(df: pd.DataFrame, keys: Sequence[str], metrics: Collection[str]) -> pd.DataFrame:
    """One row per ``keys`` + method, one column per metric (mean over seeds)."""
    wide = rows(df, metric=list(metrics)).pivot_table(
        index=[*keys, "method"], columns="metric", values="value", aggfunc="mean", dropna=False
    )
    wide.columns.name = None
    return wide.reset_index()


def _ranked(df: pd.DataFrame, split: str | None) -> tuple[pd.DataFrame, list[str]]:
    d = aggregate(df)
    if split is not None and "split" in d.columns:
        d = rows(d, split=split)
    return d, [c for c in ("dataset", "protocol") if c in d.columns]


def summary_rank(
    df: pd.DataFrame,
    metrics: Sequence[str] = ("acc", "nll", "brier"),
    higher_is_better: Collection[str] = HIGHER_IS_BETTER,
    *,
    split: str | None = "test",
) -> pd.DataFrame:
    """Per-dataset (and protocol) rank of every method on each metric and their mean
    (docs/method.md §3): means over seeds of the aggregate rows, ranked per metric (1 =
    best, ties share the best rank); ``rank`` is NaN for a method lacking a metric.

    >>> df = pd.DataFrame({"dataset": "d", "method": ["a", "a", "b", "b", "c", "c"],
    ...                    "metric": ["acc", "nll"] * 3, "value": [0.9, 0.3, 0.9, 0.2, 0.8, 0.4]})
    >>> summary_rank(df, metrics=("acc", "nll"))[["method", "rank_acc", "rank_nll", "rank"]]
      method  rank_acc  rank_nll  rank
    0      b       1.0       1.0   1.0
    1      a       1.0       2.0   1.5
    2      c       3.0       3.0   3.0
    """
    if not metrics:
        raise ValueError("`metrics` is empty; pass the metrics to rank on, e.g. ('acc', 'nll').")
    data, keys = _ranked(df, split)
    if data.empty:
        raise ValueError(f"no aggregate rows left to rank (split={split!r}); check `split`.")
    wide = _wide(data, keys, metrics)
    cols = [f"rank_{m}" for m in metrics]
    for m, col in zip(metrics, cols, strict=True):
        if m not in wide.columns:
            wide[m] = np.nan
        grouped = wide.groupby(keys, dropna=False)[m]
        wide[col] = grouped.rank(method="min", ascending=m not in higher_is_better)
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
    """``(wins, total)``: the tasks on which ``a``'s mean over seeds is strictly better than
    ``b``'s on every metric of ``better_on`` (a task is one combination of the context
    columns; ``task == "mean"`` rows are dropped), and the tasks where both have them.

    >>> df = pd.DataFrame({"task": ["x", "x", "y", "y"] * 2, "method": ["a"] * 4 + ["b"] * 4,
    ...                    "metric": ["acc", "brier"] * 4,
    ...                    "value": [0.9, 0.1, 0.8, 0.3, 0.8, 0.2, 0.9, 0.2]})
    >>> pairwise_wins(df, "a", "b")
    (1, 2)
    """
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
    context = ("dataset", "protocol", "split", "task", "condition", "severity")
    keys = [c for c in context if c in df.columns] + ["_unit"]
    df = df[df["method"].isin([a, b])].assign(_unit="")
    for k in keys:  # NaN keys would be dropped by the pivot
        df[k] = df[k].astype(object).where(df[k].notna(), "")
    wide = _wide(df, keys, better_on).set_index([*keys, "method"])
    missing = [m for m in better_on if m not in wide.columns]
    if missing:
        raise ValueError(f"metric(s) {missing} are not in the table.")
    wa, wb = wide.xs(a, level="method").align(wide.xs(b, level="method"), join="inner")
    sign = pd.Series({m: 1 if m in higher_is_better else -1 for m in better_on})
    both = wa[sign.index].notna().all(axis=1) & wb[sign.index].notna().all(axis=1)
    win = ((wa[sign.index] - wb[sign.index]) * sign > 0).all(axis=1) & both
    return int(win.sum()), int(both.sum())


def format_wins(
    a: str, b: str, wins: int, total: int, better_on: Sequence[str] = ("acc", "brier"), *,
    unit: str = "tasks",
) -> str:  # fmt: skip
    """One sentence for a :func:`pairwise_wins` count.

    >>> format_wins("cog-fc", "ts", 32, 40)
    'cog-fc beats ts on both accuracy and Brier on 32 of 40 tasks (80%).'
    """
    names = [METRIC_NAMES.get(m, m) for m in better_on]
    what = names[0] if len(names) == 1 else "both " + " and ".join(names)
    if len(names) > 2:
        what = "all of " + ", ".join(names[:-1]) + f" and {names[-1]}"
    share = f" ({100 * wins / total:.0f}%)" if total else ""
    return f"{a} beats {b} on {what} on {wins} of {total} {unit}{share}."


def pareto_front(
    df: pd.DataFrame, x: str = "ece_15", y: str = "acc", *, split: str | None = "test"
) -> pd.DataFrame:
    """Methods not dominated in (lower ``x``, higher ``y``) per dataset (and protocol),
    on means over seeds; identical points are all kept. Sorted by ``x``.

    >>> df = pd.DataFrame({"dataset": "d", "method": ["a", "a", "b", "b", "c", "c"],
    ...                    "metric": ["acc", "ece_15"] * 3,
    ...                    "value": [0.9, 0.05, 0.8, 0.02, 0.7, 0.03]})
    >>> pareto_front(df)["method"].tolist()
    ['b', 'a']
    """
    data, keys = _ranked(df, split)
    for m in (x, y):
        if m not in set(data["metric"]):
            raise ValueError(f"metric {m!r} is not in the table (split={split!r}).")
    wide = _wide(data, keys, (x, y)).dropna(subset=[x, y])
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
    order = [True] * len(keys) + [True, False]
    return out.sort_values([*keys, x, y], ascending=order).reset_index(drop=True)
