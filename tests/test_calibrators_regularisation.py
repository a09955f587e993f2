"""Regularised post-hoc vector / matrix scaling: references, the penalty, cross-validation."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cogcal.calibrators import (
    DEFAULT_L2_GRID,
    Calibrator,
    L2GridEdgeWarning,
    MatrixScaling,
    StructuredMatrixScaling,
    TaskAffine,
    Temperature,
    VectorScaling,
)
from cogcal.calibrators._base import _Problem
from cogcal.calibrators._folds import _stratified_folds
from cogcal.calibrators.affine import _RowBlocks

sklearn_linear = pytest.importorskip("sklearn.linear_model")


pytestmark = pytest.mark.usefixtures("one_thread")


def _blobs(n: int, k: int, sep: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Calibrated logits: with y uniform and z | y ~ N(sep e_y, I), p(y | z) = softmax(sep z)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g) + sep * F.one_hot(y, k)
    return sep * z, y


def _miscalibrated(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes, each scaled and shifted differently: needs more than a temperature."""
    z, y = _blobs(n, 4, 1.0, seed)
    return (z * torch.tensor([0.5, 1.0, 2.0, 3.0]) + torch.tensor([0.5, 0.0, -0.5, 1.0])), y


def _logistic_regression(C: float):
    # C = inf is unpenalised; an explicit L2 (l1_ratio=0) otherwise. Both run lbfgs, multinomial.
    return sklearn_linear.LogisticRegression(C=C, tol=1e-10, max_iter=10_000)


@pytest.mark.slow
def test_unregularised_matrix_scaling_equals_sklearn_multinomial_regression():
    z, y = _miscalibrated(600, seed=0)
    ms = MatrixScaling(4, l2=0.0).double().fit(z, y)
    ref = _logistic_regression(np.inf).fit(z.double().numpy(), y.numpy())
    z_new, _ = _miscalibrated(300, seed=1)
    for logits in (z, z_new):
        np.testing.assert_allclose(
            ms.predict_proba(logits.double().numpy()),
            ref.predict_proba(logits.double().numpy()),
            atol=1e-4,
        )


@pytest.mark.slow
def test_penalised_matrix_scaling_equals_sklearn_l2_regression_at_c_one_over_lambda():
    # Ours (penalty centred at 0 on W, bias free):   (1/N) [ sum_i l_i + (lam/2) ||W||_F^2 ].
    # scikit-learn:                                  C sum_i l_i + (1/2) ||W||_F^2.
    # Multiplying ours by N/lam gives (1/lam) sum_i l_i + (1/2) ||W||^2: the same minimiser
    # for C = 1/lam, whatever N.
    z, y = _miscalibrated(500, seed=2)
    for lam in (0.5, 20.0):
        ms = MatrixScaling(4, l2=lam).double()
        ms._weights_toward_identity, ms._penalize_bias = False, False
        ms.fit(z, y)
        ref = _logistic_regression(1.0 / lam).fit(z.double().numpy(), y.numpy())
        np.testing.assert_allclose(ms.weight.numpy(), ref.coef_, atol=1e-5)
        b = ms.bias.numpy()  # the intercepts are defined up to a common shift
        np.testing.assert_allclose(b - b.mean(), ref.intercept_ - ref.intercept_.mean(), atol=1e-5)
        np.testing.assert_allclose(
            ms.predict_proba(z.double().numpy()), ref.predict_proba(z.double().numpy()), atol=1e-6
        )


def _documented_objective(cal, z, y, lam, t0):
    """(1/N) [ sum_i l_i(W, b) + lam/2 (||T0 W - I||^2 + ||b||^2) ], written out by hand."""
    w = cal.weight.detach().double().clone().requires_grad_(True)
    b = cal.bias.detach().double().clone().requires_grad_(True)
    out = z.double() @ w.T + b if w.ndim == 2 else z.double() * w + b
    eye = torch.eye(w.shape[0], dtype=torch.float64) if w.ndim == 2 else torch.ones_like(w)
    penalty = ((t0 * w - eye) ** 2).sum() + (b**2).sum()
    j = (F.cross_entropy(out, y, reduction="sum") + 0.5 * lam * penalty) / len(y)
    return torch.autograd.grad(j, (w, b))


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling])
def test_fit_is_the_stationary_point_of_the_documented_objective(cls):
    z, y = _miscalibrated(400, seed=3)
    lam = 30.0
    cal = cls(4, l2=lam).double().fit(z, y)
    t0 = Temperature().fit(z, y).temperature  # the centre I / T0: Temperature's own fit
    assert cal.target_temperature_ == pytest.approx(t0, rel=1e-5)
    grads = _documented_objective(cal, z, y, lam, cal.target_temperature_)
    assert max(float(g.abs().max()) for g in grads) < 1e-6
    # the same parameters are not stationary for another strength: the check can fail
    grads = _documented_objective(cal, z, y, 3 * lam, cal.target_temperature_)
    assert max(float(g.abs().max()) for g in grads) > 1e-3


