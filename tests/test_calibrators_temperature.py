"""Temperature scaling: the MAP fit with a prior on log T, separable data, half precision."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cogcal.calibrators import (
    DEFAULT_L2_GRID,
    SeparableDataWarning,
    TaskTemperature,
    Temperature,
    separable_temperature_floor,
)
from test_calibrators_regularisation import _blobs

pytestmark = pytest.mark.usefixtures("one_thread")


def _margins(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    true = z.gather(1, y[:, None])[:, 0]
    return true - z.scatter(1, y[:, None], float("-inf")).amax(1)


def _map_by_grid(z: torch.Tensor, y: torch.Tensor, l2: float, lo: float, hi: float) -> float:
    """argmin of sum NLL + l2/2 (log T)^2 over T in [lo, hi], in float64: a 101-point grid
    in log T, then scipy's bounded Brent search between the best point's neighbours."""
    from scipy.optimize import minimize_scalar

    z64 = z.double()

    def objective(u: float) -> float:
        return float(F.cross_entropy(z64 / math.exp(u), y, reduction="sum")) + 0.5 * l2 * u * u

    grid = torch.linspace(math.log(lo), math.log(hi), 101, dtype=torch.float64).tolist()
    i = min(range(len(grid)), key=lambda j: objective(grid[j]))
    bounds = (grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)])
    res = minimize_scalar(objective, bounds=bounds, method="bounded", options={"xatol": 1e-9})
    return math.exp(res.x)


def test_separable_set_warns_and_keeps_temperature_bounded():
    z, y = _blobs(50, 5, 3.0, seed=5)
    margins = _margins(z, y)
    assert float(margins.min()) > 0  # every validation sample is classified correctly
    with pytest.warns(SeparableDataWarning, match="all 50 validation samples"):
        bounded = Temperature().fit(z, y)
    with pytest.warns(SeparableDataWarning, match="l2=0"):
        unbounded = Temperature(l2=0.0).fit(z, y)
    assert unbounded.nll_after_ < 1e-8  # the maximum-likelihood fit runs toward T -> 0
    floor = separable_temperature_floor(50, 5, float(margins.min()), 1.0)
    assert 0 < floor <= bounded.temperature < 1.0
    assert unbounded.temperature < bounded.temperature / 5
    # the documented MAP, found by brute force, is what fit returns
    assert bounded.temperature == pytest.approx(_map_by_grid(z, y, 1.0, 0.01, 3.0), rel=2e-3)
    # held-out data from the same generator: the bounded temperature is far better
    zt, yt = _blobs(5000, 5, 3.0, seed=1005)
    with torch.no_grad():
        nll_bounded = F.cross_entropy(bounded(zt), yt).item()
        nll_unbounded = F.cross_entropy(unbounded(zt), yt).item()
    assert nll_bounded < 0.1 * nll_unbounded
    assert nll_bounded < 2 * F.cross_entropy(zt, yt).item()  # and within 2x of the truth


@pytest.mark.parametrize(("n", "k", "margin", "l2"), [(10, 2, 0.5, 1.0), (200, 5, 3.0, 0.3)])
def test_separable_floor_holds_for_the_exact_map(n, k, margin, l2):
    # separable logits whose smallest margin is exactly `margin`
    g = torch.Generator().manual_seed(n)
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.rand(n, k, generator=g) + (margin + 1.0) * F.one_hot(y, k)
    z[0] = 0.0
    z[0, y[0]] = margin
    assert float(_margins(z, y).min()) == pytest.approx(margin)
    t_map = _map_by_grid(z, y, l2, 1e-3, 10.0)
    assert t_map >= separable_temperature_floor(n, k, margin, l2)
    with pytest.warns(SeparableDataWarning):
        fitted = Temperature(l2=l2).fit(z, y)
    assert fitted.temperature == pytest.approx(t_map, rel=2e-3)


def test_near_separable_set_has_a_finite_mle_and_no_warning():
    z, y = _blobs(50, 5, 3.0, seed=0)
    assert int((z.argmax(1) != y).sum()) == 1  # one mistake: the likelihood bounds T below
    with warnings.catch_warnings():
        warnings.simplefilter("error", SeparableDataWarning)
        t = Temperature().fit(z, y)
        mle = Temperature(l2=0.0).fit(z, y)
    assert mle.temperature == pytest.approx(_map_by_grid(z, y, 0.0, 0.05, 5.0), rel=2e-3)
    assert 0.3 < mle.temperature < t.temperature < 1.0  # the prior pulls toward T = 1
    zt, yt = _blobs(5000, 5, 3.0, seed=1000)
    with torch.no_grad():
        assert F.cross_entropy(t(zt), yt) <= F.cross_entropy(mle(zt), yt)


def test_ordinary_set_matches_the_maximum_likelihood_temperature():
    z, y = _blobs(3000, 5, 2.0, seed=1)
    observed = 1.7 * z  # too confident
    t = Temperature().fit(observed, y)
    mle = _map_by_grid(observed, y, 0.0, 0.5, 4.0)
    assert t.temperature == pytest.approx(mle, rel=0.01)
    assert Temperature(l2=0.0).fit(observed, y).temperature == pytest.approx(mle, rel=1e-3)
    assert t.l2_ == 1.0 and t.cv_scores_ is None and t.l2_at_edge_ is None


def test_prior_strength_scales_with_the_number_of_samples():
    # sum NLL + l2/2 u^2: doubling every sample and l2 leaves the MAP unchanged
    z, y = _blobs(40, 4, 2.0, seed=3)
    once = Temperature(l2=5.0).fit(2.5 * z, y)
    twice = Temperature(l2=10.0).fit(torch.cat([2.5 * z, 2.5 * z]), torch.cat([y, y]))
    other = Temperature(l2=5.0).fit(torch.cat([2.5 * z, 2.5 * z]), torch.cat([y, y]))
    assert twice.temperature == pytest.approx(once.temperature, rel=1e-6)
    assert abs(other.temperature - once.temperature) > 1e-3  # the test can fail


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_known_temperature_recovered_from_low_precision_logits(dtype):
    z, y = _blobs(20_000, 10, 1.0, seed=4)
    observed = (2.0 * z).to(dtype)  # twice too confident, rounded to `dtype`
    t = Temperature().fit(observed, y)
    assert t.temperature == pytest.approx(2.0, rel=0.03)
    # exactly the MAP of the rounded logits (brute force in float64)
    assert t.temperature == pytest.approx(_map_by_grid(observed, y, 1.0, 1.5, 2.7), rel=2e-3)
    assert t.log_temperature.dtype == torch.float32
    out = t(observed)
    assert out.dtype == dtype and not out.requires_grad


def test_temperature_l2_cv_chooses_from_the_grid():
    z, y = _blobs(300, 4, 2.0, seed=6)
    t = Temperature(l2="cv", cv=3).fit(1.5 * z, y)
    assert t.l2_ in DEFAULT_L2_GRID and t.cv_scores_.shape == (len(DEFAULT_L2_GRID),)
    assert t.cv_fold_scores_.shape == (3, len(DEFAULT_L2_GRID))
    assert t.cv_scores_[list(t.l2_grid_).index(t.l2_)] == np.nanmin(t.cv_scores_)


def test_task_temperature_warns_for_the_separable_task_only():
    g = torch.Generator().manual_seed(7)
    z = torch.randn(80, 3, generator=g) * 2
    y = torch.bernoulli(torch.sigmoid(z), generator=g)
    y[:, 1] = (z[:, 1] > 0).float()  # task 1: every sample on the right side of 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tt = TaskTemperature().fit(z, y)
    messages = [str(w.message) for w in caught if issubclass(w.category, SeparableDataWarning)]
    assert len(messages) == 1 and "task 1" in messages[0] and "all 80" in messages[0]
    margin = float(((2 * y[:, 1] - 1) * z[:, 1]).min())
    assert tt.temperature[1] >= separable_temperature_floor(80, 2, margin, 1.0)
    assert bool(torch.isfinite(tt.temperature).all())
