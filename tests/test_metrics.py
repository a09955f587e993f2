"""Tests of cogcal.metrics against independent references (scikit-learn, torchmetrics,
naive per-sample loops and hand computations)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss, roc_auc_score
from torchmetrics.functional.classification import multiclass_calibration_error

from cogcal.metrics import (
    DEFAULT_N_BINS,
    StreamingMetrics,
    evaluate,
    ood,
    ood_scores,
    reliability_bins,
)

# ----------------------------------------------------------------------------- helpers


def _data(n=600, k=7, scale=2.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, k, generator=g, dtype=torch.float64) * scale).to(dtype)
    labels = torch.randint(0, k, (n,), generator=g)
    return logits, labels


def _softmax_np(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _naive_width(conf, correct, n_bins):
    """ECE, RMSCE, MCE by an explicit loop over bins with interval tests."""
    conf = np.asarray(conf, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    n = len(conf)
    ece = ms = 0.0
    mce = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        inside = (conf >= lo) & ((conf < hi) if b < n_bins - 1 else (conf <= 1.0))
        if not inside.any():
            continue
        gap = abs(correct[inside].mean() - conf[inside].mean())
        ece += inside.sum() / n * gap
        ms += inside.sum() / n * gap**2
        mce = max(mce, gap)
    return ece, math.sqrt(ms), mce


def _naive_groups(conf, correct, groups):
    n = len(conf)
    ece = ms = mce = 0.0
    for g in groups:
        if len(g) == 0:
            continue
        gap = abs(correct[g].mean() - conf[g].mean())
        ece += len(g) / n * gap
        ms += len(g) / n * gap**2
        mce = max(mce, gap)
    return ece, math.sqrt(ms), mce


def _naive_classwise(p, labels, n_bins):
    k = p.shape[1]
    return np.mean(
        [_naive_width(p[:, j], (labels == j).astype(float), n_bins)[0] for j in range(k)]
    )


# ----------------------------------------------------------------------------- multiclass


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_multiclass_against_references(scale):
    logits, labels = _data(scale=scale, seed=1)
    m = evaluate(logits, labels)
    p = _softmax_np(logits.numpy())
    y = labels.numpy()
    assert m["acc"] == pytest.approx(accuracy_score(y, p.argmax(1)), abs=1e-15)
    assert m["nll"] == pytest.approx(log_loss(y, p, labels=range(7)), rel=1e-10)
    ref_brier = sum(brier_score_loss(y == j, p[:, j]) for j in range(7))
    assert m["brier"] == pytest.approx(ref_brier, rel=1e-10)
    conf, correct = p.max(1), (p.argmax(1) == y)
    for b in DEFAULT_N_BINS:
        ece, rmsce, mce = _naive_width(conf, correct, b)
        assert m[f"ece_{b}"] == pytest.approx(ece, abs=1e-12)
        assert m[f"rmsce_{b}"] == pytest.approx(rmsce, abs=1e-12)
        assert m[f"mce_{b}"] == pytest.approx(mce, abs=1e-12)
        for norm, key in (("l1", "ece"), ("l2", "rmsce"), ("max", "mce")):
            tm = multiclass_calibration_error(
                torch.from_numpy(p), labels, num_classes=7, n_bins=b, norm=norm
            )
            assert m[f"{key}_{b}"] == pytest.approx(float(tm), abs=2e-6)  # float32 inside


SAMPLE_KEYS = ["cwece_15", "adaece_15", "smece", "aurc"]  # always reported, after the binned


def test_default_keys_and_no_silent_extras():
    logits, labels = _data(n=50)
    m = evaluate(logits, labels)
    want = ["acc", "nll", "brier"] + [
        f"{k}_{b}" for k in ("ece", "rmsce", "mce") for b in DEFAULT_N_BINS
    ]
    assert list(m) == want + SAMPLE_KEYS
    assert all(isinstance(v, float) for v in m.values())
    assert list(evaluate(logits, labels, n_bins=15, classwise=True)) == [
        "acc", "nll", "brier", "ece_15", "rmsce_15", "mce_15", *SAMPLE_KEYS,
    ]  # fmt: skip
    assert list(evaluate(logits, labels, n_bins=10, classwise=True)) == [
        "acc", "nll", "brier", "ece_10", "rmsce_10", "mce_10", "cwece_10", *SAMPLE_KEYS,
    ]  # fmt: skip
    assert list(evaluate(logits, labels, n_bins=15, binning="mass")) == [
        "acc", "nll", "brier", "cwece_15", "ece_mass_15", "rmsce_mass_15", "mce_mass_15",
        *SAMPLE_KEYS[1:],
    ]  # fmt: skip
    with_intervals = evaluate(logits, labels, n_bins=15, intervals=True)
    assert list(with_intervals) == [
        *evaluate(logits, labels, n_bins=15),
        "ece_15_low",
        "ece_15_high",
    ]


def test_confidence_exactly_one_goes_to_last_closed_bin():
    # float32 logits [100, 0, 0] give a top-label confidence of exactly 1.0
    z = torch.tensor([[100.0, 0, 0], [100.0, 0, 0], [0.0, 0, 0]], dtype=torch.float32)
    assert float(torch.softmax(z, 1)[0].max()) == 1.0
    y = torch.tensor([0, 1, 0])
    m = evaluate(z, y, n_bins=10)
    # bin 9: two samples, conf 1, acc 1/2; bin 3: one sample, conf 1/3, acc 1
    third = float(torch.tensor(1 / 3, dtype=torch.float32))
    assert m["ece_10"] == pytest.approx(2 / 3 * 0.5 + 1 / 3 * (1 - third), abs=1e-7)
    assert m["rmsce_10"] == pytest.approx(math.sqrt(2 / 3 * 0.25 + 1 / 3 * (1 - third) ** 2))
    assert m["mce_10"] == pytest.approx(1 - third, abs=1e-7)
    b = reliability_bins(z, y, n_bins=10)
    assert b["count"].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 2]


def test_one_point_zero_shares_last_bin_unlike_torchmetrics():
    # c = 1.0 and c ~ 0.95 share our closed bin 9 of 10; torchmetrics puts 1.0 apart.
    z = torch.tensor([[100.0, 0.0], [math.log(19.0), 0.0]], dtype=torch.float32)
    y = torch.tensor([1, 0])  # the c = 1 sample is wrong, the c = 0.95 one right
    c2 = float(torch.softmax(z, 1)[1, 0])
    m = evaluate(z, y, n_bins=10)
    ours = abs(0.5 - (1.0 + c2) / 2)  # one bin holding both samples
    assert m["ece_10"] == pytest.approx(ours, abs=1e-7)
    tm = float(multiclass_calibration_error(torch.softmax(z, 1), y, num_classes=2, n_bins=10))
    assert tm == pytest.approx(0.5 * 1.0 + 0.5 * (1 - c2), abs=1e-6)
    assert tm - m["ece_10"] == pytest.approx(0.05, abs=1e-6)


def test_bin_edges_are_exact_for_float32():
    p32 = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.2, 0.8]], dtype=torch.float32)
    # float32(0.6) = 0.6000000238 > 0.6 -> bin 3 of 5; 0.5 -> bin 2; float32(0.8) > 0.8 -> 4
    b = reliability_bins(None, torch.tensor([0, 0, 1]), n_bins=5, probs=p32)
    assert b["count"].tolist() == [0, 0, 1, 1, 1]
    b2 = reliability_bins(torch.zeros(1, 2), torch.tensor([0]), n_bins=2)  # c = 0.5 exactly
    assert b2["count"].tolist() == [0, 1]
    assert np.isnan(b2["confidence"][0]) and b2["confidence"][1] == 0.5


def test_empty_bins_and_n_equals_one():
    z = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    c = 1 / (1 + math.exp(-2.0))
    m = evaluate(z, torch.tensor([1]))
    assert m["acc"] == 0.0
    assert m["nll"] == pytest.approx(math.log1p(math.exp(2.0)))
    assert m["brier"] == pytest.approx(2 * c**2)
    for b in DEFAULT_N_BINS:
        assert m[f"ece_{b}"] == pytest.approx(c)
        assert m[f"rmsce_{b}"] == pytest.approx(c)
        assert m[f"mce_{b}"] == pytest.approx(c)
    mass = evaluate(z, torch.tensor([1]), binning="mass", n_bins=(5, 100))
    assert mass["ece_mass_100"] == pytest.approx(c) and mass["mce_mass_5"] == pytest.approx(c)


def test_classes_absent_from_labels():
    logits, _ = _data(n=300, k=5, seed=3)
    labels = torch.randint(0, 2, (300,), generator=torch.Generator().manual_seed(4))
    m = evaluate(logits, labels, n_bins=(10, 15), classwise=True)
    p = _softmax_np(logits.numpy())
    assert m["nll"] == pytest.approx(log_loss(labels.numpy(), p, labels=range(5)), rel=1e-10)
    for b in (10, 15):
        ref = _naive_classwise(p, labels.numpy(), b)
        assert m[f"cwece_{b}"] == pytest.approx(ref, abs=1e-12)
    assert math.isfinite(m["ece_15"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_match_float64(dtype):
    logits, labels = _data(n=2000, k=10, scale=3.0, seed=5, dtype=dtype)
    m = evaluate(logits, labels, n_bins=(15,), classwise=True)
    ref = evaluate(logits.double(), labels, n_bins=(15,), classwise=True)  # same values
    for key in ("acc", "nll", "brier"):
        assert m[key] == pytest.approx(ref[key], abs=1e-6), key
    for key in ("ece_15", "rmsce_15", "mce_15", "cwece_15"):
        assert m[key] == pytest.approx(ref[key], abs=1e-4), key  # float32 vs float64 softmax


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_multilabel(dtype):
    g = torch.Generator().manual_seed(6)
    z = (torch.randn(500, 3, generator=g) * 4).to(dtype)
    y = torch.randint(0, 2, (500, 3), generator=g)
    m = evaluate(z, y, task="multilabel", n_bins=(10,))
    ref = evaluate(z.double(), y, task="multilabel", n_bins=(10,))
    assert list(m) == list(ref)
    for key in ref:
        assert m[key] == pytest.approx(ref[key], abs=1e-5), key


def test_half_logits_with_saturated_confidence():
    z = torch.tensor([[60.0, -60.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float16)
    m = evaluate(z, torch.tensor([0, 2]))
    assert all(math.isfinite(v) for v in m.values())
    ref = evaluate(z.double(), torch.tensor([0, 2]))
    assert m["nll"] == pytest.approx(ref["nll"], rel=1e-6)


def test_probs_path_matches_logits_path():
    logits, labels = _data(n=400, k=6, seed=7)
    p = torch.softmax(logits, 1)
    a = evaluate(logits, labels, n_bins=(10, 15), classwise=True)
    b = evaluate(None, labels, probs=p, n_bins=(10, 15), classwise=True)
    for key in a:
        assert b[key] == pytest.approx(a[key], abs=1e-10), key


def test_probs_with_zero_true_probability_gives_infinite_nll():
    with pytest.warns(UserWarning, match="1 sample"):
        m = evaluate(None, torch.tensor([1]), probs=torch.tensor([[1.0, 0.0]]))
    assert m["nll"] == math.inf and m["brier"] == 2.0


# ----------------------------------------------------------------------------- mass binning


def test_equal_mass_against_array_split():
    logits, labels = _data(n=503, k=4, seed=8)
    p = _softmax_np(logits.numpy())
    conf, correct = p.max(1), (p.argmax(1) == labels.numpy()).astype(float)
    m = evaluate(logits, labels, binning="mass", n_bins=(5, 15, 100))
    order = np.argsort(conf, kind="stable")
    n = len(conf)
    for b in (5, 15, 100):  # documented: bin b starts at the floor(b n / B)-th smallest value
        groups = np.split(order, [j * n // b for j in range(1, b)])
        assert max(map(len, groups)) - min(map(len, groups)) <= 1
        ref = _naive_groups(conf, correct, groups)
        assert m[f"ece_mass_{b}"] == pytest.approx(ref[0], abs=1e-12)
        assert m[f"rmsce_mass_{b}"] == pytest.approx(ref[1], abs=1e-12)
        assert m[f"mce_mass_{b}"] == pytest.approx(ref[2], abs=1e-12)


def test_equal_mass_ties_share_a_bin():
    z = torch.zeros(10, 2)  # every confidence is 0.5
    y = torch.tensor([0] * 3 + [1] * 7)
    m = evaluate(z, y, binning="mass", n_bins=5)
    assert m["ece_mass_5"] == pytest.approx(abs(0.3 - 0.5))  # one bin, order-independent
    assert m["mce_mass_5"] == pytest.approx(0.2)


def test_equal_mass_classwise():
    logits, labels = _data(n=300, k=3, seed=9)
    p = _softmax_np(logits.numpy())
    m = evaluate(logits, labels, binning="mass", n_bins=10, classwise=True)
    refs = []
    for j in range(3):
        order = np.argsort(p[:, j], kind="stable")
        yj = (labels.numpy() == j).astype(float)
        groups = np.split(order, [i * 300 // 10 for i in range(1, 10)])
        refs.append(_naive_groups(p[:, j], yj, groups)[0])
    assert m["cwece_mass_10"] == pytest.approx(np.mean(refs), abs=1e-12)


# ----------------------------------------------------------------------------- binary / multilabel


def test_binary_against_sklearn():
    g = torch.Generator().manual_seed(10)
    z = torch.randn(500, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 2, (500,), generator=g)
    m = evaluate(z, y, task="binary")
    p = torch.sigmoid(z).numpy()
    assert m["nll"] == pytest.approx(log_loss(y.numpy(), p), rel=1e-10)
    assert m["brier"] == pytest.approx(brier_score_loss(y.numpy(), p), rel=1e-10)
    assert m["acc"] == pytest.approx(accuracy_score(y.numpy(), p > 0.5))
    conf, correct = np.maximum(p, 1 - p), ((p > 0.5) == y.numpy())
    for b in DEFAULT_N_BINS:
        ref = _naive_width(conf, correct, b)
        assert (m[f"ece_{b}"], m[f"rmsce_{b}"], m[f"mce_{b}"]) == pytest.approx(ref, abs=1e-12)
    # (N, 1) is the same as (N,); probabilities through probs=
    assert evaluate(z[:, None], y[:, None], task="binary") == m
    mp = evaluate(None, y, task="binary", probs=torch.sigmoid(z))
    for key in m:
        assert mp[key] == pytest.approx(m[key], abs=1e-9)


def test_binary_extreme_logits_are_stable():
    z = torch.tensor([800.0, -800.0, 0.0], dtype=torch.float64)
    m = evaluate(z, torch.tensor([0, 0, 1]), task="binary", n_bins=10)
    assert m["nll"] == pytest.approx((800.0 + 0.0 + math.log(2)) / 3)
    assert m["acc"] == pytest.approx(1 / 3)  # z = 0 predicts class 0


def test_multilabel_means_and_per_task():
    g = torch.Generator().manual_seed(11)
    z = torch.randn(400, 3, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 2, (400, 3), generator=g)
    names = ["smile", "hat", "glasses"]
    m = evaluate(z, y, task="multilabel", task_names=names, n_bins=(10, 15), classwise=True)
    per = [
        evaluate(z[:, j], y[:, j], task="binary", n_bins=(10, 15), classwise=True) for j in range(3)
    ]
    plain = [k for k in per[0] if "positive" not in k]  # positive-class keys are opt-in
    for key in plain:
        for j, name in enumerate(names):
            assert m[f"{key}/{name}"] == pytest.approx(per[j][key], abs=1e-14)
        assert m[key] == pytest.approx(np.mean([d[key] for d in per]), abs=1e-14)
    assert list(m)[: len(plain)] == plain  # plain keys come first
    both = evaluate(z, y, task="multilabel", n_bins=(10, 15), positive_class=True)
    for key in per[0]:
        if key.startswith("cwece"):
            continue
        for j in range(3):
            assert both[f"{key}/t{j}"] == pytest.approx(per[j][key], abs=1e-14)
        assert both[key] == pytest.approx(np.mean([d[key] for d in per]), abs=1e-14)
    default = evaluate(z, y, task="multilabel", n_bins=15)
    assert "acc/t0" in default and "ece_15/t2" in default
    mass = evaluate(z, y, task="multilabel", n_bins=15, binning="mass")
    pm = evaluate(z[:, 1], y[:, 1], task="binary", n_bins=15, binning="mass")
    assert mass["ece_mass_15/t1"] == pytest.approx(pm["ece_mass_15"], abs=1e-14)


# ----------------------------------------------------------------------------- streaming


@pytest.mark.parametrize(
    "task",
    [
        pytest.param("multiclass", marks=pytest.mark.slow),
        "binary",
        pytest.param("multilabel", marks=pytest.mark.slow),
    ],
)
def test_streaming_equals_one_shot(task):
    g = torch.Generator().manual_seed(12)
    if task == "multiclass":
        z, y = torch.randn(1000, 5, generator=g), torch.randint(0, 5, (1000,), generator=g)
    elif task == "binary":
        z, y = torch.randn(1000, generator=g), torch.randint(0, 2, (1000,), generator=g)
    else:
        z, y = torch.randn(1000, 4, generator=g), torch.randint(0, 2, (1000, 4), generator=g)
    ref = evaluate(z, y, task=task, classwise=True)
    s = StreamingMetrics(task=task, classwise=True)
    for i in range(0, 1000, 96):
        s.update(z[i : i + 96], y[i : i + 96])
    out = s.compute()
    # the sample-level keys are one-shot only (they need every sample)
    assert list(out) == [k for k in ref if k.split("/")[0] not in SAMPLE_KEYS[1:]]
    # float32 sigmoid/exp may differ by 1 ulp between chunk sizes (vectorised tails)
    tol = 1e-12 if task == "multiclass" else 1e-9
    for key in out:
        assert out[key] == pytest.approx(ref[key], abs=tol), key
    # two "processes", merged; and a state_dict round trip with a SUM reduction
    a, b = StreamingMetrics(task=task, classwise=True), StreamingMetrics(task=task, classwise=True)
    a.update(z[:300], y[:300])
    b.update(z[300:], y[300:])
    merged = a.merge(b).compute()
    for key in out:
        assert merged[key] == pytest.approx(ref[key], abs=tol)
    c, d = StreamingMetrics(task=task, classwise=True), StreamingMetrics(task=task, classwise=True)
    c.update(z[:700], y[:700])
    d.update(z[700:], y[700:])
    summed = {k: v + d.state_dict()[k] for k, v in c.state_dict().items()}
    e = StreamingMetrics(task=task, classwise=True)
    e.load_state_dict(summed)
    for key in out:
        assert e.compute()[key] == pytest.approx(ref[key], abs=tol)


def test_streaming_memory_is_independent_of_n():
    s = StreamingMetrics(n_bins=(15, 100))
    s.update(*_data(n=10, k=3))
    size = {k: tuple(v.shape) for k, v in s.state_dict().items()}
    s.update(*_data(n=5000, k=3))
    assert {k: tuple(v.shape) for k, v in s.state_dict().items()} == size
    assert sum(v.numel() for v in s.state_dict().values()) < 1000


def test_streaming_reset_errors_and_mass():
    s = StreamingMetrics(num_classes=3)
    assert float(s.state_dict()["n"]) == 0  # allocated up front
    with pytest.raises(ValueError, match="no samples"):
        s.compute()
    z, y = _data(n=40, k=3)
    s.update(z, y)
    s.reset()
    with pytest.raises(ValueError, match="no samples"):
        s.compute()
    s.update(z, y)
    one_shot = evaluate(z, y)
    assert s.compute() == pytest.approx({k: one_shot[k] for k in s.compute()})
    with pytest.raises(ValueError, match="4 classes"):
        s.update(*_data(n=10, k=4))
    with pytest.raises(ValueError, match="equal-mass"):
        StreamingMetrics(binning="mass")
    with pytest.raises(ValueError, match="different settings"):
        s.merge(StreamingMetrics(n_bins=15).merge(_filled(n_bins=15)))
    with pytest.raises(ValueError, match="missing keys"):
        StreamingMetrics(n_bins=10).load_state_dict(s.state_dict())


def _filled(**kw):
    m = StreamingMetrics(**kw)
    m.update(*_data(n=20, k=3))
    return m


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("logits", "labels", "kw", "match"),
    [
        (torch.tensor([[0.0, float("nan")]]), torch.tensor([0]), {}, "NaN"),
        (torch.tensor([[0.0, float("inf")]]), torch.tensor([0]), {}, "infinite"),
        (torch.zeros(3, 2), torch.tensor([0, 1]), {}, "3 rows"),
        (torch.zeros(2, 2), torch.tensor([0, 2]), {}, r"\[0, 1\]"),
        (torch.zeros(2, 2), torch.tensor([-1, 0]), {}, r"\[0, 1\]"),
        (torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), {}, "empty"),
        (torch.zeros(2), torch.tensor([0, 1]), {}, "2-D"),
        (torch.zeros(2, 2), torch.tensor([0, 1]), {"n_bins": 0}, "positive"),
        (torch.zeros(2, 2), torch.tensor([0, 1]), {"n_bins": (10, 1.5)}, "positive"),
        (torch.zeros(2, 2), torch.tensor([0, 1]), {"binning": "quantile"}, "binning"),
        (torch.zeros(2, 2), torch.tensor([0, 1]), {"task": "multi"}, "task"),
        (torch.zeros(2, 2), torch.tensor([0, 2]), {"task": "multilabel"}, "shape"),
        (
            torch.zeros(2, 2),
            torch.ones(2, 2),
            {"task": "multilabel", "task_names": ["a"]},
            "1 name",
        ),
        (torch.zeros(2), torch.tensor([0, 2]), {"task": "binary"}, "0/1"),
        (
            torch.zeros(2, 2),
            torch.tensor([0, 1]),
            {"probs": torch.full((2, 2), 0.5)},
            "exactly one",
        ),
        (None, torch.tensor([0, 1]), {}, "exactly one"),
        (None, torch.tensor([0, 1]), {"probs": torch.tensor([[0.5, 0.6], [0.5, 0.5]])}, "sum to 1"),
        (
            None,
            torch.tensor([0, 1]),
            {"probs": torch.tensor([[1.5, -0.5], [0.5, 0.5]])},
            r"\[0, 1\]",
        ),
        (
            None,
            torch.tensor([0, 1]),
            {"probs": torch.tensor([2.0, 0.5]), "task": "binary"},
            r"\[0, 1\]",
        ),
    ],
)
def test_bad_input_raises(logits, labels, kw, match):
    with pytest.raises(ValueError, match=match):
        evaluate(logits, labels, **kw)


def test_probability_tolerance_depends_on_dtype():
    p = torch.tensor([[0.3, 0.7002]])  # off by 2e-4: rejected in float32
    with pytest.raises(ValueError, match="row 0"):
        evaluate(None, torch.tensor([1]), probs=p)
    p16 = torch.softmax(torch.randn(50, 100), 1).half()  # float16 rounding of a softmax
    evaluate(None, torch.zeros(50, dtype=torch.long), probs=p16)


# ----------------------------------------------------------------------------- OOD


def test_ood_auroc_against_sklearn_with_ties():
    g = torch.Generator().manual_seed(13)
    zi = torch.randn(300, 5, generator=g) * 3
    zo = torch.randn(200, 5, generator=g)
    zi[:50] = torch.tensor([100.0, 0, 0, 0, 0])  # many tied confidences of exactly 1.0
    zo[:20] = torch.tensor([100.0, 0, 0, 0, 0])
    for score in ("msp", "energy", "entropy"):
        si, so = ood_scores(zi, score=score).numpy(), ood_scores(zo, score=score).numpy()
        y = np.r_[np.ones(len(si)), np.zeros(len(so))]
        ref = roc_auc_score(y, np.r_[si, so])
        assert ood(zi, zo, score=score)["auroc"] == pytest.approx(ref, abs=1e-12)
    rounded_i, rounded_o = (
        torch.randint(0, 4, (100, 1)).float(),
        torch.randint(0, 4, (80, 1)).float(),
    )
    ri = torch.cat([rounded_i, torch.zeros_like(rounded_i)], 1)
    ro = torch.cat([rounded_o, torch.zeros_like(rounded_o)], 1)
    y = np.r_[np.ones(100), np.zeros(80)]
    ref = roc_auc_score(y, np.r_[rounded_i[:, 0].numpy(), rounded_o[:, 0].numpy()])
    assert ood(ri, ro, score="energy")["auroc"] == pytest.approx(ref, abs=1e-12)


def test_ood_scores_formulas():
    z = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    p = _softmax_np(z.numpy())
    assert ood_scores(z, score="msp").numpy() == pytest.approx(p.max(1))
    assert ood_scores(z, score="energy").numpy() == pytest.approx(np.log(np.exp(z.numpy()).sum(1)))
    assert ood_scores(z, score="entropy").numpy() == pytest.approx((p * np.log(p)).sum(1))
    assert ood_scores(torch.tensor([0.0, 2.0]), task="binary").numpy() == pytest.approx(
        [0.5, 1 / (1 + math.exp(-2))]
    )


def _scores_to_logits(s):
    """2-class logits whose energy score (logsumexp) is s... use msp-free: energy of (s, -inf)."""
    s = torch.as_tensor(s, dtype=torch.float64)
    return torch.stack([s, torch.full_like(s, -1e4)], 1)


def test_fpr95_hand_computation_with_ties():
    # ID scores 20..1 (N = 20): ceil(0.95 * 20) = 19 -> threshold = 19th largest = 2
    si = torch.arange(20, 0, -1).double()
    so = torch.tensor([2.0, 2.0, 1.5, 3.0, 0.0])  # >= 2: 2, 2, 3 -> 3 / 5
    out = ood(_scores_to_logits(si), _scores_to_logits(so), score="energy")
    assert out["fpr95"] == pytest.approx(3 / 5)
    # N = 10: ceil(9.5) = 10 -> threshold = the smallest ID score
    si = torch.tensor([5.0, 5, 5, 4, 4, 4, 3, 3, 1, 1])
    so = torch.tensor([0.5, 1.0, 2.0, 6.0])
    out = ood(_scores_to_logits(si), _scores_to_logits(so), score="energy")
    assert out["fpr95"] == pytest.approx(3 / 4)
    # brute force the definition: largest t with #(ID >= t) >= 0.95 N
    g = torch.Generator().manual_seed(14)
    si = torch.randint(0, 30, (137,), generator=g).double()
    so = torch.randint(0, 30, (91,), generator=g).double()
    cands = [t for t in si.unique().tolist() if (si >= t).sum() >= 0.95 * len(si)]
    t = max(cands)
    out = ood(_scores_to_logits(si), _scores_to_logits(so), score="energy")
    assert out["fpr95"] == pytest.approx(float((so >= t).double().mean()))


def test_ood_bad_input():
    with pytest.raises(ValueError, match="classes"):
        ood(torch.zeros(3, 4), torch.zeros(3, 5))
    with pytest.raises(ValueError, match="score"):
        ood(torch.zeros(3, 4), torch.zeros(3, 4), score="odin")
    with pytest.raises(ValueError, match="NaN"):
        ood(torch.zeros(3, 4), torch.full((3, 4), float("nan")))
    with pytest.raises(ValueError, match="empty"):
        ood(torch.zeros(3, 4), torch.zeros(0, 4))
    with pytest.raises(ValueError, match="task"):
        ood(torch.zeros(3, 4), torch.zeros(3, 4), task="multilabel")


def test_reliability_bins_shapes_and_values():
    logits, labels = _data(n=300, k=4, seed=15)
    b = reliability_bins(logits, labels, n_bins=12)
    assert b["count"].shape == b["confidence"].shape == b["accuracy"].shape == (12,)
    assert b["edges"].shape == (13,) and b["count"].sum() == 300
    ece = np.nansum(b["count"] * np.abs(b["accuracy"] - b["confidence"])) / 300
    assert ece == pytest.approx(evaluate(logits, labels, n_bins=12)["ece_12"], abs=1e-12)
    g = torch.Generator().manual_seed(16)
    ml = reliability_bins(
        torch.randn(50, 3, generator=g), torch.randint(0, 2, (50, 3), generator=g),
        n_bins=5, task="multilabel",
    )  # fmt: skip
    assert ml["count"].shape == (3, 5) and ml["edges"].shape == (6,)
    assert (ml["count"].sum(1) == 50).all()
    with pytest.raises(ValueError, match="n_bins"):
        reliability_bins(logits, labels, n_bins=(5, 10))


# ----------------------------------------------------------------------------- positive class


def test_positive_class_option():
    z2, y = _data(n=300, k=2, seed=20)
    default = evaluate(z2, y, n_bins=(10, 15))
    assert [k for k in default if "positive" in k] == [
        f"{m}_positive_{b}" for m in ("ece", "rmsce", "mce") for b in (10, 15)
    ]
    without = evaluate(z2, y, n_bins=(10, 15), positive_class=False)
    assert list(default)[:9] == list(without)[:9]
    assert list(default)[-4:] == list(without)[-4:] == SAMPLE_KEYS
    z7, y7 = _data(n=300, k=7, seed=21)
    assert not any("positive" in k for k in evaluate(z7, y7))
    with pytest.raises(ValueError, match="needs two classes.*7"):
        evaluate(z7, y7, positive_class=True)
    with pytest.raises(ValueError, match="needs two classes"):
        StreamingMetrics(num_classes=3, positive_class=True)
    with pytest.raises(ValueError, match="positive_class"):
        evaluate(z2, y, positive_class="yes")
    # streaming with K from the data, and a state_dict round trip into a fresh metric
    s = StreamingMetrics(n_bins=15)
    s.update(z2[:100], y[:100])
    s.update(z2[100:], y[100:])
    ref = {k: v for k, v in evaluate(z2, y, n_bins=15).items() if k not in SAMPLE_KEYS}
    assert s.compute() == pytest.approx(ref, abs=1e-12)
    fresh = StreamingMetrics(n_bins=15)
    fresh.load_state_dict(s.state_dict())
    assert fresh.compute() == pytest.approx(ref, abs=1e-12)
    with pytest.raises(ValueError, match="missing keys"):
        StreamingMetrics(n_bins=15, positive_class=False).load_state_dict(s.state_dict())


def test_reliability_bins_of_probabilities_with_zeros_do_not_warn():
    import warnings

    p = torch.tensor([[1.0, 0.0], [0.2, 0.8]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = reliability_bins(labels=torch.tensor([1, 1]), probs=p, n_bins=5)
    assert b["count"].tolist() == [0, 0, 0, 0, 2]