def _closure_value_and_grads(closure, variables):
    loss = float(closure())
    return loss, {name: v.grad.clone() for name, v in variables.items()}


# (vector scaling and temperature scaling are fitted by Newton's method:
# tests/test_calibrators_solvers.py)
@pytest.mark.parametrize("cls", [MatrixScaling, StructuredMatrixScaling])
@pytest.mark.parametrize("weight", [0.0, 0.01, 5.0])
@pytest.mark.parametrize("conditioning", ["standardised", "raw"])
@pytest.mark.parametrize("toward_identity", [True, False])
def test_hand_written_gradients_equal_autograd(cls, weight, conditioning, toward_identity):
    """The fits use J and its gradient written by hand; autograd on the generic objective
    (decode, forward, NLL, penalty terms) is the reference, away from the optimum."""
    z, y = _miscalibrated(60, seed=5)
    z = z.double()
    cal = cls(4).double()
    cal._weights_toward_identity = cal._penalize_bias = toward_identity
    cal._prepare(z, y)
    stats = cal._standardisation(z, weight) if conditioning == "standardised" else None
    if conditioning == "standardised":
        assert isinstance(stats, _RowBlocks)  # the block-Jacobi case is exercised
    g = torch.Generator().manual_seed(1)
    start = {
        k: v + 0.3 * torch.randn(v.shape, generator=g, dtype=v.dtype)
        for k, v in cal._encode(stats).items()
    }
    ours = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    reference = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    assert type(cal)._closure is not Calibrator._closure  # the hand-written one is tested
    with torch.no_grad():
        loss, grads = _closure_value_and_grads(
            cal._closure(ours, _Problem(z, y, stats, weight)), ours
        )
    with torch.enable_grad():
        ref = Calibrator._closure(cal, reference, _Problem(z, y, stats, weight))
        ref_loss, ref_grads = _closure_value_and_grads(ref, reference)
    assert loss == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12)


