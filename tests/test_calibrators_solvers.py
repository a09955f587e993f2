"""The solvers of the post-hoc fits: Newton's method for the vector maps
(cogcal.calibrators._newton; its Hessian against autograd's, its fits against L-BFGS on the
same objective), and the preconditioner the cross-validation folds of the full affine maps
share (against one per fold)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cogcal.calibrators import (
    BetaCalibration,
    Dirichlet,
    LaplaceTemperature,
    MatrixScaling,
    Platt,
    StructuredVectorScaling,
    Temperature,
    VectorScaling,
    _base,
    _newton,
    affine,
    make_calibrator,
)
from cogcal.calibrators._base import Calibrator
from cogcal.calibrators._newton import (
    FoldProblems,
    VectorProblem,
    _flat_directions,
    fit_folds,
    fit_log_temperature,
    fit_vector,
    fold_data_hessians,
    fold_objectives,
    hessian_sums,
    log_temperature_objective,
    stack_folds,
    vector_objective,
)
from cogcal.calibrators.temperature import fit_temperature


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
    x, y, a, w0, bb = problem[:5]
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
    assert all(part.dtype == torch.float64 for part in parts)
    penalty = torch.block_diag(torch.diag(problem.w_curvature), problem.b_curvature)
    exact = vector_objective(problem, w, b, hessian=True)[2]
    # (formed in float32, METRIC_DTYPE: a metric, to float32's precision)
    torch.testing.assert_close(sum(parts) / x.shape[0] + penalty, exact, rtol=1e-5, atol=1e-6)


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
    w_ref, b_ref, *_ = fit_vector(problem, w0, b0, **tolerances)
    w, b, *_ = fit_vector(problem, w0, b0, metric=metric, **tolerances)
    torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-8)
    torch.testing.assert_close(b, b_ref, rtol=0, atol=1e-8)


def test_vector_scaling_folds_sharing_a_metric_score_as_folds_with_their_own(monkeypatch):
    """Vector scaling's cross-validation folds step with one shared Hessian sum instead of
    forming their own: the same scores (to the scoring fits' tolerance) and choice."""
    monkeypatch.setattr(affine, "FOLDS_TOGETHER_SIZE", 0)  # (else: Newton on all folds)
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
    monkeypatch.setattr(affine, "FOLDS_TOGETHER_SIZE", 0)
    _same_cross_validation(newton, VectorScaling().fit(z, y), atol=1e-6)


@pytest.mark.parametrize("cls", [MatrixScaling, Dirichlet])
def test_folds_sharing_a_preconditioner_fit_the_same_maps(cls: type, monkeypatch) -> None:
    monkeypatch.setattr(affine, "FOLDS_TOGETHER_SIZE", 0)  # (else: Newton on all folds)
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


# -- the folds' fits stacked (few classes) -------------------------------------------------


def _fold_problems(k: int, full: bool, sizes: tuple[int, ...] = (40, 37, 33)) -> FoldProblems:
    g = torch.Generator().manual_seed(k + 10 * full)
    xs, ys = [], []
    for n in sizes:
        z, y = _data(n=n, k=k, seed=n)
        xs.append(z / 3.0)
        ys.append(y)
    p = k * (k + 1) if full else 2 * k
    m = torch.randn(len(sizes), p, p, generator=g, dtype=torch.float64)
    # flat, as the calibrators' penalties are, where the softmax is: b + c 1 (and W + 1 v^T)
    keep = torch.eye(p, dtype=torch.float64) - _flat_directions(k, full, m)
    curvature = 0.1 * keep @ m @ m.transpose(1, 2) @ keep
    centre = torch.randn(len(sizes), p, generator=g, dtype=torch.float64)
    return stack_folds(xs, ys, curvature, centre, full=full)


def _fold_reference(problems: FoldProblems, f: int, theta: torch.Tensor) -> torch.Tensor:
    """Fold ``f``'s objective at ``theta``, by autograd's building blocks, on its own rows
    only (no padding)."""
    n = int((problems.weights[f] > 0).sum())
    x, y, k = problems.features[f, :, :n].T, problems.labels[f, :n], problems.features.shape[1]
    if problems.full:
        wb = theta.view(k, k + 1)
        z = x @ wb[:, :k].T + wb[:, k]
    else:
        z = x * theta[:k] + theta[k:]
    d = theta - problems.centre[f]
    return F.cross_entropy(z, y) + 0.5 * d @ problems.curvature[f] @ d


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("k", [2, 4])
def test_stacked_fold_objectives_and_hessians_match_autograd(k: int, full: bool) -> None:
    """Each fold's objective, gradient and Hessian, computed on the padded stack, equal
    autograd's on that fold's own rows."""
    problems = _fold_problems(k, full)
    g = torch.Generator().manual_seed(3)
    theta = 0.5 * torch.randn(3, problems.centre.shape[1], generator=g, dtype=torch.float64)
    loss, grad = fold_objectives(problems, theta)
    hess = fold_data_hessians(problems, theta) + problems.curvature
    for f in range(3):
        ref = theta[f].clone().requires_grad_(True)
        value = _fold_reference(problems, f, ref)
        (ref_grad,) = torch.autograd.grad(value, ref)
        ref_hess = torch.autograd.functional.hessian(
            lambda v, f=f: _fold_reference(problems, f, v), theta[f]
        )
        assert float(loss[f]) == pytest.approx(float(value.detach()), rel=1e-12)
        torch.testing.assert_close(grad[f], ref_grad, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(hess[f], ref_hess, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("metric", ["none", "distant"])
def test_stacked_fold_fits_reach_each_folds_own_minimiser(full: bool, metric: str) -> None:
    """All folds stepped at once (each its own step length and stop; from a metric formed
    elsewhere, refreshed where it misleads) reach the minimiser of each fold's objective
    found alone by L-BFGS."""
    k = 3
    problems = _fold_problems(k, full)
    start = problems.centre.clone()
    kept = None
    if metric == "distant":
        kept = fold_data_hessians(problems, 4.0 * torch.ones_like(start))
    theta, used = fit_folds(
        problems, start, max_iter=100, tolerance_grad=1e-10, tolerance_change=0.0, metric=kept
    )  # fmt: skip
    assert used.shape == (3, start.shape[1], start.shape[1])
    for f in range(3):
        x = start[f].clone().requires_grad_(True)
        opt = torch.optim.LBFGS([x], max_iter=500, tolerance_grad=1e-12, tolerance_change=0,
                                line_search_fn="strong_wolfe")  # fmt: skip

        def closure(f: int = f, x: torch.Tensor = x) -> torch.Tensor:
            x.grad = None
            value = _fold_reference(problems, f, x)
            value.backward()
            return value

        opt.step(closure)
        ref = float(_fold_reference(problems, f, x.detach()))
        assert float(_fold_reference(problems, f, theta[f])) <= ref + 1e-12
        torch.testing.assert_close(theta[f], x.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["vs", "ms", "dirichlet"])
@pytest.mark.parametrize("k", [2, 4, 10])
def test_folds_fitted_together_score_as_folds_fitted_alone(kind: str, k: int, monkeypatch):
    """With few rows x classes^2 (FOLDS_TOGETHER_SIZE) the folds are fitted by Newton's method
    all at once: the same cross-validation scores (to the scoring fits' tolerance) and the
    same choice and map as each fold fitted alone (L-BFGS for the full maps)."""
    z, y = _data(n=400, k=k, seed=k)
    together = make_calibrator(kind).fit(z, y)
    monkeypatch.setattr(affine, "FOLDS_TOGETHER_SIZE", 0)
    alone = make_calibrator(kind).fit(z, y)
    unpenalised = together.l2_grid_ == 0  # (no minimum where the data are separable)
    together.cv_scores_[unpenalised] = alone.cv_scores_[unpenalised] = 0.0
    _same_cross_validation(together, alone, atol=2e-5)
    torch.testing.assert_close(together.weight, alone.weight, rtol=0, atol=1e-5)


# -- one-parameter and two-class fits ------------------------------------------------------


@pytest.mark.parametrize("u", [-1.0, 0.0, 0.7, 2.5])
@pytest.mark.parametrize("weight", [0.0, 0.01])
def test_log_temperature_objective_and_derivatives_match_autograd(u: float, weight: float):
    z, y = _data(n=200, k=4, seed=9)
    n = z.shape[0]
    picked = y * n + torch.arange(n)
    loss, first, second = log_temperature_objective(z.T.contiguous(), picked, u, weight)

    def reference(v: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(z * torch.exp(-v), y) + weight * v**2

    v = torch.tensor(u, dtype=torch.float64, requires_grad=True)
    value = reference(v)
    (grad,) = torch.autograd.grad(value, v, create_graph=True)
    (hess,) = torch.autograd.grad(grad, v)
    assert loss == pytest.approx(float(value), rel=1e-12)
    assert first == pytest.approx(float(grad), rel=1e-9, abs=1e-12)
    assert second == pytest.approx(float(hess), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("cls", [Temperature, LaplaceTemperature, Platt, BetaCalibration])
@pytest.mark.parametrize("l2", [0.0, 1.0, 50.0])
def test_newton_fits_of_one_to_three_parameters_equal_lbfgs(cls: type, l2: float, monkeypatch):
    """Temperature scaling (in log T) and the two-class logistic maps are fitted by
    Newton's method; L-BFGS through autograd on the generic objective is the reference."""
    k = 2 if cls in (Platt, BetaCalibration) else 4
    z, y = _data(n=300, k=k, seed=11)
    z = z / 2.0 + 0.3 * torch.randn(z.shape, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64)  # fmt: skip
    newton = cls(l2=l2).fit(z, y)
    # (Laplace smoothing's temperature is Temperature's: its reference is Temperature's)
    reference = Temperature if cls is LaplaceTemperature else cls
    monkeypatch.setattr(reference, "_fit_by_newton", Calibrator._fit_by_newton)
    lbfgs = reference(l2=l2).fit(z, y)
    for name, value in lbfgs.state_dict().items():
        torch.testing.assert_close(newton.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    if reference is cls:
        assert newton.nll_after_ <= lbfgs.nll_after_ + 1e-9


def test_log_temperature_newton_steps_downhill_where_not_convex() -> None:
    """Far from the optimum ``f`` may be concave in ``log T``: the fit still converges."""
    z, y = _data(n=200, k=4, seed=2)
    z = z * 40.0  # wildly over-confident: T ~ 40, from u = -3 (T = 0.05)
    u, steps = fit_log_temperature(z, y, -3.0, 1e-3, max_iter=200, tolerance_grad=1e-9,
                                   tolerance_change=0.0)  # fmt: skip
    n = z.shape[0]
    _, first, second = log_temperature_objective(z.T.contiguous(), y * n + torch.arange(n), u, 1e-3)
    assert abs(first) <= 1e-9 and second > 0 and steps < 200


def test_a_newton_fit_reports_its_data_term_and_can_start_from_it() -> None:
    """``fit_vector`` returns the data term (without the penalty) at its minimiser; a fit
    of the same rows at another penalty, started there with that data term (the
    cross-validation's next strength), reaches the minimiser a fresh start reaches."""
    problem = _problem(5)
    x, y = problem.features, problem.labels
    k = x.shape[1]
    w0, b0 = torch.ones(k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    tolerances = dict(max_iter=100, tolerance_grad=1e-10, tolerance_change=0.0)
    first = fit_vector(problem, w0, b0, **tolerances)
    reference = F.cross_entropy(x * first.weight + first.bias, y)
    assert first.data_loss == pytest.approx(float(reference), rel=1e-12)
    w = first.weight.clone().requires_grad_(True)
    b = first.bias.clone().requires_grad_(True)
    grads = torch.autograd.grad(F.cross_entropy(x * w + b, y), (w, b))
    torch.testing.assert_close(first.data_grad, torch.cat(grads), rtol=1e-9, atol=1e-12)
    weaker = problem._replace(
        w_curvature=problem.w_curvature / 10, b_curvature=problem.b_curvature / 10
    )
    fresh = fit_vector(weaker, first.weight, first.bias, **tolerances)
    reused = fit_vector(
        weaker, first.weight, first.bias, start=(first.data_loss, first.data_grad), **tolerances
    )
    torch.testing.assert_close(reused.weight, fresh.weight, rtol=0, atol=1e-10)
    torch.testing.assert_close(reused.bias, fresh.bias, rtol=0, atol=1e-10)


def test_a_temperature_started_elsewhere_is_the_same_minimiser() -> None:
    """``fit_temperature(start=...)`` (the folds' start: all the data's temperature) takes
    fewer Newton steps to the minimiser a start at T = 1 reaches (to its tolerance, a
    gradient of 1e-8 in log T)."""
    z, y = _data(n=400, k=6, seed=11)
    reference = fit_temperature(z, y)
    for start in (reference * 1.01, 2.5, 0.3):
        assert fit_temperature(z, y, start=start) == pytest.approx(reference, rel=1e-7)
    steps = []
    for start in (1.0, reference * 1.01):
        ts = Temperature().double()
        ts.log_temperature.data.fill_(math.log(start))
        steps.append(ts._minimise(z, y, 1.0))
    assert steps[1] < steps[0]


def test_a_newton_fit_keeping_its_hessian_reaches_the_minimiser(monkeypatch):
    """``fit_vector`` keeps a Hessian it formed while its steps converge fast: fewer
    Hessians than steps, to the minimiser (zero gradient; the same from another start)."""
    problem = _problem(6, seed=4)
    k = 6
    tolerances = dict(max_iter=100, tolerance_grad=1e-10, tolerance_change=0.0)
    formed = []
    hessian_sum = _newton._hessian_sum
    monkeypatch.setattr(
        _newton, "_hessian_sum", lambda *a, **kw: formed.append(1) or hessian_sum(*a, **kw)
    )
    w0, b0 = torch.full((k,), 3.0, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    far = fit_vector(problem, w0, b0, **tolerances)
    assert 1 <= len(formed) < far.steps
    grad = vector_objective(problem, far.weight, far.bias, hessian=False)[1]
    assert float(grad.abs().max()) <= 1e-10
    near = fit_vector(problem, torch.ones(k, dtype=torch.float64), b0, **tolerances)
    torch.testing.assert_close(far.weight, near.weight, rtol=0, atol=1e-9)
    torch.testing.assert_close(far.bias, near.bias, rtol=0, atol=1e-9)


def test_scoring_only_fold_fits_stop_early_and_skip_the_fitting_nll() -> None:
    """``cogcal.posthoc.fold_calibrator``: a fold of a cross-validation fits to the
    scoring tolerance and leaves nll_before_/nll_after_ nan; its held-out NLL is within
    the tolerance's reach of the exact fit's."""
    from cogcal.posthoc import fold_calibrator

    z, y = _data(n=500, k=5, seed=12)
    held = torch.arange(len(y)) % 5 == 0
    for kind in ("ms", "sms", "isotonic", "ts"):
        fold = fold_calibrator(kind).fit(z[~held], y[~held])
        exact = make_calibrator(kind).fit(z[~held], y[~held])
        assert math.isnan(fold.nll_before_) and math.isnan(fold.nll_after_)
        assert math.isfinite(exact.nll_after_)
        scored = F.cross_entropy(fold(z[held]).double(), y[held])
        reference = F.cross_entropy(exact(z[held]).double(), y[held])
        assert float(scored) == pytest.approx(float(reference), abs=5e-5)


def test_a_fitted_vector_scaling_refits_the_same_as_a_fresh_one() -> None:
    """The final fit's start from the folds (``_final_start``) is per fit: refitting a
    fitted calibrator, with or without cross-validation, gives a fresh fit's solution."""
    z, y = _data(n=400, k=4, seed=8)
    for l2 in ("cv", 3.0):
        cal = VectorScaling(l2=l2).fit(z, y).fit(z, y)
        fresh = VectorScaling(l2=l2).fit(z, y)
        torch.testing.assert_close(cal.weight, fresh.weight, rtol=0, atol=1e-7)
        torch.testing.assert_close(cal.bias, fresh.bias, rtol=0, atol=1e-7)


# -- reduced precision: the full maps' fits down to the cross-validation's tolerance ------


@pytest.mark.parametrize("kind", ["ms", "dirichlet", "sms"])
def test_full_maps_in_reduced_precision_fit_as_in_float64(kind: str, monkeypatch) -> None:
    """The full maps' L-BFGS fits compute in REDUCED_DTYPE (float32) down to a gradient of
    1e-4: the same cross-validation scores as in float64 (to a tenth of the scoring fits'
    tolerance), the same choice, and the same final map (which goes on to 1e-8 in float64)."""
    from cogcal.posthoc import cross_validated_nll

    monkeypatch.setattr(affine, "FOLDS_TOGETHER_SIZE", 0)  # (else: Newton on all folds)
    z, y = _data(n=600, k=8, seed=21)
    cls = type(make_calibrator(kind))
    assert make_calibrator(kind)._reduced_dtype(z) == torch.float32
    reduced = make_calibrator(kind).fit(z, y)
    reduced_cv = cross_validated_nll(z, y, kind)
    monkeypatch.setattr(cls, "_reduced_dtype", lambda self, logits: None)
    exact = make_calibrator(kind).fit(z, y)
    if exact.l2_grid_ is not None:
        _same_cross_validation(reduced, exact, atol=1e-5)
    torch.testing.assert_close(reduced.weight, exact.weight, rtol=0, atol=1e-6)
    torch.testing.assert_close(reduced.bias, exact.bias, rtol=0, atol=1e-6)
    assert cross_validated_nll(z, y, kind) == pytest.approx(reduced_cv, abs=1e-5)


def test_a_fit_that_stalls_in_reduced_precision_is_finished_in_float64(monkeypatch):
    """A fit whose reduced-precision L-BFGS stops above the cross-validation's tolerance
    (here bfloat16, too coarse to get there) goes on in the logits' float64: the scores and
    the map of the float64 fits."""
    monkeypatch.setattr(affine, "FOLDS_TOGETHER_SIZE", 0)
    z, y = _data(n=400, k=6, seed=5)
    monkeypatch.setattr(MatrixScaling, "_reduced_dtype", lambda self, logits: None)
    exact = MatrixScaling().fit(z, y)
    monkeypatch.setattr(MatrixScaling, "_reduced_dtype", lambda self, logits: torch.bfloat16)
    runs: list[tuple[float, float]] = []
    lbfgs = _base._lbfgs

    def recorded(objective, x, **kwargs):
        run = lbfgs(objective, x, **kwargs)
        runs.append((kwargs["tolerance_grad"], run.largest_gradient))
        return run

    monkeypatch.setattr(_base, "_lbfgs", recorded)
    stalled = MatrixScaling().fit(z, y)
    assert any(tol == 1e-4 and g > 1e-4 for tol, g in runs)  # some bfloat16 runs stalled
    _same_cross_validation(stalled, exact, atol=1e-5)
    torch.testing.assert_close(stalled.weight, exact.weight, rtol=0, atol=1e-6)


def test_lbfgs_continuing_an_earlier_run_reaches_its_minimiser_in_fewer_steps() -> None:
    """``_lbfgs(continuing=run)``: started where an earlier run stopped, with its curvature
    pairs, the same minimiser as a fresh run from there, in fewer iterations."""
    z, y = _data(n=300, k=5, seed=2)

    def objective(x: torch.Tensor) -> tuple[float, torch.Tensor]:
        x = x.detach().requires_grad_(True)
        w = x[:25].view(5, 5)
        loss = F.cross_entropy(z @ w.T + x[25:], y) + 1e-2 * (x**2).sum()
        (grad,) = torch.autograd.grad(loss, x)
        return float(loss.detach()), grad

    x0 = torch.zeros(30, dtype=torch.float64)
    first = _base._lbfgs(objective, x0, max_iter=500, tolerance_grad=1e-3, tolerance_change=0)
    assert first.pairs and first.largest_gradient <= 1e-3
    tight = {"max_iter": 500, "tolerance_grad": 1e-6, "tolerance_change": 1e-15}
    continued = _base._lbfgs(objective, first.x, continuing=first, **tight)
    fresh = _base._lbfgs(objective, first.x, **tight)
    assert continued.largest_gradient <= 1e-6 and fresh.largest_gradient <= 1e-6
    torch.testing.assert_close(continued.x, fresh.x, rtol=0, atol=1e-4)
    assert continued.iterations < fresh.iterations


def test_reduced_precision_only_for_features_of_moderate_size() -> None:
    small = torch.full((3, 4), affine.REDUCED_PRECISION_FEATURES, dtype=torch.float64)
    assert affine.reduced_dtype(small) == torch.float32
    assert affine.reduced_dtype(small * 1.01) is None  # float32 rounding near the tolerance
    assert affine.reduced_dtype(small.float()) is None  # already float32: nothing to reduce
    z, y = _data(n=50, k=3)
    assert MatrixScaling(3)._reduced_dtype(100.0 * z) is None  # logits beyond 256


@pytest.mark.parametrize("reduced", [torch.float32, torch.bfloat16])
def test_vector_scaling_scoring_fits_in_reduced_precision_score_as_in_float64(
    reduced: torch.dtype, monkeypatch
) -> None:
    """Vector scaling's cross-validation fits compute their softmaxes, gradients and
    Hessians in METRIC_DTYPE (float32): the scores and choice of float64 fits. In a
    precision too coarse to reach the tolerance (bfloat16) a fit goes on in float64."""
    monkeypatch.setattr(affine, "FOLDS_TOGETHER_SIZE", 0)  # (else: Newton on all folds)
    z, y = _data(n=600, k=12, seed=9)
    monkeypatch.setattr(_base, "METRIC_DTYPE", torch.float64)
    exact = VectorScaling().fit(z, y)
    monkeypatch.setattr(_base, "METRIC_DTYPE", reduced)
    dtypes: list[torch.dtype] = []
    newton = _newton._newton_vector

    def recorded(problem, columns, *args, **kwargs):
        dtypes.append(columns.x.dtype)
        return newton(problem, columns, *args, **kwargs)

    monkeypatch.setattr(_newton, "_newton_vector", recorded)
    fit = VectorScaling().fit(z, y)
    assert reduced in dtypes
    if reduced == torch.bfloat16:
        assert dtypes.count(torch.float64) > 1  # the final fit, and the stalled folds'
    _same_cross_validation(fit, exact, atol=1e-5)
    torch.testing.assert_close(fit.weight, exact.weight, rtol=0, atol=1e-7)
