"""Affine maps of the logits: vector and matrix scaling (penalised toward temperature
scaling) and one affine map per binary task (:class:`TaskAffine`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from cogcal.calibrators._base import (
    DEFAULT_L2_GRID,
    REDUCED_DTYPE,
    SCORING_TOLERANCES,
    Calibrator,
    _cast,
    _Closure,
    _LazyWidth,
    _Problem,
)
from cogcal.calibrators._newton import (
    FoldProblems,
    VectorProblem,
    fit_folds,
    hessian_sums,
    stack_folds,
    vector_columns,
)
from cogcal.calibrators.temperature import fit_temperature


def _column_stats(
    logits: torch.Tensor, penalty_weight: float, multilabel: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per-column mean and standard deviation of the logits for preconditioning an affine fit.

    Returns ``None`` (optimise the raw parameters) when the penalty's curvature
    ``2 * penalty_weight`` = lambda / n exceeds a tenth of a rough scale of the data term's
    curvature, ``mean(E[z_k^2]) / K`` (``/ 4`` for binary tasks): the penalty is isotropic in
    the raw parameters, the NLL nearly so in those of standardised logits. (The factor was
    set from L-BFGS iteration counts on both sides of the crossover.)
    """
    mu = logits.mean(0)
    sd = logits.std(0, correction=0)
    data_curvature = float((sd**2 + mu**2).mean()) / (4.0 if multilabel else logits.shape[1])
    if 2.0 * penalty_weight > 0.1 * data_curvature:
        return None
    return mu, torch.where(sd > 1e-12 * (1.0 + mu.abs()), sd, torch.ones_like(sd))