def test_very_strong_penalty_gives_temperature_scaling_or_identity():
    z, y = _miscalibrated(400, seed=4)
    t = Temperature().fit(z, y).temperature
    ms = MatrixScaling(4, l2=1e10).double().fit(z, y)
    torch.testing.assert_close(ms.weight, torch.eye(4, dtype=torch.float64) / t, atol=1e-4, rtol=0)
    torch.testing.assert_close(ms.bias, torch.zeros(4, dtype=torch.float64), atol=1e-4, rtol=0)
    vs = VectorScaling(4, l2=1e10).double().fit(z, y)
    torch.testing.assert_close(
        vs.weight, torch.full((4,), 1 / t, dtype=torch.float64), atol=1e-4, rtol=0
    )
    # on calibrated logits (T = 1) that centre is the identity map itself
    zc, yc = _blobs(2000, 4, 1.0, seed=5)
    assert Temperature().fit(zc, yc).temperature == pytest.approx(1.0, abs=0.05)
    ms = MatrixScaling(l2=1e10).fit(zc, yc)
    torch.testing.assert_close(ms.weight, torch.eye(4), atol=0.05, rtol=0)
    # the per-task affine map (Platt) is pulled to the identity itself
    g = torch.Generator().manual_seed(6)
    zt = torch.randn(300, 2, generator=g)
    ta = TaskAffine(l2=1e10).fit(3 * zt, torch.bernoulli(torch.sigmoid(zt), generator=g))
    torch.testing.assert_close(ta.weight, torch.ones(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(ta.bias, torch.zeros(2), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_cross_validation_stays_finite_where_unregularised_matrix_scaling_diverges():
    # 40 validation samples, 4 classes, logits 1.5x too confident: 20 parameters separate the
    # validation set perfectly, so the maximum-likelihood matrix grows without bound.
    z, y = _blobs(40, 4, 2.5, seed=1)
    z_test, y_test = _blobs(4000, 4, 2.5, seed=101)
    z, z_test = 1.5 * z, 1.5 * z_test
    assert int((z.argmax(1) != y).sum()) == 4  # argmax errs: temperature scaling is fine
    free = MatrixScaling(l2=0.0).fit(z, y)
    assert bool((free(z).argmax(1) == y).all())  # ... but an affine map separates the set
    with warnings.catch_warnings():
        warnings.simplefilter("error", L2GridEdgeWarning)
        cv = MatrixScaling().fit(z, y)
    ts = Temperature().fit(z, y)
    with torch.no_grad():
        nll = {
            name: F.cross_entropy(cal(z_test), y_test).item()
            for name, cal in (("free", free), ("cv", cv), ("ts", ts))
        }
    assert float(free.weight.abs().max()) > 100 and nll["free"] > 100  # blown up
    assert np.isfinite(nll["cv"]) and float(cv.weight.abs().max()) < 10
    assert nll["cv"] == pytest.approx(nll["ts"], abs=0.02)
    assert cv.l2_ > 0 and cv.l2_ in DEFAULT_L2_GRID


def test_folds_are_stratified_deterministic_and_cover_each_sample_once():
    counts = [23, 7, 50, 3, 12]
    y = torch.cat([torch.full((c,), i) for i, c in enumerate(counts)])
    y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    folds = _stratified_folds(y, 5)
    assert torch.equal(folds, _stratified_folds(y, 5))  # same data, same folds
    assert not torch.equal(folds, _stratified_folds(y, 5, seed=1))
    assert sorted(folds.unique().tolist()) == [0, 1, 2, 3, 4]
    sizes = torch.bincount(folds, minlength=5)
    assert int(sizes.max() - sizes.min()) <= 1 and int(sizes.sum()) == len(y)
    for c, n_c in enumerate(counts):
        per_fold = torch.bincount(folds[y == c], minlength=5)
        assert set(per_fold.tolist()) <= {n_c // 5, -(-n_c // 5)}


@pytest.mark.slow
def test_cv_scores_are_held_out_nll_of_fits_on_the_other_folds():
    z, y = _miscalibrated(150, seed=7)
    grid = (0.1, 10.0, 1000.0)
    ms = MatrixScaling(cv=3, l2_grid=grid).fit(z, y)
    folds = _stratified_folds(y, 3)
    expected = np.full((3, len(grid)), np.nan)
    for f in range(3):
        train, held = folds != f, folds == f
        for j, lam in enumerate(grid):
            if np.isnan(ms.cv_fold_scores_[f, j]):
                continue
            ref = MatrixScaling(4, l2=lam).double().fit(z[train], y[train])  # only that data
            with torch.no_grad():
                expected[f, j] = F.cross_entropy(ref(z[held].double()), y[held]).item()
    np.testing.assert_allclose(ms.cv_fold_scores_, expected, rtol=1e-5)
    sizes = np.bincount(folds.numpy(), minlength=3)
    np.testing.assert_allclose(ms.cv_scores_, sizes @ ms.cv_fold_scores_ / sizes.sum(), rtol=1e-12)
    np.testing.assert_allclose(ms.cv_scores_, sizes @ expected / sizes.sum(), rtol=1e-5)
    assert ms.l2_ == grid[int(np.nanargmin(ms.cv_scores_))]
    refit = MatrixScaling(l2=ms.l2_).fit(z, y)
    torch.testing.assert_close(ms.weight, refit.weight)
    # deterministic: the same data give the same folds, scores and map
    again = MatrixScaling(cv=3, l2_grid=grid).fit(z, y)
    np.testing.assert_array_equal(again.cv_fold_scores_, ms.cv_fold_scores_)


@pytest.mark.slow
def test_cv_walk_stops_after_two_strengths_without_improvement():
    z, y = _blobs(40, 4, 2.5, seed=1)  # the separable set above: weak penalties lose
    ms = MatrixScaling().fit(1.5 * z, y)
    scores = ms.cv_scores_
    evaluated = np.flatnonzero(~np.isnan(scores))
    assert evaluated.max() == len(scores) - 1  # the walk starts at the strongest penalty
    assert np.all(np.diff(evaluated) == 1)  # and skips only a weak tail
    first = evaluated.min()
    if first > 0:  # stopped: the two weakest evaluated strengths did not beat the best
        assert np.all(scores[first : first + 2] >= np.nanmin(scores))
        assert np.isnan(ms.cv_fold_scores_[:, :first]).all()
    # the seconds of each strength: where it was scored, and only there
    np.testing.assert_array_equal(np.isnan(ms.cv_seconds_), np.isnan(scores))
    assert (ms.cv_seconds_[evaluated] > 0).all()
    assert MatrixScaling(l2=1.0).fit(z, y).cv_seconds_ is None


@pytest.mark.slow
def test_grid_edges_are_reported():
    z, y = _miscalibrated(400, seed=8)
    # plenty of data for a class-dependent map: the weakest strength wins
    with pytest.warns(L2GridEdgeWarning, match="lower edge"):
        ms = MatrixScaling(cv=3, l2_grid=(1e3, 1e4)).fit(z, y)
    assert ms.l2_at_edge_ == "lower" and ms.l2_ == 1e3
    with warnings.catch_warnings():
        warnings.simplefilter("error", L2GridEdgeWarning)
        ms = MatrixScaling(cv=3, l2_grid=(0.0, 1e4)).fit(z, y)  # 0 won: nothing lies beyond
    assert ms.l2_at_edge_ == "lower" and ms.l2_ == 0.0
    # the separable set wants a strong penalty: the upper edge of a weak grid is flagged
    zs, ys = _blobs(40, 4, 2.5, seed=1)
    with pytest.warns(L2GridEdgeWarning, match="upper edge"):
        ms = MatrixScaling(cv=3, l2_grid=(0.0, 0.01, 0.1)).fit(1.5 * zs, ys)
    assert ms.l2_at_edge_ == "upper" and ms.l2_ == 0.1
    # ... but not when the map at the edge is already its centre (temperature scaling)
    with warnings.catch_warnings():
        warnings.simplefilter("error", L2GridEdgeWarning)
        ms = MatrixScaling(cv=3, l2_grid=(1.0, 1e9)).fit(1.5 * zs, ys)
    assert ms.l2_at_edge_ == "upper"


@pytest.mark.slow
def test_vector_scaling_and_task_affine_cross_validate():
    z, y = _miscalibrated(300, seed=9)
    vs = VectorScaling(cv=3).fit(z, y)
    assert vs.l2_ in DEFAULT_L2_GRID and vs.cv_fold_scores_.shape == (3, len(DEFAULT_L2_GRID))
    g = torch.Generator().manual_seed(10)
    zt = torch.randn(400, 3, generator=g)
    targets = torch.bernoulli(torch.sigmoid(zt), generator=g)
    ta = TaskAffine(cv=4, l2_grid=(0.0, 1.0, 100.0)).fit(2 * zt + 1, targets)
    assert ta.l2_ in (0.0, 1.0, 100.0) and ta.cv_fold_scores_.shape == (4, 3)
    torch.testing.assert_close(ta.weight, torch.full((3,), 0.5), atol=0.15, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"l2": "auto"}, "'cv'"),
        ({"l2": -1.0}, "non-negative"),
        ({"l2": float("nan")}, "finite"),
        ({"l2": True}, "l2"),
        ({"cv": 1}, "cv"),
        ({"cv": 2.5}, "cv"),
        ({"l2_grid": (1.0,)}, "two distinct"),
        ({"l2_grid": (1.0, -2.0)}, "non-negative"),
        ({"l2_grid": "0,1"}, "sequence"),
        ({"max_iter": 0}, "max_iter"),
    ],
)
def test_bad_hyperparameters_raise_naming_the_argument(kwargs, match):
    for cls in (VectorScaling, MatrixScaling, Temperature):
        with pytest.raises(ValueError, match=match):
            cls(**kwargs)


def test_too_few_samples_for_the_folds_says_how_to_fix():
    with pytest.raises(ValueError, match="smaller `cv` or a fixed `l2`"):
        MatrixScaling(cv=5).fit(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
