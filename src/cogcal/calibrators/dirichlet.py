"""Dirichlet calibration (Kull et al., 2019): an affine map of the log-probabilities,
ODIR-regularised, fitted with block-Jacobi preconditioning."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cogcal.calibrators.affine import (  # noqa: F401  (_RowBlocks, _row_blocks: re-exported)
    _CURVATURE_ROWS,
    _row_blocks,
    _row_curvature,
    _RowBlocks,
    _RowConditioned,
)


class Dirichlet(_RowConditioned):
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

    def _affine(
        self, logits: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        return super()._affine(F.log_softmax(logits, dim=-1), weight, bias)

    def _features(self, logits: torch.Tensor) -> torch.Tensor:
        """The ``x`` of ``W x + b``: the log-probabilities."""
        return F.log_softmax(logits, dim=1)

    def _curvature_rows(self) -> int:
        return _CURVATURE_ROWS  # this module's name, which tests may set
