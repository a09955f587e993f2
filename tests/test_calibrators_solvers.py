"""The solvers of the post-hoc fits: Newton's method for the vector maps
(cogcal.calibrators._newton; its Hessian against autograd's, its fits against L-BFGS on the
same objective), and the preconditioner the cross-validation folds of the full affine maps
share (against one per fold)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cogcal.calibrators import (
    Dirichlet,
    MatrixScaling,
    StructuredVectorScaling,
    VectorScaling,
    affine,
    make_calibrator,
)
from cogcal.calibrators._base import Calibrator
from cogcal.calibrators._newton import VectorProblem, fit_vector, hessian_sums, vector_objective


def _data(n: int = 300, k: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = 3.0 * (torch.randn(n, k, generator=g, dtype=torch.float64) + 1.5 * F.one_hot(y, k))
    return z, y


def _problem(k: int, seed: int = 1) -> VectorProblem:
    z, y = _data(k=k)
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(k, generator=g, dtype=torch.float64)
    m = torch.randn(k, k, generator=g, dtype=torch.float64)
    return VectorProblem(z, y, a, torch.randn(k, generator=g, dtype=torch.float64), m @ m.T)


def _reference(problem: VectorProblem, wb: torch.Tensor) -> torch.Tensor:
    x, y, a, w0, bb = problem
    k = x.shape[1]
    w, b = wb[:k], wb[k:]
    return F.cross_entropy(x * w + b, y) + 0.5 * (a * (w - w0) ** 2).sum() + 0.5 * b @ bb @ b


@pytest.mark.parametrize("k", [2, 5])
def test_vector_objective_matches_autograd(k: int) -> None:
    problem = _problem(k)
    g = torch.Generator().manual_seed(2)
    wb = torch.randn(2 * k, generator=g, dtype=torch.float64)
    loss, grad, hess = vector_objective(problem, wb[:k], wb[k:], hessian=True)
    ref = wb.clone().requires_grad_(True)
    ref_loss = _reference(problem, ref)
    (ref_grad,) = torch.autograd.grad(ref_loss, ref)
    ref_hess = torch.autograd.functional.hessian(lambda v: _reference(problem, v), wb)
    assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(hess, ref_hess, rtol=1e-10, atol=1e-12)
    assert vector_objective(problem, wb[:k], wb[k:], hessian=False)[2] is None


@pytest.mark.parametrize("cls", [VectorScaling, StructuredVectorScaling])
@pytest.mark.parametrize("l2", [0.0, 3.0, 300.0])
def test_newton_fit_equals_the_lbfgs_fit(cls: type, l2: float, monkeypatch) -> None:
    z, y = _data(n=400, k=4, seed=3)
    newton = cls(l2=l2).fit(z, y)
    monkeypatch.setattr(cls, "_vector_problem", Calibrator._vector_problem)
    lbfgs = cls(l2=l2).fit(z, y)
    assert newton.n_iter_ < lbfgs.n_iter_
    # (without a penalty structured vector scaling's b is defined up to a constant)
    torch.testing.assert_close(newton.predict_proba(z), lbfgs.predict_proba(z), atol=1e-5, rtol=0)
    if l2 > 0:
        torch.testing.assert_close(newton.weight, lbfgs.weight, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(newton.bias, lbfgs.bias, rtol=1e-4, atol=1e-5)
    assert newton.nll_after_ <= lbfgs.nll_after_ + 1e-9


def test_hessian_sums_over_disjoint_rows_add_up_to_the_objectives_hessian() -> None:
    problem = _problem(4)
    x = problem.features
    g = torch.Generator().manual_seed(5)
    w, b = torch.rand(4, generator=g, dtype=torch.float64), torch.randn(4, generator=g).double()
    groups = [torch.arange(x.shape[0]) % 3 == r for r in range(3)]
    parts = hessian_sums(x, w, b, groups)
    penalty = torch.block_diag(torch.diag(problem.w_curvature), problem.b_curvature)
    exact = vector_objective(problem, w, b, hessian=True)[2]
    torch.testing.assert_close(sum(parts) / x.shape[0] + penalty, exact, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("metric_at", ["start", "elsewhere"])
def test_a_newton_fit_with_a_nearby_metric_reaches_the_same_minimiser(metric_at: str) -> None:
    """``metric`` changes the path (a Hessian from nearby, refreshed when a step converges
    slowly), not the minimiser; a metric from a distant point is refreshed, not trusted."""
    problem = _problem(5)
    k, rows = 5, [torch.ones(problem.features.shape[0], dtype=torch.bool)]
    w0, b0 = torch.ones(k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    where = (w0, b0) if metric_at == "start" else (5.0 * w0, b0 + torch.arange(k) - 2.0)
    (metric,) = hessian_sums(problem.features, *where, rows)
    tolerances = dict(max_iter=100, tolerance_grad=1e-10, tolerance_change=0.0)
    w_ref, b_ref, _ = fit_vector(problem, w0, b0, **tolerances)
    w, b, _ = fit_vector(problem, w0, b0, metric=metric, **tolerances)
    torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-8)
    torch.testing.assert_close(b, b_ref, rtol=0, atol=1e-8)


def test_vector_scaling_folds_sharing_a_metric_score_as_folds_with_their_own(monkeypatch):
    """Vector scaling's cross-validation folds step with one shared Hessian sum instead of
    forming their own: the same scores (to the scoring fits' tolerance) and choice."""
    for seed, k in [(4, 6), (7, 2), (8, 12)]:
        z, y = _data(n=500, k=k, seed=seed)
        shared = VectorScaling().fit(z, y)
        with monkeypatch.context() as patch:
            patch.setattr(VectorScaling, "_fit_folds", Calibrator._fit_folds)
            own = VectorScaling().fit(z, y)
        _same_cross_validation(shared, own, atol=1e-6)
        torch.testing.assert_close(shared.weight, own.weight, rtol=0, atol=1e-6)


def _same_cross_validation(ours, reference, atol: float) -> None:
    assert ours.l2_ == reference.l2_
    torch.testing.assert_close(
        torch.tensor(ours.cv_scores_), torch.tensor(reference.cv_scores_), equal_nan=True,
        rtol=0, atol=atol,
    )  # fmt: skip


def test_newton_cross_validation_chooses_as_lbfgs(monkeypatch) -> None:
    z, y = _data(n=500, k=6, seed=4)
    newton = VectorScaling().fit(z, y)
    monkeypatch.setattr(VectorScaling, "_vector_problem", Calibrator._vector_problem)
    _same_cross_validation(newton, VectorScaling().fit(z, y), atol=1e-6)


@pytest.mark.parametrize("cls", [MatrixScaling, Dirichlet])
def test_folds_sharing_a_preconditioner_fit_the_same_maps(cls: type, monkeypatch) -> None:
    z, y = _data(n=300, k=4, seed=3)
    shared = cls().fit(z, y)
    monkeypatch.setattr(cls, "_fold_models", Calibrator._fold_models)
    per_fold = cls().fit(z, y)
    _same_cross_validation(shared, per_fold, atol=1e-5)
    torch.testing.assert_close(shared.weight, per_fold.weight, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["ms", "dirichlet", "sms"])
def test_full_maps_beyond_the_block_limit_fit_unconditioned_to_the_same_optimum(kind, monkeypatch):
    """Above BLOCK_MAX_CLASSES the row blocks (K (K+1)^2 numbers each: 24 GB at 1,000
    classes) are not built; the fit runs on W and b themselves and reaches the same map."""
    g = torch.Generator().manual_seed(3)
    y = torch.arange(600) % 5
    z = 2.0 * torch.nn.functional.one_hot(y, 5).double() + torch.randn(
        600, 5, generator=g, dtype=torch.float64
    )
    conditioned = make_calibrator(kind)
    conditioned.l2 = 1.0
    conditioned.fit(z, y)
    monkeypatch.setattr(affine, "BLOCK_MAX_CLASSES", 4)
    plain = make_calibrator(kind)
    plain.l2 = 1.0
    plain.fit(z, y)
    assert getattr(plain, "_data_curvature", None) is None
    with torch.no_grad():
        torch.testing.assert_close(plain(z), conditioned(z), atol=2e-4, rtol=0)
