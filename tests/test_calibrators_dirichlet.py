"""Dirichlet calibration (ODIR, diagonal toward TS): references, the penalty, its fit and CV."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cogcal.calibrators.affine as affine_module
import cogcal.calibrators.dirichlet as dirichlet_module
from cogcal.calibrators import (
    Calibrator,
    Dirichlet,
    L2GridEdgeWarning,
    MatrixScaling,
    ProbabilitiesAsLogitsWarning,
    Temperature,
    make_calibrator,
)
from cogcal.calibrators._base import _Problem
from cogcal.calibrators._folds import _stratified_folds
from cogcal.calibrators.dirichlet import _RowBlocks

sklearn_linear = pytest.importorskip("sklearn.linear_model")

pytestmark = pytest.mark.usefixtures("one_thread")


def _miscalibrated(n: int, k: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Classes scaled and shifted differently (needs more than a temperature), float64."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g) + 1.5 * F.one_hot(y, k)
    scale = torch.linspace(0.5, 3.0, k)
    return (z * scale + torch.linspace(0.5, -0.5, k)).double(), y


def _log_probs(z: torch.Tensor) -> np.ndarray:
    return F.log_softmax(z.double(), dim=1).numpy()


def _logistic_regression(C: float):
    return sklearn_linear.LogisticRegression(C=C, tol=1e-10, max_iter=10_000)


@pytest.mark.parametrize("k", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_unpenalised_dirichlet_is_multinomial_regression_on_log_probabilities(k):
    z, y = _miscalibrated(600, k, seed=1)
    cal = Dirichlet(k, l2=0.0).double().fit(z, y)
    ref = _logistic_regression(np.inf).fit(_log_probs(z), y.numpy())
    z_new, _ = _miscalibrated(300, k, seed=2)
    for logits in (z, z_new):
        np.testing.assert_allclose(
            cal.predict_proba(logits.numpy()), ref.predict_proba(_log_probs(logits)), atol=1e-5
        )


@pytest.mark.parametrize(
    "lam",
    [pytest.param(0.5, marks=pytest.mark.slow), pytest.param(20.0, marks=pytest.mark.slow), 2000.0],
)
def test_whole_matrix_penalty_hook_equals_sklearn_l2_regression_at_c_one_over_lambda(lam):
    # With the test hooks the penalty is (lam/2) ||W||_F^2 and the bias is free: scikit-learn's
    # C sum_i l_i + (1/2) ||W||^2 on log p has the same minimiser for C = 1/lam (see
    # test_calibrators_regularisation). The three strengths run from data-dominated to
    # penalty-dominated curvature in the row-block conditioning.
    z, y = _miscalibrated(500, seed=3)
    cal = Dirichlet(4, l2=lam).double()
    cal._weights_toward_identity, cal._penalize_bias = False, False
    assert isinstance(cal._standardisation(z, lam / (2 * len(y))), _RowBlocks)
    cal.fit(z, y)
    ref = _logistic_regression(1.0 / lam).fit(_log_probs(z), y.numpy())
    np.testing.assert_allclose(cal.weight.numpy(), ref.coef_, atol=1e-5)
    b = cal.bias.numpy()
    np.testing.assert_allclose(b - b.mean(), ref.intercept_ - ref.intercept_.mean(), atol=1e-5)


def _penalised_gradients(cal: Dirichlet, z, y, lam):
    """Gradient of (1/N)[sum_i l_i + lam/2 (sum_{j != k} (T0 W_jk)^2 + sum_k (T0 W_kk - 1)^2
    + ||b||^2)], the documented objective, by autograd (T0 = target_temperature_)."""
    t0 = cal.target_temperature_
    w = cal.weight.detach().double().clone().requires_grad_(True)
    b = cal.bias.detach().double().clone().requires_grad_(True)
    out = F.log_softmax(z.double(), dim=1) @ w.T + b
    d = t0 * w - torch.eye(w.shape[0], dtype=w.dtype)
    j = F.cross_entropy(out, y, reduction="sum") + 0.5 * lam * ((d**2).sum() + (b**2).sum())
    return torch.autograd.grad(j / len(y), (w, b))


@pytest.mark.parametrize("lam", [3.0, 300.0])
def test_fit_is_the_stationary_point_of_the_documented_objective(lam):
    z, y = _miscalibrated(400, seed=4)
    cal = Dirichlet(4, l2=lam).double().fit(z, y)
    assert cal.target_temperature_ == pytest.approx(
        Temperature().double().fit(z, y).temperature, rel=1e-6
    )
    grads = _penalised_gradients(cal, z, y, lam)
    assert max(float(g.abs().max()) for g in grads) < 1e-6
    # the same parameters are not stationary for another strength: the check can fail
    grads = _penalised_gradients(cal, z, y, 3 * lam)
    assert max(float(g.abs().max()) for g in grads) > 1e-4
    # the returned representative: each column of T0 W - I and the bias centred
    d = cal.target_temperature_ * cal.weight.numpy() - np.eye(4)
    np.testing.assert_allclose(d.sum(0), 0.0, atol=1e-9)
    assert abs(float(cal.bias.sum())) < 1e-10


def _closure_value_and_grads(closure, variables):
    loss = float(closure().detach())
    return loss, {name: v.grad.clone() for name, v in variables.items()}


@pytest.mark.parametrize("weight", [0.0, 0.01, 5.0, 500.0])
@pytest.mark.parametrize("conditioning", ["standardised", "raw"])
@pytest.mark.parametrize("toward_identity", [True, False])
def test_hand_written_gradient_equals_autograd(weight, conditioning, toward_identity):
    """The fit uses J and its gradient by hand; autograd on the generic objective (decode,
    forward on log p, NLL, ODIR penalty terms) is the reference, away from the optimum."""
    z, y = _miscalibrated(60, seed=5)
    cal = Dirichlet(4).double()
    cal._weights_toward_identity = cal._penalize_bias = toward_identity
    cal._prepare(z, y)
    stats = cal._standardisation(z, weight) if conditioning == "standardised" else None
    if conditioning == "standardised":  # the fit's conditioning: one block per row of [W|b]
        assert isinstance(stats, _RowBlocks) and stats.factor.shape == (4, 5, 5)
    g = torch.Generator().manual_seed(1)
    start = {
        k: v + 0.3 * torch.randn(v.shape, generator=g, dtype=v.dtype)
        for k, v in cal._encode(stats).items()
    }
    ours = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    reference = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    assert type(cal)._closure is not Calibrator._closure
    with torch.no_grad():
        loss, grads = _closure_value_and_grads(
            cal._closure(ours, _Problem(z, y, stats, weight)), ours
        )
    with torch.enable_grad():
        ref = Calibrator._closure(cal, reference, _Problem(z, y, stats, weight))
        ref_loss, ref_grads = _closure_value_and_grads(ref, reference)
    assert loss == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-11)


def test_very_strong_penalty_gives_temperature_scaling():
    # the diagonal is pulled toward 1 / T0 too: a strong penalty gives softmax(log p / T0)
    # = softmax(z / T0), Temperature's own fit (not ODIR's one free power per class)
    z, y = _miscalibrated(500, seed=6)
    cal = Dirichlet(4, l2=1e7).double().fit(z, y)
    ts = Temperature().double().fit(z, y)
    np.testing.assert_allclose(cal.weight.numpy(), np.eye(4) / ts.temperature, atol=1e-4)
    np.testing.assert_allclose(cal.bias.numpy(), 0.0, atol=1e-4)
    np.testing.assert_allclose(cal.predict_proba(z), ts.predict_proba(z), atol=1e-4)
    weak = Dirichlet(4, l2=1.0).double().fit(z, y)  # the data want one power per class
    assert np.ptp(np.diagonal(weak.weight.numpy())) > 0.1


def test_a_separable_validation_set_gives_a_finite_map():
    # ODIR's free diagonal diverges when the network classifies every validation sample
    # correctly (validation NLL -> 0, then an infinite test NLL for one mistake); pulled
    # toward 1 / T0 (Temperature's prior on log T keeps T0 finite), it does not
    g = torch.Generator().manual_seed(15)
    y = torch.randint(0, 4, (300,), generator=g)
    z = 2.0 * torch.randn(300, 4, generator=g, dtype=torch.float64) + 15.0 * F.one_hot(y, 4)
    assert bool((z.argmax(1) == y).all())  # separable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = Dirichlet(4).double().fit(z, y)
    assert float(cal.weight.abs().max()) < 50.0
    z_new = z.clone()
    z_new[0, y[0]] = z_new[0].min() - 10.0  # a mistake
    p = torch.as_tensor(cal.predict_proba(z_new))
    assert float(p[0, y[0]]) > 1e-30  # a finite NLL on a misclassified sample


def test_binary_dirichlet_is_beta_calibration_with_temperature_scaling_at_a_strong_penalty():
    # K = 2: unpenalised it is beta calibration (a log p1 - c log p0 + d), a logistic
    # regression on log p; a strong penalty gives temperature scaling
    z, y = _miscalibrated(800, 2, seed=7)
    free = Dirichlet(2, l2=0.0).double().fit(z, y)
    ref = _logistic_regression(np.inf)
    ref.fit(_log_probs(z), y.numpy())
    np.testing.assert_allclose(
        free.predict_proba(z)[:, 1], ref.predict_proba(_log_probs(z))[:, 1], atol=1e-5
    )
    strong = Dirichlet(2, l2=1e8).double().fit(z, y)
    ts = Temperature().double().fit(z, y)
    np.testing.assert_allclose(strong.predict_proba(z), ts.predict_proba(z), atol=1e-5)


@pytest.mark.slow
def test_cv_scores_are_held_out_nll_of_fits_on_the_other_folds():
    z, y = _miscalibrated(300, seed=8)
    grid = (0.0, 1.0, 100.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", L2GridEdgeWarning)
        cal = Dirichlet(l2="cv", cv=3, l2_grid=grid).double().fit(z, y)
    assert cal.l2_ in grid and np.array_equal(cal.l2_grid_, np.array(grid))
    folds = _stratified_folds(y, 3)
    for j, lam in enumerate(grid):
        if np.isnan(cal.cv_scores_[j]):
            continue
        total = 0.0
        for f in range(3):
            held = folds == f
            fold = Dirichlet(4, l2=lam).double().fit(z[~held], y[~held])
            total += float(F.cross_entropy(fold(z[held]), y[held], reduction="sum"))
        # the folds' scoring fits stop at a gradient of 1e-4 (SCORING_TOLERANCES): 1.2e-5
        # from the converged fits' score here; a leaked or misassigned fold is off by 1e-3
        assert cal.cv_scores_[j] == pytest.approx(total / len(y), abs=5e-5)
    assert cal.l2_ == grid[int(np.nanargmin(cal.cv_scores_))]


@pytest.mark.slow
def test_fit_improves_on_the_network_and_keeps_the_contract():
    z, y = _miscalibrated(2000, seed=9)
    z32 = z.float()
    cal = make_calibrator("dirichlet").fit(z32, y)
    assert isinstance(cal, Dirichlet) and cal.num_outputs == 4
    assert cal.nll_after_ < cal.nll_before_ - 0.05
    assert not any(p.requires_grad for p in cal.parameters())  # frozen after fit
    out = cal(z32[:5].numpy())
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert cal(z32[:5]).dtype == torch.float32
    proba = cal.predict_proba(z32[:5].half())
    assert proba.dtype == torch.float16
    # a fresh Dirichlet is the identity map: softmax of its output is softmax(z)
    fresh = Dirichlet(4)
    torch.testing.assert_close(torch.softmax(fresh(z32), 1), torch.softmax(z32, 1))
    loaded = Dirichlet()
    loaded.load_state_dict(cal.state_dict())
    torch.testing.assert_close(loaded(z32), cal(z32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fit_accepts_every_float_dtype(dtype):
    z, y = _miscalibrated(400, seed=10)
    cal = Dirichlet(l2=1.0).fit(z.to(dtype), y)
    assert cal(z.to(dtype)).dtype == dtype
    assert cal.weight.dtype == torch.float32


def test_input_errors_are_specific():
    z, y = _miscalibrated(20, seed=11)
    bad = z.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        Dirichlet().fit(bad, y)
    with pytest.raises(ValueError, match="needs at least 5 samples"):
        Dirichlet().fit(z[:3], y[:3])
    with pytest.raises(ValueError, match="built for 3 classes"):
        Dirichlet(3).fit(z, y)
    with pytest.raises(ValueError, match="l2"):
        Dirichlet(l2=-1.0)
    with pytest.raises(ValueError, match="cv"):
        Dirichlet(cv=1)
    with pytest.raises(ValueError, match="num_classes"):
        Dirichlet(1)
    with pytest.warns(ProbabilitiesAsLogitsWarning, match="log-probabilities"):
        Dirichlet(l2=1.0).fit(torch.softmax(z, 1), y)


@pytest.mark.slow
def test_one_class_present_fits_like_matrix_scaling():
    # as MatrixScaling and Temperature: no error; the penalty keeps the map finite
    z, _ = _miscalibrated(50, seed=12)
    y = torch.zeros(50, dtype=torch.long)
    cal = Dirichlet().fit(z, y)
    assert all(bool(torch.isfinite(p).all()) for p in cal.parameters())
    assert bool((cal.predict_proba(z).argmax(1) == 0).all())


def test_row_block_conditioning_makes_each_rows_curvature_the_identity_at_the_start():
    """The conditioning (docs/performance.md): in the fit's variables the Hessian's diagonal
    blocks, one per row of [W | b], are the identity at the starting map (temperature
    scaling), where they are exact for the unpenalised objective; the blocks between rows
    are not (they are what the conditioning neglects)."""
    z, y = _miscalibrated(300, seed=13)
    cal = Dirichlet(4, l2=0.0).double()
    cal._prepare(z, y)
    stats = cal._standardisation(z, 0.0)
    start = cal._encode(stats)
    flat = torch.cat([start["weight"], start["bias"][:, None]], 1).reshape(-1)

    def objective(v: torch.Tensor) -> torch.Tensor:
        v = v.reshape(4, 5)
        params = cal._decode({"weight": v[:, :4], "bias": v[:, 4]}, stats)
        return F.cross_entropy(cal._map(z, params), y)

    h = torch.autograd.functional.hessian(objective, flat).reshape(4, 5, 4, 5)
    for j in range(4):
        torch.testing.assert_close(h[j, :, j, :], torch.eye(5, dtype=h.dtype), atol=1e-6, rtol=0)
    assert float(h[0, :, 1, :].abs().max()) > 1e-3  # the coupling between rows remains


@pytest.mark.parametrize("cls", [Dirichlet, MatrixScaling])
def test_fit_does_not_depend_on_the_share_of_the_curvature_summed(cls, monkeypatch):
    # with many classes each class's curvature is summed over the rows that carry 99% of
    # its weight: a preconditioner, so the path of the fit changes, not its solution
    g = torch.Generator().manual_seed(15)
    y = torch.arange(600) % 12
    z = 4.0 * (F.one_hot(y, 12).double() + 0.8 * torch.randn(600, 12, generator=g))
    exact = cls(12, l2=5.0).double().fit(z, y)
    monkeypatch.setattr(affine_module, "_SPARSE_CURVATURE_CLASSES", 2)
    monkeypatch.setattr(affine_module, "_CURVATURE_MASS", 0.9)
    sparse = cls(12, l2=5.0).double().fit(z, y)
    assert sparse.n_iter_ != exact.n_iter_ or not torch.equal(sparse.weight, exact.weight)
    torch.testing.assert_close(sparse.weight, exact.weight, atol=1e-6, rtol=0)
    torch.testing.assert_close(sparse.bias, exact.bias, atol=1e-6, rtol=0)


def test_fit_does_not_depend_on_the_rows_the_curvature_is_estimated_from(monkeypatch):
    # the curvature is only a preconditioner: a strided subset of the rows (above
    # _CURVATURE_ROWS) changes the path of the fit, not its solution
    z, y = _miscalibrated(400, seed=14)
    full = Dirichlet(4, l2=2.0).double().fit(z, y)
    monkeypatch.setattr(dirichlet_module, "_CURVATURE_ROWS", 7)
    strided = Dirichlet(4, l2=2.0).double().fit(z, y)
    assert strided.n_iter_ != full.n_iter_ or not torch.equal(strided.weight, full.weight)
    torch.testing.assert_close(strided.weight, full.weight, atol=1e-6, rtol=0)
    torch.testing.assert_close(strided.bias, full.bias, atol=1e-6, rtol=0)