class _AffineScaling(_LazyWidth):
    """``W z + b`` (full matrix) or ``w * z + b`` (one weight per output), from the identity.

    ``_temperature_target`` (vector and matrix scaling) centres the penalty on the identity
    after temperature scaling, ``W = I / T_0``, instead of on the identity itself (see
    :class:`MatrixScaling`).
    """

    _full_matrix = False
    _temperature_target = False

    def _init_params(self, k: int) -> None:
        self.weight = nn.Parameter(torch.eye(k) if self._full_matrix else torch.ones(k))
        self.bias = nn.Parameter(torch.zeros(k))

    def _identity(self) -> torch.Tensor:
        w = self.weight
        if self._full_matrix:
            return torch.eye(w.shape[0], dtype=w.dtype, device=w.device)
        return torch.ones_like(w)

    def _deviations(self) -> list[tuple[str, Any, str]]:
        return [("weight", self._identity(), "weight"), ("bias", 0.0, "bias")]

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        self._require_built()
        return self._affine(logits, self.weight, self.bias)

    def _map(self, logits: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        # direct, not functional_call: the fits evaluate this hundreds of times
        return self._affine(logits, params["weight"], params["bias"])

    def _affine(
        self, logits: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        weight, bias = _cast(weight, logits.dtype), _cast(bias, logits.dtype)
        if self._full_matrix:
            return F.linear(logits, weight, bias)
        return logits * weight + bias

    # -- fitting: penalty centre, conditioning ----------------------------------------
    def _shrinks_to_temperature(self) -> bool:
        return self._temperature_target and self._weights_toward_identity

    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        start = getattr(self, "_temperature_start", None)  # (:meth:`_fold_models`)
        self._target_temperature = (
            fit_temperature(logits, labels, start=start) if self._shrinks_to_temperature()
            else None
        )  # fmt: skip

    def _fold_models(
        self, logits: torch.Tensor, labels: torch.Tensor, held_out: list[torch.Tensor]
    ) -> list[Calibrator]:
        """The fold copies, whose temperatures ``T_0`` (and the final fit's) start from
        the temperature of all the data: a few Newton steps fewer each, to the same
        minimiser (each fold's ``T_0`` is fitted on its own rows to a gradient of 1e-8)."""
        if self._shrinks_to_temperature():
            self._temperature_start = fit_temperature(logits, labels)
        return super()._fold_models(logits, labels, held_out)

    def _times(self, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return w @ v if self._full_matrix else w * v

    def _standardisation(self, logits: torch.Tensor, penalty_weight: float) -> Any:
        # (the full matrices, matrix scaling and Dirichlet, are conditioned by row blocks)
        return _column_stats(logits, penalty_weight, self.multilabel)

    def _encode(self, stats: Any) -> dict[str, torch.Tensor]:
        # Standardised logits x = (z - mu) / sd:  W z + b = (W diag(sd)) x + (W mu + b)
        w, b = self.weight.detach(), self.bias.detach()
        if stats is None:
            return {"weight": w, "bias": b}
        mu, scale = stats
        v = w * scale
        return {"weight": v, "bias": self._times(w, mu) + b}

    def _decode(self, variables: dict[str, torch.Tensor], stats: Any) -> dict[str, torch.Tensor]:
        if stats is None:
            return variables
        mu, scale = stats
        w = variables["weight"] / scale
        return {"weight": w, "bias": variables["bias"] - self._times(w, mu)}

    def _weight_deviation(self, weight: torch.Tensor) -> torch.Tensor:
        if self._shrinks_to_temperature():
            return self._target_temperature * weight - self._identity()  # T0 W - I
        return weight - self._identity() if self._weights_toward_identity else weight

    def _penalty_terms(self, params: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        # The softmax is unchanged by W -> W + 1 v^T and b -> b + c 1. Measuring the penalty
        # at the representative that minimises it (columns of the deviation and the bias
        # centred) makes the objective exactly flat along those directions instead of weakly
        # curved, which L-BFGS handles far better; _canonical then returns that representative,
        # the minimiser of the documented penalty.
        weight, bias = self._weight_deviation(params["weight"]), params["bias"]
        if not self.multilabel:
            if self._full_matrix:
                weight = weight - weight.mean(0, keepdim=True)
            bias = bias - bias.mean()
        return [weight, bias] if self._penalize_bias else [weight]

    def _canonical(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.multilabel:
            return params
        weight, bias = params["weight"], params["bias"]
        if self._full_matrix:
            shift = self._weight_deviation(weight).mean(0, keepdim=True)
            scale = self._target_temperature if self._shrinks_to_temperature() else 1.0
            weight = weight - shift / scale
        return {"weight": weight, "bias": bias - bias.mean()}

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        if self._temperature_target:
            self.target_temperature_ = self._target_temperature
        self._temperature_start = None  # (the cross-validation's, :meth:`_fold_models`)


_AFFINE_PARAMETERS_DOC = r"""
    Parameters
    ----------
    num_classes : int or None
        Number of classes ``K``; ``None`` takes it from :meth:`fit`.
    max_iter : int
        Iterations per fit (L-BFGS; Newton steps for vector scaling).
    l2 : float or "cv"
        Penalty strength :math:`\lambda`, or ``"cv"`` (default) to choose it by
        stratified ``cv``-fold cross-validation from ``l2_grid``; ``l2=0`` is plain
        maximum likelihood.
    cv : int
        Folds for ``l2="cv"``.
    l2_grid : sequence of float
        Strengths tried by ``l2="cv"`` (default :data:`DEFAULT_L2_GRID`).

    Attributes
    ----------
    target_temperature_ : float
        :math:`T_0`, the temperature of the penalty's centre ``I / T_0`` in the final fit
        (it plays no role when ``l2_ = 0``); the other fitted attributes are those of
        :class:`Calibrator`.
"""


#: The largest ``rows x classes^2`` for which the cross-validation folds of vector and
#: matrix scaling and Dirichlet calibration are fitted together, by Newton's method on all
#: the folds at once (:meth:`_ClassScaling._fit_folds_together`): below it a fit's cost is
#: its calls (800 x 10 logits: 15-20% faster, 135 x 2: 2-3x), above it the arithmetic of
#: the Hessians (1,000 x 10: within 10% either way; 2,500 x 10: 1.5x slower;
#: docs/performance.md).
FOLDS_TOGETHER_SIZE = 80_000


class _ClassScaling(_AffineScaling):
    """Vector or matrix scaling over K classes, penalised toward ``I / T_0`` (docs/method.md §2)."""

    _temperature_target = True

    def __init__(
        self,
        num_classes: int | None = None,
        *,
        max_iter: int = 500,
        l2: float | str = "cv",
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ):
        super().__init__(
            num_classes, max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid, name="num_classes"
        )

    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Fix the penalty's centre and, for vector scaling, start the fit there
        (``w = 1 / T_0``, ``b = 0``): fewer L-BFGS iterations than from the identity."""
        super()._prepare(logits, labels)
        self._fit_columns = None  # (:meth:`_vector_problem`'s, kept for this fit only)
        if not self._full_matrix and self._target_temperature is not None:
            with torch.no_grad():
                self.weight.fill_(1.0 / self._target_temperature)
                self.bias.zero_()

    def extra_repr(self) -> str:
        return f"num_classes={self.num_outputs}"

    def _vector_problem(
        self, logits: torch.Tensor, labels: torch.Tensor, weight: float
    ) -> VectorProblem | None:
        """Vector scaling's fit for Newton's method: the penalty ``weight |T_0 w - c|^2``
        (``c`` the identity, or 0 for the test hook) is ``a = 2 weight T_0^2`` around
        ``c / T_0``, and ``weight |b - mean(b)|^2`` is ``B = 2 weight (I - 11^T / K)``."""
        if self._full_matrix:
            return None
        k = logits.shape[1]
        t0 = self._target_temperature if self._shrinks_to_temperature() else 1.0
        centre = 1.0 / t0 if self._weights_toward_identity else 0.0
        like = dict(dtype=logits.dtype, device=logits.device)
        bb = torch.eye(k, **like) - 1.0 / k
        kept = getattr(self, "_fit_columns", None)  # a fold refitted at the next strength
        if kept is None or kept[0] is not logits:
            kept = self._fit_columns = (logits, vector_columns(logits, labels))
        return VectorProblem(
            logits, labels, torch.full((k,), 2.0 * weight * t0**2, **like),
            torch.full((k,), centre, **like), 2.0 * weight * bb * float(self._penalize_bias),
            kept[1],
        )  # fmt: skip

    def _fit_folds(
        self,
        models: list[Calibrator],
        logits: torch.Tensor,
        labels: torch.Tensor,
        held_out: list[torch.Tensor],
        l2: float,
    ) -> None:
        """Vector scaling's folds share their Newton metric. Each fold starts, as before,
        from its own solution at the previous strength (never from a point fitted on its
        held-out rows); the data term's Hessian at the folds' mean solution is summed over
        each fold's held-out rows in one pass (:func:`~cogcal.calibrators._newton.hessian_sums`),
        and those sums add up to all the data's, so every fold's Hessian there costs one
        pass for all the folds. Each fold steps with it while it converges, instead of
        forming its own Hessians (2-3 per fold and strength, most of a 100-class fit's time:
        docs/performance.md, "posthoc_peers")."""
        if logits.shape[0] * logits.shape[1] ** 2 <= FOLDS_TOGETHER_SIZE and not self.multilabel:
            return self._fit_folds_together(models, logits, labels, held_out, l2)
        if self._full_matrix:
            return super()._fit_folds(models, logits, labels, held_out, l2)
        w = torch.stack([m.weight.detach() for m in models]).mean(0)
        b = torch.stack([m.bias.detach() for m in models]).mean(0)
        parts = hessian_sums(logits, w, b, held_out)
        total = torch.stack(parts).sum(0)
        # each fold's rows (the same tensors at every strength), its data term where its
        # previous fit ended, where this one starts, and the strength of that fit
        ends = getattr(self, "_fold_ends", None)
        if ends is None or ends[0] is not held_out:  # once per cross-validation
            rows = [(logits[~held], labels[~held]) for held in held_out]
            ends = self._fold_ends = [held_out, [None] * len(models), rows, None]
            self._fold_means = {}
        if ends[3] is not None:  # the folds' mean solution there and all the data's Hessian
            self._fold_means[ends[3]] = (w, b, total)
        ends[3] = l2
        for f, (model, part) in enumerate(zip(models, parts, strict=True)):
            model._minimise(
                *ends[2][f], l2, scoring=True, metric=total - part, start=ends[1][f]
            )  # fmt: skip
            ends[1][f] = model._data_term

    def _fit_folds_together(
        self,
        models: list[Calibrator],
        logits: torch.Tensor,
        labels: torch.Tensor,
        held_out: list[torch.Tensor],
        l2: float,
    ) -> None:
        """With few classes, the folds' fits at ``l2`` as one stacked Newton problem
        (:func:`~cogcal.calibrators._newton.fit_folds`), each fold from its own solution at
        the previous strength, with the penalty of :meth:`_minimise` (``l2 / (2 n)`` times
        :meth:`_penalty_terms`' squares) as a quadratic form."""
        k, full = logits.shape[1], self._full_matrix
        stacked = getattr(self, "_stacked_folds", None)
        if stacked is None or stacked[0] is not held_out:  # once per cross-validation
            stacked = [held_out, self._stack_folds(models, logits, labels, held_out), None]
            self._stacked_folds = stacked
        if full:
            starts = [torch.cat([m.weight.detach(), m.bias.detach()[:, None]], 1) for m in models]
        else:
            starts = [torch.cat([m.weight.detach(), m.bias.detach()]) for m in models]
        theta, stacked[2] = fit_folds(
            stacked[1].at_strength(float(l2)), torch.stack(starts).flatten(1),
            max_iter=self.max_iter, metric=stacked[2], **SCORING_TOLERANCES,
        )  # fmt: skip
        for model, solution in zip(models, theta, strict=True):
            if full:
                wb = solution.view(k, k + 1)
                params = {"weight": wb[:, :k], "bias": wb[:, k]}
            else:
                params = {"weight": solution[:k], "bias": solution[k:]}
            model._set_solution(model._canonical(params))

    def _stack_folds(
        self,
        models: list[Calibrator],
        logits: torch.Tensor,
        labels: torch.Tensor,
        held_out: list[torch.Tensor],
    ) -> FoldProblems:
        """The folds' problems of :meth:`_fit_folds_together` at ``l2 = 1``: each fold's
        ``T_0`` and penalty centre, and its curvature ``(I - 11^T / K) (x) diag(q)`` (the
        penalty measures centred deviations; ``q`` is ``T_0^2 / n`` on the weights and
        ``1 / n`` on a penalised bias)."""
        k, full = logits.shape[1], self._full_matrix
        like = dict(dtype=logits.dtype, device=logits.device)
        centred = torch.eye(k, **like) - 1.0 / k
        curvatures, centres = [], []
        for model, held in zip(models, held_out, strict=True):
            n = float((~held).sum())
            t0 = model._target_temperature if model._shrinks_to_temperature() else 1.0
            w_centre = torch.eye(k, **like) / t0 * float(model._weights_toward_identity)
            on_bias = float(self._penalize_bias) / n
            if full:
                q = torch.full((k + 1,), t0**2 / n, **like)
                q[k] = on_bias
                curvatures.append(torch.kron(centred, torch.diag(q)))
                centres.append(torch.cat([w_centre, torch.zeros(k, 1, **like)], 1).flatten())
            else:
                a = torch.full((k,), t0**2 / n, **like)
                curvatures.append(torch.block_diag(torch.diag(a), on_bias * centred))
                centres.append(torch.cat([w_centre.diagonal(), torch.zeros(k, **like)]))
        x = self._features(logits) if full else logits
        return stack_folds(
            [x[~held] for held in held_out], [labels[~held] for held in held_out],
            torch.stack(curvatures), torch.stack(centres), full=full,
        )  # fmt: skip

    def _final_start(self, l2: float) -> dict[str, Any]:
        """Vector scaling's final fit starts from the mean of the folds' solutions at
        ``l2``, with all the data's Hessian there as its Newton metric (both from
        :meth:`_fit_folds`): a step or two to the same minimiser, where a start at
        ``1 / T_0`` took four, each forming the Hessian."""
        w, b, metric = (getattr(self, "_fold_means", None) or {}).get(l2, (None, None, None))
        if metric is None:
            return {}
        with torch.no_grad():
            self.weight.copy_(w)
            self.bias.copy_(b)
        return {"metric": metric}

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        super()._after_fit(logits, labels)
        # the folds' and the fit's data as the solvers read them: not a fitted calibrator's
        self._stacked_folds = self._fold_ends = self._fit_columns = self._fold_means = None

    def _weight_penalty_deviation(self, w: torch.Tensor, t0: float, identity: Any) -> torch.Tensor:
        """The penalised weight deviation of :meth:`_penalty_terms` for the hand-written
        closure, an orthogonal projection of ``t0 * w - identity`` (so the penalty's gradient
        in ``w`` is ``2 weight t0`` times it)."""
        d_w = t0 * w - identity
        return d_w - d_w.mean(0, keepdim=True) if self._full_matrix else d_w


class _RowBlocks(NamedTuple):
    """Block-Jacobi conditioning of a full affine map (:class:`MatrixScaling`, Dirichlet): per output row
    ``j``, ``factor[j] = L_j`` with ``L_j L_j^T`` the curvature of ``[W | b]_j`` and
    ``inverse[j] = L_j^{-1}``, both (K, K+1, K+1)."""

    factor: torch.Tensor
    inverse: torch.Tensor
    #: ``inverse`` in a reduced precision, made once per dtype (the folds of a
    #: cross-validation share the blocks: :func:`_row_closure`)
    reduced: dict[torch.dtype, torch.Tensor]


#: Rows of the data from which :func:`_row_curvature` estimates the curvature (a strided
#: subset above it: a preconditioner needs no more, and K (K+1)^2 work per row adds up).
_CURVATURE_ROWS = 4096
#: The most classes for which a full affine map is conditioned by row blocks: the blocks
#: take K (K+1)^2 numbers (three such tensors live at once: 0.4 GB at 256 classes, 24 GB
#: at 1,000, which ran out of memory); above it the map is fitted unconditioned (slowly:
#: ``method="auto"`` does not try the full maps there, :mod:`cogcal.calibrators._factory`).
BLOCK_MAX_CLASSES = 256


#: Share of each class's curvature weight on the rows :func:`_row_curvature` sums over,
#: from this many classes on (below it every row: the sum is cheap, and with few classes
#: the rows left out can carry most of a block's weight in some direction).
_CURVATURE_MASS = 0.99
_SPARSE_CURVATURE_CLASSES = 32


def row_conditioned(k: int) -> bool:
    """Whether a full affine map over ``k`` classes is conditioned by row blocks
    (:data:`BLOCK_MAX_CLASSES`)."""
    return k <= BLOCK_MAX_CLASSES


def _row_curvature(
    features: torch.Tensor, probs: torch.Tensor, max_rows: int = _CURVATURE_ROWS
) -> torch.Tensor:
    """``H_j = sum_i p_ij (1 - p_ij) [x_i, 1] [x_i, 1]^T / n`` for each class ``j``: the
    multinomial NLL's curvature in row ``j`` of ``[W | b]`` at probabilities ``p``, on at
    most ``max_rows`` evenly spaced rows; with many classes, for each class only on the
    fewest rows that carry :data:`_CURVATURE_MASS` of its weight ``p_ij (1 - p_ij)``: most
    rows put almost no probability on a given class (a fifth of the rows carry 99% of the
    weight on docs/performance.md's 100-class set, where this cut the sum from 130 to
    50 ms). Shape (K, K+1, K+1)."""
    n, k = features.shape
    step = -(-n // max_rows)
    x = torch.cat([features[::step], torch.ones_like(features[::step, :1])], 1)
    s = (probs[::step] * (1.0 - probs[::step])) / x.shape[0]
    if k < _SPARSE_CURVATURE_CLASSES:
        return torch.stack([(x * s[:, j : j + 1]).T @ x for j in range(k)])
    weights, order = s.sort(0, descending=True)
    kept = ((weights.cumsum(0) < _CURVATURE_MASS * weights.sum(0)).sum(0) + 1).tolist()
    blocks = x.new_empty(k, x.shape[1], x.shape[1])
    for j, m in enumerate(kept):
        xj = x[order[:m, j]]
        torch.mm((xj * weights[:m, j : j + 1]).T, xj, out=blocks[j])
    return blocks


def _row_blocks(curvature: torch.Tensor, diagonal: torch.Tensor) -> _RowBlocks:
    """Cholesky factors of the (K, K+1, K+1) symmetric blocks ``curvature`` plus
    ``diagonal`` (K, K+1) on their diagonals, and their inverses, adding to each block's
    diagonal the least jitter (from 1e-10 of its largest entry) that makes it positive
    definite."""
    eye = torch.eye(curvature.shape[-1], dtype=curvature.dtype, device=curvature.device)
    diagonal = curvature.diagonal(dim1=1, dim2=2) + diagonal
    top = diagonal.amax(1, keepdim=True).clamp(min=1e-300)
    for jitter in (1e-10, 1e-7, 1e-4, 1e-1, 1.0):
        h = curvature.clone()
        h.diagonal(dim1=1, dim2=2).copy_(diagonal + jitter * top)
        factor, info = torch.linalg.cholesky_ex(h)
        if not bool(info.any()):
            break
    else:  # pragma: no cover - a diagonal of 1s makes any symmetric block positive definite
        factor = torch.linalg.cholesky(torch.diag_embed(diagonal + top))
    inverse = torch.linalg.solve_triangular(factor, eye.expand_as(factor), upper=False)
    return _RowBlocks(factor, inverse, {})


def _encode_rows(w: torch.Tensor, b: torch.Tensor, blocks: _RowBlocks) -> dict[str, torch.Tensor]:
    """The variables ``v_j = [W | b]_j L_j`` of a row-conditioned fit."""
    v = torch.bmm(torch.cat([w, b[:, None]], 1)[:, None, :], blocks.factor).squeeze(1)
    return {"weight": v[:, :-1].contiguous(), "bias": v[:, -1].contiguous()}


def _decode_rows(
    v: torch.Tensor, c: torch.Tensor, blocks: _RowBlocks
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[W | b]_j = v_j L_j^{-1}``: the map of a row-conditioned fit's variables."""
    wb = torch.bmm(torch.cat([v, c[:, None]], 1)[:, None, :], blocks.inverse).squeeze(1)
    return wb[:, :-1], wb[:, -1]


#: The penalty of a full affine map: ``(W, b) -> (value, gradient in W, gradient in b)``.
_Penalty = Callable[[torch.Tensor, torch.Tensor], tuple[Any, Any, Any]]


def _row_closure(
    x: torch.Tensor,
    labels: torch.Tensor,
    variables: dict[str, torch.Tensor],
    blocks: _RowBlocks | None,
    penalty: _Penalty | None,
    dtype: torch.dtype | None = None,
) -> _Closure:
    """The closure of a full affine map ``W x + b`` of features ``x`` with the mean NLL
    and ``penalty``, by hand (tests check it against autograd): the data term's gradient
    is ``G x`` and ``G 1`` with ``G = (softmax - onehot) / n``, chained back through
    ``[W | b]_j = v_j L_j^{-1}`` (``blocks``; ``None``: the variables are ``W`` and ``b``).
    ``dtype``: the products and the softmax in it (:data:`~cogcal.calibrators._base.REDUCED_DTYPE`
    while a fit's gradient is above the cross-validation's tolerance); the loss is summed,
    and the penalty and the gradient returned, in the variables' dtype."""
    exact = v_dtype = variables["weight"].dtype
    if dtype is not None and dtype != x.dtype:
        x, exact = x.to(dtype), dtype
        if blocks is not None:  # (only the inverse enters the closure)
            if dtype not in blocks.reduced:
                blocks.reduced[dtype] = blocks.inverse.to(dtype)
            blocks = blocks._replace(inverse=blocks.reduced[dtype])
    # the logits as (K, n): with few classes torch's softmax over a long contiguous
    # dimension, and the addmm producing it, are 2.5-4x faster than over rows of K
    x_cols, n = x.T.contiguous(), x.shape[0]
    picked = labels * n + torch.arange(n, device=x.device)  # the labels' entries of (K, n)
    v, c = variables["weight"], variables["bias"]
    # the one-hot part of G = (P - onehot) / n is constant: G x = P x / n - onehot x / n,
    # summed per class (O(n K), where the one-hot product was O(n K^2))
    label_x = x.new_zeros(v.shape[0], x.shape[1]).index_add_(0, labels, x).div_(n)
    label_share = torch.bincount(labels, minlength=v.shape[0]).to(x.dtype).div_(n)

    @torch.no_grad()  # L-BFGS enables autograd around its closure: no graph is needed
    def closure() -> torch.Tensor:
        vx, cx = v.to(exact), c.to(exact)
        w, b = (vx, cx) if blocks is None else _decode_rows(vx, cx, blocks)
        logp = torch.log_softmax(torch.addmm(b[:, None], w, x_cols), dim=0)
        loss = -logp.take(picked).to(v_dtype).sum() / n
        p = logp.exp_()  # (logp is not needed after the loss)
        grad_w = torch.addmm(label_x, p, x, beta=-1.0, alpha=1.0 / n)
        grad_b = p.sum(1).div_(n).sub_(label_share)
        if penalty is not None:
            value, pen_w, pen_b = penalty(w.to(v_dtype), b.to(v_dtype))
            loss, grad_w, grad_b = loss + value, grad_w + pen_w, grad_b + pen_b
        if blocks is None:
            v.grad, c.grad = grad_w.to(v_dtype), grad_b.to(v_dtype)
        else:
            # L_j^{-1} g_j as the row g_j^T L_j^{-T}: a batch of rows times matrices is 4-5x
            # faster than of matrices times columns (100 classes, one thread: 0.3 vs 1.3 ms)
            grad = torch.cat([grad_w, grad_b[:, None]], 1)[:, None, :].to(exact)
            grad = torch.bmm(grad, blocks.inverse.transpose(1, 2)).squeeze(1).to(v_dtype)
            v.grad, c.grad = grad[:, :-1].contiguous(), grad[:, -1].contiguous()
        return loss

    return closure


#: The largest feature (logit; log-probability for Dirichlet calibration) in absolute value
#: for which a full map's fits compute in :data:`~cogcal.calibrators._base.REDUCED_DTYPE`
#: down to the cross-validation's tolerance: there float32's rounding of a gradient entry,
#: about 1e-7 of the largest feature, stays well below that tolerance of 1e-4.
REDUCED_PRECISION_FEATURES = 256.0


def reduced_dtype(features: torch.Tensor) -> torch.dtype | None:
    """The reduced precision of a full map's fit on ``features`` (:func:`_row_closure`):
    :data:`~cogcal.calibrators._base.REDUCED_DTYPE` where every feature is at most
    :data:`REDUCED_PRECISION_FEATURES` in size, else ``None`` (only the features' own)."""
    if features.dtype == REDUCED_DTYPE:
        return None
    small = float(features.abs().max()) <= REDUCED_PRECISION_FEATURES
    return REDUCED_DTYPE if small else None


class _RowConditioned(_ClassScaling):
    """A full affine map ``W x + b`` of features ``x`` of the logits, penalised toward
    ``I / T_0`` as :class:`_ClassScaling`, fitted from temperature scaling with block-Jacobi
    preconditioning: one block per row of ``[W | b]``, the objective's exact curvature in
    that row at the start (docs/performance.md, "Post-hoc fits"). One network's logits (and
    more so its log-probabilities) are strongly correlated and, when it is confident, carry
    their curvature in few samples, which neither whitening nor a diagonal scaling captures:
    4-15x fewer L-BFGS evaluations than whitening, K = 10-100."""

    _full_matrix = True

    def _features(self, logits: torch.Tensor) -> torch.Tensor:
        """The ``x`` of ``W x + b``: the logits (matrix scaling)."""
        return logits

    def _curvature_rows(self) -> int:
        return _CURVATURE_ROWS

    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Start the fit at temperature scaling, ``W = I / T_0``, ``b = 0`` (which both maps
        contain exactly; for Dirichlet calibration ``softmax(log p / T) = softmax(z / T)``),
        and store the data term's curvature there for :meth:`_standardisation`."""
        super()._prepare(logits, labels)
        t0 = self._target_temperature  # the penalty's centre is I / T_0 (_AffineScaling)
        if t0 is None:  # the test hook's penalty toward 0: start at temperature scaling too
            t0 = fit_temperature(logits, labels)
        with torch.no_grad():
            k = self.weight.shape[0]
            self.weight.copy_(torch.eye(k, dtype=self.weight.dtype) / t0)
            self.bias.zero_()
        shared = getattr(self, "_fold_curvature", None)
        self._fold_curvature = None
        if not row_conditioned(k):
            self._data_curvature = None
            return
        self._data_curvature = shared if shared is not None else _row_curvature(
            self._features(logits), F.softmax(logits / t0, dim=1), self._curvature_rows()
        )  # fmt: skip

    def _fold_models(
        self, logits: torch.Tensor, labels: torch.Tensor, held_out: list[torch.Tensor]
    ) -> list[Calibrator]:
        """The fold copies, sharing one preconditioner: the curvature of all the data at
        its temperature (also the final fit's) and, per penalty strength, its row blocks
        (:meth:`_standardisation`), instead of one curvature and one set of blocks per fold
        (for 100 classes those cost as much as the fits). The labels enter it only through
        that temperature; a preconditioner changes the path of a fold's fit, not its
        solution."""
        curvature = None
        if row_conditioned(logits.shape[1]):
            t0 = fit_temperature(logits, labels)
            self._temperature_start = t0 if self._shrinks_to_temperature() else None
            curvature = _row_curvature(
                self._features(logits), F.softmax(logits / t0, dim=1), self._curvature_rows()
            )
        blocks: dict[float, _RowBlocks] = {}
        models = []
        for held in held_out:
            model = copy.deepcopy(self)
            model._reset_parameters()
            model._fold_curvature, model._shared_blocks = curvature, blocks
            model._prepare(logits[~held], labels[~held])
            models.append(model)
        self._fold_curvature = curvature  # for the final fit's _prepare, on all of it
        return models

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        super()._after_fit(logits, labels)
        self._data_curvature = None  # (K, K+1, K+1): a fitted calibrator need not carry it

    def _standardisation(self, logits: torch.Tensor, penalty_weight: float) -> Any:
        """Block-Jacobi conditioning: one block per row ``j`` of ``[W | b]``, the objective's
        exact curvature in that row at the starting map (:meth:`_prepare`): the data term's
        ``sum_i p_ij (1 - p_ij) [log p_i, 1] [log p_i, 1]^T / n`` plus ``2 * penalty_weight``
        on the penalised entries (all but ``W_jj``). With ``H_j = L_j L_j^T`` the variables are
        ``v_j = [W | b]_j L_j``, in which each block's curvature is the identity; the blocks
        neglect only the coupling between rows. (6-7x fewer L-BFGS evaluations than
        whitening or a diagonal scaling on over-confident logits, K = 10-100.)"""
        if not row_conditioned(logits.shape[1]):
            return None  # unconditioned: the variables are W and b themselves
        shared = getattr(self, "_shared_blocks", None)  # the folds' (:meth:`_fold_models`)
        key = float(f"{penalty_weight:.3g}")  # folds of unequal sizes: weights within 0.5%
        if shared is not None and key in shared:
            return shared[key]
        curvature = getattr(self, "_data_curvature", None)
        k = logits.shape[1]
        if curvature is None or curvature.shape[0] != k:  # only a speed matter: any SPD works
            p = F.softmax(logits, dim=1)
            curvature = _row_curvature(self._features(logits), p, self._curvature_rows())
        t0 = self._target_temperature if self._shrinks_to_temperature() else 1.0
        penalised = torch.full((k, k + 1), t0**2, dtype=curvature.dtype, device=curvature.device)
        penalised[:, k] = 1.0 if self._penalize_bias else 0.0
        blocks = _row_blocks(curvature, 2.0 * penalty_weight * penalised)
        if shared is not None:
            shared[key] = blocks
        return blocks

    def _encode(self, stats: Any) -> dict[str, torch.Tensor]:
        if not isinstance(stats, _RowBlocks):
            return super()._encode(stats)
        return _encode_rows(self.weight.detach(), self.bias.detach(), stats)

    def _decode(self, variables: dict[str, torch.Tensor], stats: Any) -> dict[str, torch.Tensor]:
        if not isinstance(stats, _RowBlocks):
            return super()._decode(variables, stats)
        w, b = _decode_rows(variables["weight"], variables["bias"], stats)
        return {"weight": w, "bias": b}

    def _closure(self, variables: dict[str, torch.Tensor], problem: _Problem) -> _Closure:
        """:math:`J_\\lambda` and its gradient by hand (:func:`_row_closure`; tests check
        them against autograd on the generic objective). The calibrated logits are
        ``W x + b`` (:meth:`_features`); the penalty's gradient is ``2 weight T_0 D`` on ``W``
        (``D = T_0 W - I`` with centred columns, an orthogonal projection:
        :meth:`_weight_penalty_deviation`) and ``2 weight d_b``."""
        logits, labels, stats, weight, _ = problem
        blocks = stats if isinstance(stats, _RowBlocks) else None
        t0 = self._target_temperature if self._shrinks_to_temperature() else 1.0
        identity = self._identity() if self._weights_toward_identity else 0.0

        def penalty(w: torch.Tensor, b: torch.Tensor) -> tuple[Any, Any, Any]:
            d_w = self._weight_penalty_deviation(w, t0, identity)
            value, grad_b = weight * (d_w**2).sum(), 0.0
            if self._penalize_bias:
                d_b = b - b.mean()
                value, grad_b = value + weight * (d_b**2).sum(), 2.0 * weight * d_b
            return value, (2.0 * weight * t0) * d_w, grad_b

        features = self._features(logits)
        return _row_closure(
            features, labels, variables, blocks, penalty if weight else None, problem.dtype
        )  # fmt: skip

    def _reduced_dtype(self, logits: torch.Tensor) -> torch.dtype | None:
        return reduced_dtype(self._features(logits))


class VectorScaling(_ClassScaling):
    __doc__ = (
        r"""Vector scaling: ``w * z + b`` with one weight and one bias per class (2K parameters).

    Starts at the identity (``w = 1``, ``b = 0``). ``num_classes=None`` defers creating the
    parameters until :meth:`fit` sees the logits.

    Post-hoc fitting is regularised as in docs/method.md §2, with the penalty of
    :class:`MatrixScaling` restricted to a diagonal map: with ``N`` validation samples it
    minimises

    .. math::

        \frac1N\Big[\sum_{i=1}^N \ell_i(w, b)
            + \frac{\lambda}{2}\Big(\sum_k (T_0 w_k - 1)^2 + \sum_k b_k^2\Big)\Big],

    :math:`T_0` being the temperature :class:`Temperature` fits to the same data, so that a
    strong penalty gives temperature scaling (``w = 1 / T_0``, ``b = 0``) and ``l2=0`` the
    maximum-likelihood vector scaling.
"""
        + _AFFINE_PARAMETERS_DOC
        + r"""
    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import VectorScaling
    >>> vs = VectorScaling(3)
    >>> vs(torch.tensor([[1.0, 2.0, 3.0]]))
    tensor([[1., 2., 3.]], grad_fn=<AddBackward0>)
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randint(0, 3, (600,), generator=g)
    >>> z = torch.randn(600, 3, generator=g) + 2 * torch.nn.functional.one_hot(y, 3)
    >>> vs.fit(z, y).l2_ in vs.l2_grid_           # strength chosen by 5-fold CV
    True
    """
    )


class MatrixScaling(_RowConditioned):
    __doc__ = (
        r"""Matrix scaling: ``W z + b`` with a full K x K matrix (K^2 + K parameters).

    ``W`` starts at the identity and ``b`` at zero, so an untrained calibrator changes
    nothing. ``num_classes=None`` defers creating the parameters until :meth:`fit`.

    Post-hoc fitting is regularised (docs/method.md §2; the unregularised fit overfits a
    small validation split, or diverges on a separable one). With ``N`` samples it
    minimises

    .. math::

        \frac1N\Big[\sum_{i=1}^N \ell_i(W, b)
            + \frac{\lambda}{2}\Big(\lVert T_0 W - I \rVert_F^2 + \lVert b \rVert^2\Big)\Big],

    where :math:`T_0` is the temperature :class:`Temperature` fits to the same data (with
    its prior on :math:`\log T`; under ``l2="cv"``, to the training folds of each fit).
    Writing the map as :math:`(I + \Delta)(z / T_0) + b`, this is a Gaussian prior on
    :math:`\Delta = T_0 W - I` and :math:`b`: the off-diagonal weights, the diagonal's
    deviation from :math:`1/T_0` and the biases are all pulled toward 0 (the ODIR penalty
    of Kull et al. 2019, plus the diagonal). As with Probmetrics' structured matrix scaling
    (temperature scaling first, then a map regularised toward the identity), a strong
    penalty gives temperature scaling (:math:`\lambda \to \infty`: ``W = I / T_0``,
    ``b = 0``), never the uncalibrated logits, and the objective is convex in
    :math:`(W, b)`; ``l2=0`` is plain multinomial logistic regression on the logits. The
    softmax does not change when a vector is added to every row of ``W`` or a constant to
    ``b``; the fit returns the representative with the smallest penalty (the minimiser
    above, which for ``l2=0`` is one of many).
"""
        + _AFFINE_PARAMETERS_DOC
        + r"""
    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import MatrixScaling
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randint(0, 4, (400,), generator=g)
    >>> z = torch.randn(400, 4, generator=g) + 2 * torch.nn.functional.one_hot(y, 4)
    >>> ms = MatrixScaling().fit(z, y)        # K taken from the data, l2 by 5-fold CV
    >>> ms.num_outputs, ms.weight.shape
    (4, torch.Size([4, 4]))
    >>> ms.predict_proba(z[:2]).sum(1)
    tensor([1., 1.])
    """
    )

    _full_matrix = True


class TaskAffine(_AffineScaling):
    r"""One affine map per binary task, ``a_t * z_t + b_t`` (Platt scaling in logit form).

    This is the multi-label form of vector and matrix scaling (docs/method.md §4): each
    task's calibrated probability is ``sigmoid(a_t z_t + b_t)``. Starts at ``a = 1``,
    ``b = 0``. Post-hoc fitting minimises the summed binary cross-entropy over the
    ``N T`` terms plus :math:`\tfrac{\lambda}{2}\sum_t\big[(a_t - 1)^2 + b_t^2\big]`, with
    :math:`\lambda` chosen by ``cv``-fold cross-validation over shuffled rows (``l2="cv"``,
    the default; one strength for all tasks) or fixed.

    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import TaskAffine
    >>> rng = np.random.default_rng(0)
    >>> true = rng.normal(size=(2000, 2))
    >>> y = rng.random((2000, 2)) < 1 / (1 + np.exp(-true))
    >>> cal = TaskAffine().fit(2.0 * true + 1.0, y)
    >>> np.round(cal.weight.numpy(), 1), np.round(cal.bias.numpy(), 1)
    (array([0.5, 0.5], dtype=float32), array([-0.5, -0.5], dtype=float32))
    >>> cal.predict_proba(np.zeros((3, 2))).shape    # one sigmoid per task
    (3, 2)
    """

    multilabel = True

    def __init__(
        self,
        num_tasks: int | None = None,
        *,
        max_iter: int = 500,
        l2: float | str = "cv",
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ):
        super().__init__(
            num_tasks, max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid, name="num_tasks"
        )

    def extra_repr(self) -> str:
        return f"num_tasks={self.num_outputs}"
