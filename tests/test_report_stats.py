"""Tests of cogcal.report.stats on hand-built tidy tables; the paired statistics against
scipy.stats (ttest_rel, t.ppf) and hand computations."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from cogcal.report.stats import (
    Paired,
    format_wins,
    holm,
    paired,
    pairwise_wins,
    pareto_front,
    summary_rank,
)
from cogcal.report.tables import stats_of
from cogcal.runs.columns import RESULT_COLUMNS

COLS = list(RESULT_COLUMNS)


def _rows(rows):
    """rows: (dataset, method, seed, metric, value[, task[, split]])."""
    out = []
    for r in rows:
        d, m, s, metric, v, *rest = r
        task = rest[0] if rest else np.nan
        split = rest[1] if len(rest) > 1 else "test"
        out.append([d, m, "paper", s, split, metric, v, task, np.nan, np.nan])
    return pd.DataFrame(out, columns=COLS)


def test_stats_of_sample_std_single_seed_and_nan():
    df = _rows(
        [("c10", "ce", s, "acc", v) for s, v in enumerate([0.90, 0.92, 0.97])]
        + [("c10", "ts", 0, "acc", 0.91), ("c10", "ts", 1, "acc", np.nan)]
    )
    out = stats_of(df, ("method",))
    assert out["ce"].mean == pytest.approx(np.mean([0.90, 0.92, 0.97]))
    assert out["ce"].std == pytest.approx(np.std([0.90, 0.92, 0.97], ddof=1)) and out["ce"].n == 3
    assert out["ts"].n == 1 and np.isnan(out["ts"].std)  # NaN is no seed; one seed, no spread
    by_task = stats_of(df.assign(task=["a", "b", "a", "a", "a"]), ("method", "task"))
    assert by_task[("ce", "b")].n == 1 and by_task[("ce", "a")].n == 2


def test_summary_rank_ties_share_best_rank():
    vals = {  # method: (acc, nll, brier), two seeds each with the same mean
        "a": (0.90, 0.30, 0.15),
        "b": (0.90, 0.25, 0.15),
        "c": (0.80, 0.40, 0.10),
        "d": (0.70, 0.40, 0.20),
    }
    rows = []
    for m, (acc, nll, br) in vals.items():
        for s, eps in ((0, -0.01), (1, 0.01)):
            rows += [
                ("c10", m, s, "acc", acc + eps),
                ("c10", m, s, "nll", nll + eps),
                ("c10", m, s, "brier", br + eps),
            ]
    rows += [("c10", "a", 0, "acc", 0.0, np.nan, "val")]  # other split: ignored
    rows += [("c10", "d", 0, "acc", 1.0, "t0")]  # per-task row: ignored
    out = summary_rank(_rows(rows)).set_index("method")
    assert out["rank_acc"].to_dict() == {"a": 1, "b": 1, "c": 3, "d": 4}
    assert out["rank_nll"].to_dict() == {"a": 2, "b": 1, "c": 3, "d": 3}
    assert out["rank_brier"].to_dict() == {"a": 2, "b": 2, "c": 1, "d": 4}
    assert out.loc["b", "rank"] == pytest.approx(4 / 3)
    assert out.loc["d", "rank"] == pytest.approx(11 / 3)
    assert list(out.index) == ["b", "a", "c", "d"]  # sorted by rank
    assert (out["dataset"] == "c10").all() and (out["protocol"] == "paper").all()


def test_summary_rank_per_dataset_and_missing_metric():
    rows = [
        ("d1", "a", 0, "acc", 0.9),
        ("d1", "b", 0, "acc", 0.8),
        ("d2", "a", 0, "acc", 0.5),
        ("d2", "b", 0, "acc", 0.6),
    ]
    rows += [("d1", "a", 0, "nll", 0.3), ("d1", "b", 0, "nll", 0.2), ("d2", "a", 0, "nll", 0.3)]
    out = summary_rank(_rows(rows), metrics=("acc", "nll"))
    d1 = out[out.dataset == "d1"].set_index("method")
    d2 = out[out.dataset == "d2"].set_index("method")
    assert d1["rank"].to_dict() == {"a": 1.5, "b": 1.5}
    assert d2.loc["b", "rank_acc"] == 1 and math.isnan(d2.loc["b", "rank"])  # b lacks nll on d2
    # auroc counts as higher-is-better, fpr95 as lower-is-better
    o = _rows(
        [
            ("d", "a", 0, "auroc", 0.9),
            ("d", "b", 0, "auroc", 0.8),
            ("d", "a", 0, "fpr95", 0.5),
            ("d", "b", 0, "fpr95", 0.4),
        ]
    )
    r = summary_rank(o, metrics=("auroc", "fpr95")).set_index("method")
    assert r["rank_auroc"].to_dict() == {"a": 1, "b": 2} and r["rank_fpr95"].to_dict() == {
        "a": 2,
        "b": 1,
    }


def test_pairwise_wins_both_metrics_strict():
    rows = []
    tasks = {  # task: (acc_a, brier_a, acc_b, brier_b)
        "t0": (0.9, 0.10, 0.8, 0.20),  # a wins both
        "t1": (0.9, 0.30, 0.8, 0.20),  # a better acc, worse brier
        "t2": (0.8, 0.10, 0.8, 0.20),  # tie on acc: not a win
        "t3": (0.7, 0.40, 0.9, 0.10),  # b wins
        "t4": (0.95, 0.05, 0.90, 0.10),  # a wins
    }
    for t, (aa, ba, ab, bb) in tasks.items():
        for s in (0, 1):
            rows += [("celeba", "a", s, "acc", aa, t), ("celeba", "a", s, "brier", ba, t)]
            rows += [("celeba", "b", s, "acc", ab, t), ("celeba", "b", s, "brier", bb, t)]
    rows += [("celeba", "a", 0, "acc", 1.0, "mean"), ("celeba", "a", 0, "brier", 0.0, "mean")]
    rows += [("celeba", "b", 0, "acc", 0.0, "mean"), ("celeba", "b", 0, "brier", 1.0, "mean")]
    rows += [
        ("celeba", "a", 0, "acc", 0.99, "t5"),
        ("celeba", "a", 0, "brier", 0.01, "t5"),
    ]  # b lacks t5
    df = _rows(rows)
    assert pairwise_wins(df, "a", "b") == (2, 5)
    assert pairwise_wins(df, "b", "a") == (1, 5)
    assert pairwise_wins(df, "a", "b", better_on=("acc",)) == (3, 5)
    with pytest.raises(ValueError, match="not in the table"):
        pairwise_wins(df, "a", "zz")


def test_format_wins():
    assert (
        format_wins("cog-fc", "ts", 32, 40)
        == "cog-fc beats ts on both accuracy and Brier on 32 of 40 tasks (80%)."
    )
    s = format_wins("a", "b", 1, 3, ("acc", "nll", "brier"), unit="datasets")
    assert s == "a beats b on all of accuracy, NLL and Brier on 1 of 3 datasets (33%)."
    assert format_wins("a", "b", 0, 0) == "a beats b on both accuracy and Brier on 0 of 0 tasks."


def test_pareto_front():
    pts = {
        "a": (0.05, 0.90),
        "b": (0.02, 0.80),
        "c": (0.03, 0.70),
        "d": (0.05, 0.90),
        "e": (0.06, 0.90),
        "f": (0.01, 0.60),
    }
    rows = []
    for m, (e, acc) in pts.items():
        rows += [("c10", m, 0, "ece_15", e), ("c10", m, 0, "acc", acc)]
    rows += [("c100", "a", 0, "ece_15", 0.1), ("c100", "a", 0, "acc", 0.5)]
    out = pareto_front(_rows(rows))
    c10 = out[out.dataset == "c10"]
    assert c10["method"].tolist() == ["f", "b", "a", "d"]  # c, e dominated; a, d identical
    assert out[out.dataset == "c100"]["method"].tolist() == ["a"]
    alt = pareto_front(_rows(rows + [("c10", "g", 0, "brier", 0.1)]), x="ece_15")
    assert "g" not in set(alt["method"])  # lacks the metrics
    with pytest.raises(ValueError, match="rmsce_15"):
        pareto_front(_rows(rows), x="rmsce_15")


@pytest.mark.slow
def test_stats_does_not_import_matplotlib():
    code = "import sys, cogcal.report.stats; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "a, b",
    [
        ([0.31, 0.35, 0.29, 0.40, 0.33], [0.30, 0.30, 0.27, 0.36, 0.34]),
        ([1.2, 0.9, 1.1], [1.0, 1.0, 0.7]),
        ([0.5, 0.7, 0.6, 0.65, 0.55, 0.8, 0.9], [0.52, 0.71, 0.58, 0.60, 0.58, 0.77, 0.86]),
    ],
)
def test_paired_matches_scipy(a, b):
    seeds = [3, 1, 4, 0, 2, 6, 5][: len(a)]
    t = paired(pd.Series(a, index=seeds), pd.Series(b, index=seeds), higher_is_better=False)
    ref = sps.ttest_rel(a, b)
    d = np.subtract(a, b)
    half = sps.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    assert t.n == len(a) and t.diff == pytest.approx(d.mean())
    assert t.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert (t.low, t.high) == pytest.approx((d.mean() - half, d.mean() + half))
    ci = ref.confidence_interval(0.95)
    assert (t.low, t.high) == pytest.approx((ci.low, ci.high))
    assert t.diffs == pytest.approx(tuple(d))


def test_paired_aligns_seeds_and_edge_cases():
    a = pd.Series([0.1, 0.2, np.nan, 0.4], index=[0, 1, 2, 3])
    b = pd.Series([0.0, 0.1, 0.3], index=[1, 2, 3])  # seeds 1 and 3 are paired only
    t = paired(a, b, higher_is_better=True)
    assert t.n == 2 and t.diffs == pytest.approx((0.2, 0.1))
    one = paired(pd.Series([0.5]), pd.Series([0.1]), higher_is_better=True)
    assert one.n == 1 and math.isnan(one.p) and one.verdict == "undecided"
    assert "n = 1" in one.text()
    assert (
        paired(pd.Series([0.5], index=[0]), pd.Series([0.1], index=[1]), higher_is_better=True)
        is None
    )
    same = paired(pd.Series([0.5, 0.75]), pd.Series([0.25, 0.5]), higher_is_better=False)
    assert same.p == 0.0 and same.low == same.high == 0.25  # identical differences
    zero = paired(pd.Series([0.3, 0.4]), pd.Series([0.3, 0.4]), higher_is_better=False)
    assert zero.p == 1.0


def test_holm_by_hand_and_verdicts():
    ps = [0.01, 0.04, 0.03, 0.005, float("nan")]
    tests = [Paired(0.1, 0.05, 0.15, p, 5, higher_is_better=False) for p in ps] + [None]
    out = holm(tests)
    # m = 4 p-values: sorted 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1, max 0.06)
    assert [round(t.p_adj, 6) for t in out[:4]] == [0.03, 0.06, 0.06, 0.02]
    assert math.isnan(out[4].p_adj) and out[5] is None
    assert [t.verdict for t in out[:4]] == ["worse", "undecided", "undecided", "worse"]
    better = holm([Paired(0.1, 0.05, 0.15, 0.001, 5, higher_is_better=True)])[0]
    assert better.verdict == "better" and better.p_adj == pytest.approx(0.001)
    assert Paired(0.1, 0.05, 0.15, 0.001, 5).verdict == "undecided"  # not adjusted yet
