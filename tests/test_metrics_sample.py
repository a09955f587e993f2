"""The sample-level metrics of evaluate (adaece_15, cwece_15, smece, aurc), the bootstrap
interval of ece_15 and the max-logit OOD score: direct definitions written plainly here,
relplot for smece, and the edge cases (ties, one sample, confidence 1.0, K = 2, multilabel).
The comparisons with netcal, scikit-learn and torch-uncertainty's formulas are in
tests/test_metrics_conventions.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from cogcal.metrics import ece_interval, evaluate, ood, ood_scores, sample

# ----------------------------------------------------------------------------- references


def _data(n=500, k=6, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z / 2.0, 1), 1, generator=g)[:, 0]
    return z, y


def _top(z, y):
    p = torch.softmax(z.double(), 1).numpy()
    return p.max(1), (p.argmax(1) == np.asarray(y)).astype(float)


def _adaece_direct(conf, correct, n_bins=15):
    """Sorted samples cut into array_split groups; a tied run cut by a boundary gives each
    group (its places in the group) x (the run's mean correctness)."""
    conf, correct = np.asarray(conf, float), np.asarray(correct, float)
    n = len(conf)
    order = np.argsort(conf, kind="stable")
    c = conf[order]
    run_mean = np.array([correct[conf == v].mean() for v in c])  # each place: its run's mean
    total = 0.0
    for g in np.array_split(np.arange(n), n_bins):
        if len(g):
            total += abs(run_mean[g].sum() - c[g].sum()) / n
    return total


def _aurc_over_orders(conf, correct):
    """Mean AURC over every order of the tied samples (the direct definition of the ties)."""
    conf, correct = np.asarray(conf, float), np.asarray(correct, float)
    values = []
    for perm in itertools.permutations(range(len(conf))):
        perm = np.array(perm)
        if np.any(np.diff(conf[perm]) > 0):  # keep the orders by decreasing confidence
            continue
        err = 1 - correct[perm]
        values.append(np.mean([err[:i].mean() for i in range(1, len(conf) + 1)]))
    return float(np.mean(values))


def _naive_ece(conf, correct, n_bins=15):
    conf, correct = np.asarray(conf, float), np.asarray(correct, float)
    b = np.minimum(np.floor(conf * n_bins), n_bins - 1)
    return sum(abs((correct - conf)[b == j].sum()) for j in range(n_bins)) / len(conf)


# ----------------------------------------------------------------------------- adaece_15


def test_adaece_with_ties_is_the_direct_definition_and_order_free():
    z, y = _data(n=203, k=3, seed=1)
    z = torch.round(z).clamp(-1, 1)  # few distinct confidences: runs cut by the boundaries
    p = torch.softmax(z, 1)  # probs=: the confidences tie exactly as in the reference
    conf, correct = _top(z, y)
    assert len(np.unique(conf)) < 15
    m = evaluate(labels=y, probs=p)
    assert m["adaece_15"] == pytest.approx(_adaece_direct(conf, correct), abs=1e-12)
    perm = torch.randperm(203, generator=torch.Generator().manual_seed(0))
    again = evaluate(labels=y[perm], probs=p[perm])["adaece_15"]
    assert again == pytest.approx(m["adaece_15"], abs=1e-12)
    # a plain array_split of one sort order differs: the tie handling matters here
    order = np.argsort(conf, kind="stable")
    plain = sum(abs(correct[order][g].sum() - conf[order][g].sum())
                for g in np.array_split(np.arange(203), 15)) / 203  # fmt: skip
    assert abs(plain - m["adaece_15"]) > 1e-4


def test_adaece_edge_cases():
    # constant confidence: one run, so every group has the overall accuracy
    z = torch.zeros(40, 2, dtype=torch.float64)
    y = torch.tensor([0] * 30 + [1] * 10)
    assert evaluate(z, y)["adaece_15"] == pytest.approx(0.25, abs=1e-12)
    # fewer samples than bins: one sample per group (the rest empty)
    z, y = _data(n=7, k=3, seed=2)
    conf, correct = _top(z, y)
    assert evaluate(z, y)["adaece_15"] == pytest.approx(np.mean(abs(correct - conf)), abs=1e-12)
    # one sample; all correct at confidence exactly 1.0; all wrong
    one = evaluate(torch.tensor([[2.0, 0.0]]), torch.tensor([1]))
    assert one["adaece_15"] == pytest.approx(1 / (1 + np.exp(-2.0)), abs=1e-12)
    sure = torch.tensor([[200.0, 0.0, 0.0]] * 20)
    assert evaluate(sure, torch.zeros(20, dtype=torch.long))["adaece_15"] == 0.0
    assert evaluate(sure, torch.ones(20, dtype=torch.long))["adaece_15"] == 1.0


# ----------------------------------------------------------------------------- cwece_15


def test_cwece_direct_definition_two_classes_and_binary():
    z, y = _data(n=300, k=2, seed=3)
    p = torch.softmax(z, 1).numpy()
    yn = y.numpy()
    ref = np.mean([_naive_ece(p[:, k], (yn == k).astype(float)) for k in range(2)])
    m = evaluate(z, y)
    assert m["cwece_15"] == pytest.approx(ref, abs=1e-12)
    # binary: the two classes 1 - p and p, the same as the two-class multiclass input
    zb = z[:, 1] - z[:, 0]
    assert evaluate(zb, y, task="binary")["cwece_15"] == pytest.approx(ref, abs=1e-12)
    # classes absent from the labels are counted (their ECE is the mean of p_k)
    z4, y4 = _data(n=200, k=4, seed=4)
    y4 = y4.clamp(max=1)
    p4 = torch.softmax(z4, 1).numpy()
    ref4 = np.mean([_naive_ece(p4[:, k], (y4.numpy() == k).astype(float)) for k in range(4)])
    assert evaluate(z4, y4)["cwece_15"] == pytest.approx(ref4, abs=1e-12)


def test_cwece_at_probability_one_and_zero():
    p = torch.tensor([[1.0, 0.0, 0.0]] * 3 + [[0.0, 0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 2])
    # class 0: bin 14 holds 3 samples at 1.0 with 2 positives; bin 0 one sample at 0.0
    ref = np.mean([abs(2 - 3) / 4, abs(1 - 0) / 4, 0.0])
    assert evaluate(labels=y, probs=p, eps=1e-15)["cwece_15"] == pytest.approx(ref, abs=1e-15)


# ----------------------------------------------------------------------------- smece


@pytest.mark.slow
def test_smece_matches_relplot_on_edge_cases():
    relplot = pytest.importorskip("relplot")
    rng = np.random.default_rng(0)
    c = rng.uniform(0.5, 1.0, 50_000)  # calibrated: a small bandwidth (a finer grid)
    h = (rng.uniform(size=50_000) < c).astype(float)
    z = torch.from_numpy(np.log(c / (1 - c)))  # binary logits with top-label confidence c
    cases = [
        (z, torch.from_numpy(h).long(), "binary", c, h),
        (torch.tensor([[2.0, 0.0]]), torch.tensor([1]), "multiclass", None, None),  # N = 1
        (torch.zeros(40, 3), torch.randint(0, 3, (40,)), "multiclass", None, None),  # constant
        (torch.tensor([[200.0, 0.0]] * 9), torch.zeros(9, dtype=torch.long), "multiclass",
         None, None),  # all correct at 1.0
        (torch.tensor([[200.0, 0.0]] * 9), torch.ones(9, dtype=torch.long), "multiclass",
         None, None),  # all wrong at 1.0
    ]  # fmt: skip
    for z_, y_, task, conf, correct in cases:
        if conf is None:
            conf, correct = _top(z_, y_)
        got = evaluate(z_, y_, task=task, n_bins=15)["smece"]
        assert got == pytest.approx(relplot.smECE(conf, correct), abs=1e-9), task


def test_smece_multilabel_per_task():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(300, 3, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 2, (300, 3), generator=g)
    m = evaluate(z, y, task="multilabel", n_bins=15)
    per = [evaluate(z[:, j], y[:, j], task="binary", n_bins=15) for j in range(3)]
    for key in ("smece", "aurc", "adaece_15", "cwece_15"):
        for j in range(3):
            assert m[f"{key}/t{j}"] == pytest.approx(per[j][key], abs=1e-14)
        assert m[key] == pytest.approx(np.mean([d[key] for d in per]), abs=1e-14)


def test_smece_does_not_depend_on_the_sets_evaluated_before():
    """The kernels' spectra and interpolation weights are cached across calls (the 20 shift
    sets of a run share most bandwidths); a value is the same, bit for bit, with or
    without them."""
    sets = [_data(n=n, seed=s) for n, s in ((400, 1), (2000, 2), (60, 3))]
    sample._gaussian_spectrum.cache_clear()
    sample._interpolation.cache_clear()
    fresh = []
    for z, y in sets:
        fresh.append(evaluate(z, y)["smece"])
        sample._gaussian_spectrum.cache_clear()
        sample._interpolation.cache_clear()
    warm = [evaluate(z, y)["smece"] for z, y in sets + sets]
    assert sample._gaussian_spectrum.cache_info().hits > 0
    assert warm == fresh + fresh


# ----------------------------------------------------------------------------- aurc


def test_aurc_ties_are_the_mean_over_orders():
    conf = np.array([0.9, 0.9, 0.9, 0.7, 0.7, 0.6])
    correct = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    p = np.stack([conf, 1 - conf], 1)
    y = torch.from_numpy((correct == 0).astype(np.int64))  # class 0 is the prediction
    got = evaluate(labels=y, probs=torch.from_numpy(p), n_bins=15)["aurc"]
    assert got == pytest.approx(_aurc_over_orders(conf, correct), abs=1e-12)


def test_aurc_edge_cases():
    sure = torch.tensor([[200.0, 0.0, 0.0]] * 8)
    assert evaluate(sure, torch.zeros(8, dtype=torch.long))["aurc"] == 0.0  # all correct
    assert evaluate(sure, torch.ones(8, dtype=torch.long))["aurc"] == 1.0  # all wrong
    assert evaluate(torch.tensor([[2.0, 0.0]]), torch.tensor([1]))["aurc"] == 1.0  # N = 1
    # constant confidence: every position's expected risk is the error rate
    z = torch.zeros(10, 2)
    y = torch.tensor([0] * 7 + [1] * 3)
    assert evaluate(z, y)["aurc"] == pytest.approx(0.3, abs=1e-15)
    # the errors ranked last: (1/N) sum_i (#errors among the i first) / i
    z = torch.tensor([[4.0, 0.0], [3.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
    y = torch.tensor([0, 0, 1, 1])
    assert evaluate(z, y)["aurc"] == pytest.approx((0 + 0 + 1 / 3 + 2 / 4) / 4, abs=1e-15)


# ----------------------------------------------------------------------------- intervals


def test_interval_is_a_plain_percentile_bootstrap():
    z, y = _data(n=400, k=5, seed=6)
    conf, correct = _top(z, y)
    rng = np.random.default_rng(3)
    draws = rng.integers(0, 400, size=(300, 400))  # one chunk: the same draws as cogcal
    boot = [_naive_ece(conf[d], correct[d]) for d in draws]  # bins of the resampled values
    low, high = np.quantile(boot, [0.05, 0.95])
    assert ece_interval(z, y, level=0.9, n_boot=300, seed=3) == pytest.approx((low, high))
    m = evaluate(z, y, intervals=True, n_boot=300, seed=3, n_bins=15)
    ref = ece_interval(z, y, n_boot=300, seed=3)
    assert (m["ece_15_low"], m["ece_15_high"]) == ref
    assert ref[0] < m["ece_15"] < ref[1]
    assert ece_interval(z, y, n_boot=300, seed=4) != ref  # the seed matters
    assert ece_interval(labels=y, probs=torch.softmax(z, 1), n_boot=300, seed=3) == pytest.approx(
        ref, abs=1e-12
    )


def test_interval_keys_multilabel_and_one_sample():
    g = torch.Generator().manual_seed(7)
    z = torch.randn(200, 2, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 2, (200, 2), generator=g)
    m = evaluate(z, y, task="multilabel", task_names=["a", "b"], n_bins=15, intervals=True)
    for name, j in (("a", 0), ("b", 1)):
        alone = ece_interval(z[:, j], y[:, j], task="binary", n_boot=1000, seed=0)
        assert (m[f"ece_15_low/{name}"], m[f"ece_15_high/{name}"]) == pytest.approx(alone)
    assert (m["ece_15_low"], m["ece_15_high"]) == ece_interval(z, y, task="multilabel")
    plain = [k for k in m if "/" not in k]
    assert plain[-2:] == ["ece_15_low", "ece_15_high"] and "/" in list(m)[len(plain)]
    assert "ece_15_low" not in evaluate(z, y, task="multilabel")  # off by default
    one = evaluate(torch.tensor([[2.0, 0.0]]), torch.tensor([0]), intervals=True)
    assert one["ece_15_low"] == one["ece_15_high"] == pytest.approx(one["ece_15"])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"level": 1.0}, "`level` must be a number in"),
        ({"level": "0.9"}, "`level`"),
        ({"n_boot": 0}, "`n_boot` must be an integer >= 1"),
        ({"n_boot": 10.0}, "`n_boot`"),
        ({"seed": -1}, "`seed` must be an integer from 0 to"),
        ({"seed": None}, "`seed`"),
        ({"n_bins": (10, 15)}, "`n_bins` must be an integer >= 1"),
    ],
)
def test_interval_bad_arguments(kw, match):
    z, y = _data(n=20, k=3)
    with pytest.raises(ValueError, match=match):
        ece_interval(z, y, **kw)
    if "level" not in kw and "n_bins" not in kw:
        with pytest.raises(ValueError, match=match):
            evaluate(z, y, intervals=True, **kw)


# ----------------------------------------------------------------------------- OOD max logit


def test_maxlogit_score():
    g = torch.Generator().manual_seed(8)
    zi = torch.randn(300, 5, generator=g, dtype=torch.float64) * 3
    zo = torch.randn(200, 5, generator=g, dtype=torch.float64)
    zo[:20] = zi[:20]  # ties
    s = ood_scores(zi, score="maxlogit")
    assert torch.equal(s, zi.max(1).values)
    o = ood(zi, zo, score="maxlogit")
    si, so = zi.max(1).values.numpy(), zo.max(1).values.numpy()
    target = np.r_[np.ones(300), np.zeros(200)]
    assert o["auroc"] == pytest.approx(roc_auc_score(target, np.r_[si, so]), abs=1e-12)
    t = np.sort(si)[::-1][int(np.ceil(0.95 * 300)) - 1]
    assert o["fpr95"] == pytest.approx(np.mean(so >= t), abs=1e-12)
    # binary: the logits (0, z), so max(0, z); float32 input is scored in float64
    zb = torch.tensor([-1.0, 0.5, 2.0])
    assert ood_scores(zb, score="maxlogit", task="binary").tolist() == [0.0, 0.5, 2.0]
    assert ood_scores(zi.float(), score="maxlogit").dtype == torch.float64
    with pytest.raises(ValueError, match="score='maxlogit'.*needs logits"):
        ood(id_probs=torch.softmax(zi, 1), ood_logits=zo, score="maxlogit")
    with pytest.raises(ValueError, match="'maxlogit'"):
        ood(zi, zo, score="max_logit")
