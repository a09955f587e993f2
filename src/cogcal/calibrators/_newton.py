"""Newton's method for the vector maps ``x * w + b`` (vector scaling, structured vector
scaling): 2K parameters, whose Hessian is four K x K blocks formed in O(N K^2).

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

from typing import NamedTuple

import torch


class VectorProblem(NamedTuple):
    """The data and the quadratic penalty of one vector-map fit (see the module docstring)."""

    features: torch.Tensor  # (N, K) the x of x * w + b
    labels: torch.Tensor  # (N,)
    w_curvature: torch.Tensor  # (K,) a
    w_centre: torch.Tensor  # (K,) w_0
    b_curvature: torch.Tensor  # (K, K) B, symmetric positive semi-definite


def _hessian_sum(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The data term's Hessian summed over the rows of features ``x`` at their softmax
    probabilities ``p``: ``diag([X^2, X, 1]^T P) - M^T M`` over ``M = [X * P, P]`` (the
    blocks ``w w``, ``w b``, ``b b``; the cross term of a block's diagonal on its diagonal)."""
    k = x.shape[1]
    xp = x * p
    m = torch.cat([xp, p], 1)
    h = -(m.T @ m)
    h.diagonal().add_(torch.cat([(xp * x).sum(0), p.sum(0)]))
    cross = xp.sum(0)  # d2 / dw_k db_k: sum_i x_ik p_ik (the -p_ik^2 x_ik is in M^T M)
    idx = torch.arange(k, device=x.device)
    h[idx, idx + k] += cross
    h[idx + k, idx] += cross
    return h


def _data_terms(
    x: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: the log-probabilities' picked entry (N,), the residual ``P - onehot``
    (N, K) and the probabilities ``P``."""
    logp = torch.log_softmax(x * w + b, dim=1)
    p = logp.exp()
    rows = torch.arange(x.shape[0], device=x.device)
    g = p.clone()
    g[rows, labels] -= 1.0
    return logp[rows, labels], g, p


def hessian_sums(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, groups: list[torch.Tensor]
) -> list[torch.Tensor]:
    """The data term's Hessian at ``(w, b)`` summed over each of ``groups`` (boolean row
    masks of ``x``), from one softmax of all the rows. Sums over disjoint rows add up: the
    held-out rows' sums of the cross-validation folds give every fold's Hessian."""
    with torch.no_grad():
        p = torch.softmax(x * w + b, dim=1)
    return [_hessian_sum(x[rows], p[rows]) for rows in groups]


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


def vector_objective(
    problem: VectorProblem, w: torch.Tensor, b: torch.Tensor, *, hessian: bool
) -> tuple[float, torch.Tensor, torch.Tensor | None]:
    """The objective at ``(w, b)``, its gradient (2K,) and, if ``hessian``, its Hessian
    (2K, 2K): the data term's mean over the ``n`` rows plus the penalty's."""
    x, labels = problem.features, problem.labels
    n = x.shape[0]
    picked, g, p = _data_terms(x, labels, w, b)
    grad = torch.cat([(g * x).sum(0), g.sum(0)]) / n
    return _penalised(
        problem, w, b, -float(picked.sum()) / n, grad, _hessian_sum(x, p) if hessian else None
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


def fit_vector(
    problem: VectorProblem,
    w: torch.Tensor,
    b: torch.Tensor,
    *,
    max_iter: int,
    tolerance_grad: float,
    tolerance_change: float,
    metric: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Minimise the objective from ``(w, b)`` by damped Newton steps (Armijo backtracking
    from the full step); return the minimiser and the steps taken.

    ``metric``: the data term's Hessian summed over the problem's rows at a point near
    ``(w, b)`` (:func:`hessian_sums`). With the penalty's curvature it stands in for the
    exact Hessian as long as each full step is accepted and cuts the largest gradient entry
    ten-fold; from the first step that does not, the steps form the Hessian afresh. Near
    the minimum a Hessian from nearby is as good a metric as the exact one, at no pass
    over the data.

    Stops when the largest gradient entry is at most ``tolerance_grad``, when a step
    changes the objective by less than ``tolerance_change``, or after ``max_iter`` steps.
    """
    k = w.shape[0]
    loss, grad, _ = vector_objective(problem, w, b, hessian=False)
    fixed = None  # the Hessian kept from `metric`, with the penalty's curvature
    if metric is not None:
        fixed = _penalised(problem, w, b, 0.0, torch.zeros_like(grad), metric)[2]
    n_iter = 0
    # the Hessian (the (2K x N) (N x 2K) product, most of a step's cost) only where a step
    # starts: a warm-started fit that converges in one step forms it once
    while n_iter < max_iter and float(grad.abs().max()) > tolerance_grad:
        n_iter += 1
        h = fixed if fixed is not None else vector_objective(problem, w, b, hessian=True)[2]
        step = _solve(h, grad)
        slope, t = float(grad @ step), 1.0
        for _ in range(40):
            w_new, b_new = w + t * step[:k], b + t * step[k:]
            new_loss, new_grad, _ = vector_objective(problem, w_new, b_new, hessian=False)
            if new_loss <= loss + 1e-4 * t * slope:
                break
            t *= 0.5
        else:
            if fixed is not None:  # the kept Hessian misled the step: form it afresh
                fixed = None
                continue
            break  # no decrease along the Newton direction: at the minimum to rounding
        if t < 1.0 or float(new_grad.abs().max()) > 0.1 * float(grad.abs().max()):
            fixed = None
        previous = loss
        w, b, loss, grad = w_new, b_new, new_loss, new_grad
        if abs(previous - loss) < tolerance_change:
            break
    return w, b, n_iter
