"""Newton's method for the vector maps ``x * w + b`` (vector scaling, structured vector
scaling): 2K parameters, whose Hessian is four K x K blocks formed in O(N K^2); for the
cross-validation folds of the affine maps over few classes, all folds at once
(:func:`fit_folds`); for the two-class logistic maps (Platt, Beta calibration,
:func:`fit_logistic`); and for temperature scaling's ``log T`` (:func:`fit_log_temperature`).

A penalised vector-scaling fit by L-BFGS takes 25-600 evaluations (more the stronger the
coupling between classes); Newton's method takes 3-10 steps from the same start, each one
evaluation, one Hessian and one Cholesky solve of size 2K (docs/performance.md,
"posthoc_peers"). The objective is

.. math::

    \\frac1n \\sum_i -\\log\\mathrm{softmax}(x_i \\odot w + b)_{y_i}
        + \\tfrac12 (w - w_0)^\\top \\mathrm{diag}(a) (w - w_0) + \\tfrac12 b^\\top B b,

with ``a`` and ``B`` given by the calibrator (its penalty, already divided by ``n``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F


class VectorColumns(NamedTuple):
    """A vector problem's data laid out for the objective: the features as (K, N) (a
    softmax over a long contiguous dimension is 2.5x faster than over rows of K at K = 100),
    the labels' entries of that layout, and the constant one-hot part of the gradient per
    class (the labelled rows' features and their count)."""

    x: torch.Tensor  # (K, N)
    picked: torch.Tensor  # (N,) label * N + row
    label_x: torch.Tensor  # (K,) sum of x_iy over the rows labelled y
    label_count: torch.Tensor  # (K,)


def vector_columns(x: torch.Tensor, labels: torch.Tensor) -> VectorColumns:
    """The :class:`VectorColumns` of features ``x`` (N, K) and ``labels``."""
    n, k = x.shape
    rows = torch.arange(n, device=x.device)
    return VectorColumns(
        x.T.contiguous(), labels * n + rows,
        x.new_zeros(k).index_add_(0, labels, x[rows, labels]),
        torch.bincount(labels, minlength=k).to(x.dtype),
    )  # fmt: skip


class VectorProblem(NamedTuple):
    """The data and the quadratic penalty of one vector-map fit (see the module docstring)."""

    features: torch.Tensor  # (N, K) the x of x * w + b
    labels: torch.Tensor  # (N,)
    w_curvature: torch.Tensor  # (K,) a
    w_centre: torch.Tensor  # (K,) w_0
    b_curvature: torch.Tensor  # (K, K) B, symmetric positive semi-definite
    # the features and labels as the objective reads them (formed by fit_vector if None;
    # a calibrator refitting the same rows at several strengths keeps them)
    columns: VectorColumns | None = None


def _hessian_sum(
    x: torch.Tensor,
    p: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The data term's Hessian summed over the columns (rows of the data) of features ``x``
    (..., K, N) at their softmax probabilities ``p`` (..., K, N), each column weighted by
    ``weights`` (..., 1, N) if given: ``diag([X^2, X, 1] P) - M M^T`` over
    ``M = [X * P; P]`` (the blocks ``w w``, ``w b``, ``b b``; the cross term of a block's
    diagonal on its diagonal); batched over the leading dimensions. ``dtype``: compute in
    it, returning ``x``'s (:data:`METRIC_DTYPE` for a Newton metric)."""
    if dtype is not None and dtype != x.dtype:
        w32 = None if weights is None else weights.to(dtype)
        return _hessian_sum(x.to(dtype), p.to(dtype), w32).to(x.dtype)
    k = x.shape[-2]
    pw = p if weights is None else p * weights
    xp, xpw = x * p, x * pw
    wb = xp @ pw.mT  # (the three distinct blocks of M M^T: a quarter fewer products than it)
    h = torch.cat(
        [torch.cat([xp @ xpw.mT, wb], -1), torch.cat([wb.mT, p @ pw.mT], -1)], -2
    ).neg_()  # fmt: skip
    h.diagonal(dim1=-2, dim2=-1).add_(torch.cat([(xpw * x).sum(-1), pw.sum(-1)], -1))
    cross = xpw.sum(-1)  # d2 / dw_k db_k: sum_i x_ik p_ik (the -p_ik^2 x_ik is in M M^T)
    h.diagonal(k, dim1=-2, dim2=-1).add_(cross)
    h.diagonal(-k, dim1=-2, dim2=-1).add_(cross)
    return h


#: The precision of the Hessians that serve only as Newton metrics of fits to a loose
#: gradient (:func:`hessian_sums`), and of everything a fit to a loose gradient computes
#: per row (:func:`fit_vector`'s ``dtype``: softmaxes, gradients, Hessians; the loss is
#: summed and the iterate kept in float64): the step a metric gives is a descent direction
#: at any precision, and float32's seven digits (a relative error of about 4e-7 on
#: 1,600 x 100 logits) cost no step of a fit to a gradient of 1e-4, for softmaxes and
#: products that take 40-60% less time (docs/performance.md, "posthoc_peers"). A fit
#: whose steps stall above its tolerance in it goes on in float64.
METRIC_DTYPE = torch.float32


def hessian_sums(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, groups: list[torch.Tensor]
) -> list[torch.Tensor]:
    """The data term's Hessian at ``(w, b)`` summed over each of ``groups`` (boolean row
    masks of ``x``), from one softmax of all the rows. Sums over disjoint rows add up: the
    held-out rows' sums of the cross-validation folds give every fold's Hessian."""
    with torch.no_grad():
        p = torch.softmax(x * w + b, dim=1)
    return [_hessian_sum(x[rows].T, p[rows].T, dtype=METRIC_DTYPE) for rows in groups]


def _penalised(
    problem: VectorProblem, w: torch.Tensor, b: torch.Tensor, loss: float, grad: torch.Tensor,
    hessian_sum: torch.Tensor | None,
) -> tuple[float, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """The data term's mean (``loss``, ``grad``, and ``hessian_sum / n`` if given) plus the
    penalty's value and derivatives."""
    a, w0, bb = problem.w_curvature, problem.w_centre, problem.b_curvature
    dw, bp = w - w0, bb @ b
    loss += 0.5 * float(a @ dw**2) + 0.5 * float(b @ bp)
    grad = grad + torch.cat([a * dw, bp])
    if hessian_sum is None:
        return loss, grad, None
    k = w.shape[0]
    h = hessian_sum / problem.features.shape[0]
    h.diagonal()[:k].add_(a)
    h[k:, k:] += bb
    return loss, grad, h


def _data_term(
    columns: VectorColumns, w: torch.Tensor, b: torch.Tensor
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """The data term's mean at ``(w, b)``, its gradient (2K,) and the probabilities (K, N)
    (for its Hessian, :func:`_hessian_sum`); computed in ``columns.x``'s dtype (the loss
    summed, and the gradient returned, in ``w``'s)."""
    x, n = columns.x, columns.x.shape[1]
    wx, bx = w.to(x.dtype), b.to(x.dtype)
    logp = torch.log_softmax(torch.addcmul(bx[:, None], x, wx[:, None]), dim=0)
    loss = -float(logp.take(columns.picked).sum(dtype=w.dtype)) / n
    p = logp.exp_()  # (logp is not needed after the loss)
    sums = torch.cat([(p * x).sum(1), p.sum(1)]).to(w.dtype)
    return loss, (sums - torch.cat([columns.label_x, columns.label_count])) / n, p


def vector_objective(
    problem: VectorProblem, w: torch.Tensor, b: torch.Tensor, *, hessian: bool
) -> tuple[float, torch.Tensor, torch.Tensor | None]:
    """The objective at ``(w, b)``, its gradient (2K,) and, if ``hessian``, its Hessian
    (2K, 2K): the data term's mean over the ``n`` rows plus the penalty's."""
    columns = problem.columns
    if columns is None:
        columns = vector_columns(problem.features, problem.labels)
    loss, grad, p = _data_term(columns, w, b)
    return _penalised(
        problem, w, b, loss, grad, _hessian_sum(columns.x, p) if hessian else None
    )  # fmt: skip


def _solve(h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``-H^{-1} g`` by Cholesky, adding the least jitter (relative to H's largest diagonal
    entry) that makes ``H`` positive definite: the softmax is flat along ``b + c 1``, so an
    unpenalised ``H`` is singular there (where ``g`` is 0)."""
    top = float(h.diagonal().abs().max().clamp(min=1e-300))
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    for jitter in (1e-12, 1e-9, 1e-6, 1e-3, 1.0):
        factor, info = torch.linalg.cholesky_ex(h + jitter * top * eye)
        if not int(info):
            return -torch.cholesky_solve(g[:, None], factor)[:, 0]
    return -g / top  # pragma: no cover - a diagonal of `top` makes any symmetric H definite


def _backtrack(
    evaluate: Callable[[Any], Any], x: Any, step: Any, loss: float, slope: float
) -> tuple[float, Any]:
    """Armijo backtracking from the full step: the first ``t`` of 1, 1/2, 1/4, ... (40 of
    them) at which ``evaluate(x + t step)``'s objective (its first entry) falls below
    ``loss + 1e-4 t slope``, and that evaluation; ``(0.0, None)`` when none does."""
    t = 1.0
    for _ in range(40):
        new = evaluate(x + t * step)
        if new[0] <= loss + 1e-4 * t * slope:
            return t, new
        t *= 0.5
    return 0.0, None


def _largest(g: Any) -> float:
    return abs(g) if isinstance(g, float) else float(g.abs().max())


def _damped_newton(
    evaluate: Callable[[Any], Any],
    newton_step: Callable[[Any], Any],
    x: Any,
    *,
    max_iter: int,
    tolerance_grad: float,
    tolerance_change: float,
) -> tuple[Any, int]:
    """Minimise from ``x`` (a tensor, or a float) by damped Newton steps with the stopping
    rules of :func:`fit_vector`: ``evaluate(x)`` gives the objective, its gradient and
    what ``newton_step(evaluation)`` needs to return the step. Returns the minimiser and
    the steps taken."""
    current = evaluate(x)
    n_iter = 0
    while n_iter < max_iter and _largest(current[1]) > tolerance_grad:
        n_iter += 1
        step = newton_step(current)
        slope = current[1] * step if isinstance(step, float) else float(current[1] @ step)
        t, new = _backtrack(evaluate, x, step, current[0], slope)
        if new is None:
            break  # no decrease along the Newton direction: at the minimum to rounding
        previous = current[0]
        x, current = x + t * step, new
        if abs(previous - current[0]) < tolerance_change:
            break
    return x, n_iter


class VectorFit(NamedTuple):
    """What :func:`fit_vector` found: the minimiser, the steps taken, and the data term
    (the mean NLL, without the penalty) and its gradient there."""

    weight: torch.Tensor
    bias: torch.Tensor
    steps: int
    data_loss: float
    data_grad: torch.Tensor


def fit_vector(
    problem: VectorProblem,
    w: torch.Tensor,
    b: torch.Tensor,
    *,
    max_iter: int,
    tolerance_grad: float,
    tolerance_change: float,
    metric: torch.Tensor | None = None,
    start: tuple[float, torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> VectorFit:
    """Minimise the objective from ``(w, b)`` by damped Newton steps (Armijo backtracking
    from the full step).

    ``start``: the data term and its gradient at ``(w, b)`` when they are known (the
    previous fit of the same rows ended there, :attr:`VectorFit.data_loss`), which saves
    the first evaluation: only the penalty changed.

    ``metric``: the data term's Hessian summed over the problem's rows at a point near
    ``(w, b)`` (:func:`hessian_sums`). With the penalty's curvature it stands in for the
    exact Hessian as long as each full step is accepted and cuts the largest gradient entry
    ten-fold; from the first step that does not, the steps form the Hessian afresh. Near
    the minimum a Hessian from nearby is as good a metric as the exact one, at no pass
    over the data.

    ``dtype``: the precision of what the fit computes per row (softmaxes, gradients,
    Hessians; default the data's): :data:`METRIC_DTYPE` for a fit that stops at a loose
    gradient (the cross-validation's scoring fits); if its steps stall above
    ``tolerance_grad`` there, the fit goes on in the data's. A fit to a tight gradient
    keeps float64: near the minimum the objective's changes fall to float32's rounding
    before its steps reach 1e-8.

    Stops when the largest gradient entry is at most ``tolerance_grad``, when a step taken
    with a Hessian formed where it started changes the objective by less than
    ``tolerance_change`` (a kept metric's step that does is checked by forming it there),
    or after ``max_iter`` steps.
    """
    columns = problem.columns
    if columns is None:
        columns = vector_columns(problem.features, problem.labels)
    limits = dict(
        max_iter=max_iter, tolerance_grad=tolerance_grad, tolerance_change=tolerance_change
    )
    if dtype is None or dtype == columns.x.dtype:
        return _newton_vector(problem, columns, w, b, metric=metric, start=start, **limits)[0]
    reduced = columns._replace(x=columns.x.to(dtype))
    fit, largest = _newton_vector(problem, reduced, w, b, metric=metric, start=start, **limits)
    if largest <= tolerance_grad or fit.steps >= max_iter:
        return fit
    # stalled in the reduced precision: on in the data's, from where it stopped
    limits["max_iter"] = max_iter - fit.steps
    rest, _ = _newton_vector(
        problem, columns, fit.weight, fit.bias, metric=None, start=None, **limits
    )
    return rest._replace(steps=fit.steps + rest.steps)


def _newton_vector(
    problem: VectorProblem,
    columns: VectorColumns,
    w: torch.Tensor,
    b: torch.Tensor,
    *,
    max_iter: int,
    tolerance_grad: float,
    tolerance_change: float,
    metric: torch.Tensor | None,
    start: tuple[float, torch.Tensor] | None,
) -> tuple[VectorFit, float]:
    """:func:`fit_vector`'s Newton steps on the rows as ``columns`` lays them out (in their
    dtype); also returns the largest entry of the objective's gradient where they stop."""
    k = w.shape[0]

    def evaluate(v: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
        """The objective, its gradient and the probabilities at ``v = [w, b]``."""
        loss, grad, p = _data_term(columns, v[:k], v[k:])
        return (*_penalised(problem, v[:k], v[k:], loss, grad, None)[:2], p)

    probs = None  # at (w, b), for the Hessian there
    if start is None:
        loss, grad, probs = evaluate(torch.cat([w, b]))
    else:
        loss, grad, _ = _penalised(problem, w, b, start[0], start[1], None)
    fixed = None  # the Hessian kept (from `metric`, or formed at an earlier step)
    if metric is not None:
        fixed = _penalised(problem, w, b, 0.0, torch.zeros_like(grad), metric)[2]
    exact = False  # whether `fixed` was formed where the fit is now
    n_iter = 0
    # the Hessian (the (2K x N) (N x 2K) product, most of a step's cost) only where a step
    # starts, and kept while the steps it gives converge fast: a warm-started fit that
    # converges in one step forms it once
    while n_iter < max_iter and float(grad.abs().max()) > tolerance_grad:
        n_iter += 1
        if fixed is None:
            if probs is None:
                probs = _data_term(columns, w, b)[2]
            hessian = _hessian_sum(columns.x, probs).to(grad.dtype)
            fixed = _penalised(problem, w, b, 0.0, torch.zeros_like(grad), hessian)[2]
            exact = True
        step = _solve(fixed, grad)
        t, new = _backtrack(evaluate, torch.cat([w, b]), step, loss, float(grad @ step))
        if new is None:
            if not exact:  # the kept Hessian misled the step: form it afresh
                fixed = None
                continue
            break  # no decrease along the Newton direction: at the minimum to rounding
        new_loss, new_grad, probs = new
        stepped_exact, exact = exact, False
        if t < 1.0 or float(new_grad.abs().max()) > 0.1 * float(grad.abs().max()):
            fixed = None
        previous = loss
        w, b, loss, grad = w + t * step[:k], b + t * step[k:], new_loss, new_grad
        if abs(previous - loss) < tolerance_change:
            if stepped_exact:
                break
            fixed = None  # a kept metric's step that barely moved: check with the Hessian here
    penalty, penalty_grad, _ = _penalised(problem, w, b, 0.0, torch.zeros_like(grad), None)
    fit = VectorFit(w, b, n_iter, loss - penalty, grad - penalty_grad)
    return fit, float(grad.abs().max())


# -- the cross-validation folds' fits, all at once -------------------------------------
#
# With few classes a fold's fit is a few Newton steps on a handful of parameters, and its
# cost is the calls, not the arithmetic (two classes: 45 fits of 5 folds x 9 strengths took
# 50 ms, 1 ms each). The folds' fits at one strength are independent problems of the same
# shape: stacked (rows padded with zeros of weight 0), each step of all of them is one call
# of each operation, each fold keeping its own step length and stopping rule.


class FoldProblems(NamedTuple):
    """The folds' fits of one affine map at one penalty strength, stacked: fold ``f``
    minimises the mean NLL of its own rows (``weights[f]``: ``1 / n_f`` on them, 0 on the
    padding) plus ``(theta - centre[f])^T curvature[f] (theta - centre[f]) / 2``. The parameters ``theta`` (F, P) are ``[w, b]``
    (P = 2K, ``x * w + b``) or, with ``full``, ``[W | b]`` row by row (P = K (K+1),
    ``W x + b``)."""

    features: torch.Tensor  # (F, K, M): the rows as columns, zero past each fold's own
    labels: torch.Tensor  # (F, M)
    weights: torch.Tensor  # (F, M): 1 / rows[f] on a fold's rows, 0 on the padding
    curvature: torch.Tensor  # (F, P, P)
    centre: torch.Tensor  # (F, P)
    full: bool

    def take(self, folds: torch.Tensor) -> FoldProblems:
        """The problems of ``folds`` (indices, ascending) only."""
        if folds.numel() == self.features.shape[0]:
            return self
        return FoldProblems(*(t[folds] for t in self[:5]), self.full)

    def at_strength(self, scale: float) -> FoldProblems:
        """The same problems with the penalty's curvature times ``scale``."""
        return self._replace(curvature=scale * self.curvature)


def stack_folds(
    features: list[torch.Tensor], labels: list[torch.Tensor], curvature: torch.Tensor,
    centre: torch.Tensor, *, full: bool,
) -> FoldProblems:  # fmt: skip
    """The :class:`FoldProblems` of the folds' ``features`` (each (N_f, K)) and ``labels``,
    padded to the longest fold."""
    longest = max(x.shape[0] for x in features)
    x = features[0].new_zeros(len(features), features[0].shape[1], longest)
    y = labels[0].new_zeros(len(features), longest)
    weights = features[0].new_zeros(len(features), longest)
    for f, (xf, yf) in enumerate(zip(features, labels, strict=True)):
        x[f, :, : xf.shape[0]], y[f, : yf.shape[0]] = xf.T, yf
        weights[f, : xf.shape[0]] = 1.0 / len(yf)
    return FoldProblems(x, y, weights, curvature, centre, full)


def _fold_logits(problems: FoldProblems, theta: torch.Tensor) -> torch.Tensor:
    """Each fold's calibrated logits as (F, K, M)."""
    x, k = problems.features, problems.features.shape[1]
    if problems.full:
        wb = theta.view(-1, k, k + 1)
        return torch.baddbmm(wb[:, :, k, None], wb[:, :, :k], x)
    return torch.addcmul(theta[:, k:, None], x, theta[:, :k, None])


def fold_objectives(
    problems: FoldProblems, theta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each fold's objective (F,) and gradient (F, P) at ``theta``."""
    x, s = problems.features, problems.weights
    logp = torch.log_softmax(_fold_logits(problems, theta), dim=1)
    labels = problems.labels[:, None, :]
    loss = -(logp.gather(1, labels).squeeze(1) * s).sum(1)
    r = logp.exp_().scatter_add_(1, labels, torch.full_like(labels, -1, dtype=x.dtype))
    r.mul_(s[:, None, :])  # (P - onehot) / n on each fold's rows, 0 on the padding
    if problems.full:
        grad = torch.cat([r @ x.transpose(1, 2), r.sum(2, keepdim=True)], 2).flatten(1)
    else:
        grad = torch.cat([(r * x).sum(2), r.sum(2)], 1)
    d = theta - problems.centre
    qd = (problems.curvature @ d[:, :, None]).squeeze(2)
    return loss + 0.5 * (d * qd).sum(1), grad + qd


def fold_data_hessians(problems: FoldProblems, theta: torch.Tensor) -> torch.Tensor:
    """Each fold's data-term Hessian (F, P, P) at ``theta``: ``sum_i s_i (diag(p_i) -
    p_i p_i^T) (x) d_i d_i^T`` (``d_i`` the derivative of the logits in one class's
    parameters; the penalty's curvature is ``problems.curvature``)."""
    x, s = problems.features, problems.weights[:, None, :]
    f, k, m = x.shape
    p = torch.softmax(_fold_logits(problems, theta), dim=1)
    if problems.full:
        xt = torch.cat([x, torch.ones_like(x[:, :1])], 1)  # (F, K+1, M)
        outer = ((p * s.sqrt())[:, :, None, :] * xt[:, None, :, :]).reshape(f, -1, m)
        h = -(outer @ outer.transpose(1, 2))
        weighted = ((p * s)[:, :, None, :] * xt[:, None, :, :]).reshape(f, -1, m)
        blocks = (weighted @ xt.transpose(1, 2)).view(f, k, k + 1, k + 1)  # diag(p_i) part
        h.view(f, k, k + 1, k, k + 1).diagonal(dim1=1, dim2=3).add_(blocks.permute(0, 2, 3, 1))
    else:
        h = _hessian_sum(x, p, s)  # (s: 0 on the padding)
    return h


def _flat_directions(k: int, full: bool, like: torch.Tensor) -> torch.Tensor:
    """The projector onto the directions along which the softmax (and the penalties, which
    are centred) do not change: ``b + c 1`` and, for a full map, ``W + 1 v^T``."""
    ones = torch.full((k, k), 1.0 / k, dtype=like.dtype, device=like.device)
    if full:
        return torch.kron(ones, torch.eye(k + 1, dtype=like.dtype, device=like.device))
    return torch.block_diag(torch.zeros_like(ones), ones)


def _solve_folds(h: torch.Tensor, g: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``-H_f^{-1} g_f`` for each fold, with ``H_f`` made definite along the flat
    directions (where ``g_f`` is 0) and, where still needed, the least jitter as
    :func:`_solve`."""
    top = h.diagonal(dim1=1, dim2=2).abs().amax(1).clamp(min=1e-300)[:, None, None]
    h = h + top * flat
    eye = torch.eye(h.shape[1], dtype=h.dtype, device=h.device)
    step, left = torch.empty_like(g), torch.arange(g.shape[0], device=g.device)
    for jitter in (0.0, 1e-12, 1e-9, 1e-6, 1e-3, 1.0):
        factor, info = torch.linalg.cholesky_ex(h[left] + jitter * top[left] * eye)
        ok = info == 0
        step[left[ok]] = -torch.cholesky_solve(g[left[ok], :, None], factor[ok])[:, :, 0]
        left = left[~ok]
        if not left.numel():
            return step
    step[left] = -g[left] / top[left, 0]  # pragma: no cover - as in _solve
    return step


def _pending_objectives(
    problems: FoldProblems, theta: torch.Tensor, pending: torch.Tensor, loss: torch.Tensor,
    grad: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """:func:`fold_objectives` of the ``pending`` folds (elsewhere ``loss`` and ``grad``):
    with many classes a fold's evaluation is not free, and late in a fit few are pending."""
    if bool(pending.all()):
        return fold_objectives(problems, theta)
    folds = pending.nonzero().squeeze(1)
    some_loss, some_grad = fold_objectives(problems.take(folds), theta[folds])
    return loss.index_put((folds,), some_loss), grad.index_put((folds,), some_grad)


def fit_folds(
    problems: FoldProblems,
    theta: torch.Tensor,
    *,
    max_iter: int,
    tolerance_grad: float,
    tolerance_change: float,
    metric: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise every fold's objective from ``theta`` (F, P) by damped Newton steps, as
    :func:`fit_vector` does for one (Armijo backtracking from the full step, each fold its
    own step length and its own stop), all folds' steps at once: every evaluation covers
    all the folds (with few classes it costs what one fold's does), a fold that has stopped
    or accepted its step keeping its parameters.

    ``metric`` (F, P, P): the folds' data-term Hessians at a nearby point (the previous
    strength's solutions), used as :func:`fit_vector` uses its metric: kept while each full
    step is accepted and cuts the largest gradient entry ten-fold, formed afresh from the
    first that does not. Returns the minimisers and the data-term Hessians last used (the
    next strength's metric)."""
    k = problems.features.shape[1]
    flat = _flat_directions(k, problems.full, theta)
    loss, grad = fold_objectives(problems, theta)
    exact = torch.full_like(loss, metric is None, dtype=torch.bool)
    metric = fold_data_hessians(problems, theta) if metric is None else metric.clone()
    trusted = torch.ones_like(exact)  # the fold's metric may be stepped with
    steps = torch.zeros_like(loss, dtype=torch.long)
    active = grad.abs().amax(1) > tolerance_grad
    while bool(active.any()):
        redo = active & ~trusted
        if bool(redo.any()):  # (a Hessian costs more than an evaluation: only those)
            folds = redo.nonzero().squeeze(1)
            metric[folds] = fold_data_hessians(problems.take(folds), theta[folds])
            exact, trusted = exact | redo, trusted | redo
        steps += active
        direction = _solve_folds(metric + problems.curvature, grad, flat)
        slope = (grad * direction).sum(1)
        before = grad.abs().amax(1)
        t = torch.ones_like(slope)
        pending = active.clone()
        for _ in range(40):
            trial = theta + t[:, None] * direction
            new_loss, new_grad = _pending_objectives(problems, trial, pending, loss, grad)
            good = pending & (new_loss <= loss + 1e-4 * t * slope)
            slow = good & ((t < 1.0) | (new_grad.abs().amax(1) > 0.1 * before))
            active &= ~(good & ((loss - new_loss).abs() < tolerance_change))
            theta = torch.where(good[:, None], trial, theta)
            grad = torch.where(good[:, None], new_grad, grad)
            loss = torch.where(good, new_loss, loss)
            exact, trusted = exact & ~good, trusted & ~slow
            pending &= ~good
            if not bool(pending.any()):
                break
            t = torch.where(pending, 0.5 * t, t)
        # no decrease along the direction: a kept metric misled it (form the Hessian
        # afresh), or with an exact Hessian the fold is at its minimum to rounding
        active &= ~(pending & exact)
        trusted &= ~pending
        active &= (grad.abs().amax(1) > tolerance_grad) & (steps < max_iter)
    return theta, metric


# -- two-class logistic maps ------------------------------------------------------------


def logistic_objective(
    x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor, curvature: torch.Tensor,
    centre: torch.Tensor,
) -> tuple[float, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The mean binary NLL of the calibrated logit ``s = x theta`` (``x`` with its column of
    ones) against 0/1 targets ``y``, plus ``sum(curvature (theta - centre)^2) / 2``: the
    value, the gradient and each row's ``sigma(s) (1 - sigma(s)) / n``."""
    n = x.shape[0]
    s = x @ theta
    p = torch.sigmoid(s)
    d = theta - centre
    loss = float((F.softplus(s) - y * s).sum()) / n + 0.5 * float((curvature * d * d).sum())
    return loss, x.T @ ((p - y) / n) + curvature * d, p * (1.0 - p) / n


def fit_logistic(
    x: torch.Tensor,
    y: torch.Tensor,
    theta: torch.Tensor,
    curvature: torch.Tensor,
    centre: torch.Tensor,
    *,
    max_iter: int,
    tolerance_grad: float,
    tolerance_change: float,
) -> tuple[torch.Tensor, int]:
    """Minimise :func:`logistic_objective` over ``theta`` (the weights of the features
    ``x`` (N, m), then the bias) by damped Newton steps, with the stopping rules of
    :func:`fit_vector`; return the minimiser and the steps taken."""
    x = torch.cat([x, torch.ones_like(x[:, :1])], 1)
    penalty = torch.diag(curvature)
    return _damped_newton(
        lambda v: logistic_objective(x, y, v, curvature, centre),
        lambda at: _solve((x * at[2][:, None]).T @ x + penalty, at[1]),
        theta, max_iter=max_iter, tolerance_grad=tolerance_grad,
        tolerance_change=tolerance_change,
    )  # fmt: skip


# -- temperature scaling ------------------------------------------------------------------


def log_temperature_objective(
    z_cols: torch.Tensor, picked: torch.Tensor, u: float, weight: float
) -> tuple[float, float, float]:
    """Temperature scaling's objective in ``u = log T``, its first and second derivative:
    ``f(u) = mean_i [logsumexp(z'_i) - z'_iy] + weight u^2`` with ``z' = z e^{-u}``, so
    ``f' = mean(z'_y - E_p z') + 2 weight u`` and ``f'' = mean(Var_p z' + E_p z' - z'_y) +
    2 weight`` (``p = softmax(z')``). ``z_cols`` are the logits as (K, n) (a softmax over
    a long contiguous dimension is faster), ``picked`` the labels' entries of it."""
    n = z_cols.shape[1]
    z = z_cols * math.exp(-u)
    logp = torch.log_softmax(z, dim=0)
    true = float(z.take(picked).sum()) / n
    loss = -float(logp.take(picked).sum()) / n + weight * u * u
    pz = logp.exp_().mul_(z)
    e = pz.sum(0)  # E_p z' per row
    mean = float(e.sum()) / n
    variance = float(pz.mul_(z).sum(0).sub_(e * e).sum()) / n
    return loss, true - mean + 2.0 * weight * u, variance + mean - true + 2.0 * weight


def fit_log_temperature(
    logits: torch.Tensor,
    labels: torch.Tensor,
    u: float,
    weight: float,
    *,
    max_iter: int,
    tolerance_grad: float,
    tolerance_change: float,
) -> tuple[float, int]:
    """Minimise :func:`log_temperature_objective` from ``u`` by damped Newton steps (where
    the objective is not convex in ``u``, a unit step downhill), with the stopping rules of
    :func:`fit_vector`; return the minimiser and the steps taken. 3-6 steps where L-BFGS
    took 8-10 evaluations."""
    n = logits.shape[0]
    z_cols = logits.T.contiguous()
    picked = labels * n + torch.arange(n, device=logits.device)

    def newton_step(at: tuple[float, float, float]) -> float:
        _, grad, curvature = at
        return -grad / curvature if curvature > 0 else -math.copysign(1.0, grad)

    return _damped_newton(
        lambda v: log_temperature_objective(z_cols, picked, v, weight), newton_step, u,
        max_iter=max_iter, tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
    )  # fmt: skip
