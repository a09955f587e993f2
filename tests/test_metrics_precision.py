"""NLL and Brier are computed in float64 from log-softmax / log-sigmoid for every input dtype.

References are hand computations in float64 (math module) on the exact input values.
"""

from __future__ import annotations

import math

import pytest
import torch

from cogcal.metrics import StreamingMetrics, evaluate

LOW = [torch.float32, torch.float16, torch.bfloat16]


def _sigmoid_tail(z: float) -> float:
    """1 - sigmoid(z) = sigmoid(-z), without cancellation."""
    return math.exp(-z) / (1.0 + math.exp(-z))


@pytest.mark.parametrize("dtype", LOW)
def test_confident_two_class_brier_and_nll_are_exact(dtype):
    # the example of the issue: p = softmax([9, 0]) = (sigma(9), 1 - sigma(9)), label 0
    z = torch.tensor([[9.0, 0.0]] * 1000, dtype=dtype)
    m = evaluate(z, torch.zeros(1000, dtype=torch.long))
    e = _sigmoid_tail(9.0)
    assert m["brier"] == pytest.approx(2 * e**2, rel=1e-12, abs=0)  # 3.05e-8, not 1.52e-8
    assert m["brier"] == pytest.approx(3.045244e-8, rel=1e-6)
    assert m["nll"] == pytest.approx(math.log1p(math.exp(-9.0)), rel=1e-12, abs=0)
    assert m["acc"] == 1.0


@pytest.mark.parametrize("dtype", LOW)
def test_very_confident_multiclass_is_exact(dtype):
    # p_y = 1 / (1 + 2 e^-30): float32 (and float64 p) would round 1 - p_y to 0
    z = torch.tensor([[30.0, 0.0, 0.0], [0.0, 30.0, 0.0]], dtype=dtype)
    y = torch.tensor([0, 0])
    m = evaluate(z, y, n_bins=10)
    q = math.exp(-30.0) / (1 + 2 * math.exp(-30.0))  # probability of each other class
    p_top = 1 / (1 + 2 * math.exp(-30.0))
    brier_right = 2 * q**2 + (2 * q) ** 2  # sum_{k != y} p_k^2 + (1 - p_y)^2
    brier_wrong = (1 - q) ** 2 + p_top**2 + q**2
    assert m["brier"] == pytest.approx((brier_right + brier_wrong) / 2, rel=1e-12, abs=0)
    nll_right = math.log1p(2 * math.exp(-30.0))
    nll_wrong = 30.0 + math.log1p(2 * math.exp(-30.0))
    assert m["nll"] == pytest.approx((nll_right + nll_wrong) / 2, rel=1e-12, abs=0)
    # the correct sample alone: Brier ~ 5.6e-26, far below float32 / float64 p resolution
    one = evaluate(z[:1], y[:1], n_bins=10)
    assert one["brier"] == pytest.approx(brier_right, rel=1e-12, abs=0)
    assert one["nll"] == pytest.approx(nll_right, rel=1e-12, abs=0)


@pytest.mark.parametrize("dtype", LOW)
def test_float32_and_half_match_float64_on_the_same_values(dtype):
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(3000, 10, generator=g, dtype=torch.float64) * 6).to(dtype)
    y = torch.randint(0, 10, (3000,), generator=g)
    m = evaluate(z, y, n_bins=(15,), classwise=True)
    ref = evaluate(z.double(), y, n_bins=(15,), classwise=True)  # identical input values
    for key in ref:
        assert m[key] == pytest.approx(ref[key], rel=1e-13, abs=1e-15), key


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("z0", [9.0, 30.0, -9.0])
def test_binary_brier_and_nll_are_exact(dtype, z0):
    z = torch.tensor([z0] * 10, dtype=dtype)
    for label in (0, 1):
        m = evaluate(z, torch.full((10,), label), task="binary", n_bins=10)
        # margin against the truth: |p - y| = sigmoid(s), -log p_y = log(1 + e^s)
        s = z0 if label == 0 else -z0
        gap = 1 / (1 + math.exp(-s))
        assert m["brier"] == pytest.approx(gap**2, rel=1e-12, abs=0), label
        nll = max(s, 0.0) + math.log1p(math.exp(-abs(s)))
        assert m["nll"] == pytest.approx(nll, rel=1e-12, abs=0), label


@pytest.mark.parametrize("dtype", LOW)
def test_multilabel_brier_is_exact(dtype):
    z = torch.tensor([[9.0, -9.0], [9.0, -9.0]], dtype=dtype)
    y = torch.tensor([[1, 0], [1, 0]])
    m = evaluate(z, y, task="multilabel", n_bins=10)
    e = _sigmoid_tail(9.0)
    assert m["brier/t0"] == pytest.approx(e**2, rel=1e-12, abs=0)
    assert m["brier"] == pytest.approx(e**2, rel=1e-12, abs=0)
    assert m["nll"] == pytest.approx(math.log1p(math.exp(-9.0)), rel=1e-12, abs=0)


@pytest.mark.parametrize("task", ["multiclass", "binary"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_streaming_is_as_precise_as_evaluate(task, dtype):
    if task == "multiclass":
        z = torch.tensor([[9.0, 0.0, -3.0]] * 100 + [[0.0, 12.0, 0.0]] * 28, dtype=dtype)
        y = torch.tensor([0] * 100 + [1] * 28)
    else:
        z = torch.tensor([9.0] * 100 + [-12.0] * 28, dtype=dtype)
        y = torch.tensor([1] * 100 + [0] * 28)
    s = StreamingMetrics(task=task, n_bins=(15,))
    for i in range(0, 128, 32):
        s.update(z[i : i + 32], y[i : i + 32])
    ref = evaluate(z.double(), y, task=task, n_bins=(15,))
    out = s.compute()
    for key in ("nll", "brier"):
        assert out[key] == pytest.approx(ref[key], rel=1e-12, abs=0), key


def test_probs_brier_is_computed_in_float64():
    # float32 probabilities (the values as stored): (1 - p_y)^2 + p_other^2 in float64
    p = torch.tensor([[1 - 2**-20, 2**-20]], dtype=torch.float32)
    m = evaluate(labels=torch.tensor([0]), probs=p)
    assert m["brier"] == pytest.approx(2 * 2.0**-40, rel=1e-12, abs=0)
    assert m["nll"] == pytest.approx(-math.log1p(-(2.0**-20)), rel=1e-12, abs=0)
