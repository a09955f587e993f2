"""Dirichlet calibration (Kull et al., 2019): an affine map of the log-probabilities,
ODIR-regularised, fitted with block-Jacobi preconditioning."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from cogcal.calibrators._base import _Closure, _one_hot_columns, _Problem
from cogcal.calibrators.affine import _ClassScaling
from cogcal.calibrators.temperature import fit_temperature


class _RowBlocks(NamedTuple):
    """Block-Jacobi conditioning of a full affine map (:class:`Dirichlet`): per output row
    ``j``, ``factor[j] = L_j`` with ``L_j L_j^T`` the curvature of ``[W | b]_j`` and
    ``inverse[j] = L_j^{-1}``, both (K, K+1, K+1)."""

    factor: torch.Tensor
    inverse: torch.Tensor


#: Rows of the data from which :func:`_row_curvature` estimates the curvature (a strided
#: subset above it: a preconditioner needs no more, and K (K+1)^2 work per row adds up).
_CURVATURE_ROWS = 4096


def _row_curvature(features: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``H_j = sum_i p_ij (1 - p_ij) [x_i, 1] [x_i, 1]^T / n`` for each class ``j``: the
    multinomial NLL's curvature in row ``j`` of ``[W | b]`` at probabilities ``p``, on at
    most :data:`_CURVATURE_ROWS` evenly spaced rows. Shape (K, K+1, K+1)."""
    n, k = features.shape
    step = -(-n // _CURVATURE_ROWS)
    x = torch.cat([features[::step], torch.ones_like(features[::step, :1])], 1)
    s = (probs[::step] * (1.0 - probs[::step])) / x.shape[0]
    return torch.stack([(x * s[:, j : j + 1]).T @ x for j in range(k)])


def _row_blocks(h: torch.Tensor) -> _RowBlocks:
    """Cholesky factors of the (K, K+1, K+1) symmetric blocks ``h`` and their inverses,
    adding to each block's diagonal the least jitter (from 1e-10 of its largest entry) that
    makes it positive definite."""
    eye = torch.eye(h.shape[-1], dtype=h.dtype, device=h.device)
    top = h.diagonal(dim1=1, dim2=2).amax(1).clamp(min=1e-300)[:, None, None]
    for jitter in (1e-10, 1e-7, 1e-4, 1e-1, 1.0):
        factor, info = torch.linalg.cholesky_ex(h + jitter * top * eye)
        if not bool(info.any()):
            break
    else:  # pragma: no cover - a diagonal of 1s makes any symmetric block positive definite
        factor = torch.linalg.cholesky(torch.diag_embed(h.diagonal(dim1=1, dim2=2)) + top * eye)
    inverse = torch.linalg.solve_triangular(factor, eye.expand_as(factor), upper=False)
    return _RowBlocks(factor, inverse)


class Dirichlet(_ClassScaling):
    r"""Dirichlet calibration: ``W log softmax(z) + b``, ODIR-regularised (K^2 + K parameters).

    Kull et al. (2019), "Beyond temperature scaling": a multinomial logistic regression on
    the log-probabilities :math:`\log p = \log\mathrm{softmax}(z)`, the multiclass
    generalisation of beta calibration. ``W`` starts at the identity and ``b`` at zero,
    which gives back ``softmax(z)`` unchanged. ``num_classes=None`` defers creating the
    parameters until :meth:`fit`.

    Post-hoc fitting uses the ODIR regularisation (Off-Diagonal and Intercept
    Regularisation) with one addition, the diagonal pulled toward temperature scaling: with
    ``N`` samples it minimises

    .. math::

        \frac1N\Big[\sum_{i=1}^N \ell_i(W, b)
            + \frac{\lambda}{2}\Big(\sum_{j \neq k} (T_0 W_{jk})^2
            + \sum_k (T_0 W_{kk} - 1)^2 + \lVert b \rVert^2\Big)\Big],
        \qquad \ell_i = -\log\mathrm{softmax}\big(W \log p_i + b\big)_{y_i},

    i.e. :class:`MatrixScaling`'s penalty on :math:`\lVert T_0 W - I\rVert_F^2 +
    \lVert b\rVert^2`, with :math:`T_0` the temperature :class:`Temperature` fits to the same
    data (with its prior on :math:`\log T`). Two choices of ours (docs/method.md §2): the
    off-diagonal and intercept strengths are coupled (one ``l2``, chosen by stratified
    ``cv``-fold cross-validation exactly as for :class:`MatrixScaling`; Kull et al. searched
    a 2-D grid), and the diagonal is not free: ODIR's free diagonal is one power per class,
    :math:`p_k^{W_{kk}}` renormalised, whose maximum-likelihood value diverges on a
    validation set the network classifies perfectly (a CNN on scikit-learn's digits:
    validation NLL 0, infinite test NLL); pulled toward :math:`1/T_0`, a strong penalty
    gives temperature scaling (``W = I / T_0``, ``b = 0``, since
    :math:`\mathrm{softmax}(\log p / T) = \mathrm{softmax}(z / T)`), which stays finite
    there. ``l2=0`` is plain multinomial logistic regression on :math:`\log p`. The softmax
    does not change when a vector is added to every row of ``W`` or a constant to ``b``;
    the fit returns the representative with the smallest penalty (each column of
    :math:`T_0 W - I` and the bias centred on 0).

    Parameters
    ----------
    num_classes : int or None
        Number of classes ``K``; ``None`` takes it from :meth:`fit`.
    max_iter : int
        L-BFGS iterations per fit.
    l2 : float or "cv"
        The strength :math:`\lambda` of the penalty, or ``"cv"`` (default) to choose it by
        stratified ``cv``-fold cross-validation from ``l2_grid``; ``l2=0`` is plain maximum
        likelihood (which diverges on a separable validation set).
    cv : int
        Folds for ``l2="cv"``.
    l2_grid : sequence of float
        Strengths tried by ``l2="cv"`` (default :data:`DEFAULT_L2_GRID`).

    Attributes
    ----------
    weight, bias : Parameter
        ``W`` (K, K) and ``b`` (K,).
    target_temperature_ : float
        :math:`T_0` of the final fit; the other fitted attributes are those of
        :class:`Calibrator`.

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import Dirichlet
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randint(0, 3, (600,), generator=g)
    >>> z = 3 * (torch.randn(600, 3, generator=g) + 2 * torch.nn.functional.one_hot(y, 3))
    >>> cal = Dirichlet().fit(z, y)           # K from the data, l2 by 5-fold CV
    >>> cal.weight.shape, cal.l2_ in cal.l2_grid_
    (torch.Size([3, 3]), True)
    >>> cal.predict_proba(z[:2]).sum(1)
    tensor([1., 1.])
    """

    _full_matrix = True

    def _affine(
        self, logits: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        return super()._affine(F.log_softmax(logits, dim=-1), weight, bias)

    # The fit is a multinomial regression on the features log p with the penalty above, started
    # from temperature scaling and preconditioned row by row (docs/performance.md, "Post-hoc
    # fits"): log-probabilities are strongly correlated and, for a confident network, carry
    # their curvature in few samples, which neither whitening nor a diagonal scaling captures.
    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Start the fit at temperature scaling, ``W = I / T_0``, ``b = 0`` (which Dirichlet
        calibration contains exactly: ``softmax(log p / T) = softmax(z / T)``), and store the
        data term's curvature there for :meth:`_standardisation`."""
        super()._prepare(logits, labels)
        t0 = self._target_temperature  # the penalty's centre is I / T_0 (_AffineScaling)
        if t0 is None:  # the test hook's penalty toward 0: start at temperature scaling too
            t0 = fit_temperature(logits, labels)
        with torch.no_grad():
            k = self.weight.shape[0]
            self.weight.copy_(torch.eye(k, dtype=self.weight.dtype) / t0)
            self.bias.zero_()
        self._data_curvature = _row_curvature(
            F.log_softmax(logits, dim=1), F.softmax(logits / t0, dim=1)
        )

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
        curvature = getattr(self, "_data_curvature", None)
        k = logits.shape[1]
        if curvature is None or curvature.shape[0] != k:  # only a speed matter: any SPD works
            p = F.softmax(logits, dim=1)
            curvature = _row_curvature(F.log_softmax(logits, dim=1), p)
        t0 = self._target_temperature if self._shrinks_to_temperature() else 1.0
        penalised = torch.full((k, k + 1), t0**2, dtype=curvature.dtype, device=curvature.device)
        penalised[:, k] = 1.0 if self._penalize_bias else 0.0
        h = curvature + torch.diag_embed(2.0 * penalty_weight * penalised)
        return _row_blocks(h)

    def _encode(self, stats: Any) -> dict[str, torch.Tensor]:
        if not isinstance(stats, _RowBlocks):
            return super()._encode(stats)
        w, b = self.weight.detach(), self.bias.detach()
        v = torch.bmm(torch.cat([w, b[:, None]], 1)[:, None, :], stats.factor).squeeze(1)
        return {"weight": v[:, :-1].contiguous(), "bias": v[:, -1].contiguous()}

    def _decode(self, variables: dict[str, torch.Tensor], stats: Any) -> dict[str, torch.Tensor]:
        if not isinstance(stats, _RowBlocks):
            return super()._decode(variables, stats)
        v = torch.cat([variables["weight"], variables["bias"][:, None]], 1)
        wb = torch.bmm(v[:, None, :], stats.inverse).squeeze(1)
        return {"weight": wb[:, :-1], "bias": wb[:, -1]}

    def _closure(self, variables: dict[str, torch.Tensor], problem: _Problem) -> _Closure:
        """:math:`J_\\lambda` and its gradient by hand (tests check them against autograd on
        the generic objective). The calibrated logits are ``W x + b`` with ``x = log p``;
        the data term's gradient is ``G x`` and ``G 1`` with ``G = (softmax - onehot) / n``;
        the penalty's is ``2 weight T_0 D`` on ``W`` (``D = T_0 W - I`` with centred
        columns, an orthogonal projection: :meth:`_weight_penalty_deviation`) and
        ``2 weight d_b``; both are chained back through ``[W | b]_j = v_j L_j^{-1}``."""
        logits, labels, stats, weight = problem
        x = F.log_softmax(logits, dim=1)
        x_cols, n = x.T.contiguous(), x.shape[0]  # (K, n): see _one_hot_columns
        onehot = _one_hot_columns(labels, logits)
        v, c = variables["weight"], variables["bias"]
        blocks = stats if isinstance(stats, _RowBlocks) else None
        t0 = self._target_temperature if self._shrinks_to_temperature() else 1.0
        identity = self._identity() if self._weights_toward_identity else 0.0

        @torch.no_grad()  # L-BFGS enables autograd around its closure: no graph is needed
        def closure() -> torch.Tensor:
            if blocks is None:
                w, b = v, c
            else:
                wb = torch.bmm(torch.cat([v, c[:, None]], 1)[:, None, :], blocks.inverse)
                w, b = wb[:, 0, :-1], wb[:, 0, -1]
            logp = torch.log_softmax(torch.addmm(b[:, None], w, x_cols), dim=0)
            loss = -(logp * onehot).sum()
            g = logp.exp().div_(n).sub_(onehot)
            grad_w, grad_b = g @ x, g.sum(1)
            if weight:
                d_w = self._weight_penalty_deviation(w, t0, identity)
                loss = loss + weight * (d_w**2).sum()
                grad_w = grad_w + (2.0 * weight * t0) * d_w
                if self._penalize_bias:
                    d_b = b - b.mean()
                    loss = loss + weight * (d_b**2).sum()
                    grad_b = grad_b + 2.0 * weight * d_b
            if blocks is None:
                v.grad, c.grad = grad_w, grad_b
            else:
                grad = torch.cat([grad_w, grad_b[:, None]], 1)[:, :, None]
                grad = torch.bmm(blocks.inverse, grad).squeeze(2)  # L_j^{-1} [G_W | g_b]_j
                v.grad, c.grad = grad[:, :-1].contiguous(), grad[:, -1].contiguous()
            return loss

        return closure
