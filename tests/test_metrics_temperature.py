"""The NLL after the best temperature (cogcal.metrics.temperature_scaled_nll), against an
independent scalar minimiser (scipy), streamed, summed over processes, and its errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar

from cogcal.metrics import TemperatureScaledNLL, temperature_scaled_nll
from cogcal.metrics.temperature import INVERSE_TEMPERATURES


def _reference(z: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The exact minimum over the temperature (scipy's bounded scalar minimiser on log T,
    over a range wider than the grid) and its temperature."""
    z64 = z.double()

    def nll(log_t: float) -> float:
        return F.cross_entropy(z64 / math.exp(log_t), y).item()

    found = minimize_scalar(nll, bounds=(-6.0, 6.0), method="bounded", options={"xatol": 1e-11})
    return float(found.fun), math.exp(found.x)


def _problem(n: int, k: int, signal: float, noise: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    return signal * F.one_hot(y, k) + noise * torch.randn(n, k, generator=g), y


@pytest.mark.parametrize(
    "n, k, signal, noise",
    [
        (400, 5, 6.0, 3.0),  # over-confident: T > 1
        (1000, 10, 3.0, 1.0),  # under-confident: T < 1
        (3000, 100, 8.0, 2.0),
        (200, 2, 20.0, 15.0),  # two classes, very over-confident
        (500, 10, 1.0, 3.0),  # nearly uninformative
    ],
)
def test_equals_the_exact_minimum_over_the_temperature(n, k, signal, noise):
    z, y = _problem(n, k, signal, noise)
    exact, temperature = _reference(z, y)
    assert 1 / 20 < temperature < 20  # inside the grid
    assert F.cross_entropy(z.double(), y).item() > exact + 1e-3  # a temperature matters here
    assert temperature_scaled_nll(z, y) == pytest.approx(exact, abs=1e-5)


def test_a_hand_computed_case():
    """3 of 4 right with the same margin: the best confidence is 3/4, whose NLL is the
    entropy of a coin of bias 1/4."""
    z = torch.tensor([[4.0, 0.0], [4.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    y = torch.tensor([0, 0, 1, 1])
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert temperature_scaled_nll(z, y) == pytest.approx(entropy, abs=1e-6)


def test_beyond_the_grid_it_is_the_end_value_an_upper_bound():
    """Logits independent of the labels want a temperature far above 20: the value is the
    NLL at T = 20, above the exact minimum."""
    g = torch.Generator().manual_seed(1)
    z, y = torch.randn(300, 3, generator=g), torch.randint(0, 3, (300,), generator=g)
    exact, temperature = _reference(z, y)
    assert temperature > 20
    at_end = F.cross_entropy(z.double() * float(INVERSE_TEMPERATURES[0]), y).item()
    assert temperature_scaled_nll(z, y) == pytest.approx(at_end, rel=1e-6)
    assert temperature_scaled_nll(z, y) >= exact


def test_streamed_in_batches_and_summed_over_processes_equals_one_pass():
    z, y = _problem(1000, 10, 3.0, 2.0)
    whole = temperature_scaled_nll(z, y)
    streamed = TemperatureScaledNLL()
    for i in range(0, 1000, 96):
        streamed.update(z[i : i + 96], y[i : i + 96])
    assert streamed.compute() == pytest.approx(whole, abs=1e-12)
    # two processes' states add up (what sync does with an all-reduce)
    first, second = TemperatureScaledNLL(), TemperatureScaledNLL()
    first.update(z[:300], y[:300])
    second.update(z[300:], y[300:])
    first.sums += second.sums
    first.count += second.count
    assert first.compute() == pytest.approx(whole, abs=1e-12)
    streamed.reset()
    assert math.isnan(streamed.compute())


def test_wrong_input_is_named():
    m = TemperatureScaledNLL()
    with pytest.raises(ValueError, match=r"expected \(N, K\) logits and \(N,\) labels"):
        m.update(torch.zeros(4), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\).*from 0 to 3"):
        m.update(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="NaN or infinite"):
        m.update(torch.tensor([[0.0, math.inf]]), torch.tensor([0]))


def test_never_negative_where_the_nll_is_nearly_zero():
    """Validation logits the network separates with a wide margin: the NLL falls toward 0
    as the temperature does, and the interpolating cubic, which can dip below the values it
    joins, must not report a negative NLL (the default path logged -7e-11 on digits)."""
    metric = TemperatureScaledNLL()
    i = 20  # an interior grid interval whose cubic dips below zero
    metric.sums[0].fill_(1.0)
    metric.sums[0, i : i + 2] = torch.tensor([1e-12, 1e-12], dtype=torch.float64)
    metric.sums[1].fill_(0.0)
    metric.sums[1, i : i + 2] = torch.tensor([-1e-6, 1e-6], dtype=torch.float64)
    metric.count = 1.0
    assert metric.compute() == 0.0
