r"""Calibrators: ``nn.Module`` maps from logits (or features, for the TST heads) to logits.

Each parametric calibrator serves both ways the paper uses it (docs/method.md §1-§2):

* **post hoc**: ``.fit(val_logits, val_labels)`` fits it on frozen logits of a held-out
  split by full-batch L-BFGS, computed in float64, and returns ``self`` with its
  parameters frozen (``requires_grad=False``), so that
  ``Temperature().fit(v, y)(test_logits).numpy()`` works;
* **in one go** (COG): placed after a network by :class:`cogcal.CalibratedModel`, its
  parameters are trained by the network's own optimiser on a slower learning rate.

Multiclass calibrators take ``(N, K)`` logits; the multi-label ones take ``(N, T)`` logits of
``T`` independent binary tasks and keep one temperature (:class:`TaskTemperature`) or one
affine map ``a * z + b`` (Platt form, :class:`TaskAffine`) per task. The parametric
multiclass ones are :class:`Temperature`, :class:`VectorScaling`, :class:`MatrixScaling`
and :class:`Dirichlet` (an affine map of the log-probabilities).

Two non-parametric multiclass calibrators, :class:`Isotonic` and :class:`HistogramBinning`,
are post hoc only and fitted differently: no parameters and no L-BFGS, ``fit`` computes
one-vs-rest maps of the class probabilities in closed form and keeps them in buffers; their
output is the log of the clipped, renormalised calibrated probabilities (docs/method.md §2).

Post-hoc fitting is a penalised (MAP) fit. With ``n`` NLL terms :math:`\ell_i` (``n = N``
samples for multiclass, ``n = N T`` binary terms for multi-label) and parameters
:math:`\theta`, :meth:`Calibrator.fit` minimises

.. math::

    J_\lambda(\theta) = \frac{1}{n}\Big[\sum_{i=1}^{n} \ell_i(\theta)
        + \frac{\lambda}{2}\,\lVert \theta - \theta_0 \rVert_2^2\Big],

the summed NLL plus a Gaussian prior :math:`\mathcal N(\theta_0, \lambda^{-1} I)` on the
parameters, centred on a simple map :math:`\theta_0`: ``T = 1`` for the temperatures (the
parameter is :math:`\log T`), the identity ``a = 1, b = 0`` for :class:`TaskAffine`, and
for :class:`VectorScaling` / :class:`MatrixScaling` the identity *after temperature
scaling*, ``W = I / T_0, b = 0``, with :math:`T_0` the temperature :class:`Temperature`
fits to the same data (see :class:`MatrixScaling`), so that the strongest penalty gives
temperature scaling rather than the uncalibrated logits.
The penalty's weight relative to the data falls as ``1/n``: a fixed ``l2`` is the same
prior for any validation size, and the fit tends to maximum likelihood as ``n`` grows.
``l2="cv"`` chooses :math:`\lambda` from ``l2_grid`` by stratified ``cv``-fold
cross-validation inside the data given to ``fit`` (see :meth:`Calibrator.fit`).

Arrays are first-class: calling a calibrator, or its :meth:`~Calibrator.predict_proba`, with
a numpy array returns a numpy array (computed without gradients); a tensor returns a tensor
of the input's dtype.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cogcal._checks import (
    ProbabilitiesAsLogitsWarning,
    as_float_tensor,
    check_multiclass,
    check_multilabel,
    warn_if_probabilities,
)

__all__ = [
    "Calibrator",
    "Temperature",
    "VectorScaling",
    "MatrixScaling",
    "Dirichlet",
    "Isotonic",
    "HistogramBinning",
    "TaskTemperature",
    "TaskAffine",
    "TSTHead",
    "VTSTHead",
    "default_latent_dim",
    "make_calibrator",
    "separable_temperature_floor",
    "DEFAULT_L2_GRID",
    "CV_SEED",
    "DEFAULT_TEMPERATURE_L2",
    "SeparableDataWarning",
    "L2GridEdgeWarning",
    "ProbabilitiesAsLogitsWarning",
]

#: Penalty strengths :math:`\lambda` tried by ``l2="cv"``: 0 (maximum likelihood) and one
#: per decade from 1e-2 to 1e5. :math:`\lambda` is a prior precision per parameter, so the
#: grid spans "no penalty" to "the shrinkage target" for validation sets of 10^2-10^5 samples.
DEFAULT_L2_GRID: tuple[float, ...] = (0.0, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5)

#: Seed of the permutation that assigns samples to cross-validation folds.
CV_SEED = 0

# Cross-validation walks the grid from the strongest penalty down and stops once the pooled
# held-out NLL has failed to improve on its best at this many consecutive weaker strengths.
_CV_PATIENCE = 2

#: Precision of the Gaussian prior on ``log T`` (``sigma = 1``): the default ``l2`` of
#: :class:`Temperature` and :class:`TaskTemperature`, and the fixed prior on the temperature
#: of the shrinkage target of :class:`VectorScaling` and :class:`MatrixScaling`.
DEFAULT_TEMPERATURE_L2 = 1.0


class SeparableDataWarning(UserWarning):
    """A temperature was fitted to data whose samples are all classified correctly.

    The maximum-likelihood temperature of such data is unbounded below (``T -> 0``); the
    fitted value is then set by the prior on ``log T`` (``l2``), not by the data.

    Examples
    --------
    >>> import warnings, torch
    >>> from cogcal.calibrators import SeparableDataWarning, Temperature
    >>> z, y = torch.tensor([[3.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     t = Temperature().fit(z, y)
    >>> [w.category.__name__ for w in caught]
    ['SeparableDataWarning']
    >>> 0 < t.temperature < 1
    True
    """


class L2GridEdgeWarning(UserWarning):
    """Cross-validation chose the smallest positive or the largest strength of ``l2_grid``.

    The best strength may then lie outside the grid; extend ``l2_grid`` past that edge.

    Examples
    --------
    >>> from cogcal.calibrators import L2GridEdgeWarning
    >>> issubclass(L2GridEdgeWarning, UserWarning)
    True
    """


def _check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        expected = "a positive integer or None" if allow_none else "a positive integer"
        raise ValueError(f"`{name}` must be {expected}, got {value!r}.")


def _is_nonnegative_number(value: Any) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float | np.integer | np.floating)
        and math.isfinite(float(value))
        and float(value) >= 0
    )


def _check_l2(value: Any) -> None:
    if isinstance(value, str):
        if value != "cv":
            raise ValueError(
                f"`l2` must be a non-negative number or the string 'cv', got {value!r}."
            )
        return
    if not _is_nonnegative_number(value):
        raise ValueError(
            f"`l2` must be a non-negative finite number (the penalty strength) or 'cv' "
            f"(choose it by cross-validation), got {value!r}."
        )


def _check_grid(grid: Any) -> tuple[float, ...]:
    if isinstance(grid, str) or not isinstance(grid, Sequence | np.ndarray):
        raise ValueError(
            f"`l2_grid` must be a sequence of non-negative numbers, got {type(grid).__name__}."
        )
    values = list(grid)
    bad = [v for v in values if not _is_nonnegative_number(v)]
    if bad:
        raise ValueError(
            f"`l2_grid` must hold non-negative finite numbers, got {bad[0]!r} among them."
        )
    distinct = tuple(sorted({float(v) for v in values}))
    if len(distinct) < 2:
        raise ValueError(
            f"`l2_grid` needs at least two distinct strengths to choose from, got {values!r}; "
            "for one fixed strength pass it as `l2=` instead."
        )
    return distinct


def _array_like(x: Any) -> Any:
    """Turn pandas objects and other ``__array__`` providers into (writable) numpy arrays.

    Tensors, lists and tuples pass through for :mod:`cogcal._checks`; anything else
    without ``__array__`` also passes through, to be refused there by name.
    """
    if isinstance(x, torch.Tensor | list | tuple):
        return x
    if isinstance(x, np.ndarray) or hasattr(x, "__array__"):
        array = np.asarray(x)
        # read-only arrays (pandas' copy-on-write views, np.broadcast_to) cannot back a tensor
        return array if array.flags.writeable else array.copy()
    return x


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


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the call when it would be a no-op (the training step's path)."""
    return t if t.dtype == dtype else t.to(dtype)


class _Problem(NamedTuple):
    """One penalised fit: the logits and labels, the conditioning statistics of
    :meth:`Calibrator._standardisation` and the penalty's weight ``l2 / (2 n)``."""

    logits: torch.Tensor
    labels: torch.Tensor
    stats: Any
    weight: float


#: An L-BFGS closure: returns the objective, leaves the gradient in the variables' ``.grad``.
_Closure = Callable[[], torch.Tensor]


def _one_hot_columns(labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``onehot(labels).T / n``, shape (K, N), for the hand-written objectives, which work on
    (K, N) logits: with few classes torch's softmax over a long contiguous dimension and
    ``addmm`` producing it are 2.5-4x faster than over rows of K."""
    n, k = logits.shape
    return F.one_hot(labels, k).to(logits.dtype).T.contiguous() / n


def _matrix_roots(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M^(1/2), M^(-1/2))`` of a symmetric positive semi-definite ``M`` (eigenvalues
    floored at 1e-10 of the largest), the preconditioner of a full-matrix fit."""
    evals, evecs = torch.linalg.eigh(m)
    top = float(evals.max()) if evals.numel() else 1.0
    evals = evals.clamp(min=1e-10 * top if top > 0 else 1.0)
    return (evecs * evals.sqrt()) @ evecs.T, (evecs * evals.rsqrt()) @ evecs.T


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


def _stratified_folds(y: torch.Tensor, k: int, seed: int = CV_SEED) -> torch.Tensor:
    """Fold index (0..k-1) of each of the N labels in ``y``, stratified by class.

    The samples are permuted with a generator seeded by ``seed``, stably sorted by class,
    and dealt to the folds in turn, so every fold holds ``floor(n_c / k)`` or
    ``ceil(n_c / k)`` samples of each class ``c`` and the fold sizes differ by at most one.
    The assignment depends only on ``y``, ``k`` and ``seed``.
    """
    labels = y.detach().cpu().long()
    n = labels.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    order = perm[torch.argsort(labels[perm], stable=True)]
    folds = torch.empty(n, dtype=torch.long)
    folds[order] = torch.arange(n) % k
    return folds


def _shuffled_folds(n: int, k: int, seed: int = CV_SEED) -> torch.Tensor:
    """Fold index of each of ``n`` rows: a seeded permutation dealt to the folds in turn."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    folds = torch.empty(n, dtype=torch.long)
    folds[perm] = torch.arange(n) % k
    return folds


def separable_temperature_floor(
    num_samples: int, num_classes: int, min_margin: float, l2: float
) -> float:
    r"""Lower bound on the fitted temperature of perfectly separable data.

    If every one of ``N`` samples has margin :math:`\Delta_i = z_{i,y_i} - \max_{k \neq y_i}
    z_{ik} \ge \Delta > 0`, any stationary point of the penalised objective of
    :class:`Temperature` with ``l2`` :math:`= \lambda > 0` satisfies

    .. math::

        T \;\ge\; \min\Big(e^{-1},\; \frac{\Delta}{2 \ln\big(2N(K-1)/(e\lambda)\big)}\Big)

    (only :math:`T \ge e^{-1}` when :math:`2N(K-1) \le e\lambda`). For binary tasks use
    ``num_classes=2`` and the margin :math:`(2y-1)z`.

    Why: with :math:`u = \log T`, :math:`s = 1/T`, each sample's NLL has
    :math:`\partial\ell_i/\partial u = s\sum_{k \neq y} p_k \Delta_{ik} \le \sum_{k \neq y}
    s\Delta_{ik} e^{-s\Delta_{ik}} \le (K-1)\,\tfrac{2}{e}\, e^{-s\Delta/2}`, while the
    stationarity condition reads :math:`\sum_i \partial\ell_i/\partial u = -\lambda u`.
    If :math:`T < e^{-1}`, then :math:`-u > 1` and
    :math:`\lambda < \tfrac{2}{e} N (K-1) e^{-\Delta/(2T)}`, which rearranges to the bound.
    The floor falls only logarithmically with ``N`` and scales with the logits.

    Examples
    --------
    >>> from cogcal.calibrators import separable_temperature_floor
    >>> round(separable_temperature_floor(200, 5, 4.0, 1.0), 3)
    0.314
    """
    if not (min_margin > 0 and l2 > 0):
        return 0.0
    ratio = 2.0 * num_samples * (num_classes - 1) / (math.e * l2)
    if ratio <= 1.0:
        return math.exp(-1.0)
    return min(math.exp(-1.0), min_margin / (2.0 * math.log(ratio)))


class Calibrator(nn.Module):
    r"""Base class of the post-hoc-capable calibrators.

    Subclasses define ``_forward`` (logits to calibrated logits), ``_deviations`` (each
    parameter with its value at the shrinkage centre) and, when their size is only known
    from data, ``_build(num_outputs)``. :meth:`fit` then runs full-batch L-BFGS in float64
    and writes the result back in the parameters' own dtype.

    Parameters
    ----------
    max_iter : int
        L-BFGS iterations per fit.
    l2 : float or "cv"
        Strength :math:`\lambda \ge 0` of the penalty
        :math:`\tfrac{\lambda}{2}\lVert\theta-\theta_0\rVert^2` added to the summed NLL
        (see the module docstring), or ``"cv"`` to choose it from ``l2_grid``.
    cv : int
        Number of cross-validation folds for ``l2="cv"`` (at least 2).
    l2_grid : sequence of float
        Strengths tried by ``l2="cv"`` (default :data:`DEFAULT_L2_GRID`).

    Attributes
    ----------
    n_iter_ : int
        L-BFGS iterations of the final fit.
    nll_before_, nll_after_ : float
        Mean NLL on the fitting data of the identity map (the uncalibrated logits) and of
        the fitted calibrator.
    l2_ : float
        Penalty strength used for the final fit (``l2`` itself, or the one CV chose).
    l2_grid_ : ndarray or None
        The distinct strengths CV tried, ascending (``None`` for a fixed ``l2``).
    cv_scores_ : ndarray or None
        Pooled mean held-out NLL of each strength of ``l2_grid_`` (every sample is held out
        exactly once; ``nan`` for strengths the early stop skipped, see :meth:`fit`); CV
        picks the smallest (the strongest penalty among exact ties).
    cv_fold_scores_ : ndarray or None
        Mean held-out NLL per fold and strength, shape ``(cv, len(l2_grid_))`` (``inf``
        where a fit diverged, ``nan`` where skipped).
    l2_at_edge_ : {None, "lower", "upper"}
        Where in ``l2_grid_`` the chosen strength lies, if at an end. An edge raises an
        :class:`L2GridEdgeWarning` when a strength beyond it could give a different map:
        not for ``"lower"`` at 0 (no weaker penalty exists) and not for ``"upper"`` when the
        fitted map already equals the penalty's centre (every penalised deviation below
        1e-3, so a stronger penalty changes nothing).

    Examples
    --------
    Numpy in, numpy out; tensors in, tensors out:

    >>> import numpy as np, torch
    >>> from cogcal.calibrators import Temperature
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 600)
    >>> z = rng.normal(size=(600, 3)) + 2.0 * np.eye(3)[y]
    >>> t = Temperature().fit(3.0 * z, y)              # three times too confident
    >>> out = t(3.0 * z[:2].astype(np.float32))
    >>> type(out).__name__, out.dtype
    ('ndarray', dtype('float32'))
    >>> t.predict_proba(torch.tensor(3.0 * z[:2])).sum(1)
    tensor([1.0000, 1.0000], dtype=torch.float64)
    """

    multilabel: bool = False
    # Test hooks (private): centre the weight penalty at 0 instead of the identity, and
    # leave the biases unpenalised -- the form of scikit-learn's L2 LogisticRegression.
    _weights_toward_identity: bool = True
    _penalize_bias: bool = True

    def __init__(
        self,
        *,
        max_iter: int = 200,
        l2: float | str = 0.0,
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ) -> None:
        super().__init__()
        self.max_iter = max_iter
        self.l2 = l2
        self.cv = cv
        grid_like = isinstance(l2_grid, Sequence | np.ndarray) and not isinstance(l2_grid, str)
        self.l2_grid = tuple(l2_grid) if grid_like else l2_grid
        self._validate_hyperparameters()

    def _validate_hyperparameters(self) -> None:
        _check_positive_int("max_iter", self.max_iter)
        _check_l2(self.l2)
        if isinstance(self.cv, bool) or not isinstance(self.cv, int) or self.cv < 2:
            raise ValueError(f"`cv` must be an integer >= 2 (number of folds), got {self.cv!r}.")
        _check_grid(self.l2_grid)

    # -- to be provided by subclasses -------------------------------------------------
    def _build(self, num_outputs: int) -> None:  # pragma: no cover - overridden when needed
        return None

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _map(self, logits: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """``forward`` with ``params`` in place of the parameters (the fit's objective)."""
        return torch.func.functional_call(self, params, (logits,))

    def _deviations(self) -> list[tuple[str, Any, str]]:  # pragma: no cover
        """``(parameter name, identity value, "weight" | "bias")`` for every parameter."""
        raise NotImplementedError

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        return None

    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Fix data-dependent parts of the penalty from the training data of one fit."""
        return None

    # The optimisation runs on variables v = encode(theta) in which L-BFGS is well
    # conditioned; each evaluation decodes the parameters, so the objective is unchanged.
    def _standardisation(self, logits: torch.Tensor, penalty_weight: float) -> Any:
        return None

    def _encode(self, stats: Any) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name).detach() for name, _, _ in self._deviations()}

    def _decode(self, variables: dict[str, torch.Tensor], stats: Any) -> dict[str, torch.Tensor]:
        return variables

    def _canonical(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The representative of ``params`` that the fit returns (for maps with symmetries)."""
        return params

    def _penalty_terms(self, params: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The penalised deviations ``theta - theta_0`` (their squares sum to the penalty)."""
        terms = []
        for name, identity, kind in self._deviations():
            if kind == "bias" and not self._penalize_bias:
                continue
            centre = identity if (kind == "bias" or self._weights_toward_identity) else 0.0
            terms.append(params[name] - centre)
        return terms

    # -- prediction ---------------------------------------------------------------------
    def forward(self, logits: Any) -> Any:
        """Calibrated logits. A tensor gives a tensor (differentiable, as in COG training);
        a numpy array (or anything with ``__array__``) gives a numpy array of its dtype."""
        if isinstance(logits, torch.Tensor):
            if logits.ndim >= 1:  # a width mismatch must not broadcast (or fail inside torch)
                self._check_width(int(logits.shape[-1]))
            return self._forward(logits)
        z = self._prediction_input(logits)
        with torch.no_grad():
            return self._forward(z.to(self._device())).cpu().numpy()

    def predict_proba(self, logits: Any) -> Any:
        """Calibrated probabilities, without gradients.

        Softmax over the classes for multiclass calibrators, one sigmoid per task for the
        multi-label ones. Numpy in gives numpy out; a tensor gives a tensor on its own
        device. The output has the input's dtype (half precision is computed in float32).
        """
        is_tensor = isinstance(logits, torch.Tensor)
        z = self._prediction_input(logits)
        work = torch.float32 if z.dtype in (torch.float16, torch.bfloat16) else z.dtype
        with torch.no_grad():
            out = self._forward(z.to(self._device())).to(work)
            probs = torch.sigmoid(out) if self.multilabel else torch.softmax(out, dim=1)
        probs = probs.to(z.dtype)
        return probs.to(z.device) if is_tensor else probs.cpu().numpy()

    def _prediction_input(self, logits: Any) -> torch.Tensor:
        z = as_float_tensor(_array_like(logits), "logits", 2)
        if not self.multilabel and z.shape[1] < 2:
            raise ValueError(
                f"`logits` has {z.shape[1]} column(s); a multiclass calibrator needs K >= 2 "
                "columns (for independent binary tasks use TaskTemperature or TaskAffine)."
            )
        self._require_built()
        self._check_width(z.shape[1])
        return z

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    # -- fitting --------------------------------------------------------------------------
    def _check(self, logits: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        logits, labels = _array_like(logits), _array_like(labels)
        if self.multilabel:
            return check_multilabel(logits, labels)
        return check_multiclass(logits, labels)

    def _nll(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self._nll_of(self._forward(logits), labels)

    def _nll_of(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.multilabel:
            return F.binary_cross_entropy_with_logits(z, labels.to(z.dtype), reduction="mean")
        return F.cross_entropy(z, labels)

    def _reset_parameters(self) -> None:
        with torch.no_grad():
            for name, identity, _ in self._deviations():
                param = getattr(self, name)
                param.copy_(torch.as_tensor(identity, dtype=param.dtype).expand_as(param))

    def _minimise(
        self, logits: torch.Tensor, labels: torch.Tensor, l2: float, *, scoring: bool = False
    ) -> int:
        """Minimise :math:`J_\\lambda` from the current parameters; return the iterations.

        ``scoring``: a cross-validation fit, whose only use is its held-out NLL; it stops at
        a gradient of 1e-6 instead of 1e-8 (the held-out scores agree to ~1e-6, at about half
        the iterations). The decoded parameters are also left (detached) in
        ``self._solution``.
        """
        n_terms = logits.numel() if self.multilabel else logits.shape[0]
        weight = float(l2) / (2.0 * n_terms)
        stats = self._standardisation(logits, weight)
        variables = {
            k: v.detach().clone().requires_grad_(True) for k, v in self._encode(stats).items()
        }
        opt = torch.optim.LBFGS(
            list(variables.values()),
            lr=1.0,
            max_iter=self.max_iter,
            tolerance_grad=1e-6 if scoring else 1e-8,
            tolerance_change=1e-12 if scoring else 1e-15,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        with torch.enable_grad():
            opt.step(self._closure(variables, _Problem(logits, labels, stats, weight)))
        with torch.no_grad():
            decoded = self._canonical(self._decode(variables, stats))
            solution = {k: v.detach() for k, v in decoded.items()}
            for name, value in solution.items():
                getattr(self, name).copy_(value)
        self._solution = solution
        return int(opt.state[next(iter(variables.values()))].get("n_iter", 0))

    def _closure(self, variables: dict[str, torch.Tensor], problem: _Problem) -> _Closure:
        """The L-BFGS closure: :math:`J_\\lambda` at ``variables``, their ``.grad`` set."""
        logits, labels, stats, weight = problem

        def closure() -> torch.Tensor:
            for v in variables.values():
                v.grad = None
            params = self._decode(variables, stats)
            loss = self._nll_of(self._map(logits, params), labels)
            if weight:
                loss = loss + weight * sum((d**2).sum() for d in self._penalty_terms(params))
            loss.backward()
            return loss

        return closure

    def _folds(self, labels: torch.Tensor) -> torch.Tensor:
        if self.multilabel:
            return _shuffled_folds(labels.shape[0], self.cv)
        return _stratified_folds(labels, self.cv)

    def _cross_validate(self, logits: torch.Tensor, labels: torch.Tensor) -> float:
        n = labels.shape[0]
        if n < self.cv:
            raise ValueError(
                f"`l2='cv'` with cv={self.cv} folds needs at least {self.cv} samples, got {n}; "
                "pass a smaller `cv` or a fixed `l2`."
            )
        grid = np.asarray(_check_grid(self.l2_grid))
        folds = self._folds(labels).to(labels.device)
        held_out = [folds == f for f in range(self.cv)]
        sizes = np.array([float(h.sum()) for h in held_out])
        models = []
        for held in held_out:
            model = copy.deepcopy(self)
            model._reset_parameters()
            model._prepare(logits[~held], labels[~held])
            models.append(model)
        fold_scores = np.full((self.cv, grid.size), np.nan)
        pooled = np.full(grid.size, np.nan)
        best_score, worse_in_a_row = np.inf, 0
        for j in reversed(range(grid.size)):  # strongest first, each fit warm-starts the next
            for f, (model, held) in enumerate(zip(models, held_out, strict=True)):
                model._minimise(logits[~held], labels[~held], float(grid[j]), scoring=True)
                with torch.no_grad():
                    score = float(model._nll(logits[held], labels[held]))
                finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
                fold_scores[f, j] = score if math.isfinite(score) and finite else np.inf
            pooled[j] = float((fold_scores[:, j] * sizes).sum() / sizes.sum())
            if pooled[j] < best_score:
                best_score, worse_in_a_row = pooled[j], 0
            else:
                worse_in_a_row += 1
            if worse_in_a_row == _CV_PATIENCE:
                break
        if not np.isfinite(best_score):
            raise RuntimeError(
                f"{type(self).__name__}.fit: every strength of `l2_grid` diverged in "
                "cross-validation; check the logits for extreme values."
            )
        best = int(np.flatnonzero(pooled == best_score).max())  # ties: stronger penalty
        self.l2_grid_, self.cv_scores_, self.cv_fold_scores_ = grid, pooled, fold_scores
        self.l2_at_edge_ = "upper" if best == grid.size - 1 else "lower" if best == 0 else None
        return float(grid[best])

    def _warn_edge(self) -> None:
        name, grid = type(self).__name__, self.l2_grid_
        if self.l2_at_edge_ == "upper":
            deviation = max(float(d.abs().max()) for d in self._penalty_terms(self._solution))
            if deviation >= 1e-3:
                warnings.warn(
                    f"{name}.fit: cross-validation chose the strongest penalty in `l2_grid` "
                    f"(l2={grid[-1]:g}, its upper edge) and the fitted map is still "
                    f"{deviation:.2g} away from the penalty's centre; a stronger penalty may "
                    "be better: extend `l2_grid` upwards.",
                    L2GridEdgeWarning,
                    stacklevel=3,
                )
        elif self.l2_at_edge_ == "lower" and grid[0] > 0:
            warnings.warn(
                f"{name}.fit: cross-validation chose the weakest penalty in `l2_grid` "
                f"(l2={grid[0]:g}, its lower edge); a weaker one may be better: add smaller "
                "strengths (or 0) to `l2_grid`.",
                L2GridEdgeWarning,
                stacklevel=3,
            )

    def fit(self, logits: Any, labels: Any) -> Calibrator:
        r"""Fit the calibrator post hoc by full-batch float64 L-BFGS on the penalised NLL.

        Minimises :math:`J_\lambda(\theta) = \frac1n\big[\sum_i \ell_i(\theta) +
        \frac{\lambda}{2}\lVert\theta-\theta_0\rVert^2\big]` (module docstring; each class
        documents its :math:`\theta_0`) starting from the identity map (``fit`` always
        starts afresh), with :math:`\lambda` = ``l2``.

        With ``l2="cv"``, :math:`\lambda` is chosen by ``cv``-fold cross-validation **inside
        the data given here**: the folds are stratified by class (multi-label: shuffled rows)
        with the fixed seed :data:`CV_SEED`. Walking ``l2_grid`` from the strongest penalty
        down, the calibrator is fitted on each fold's complement (each fit starting from that
        fold's previous solution) and scored by the mean NLL of the held-out fold; the scores
        are pooled over all samples. The walk stops early once the pooled score has failed
        to improve on its best at two consecutive weaker strengths (those fits are the
        slowest and, past a minimum of the usual U-shaped curve, cannot win; the skipped
        strengths score ``nan``). The strength with the smallest pooled held-out NLL is
        refitted on all the data. A choice at an edge of the grid is recorded in
        ``l2_at_edge_`` (see the class docstring).

        After fitting, the parameters are frozen (``requires_grad=False``), so the
        calibrator's outputs carry no gradient and ``.numpy()`` works on them. To train
        the fitted calibrator further -- e.g. as the COG calibrator of
        :class:`cogcal.CalibratedModel` -- unfreeze it with ``.requires_grad_(True)``.

        Parameters
        ----------
        logits : Tensor, ndarray or array-like of shape (N, K) or (N, T)
            Frozen logits of a held-out split (never the test split): (N, K) for multiclass,
            (N, T) for multi-label. Any floating dtype; the optimisation runs in float64.
        labels : Tensor, ndarray, list or pandas Series
            (N,) class indices for multiclass, (N, T) 0/1 targets for multi-label.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            For logits that are not a finite 2-D floating array, labels of the wrong shape,
            dtype or range, or ``l2="cv"`` with fewer than ``cv`` samples.
        RuntimeError
            If the fit diverges to non-finite parameters.
        """
        self._validate_hyperparameters()
        z, y = self._check(logits, labels)
        warn_if_probabilities(
            z, "logits", f"{type(self).__name__}.fit needs logits (the model's outputs before "
            "softmax/sigmoid), not predict_proba's output: pass log-probabilities "
            "(np.log(p)), which are valid logits.", rows=not self.multilabel, stacklevel=3,
        )  # fmt: skip
        width = z.shape[1]
        self._build(width)
        self._check_width(width)
        device = self._device()
        original_dtype = next(self.parameters()).dtype
        z64 = z.detach().to(device=device, dtype=torch.float64)
        y = y.to(device)
        self.to(torch.float64)
        self.train(False)
        try:
            for p in self.parameters():
                p.requires_grad_(True)
            self._reset_parameters()
            with torch.no_grad():
                self.nll_before_ = float(self._nll(z64, y))
            if self.l2 == "cv":
                self.l2_ = self._cross_validate(z64, y)
            else:
                self.l2_ = float(self.l2)
                self.l2_grid_ = self.cv_scores_ = self.cv_fold_scores_ = None
                self.l2_at_edge_ = None
            self._reset_parameters()
            self._prepare(z64, y)
            self.n_iter_ = self._minimise(z64, y, self.l2_)
            with torch.no_grad():
                self.nll_after_ = float(self._nll(z64, y))
            if not all(bool(torch.isfinite(p).all()) for p in self.parameters()):
                raise RuntimeError(
                    f"{type(self).__name__}.fit diverged (non-finite parameters); the logits "
                    "may be extreme or the classes perfectly separable: try l2 > 0 or 'cv'."
                )
            self._warn_edge()
            self._after_fit(z64, y)
        finally:
            self.to(original_dtype)
        for p in self.parameters():
            p.requires_grad_(False)
        return self

    def _check_width(self, width: int) -> None:
        """Refuse logits of the wrong width (a calibrator without a width takes any)."""

    def _require_built(self) -> None:
        """Refuse to run before the parameters exist (a calibrator without a width has them)."""


def _warn_separable(
    name: str, margins: torch.Tensor, temperature: float, l2: float, num_classes: int, what: str
) -> None:
    """Warn when no margin is negative (and one is positive): the ML temperature is T -> 0."""
    lo, hi = float(margins.min()), float(margins.max())
    if not (lo >= 0 and hi > 0):
        return
    n = margins.numel()
    if l2 > 0:
        floor = separable_temperature_floor(n, num_classes, lo, l2)
        how = (
            f"the fitted T = {temperature:.4g} is set by the Gaussian prior on log T "
            f"(l2={l2:g}; T >= {floor:.3g} by separable_temperature_floor), not by the data"
        )
    else:
        how = (
            f"with l2=0 the fitted T = {temperature:.4g} is wherever L-BFGS stopped: pass "
            "l2 > 0 (a prior on log T) to bound it"
        )
    warnings.warn(
        f"{name}.fit: all {n} {what} are classified correctly (smallest margin {lo:.3g}), so "
        f"the maximum-likelihood temperature is unbounded below (T -> 0); {how}. A larger "
        "or harder validation split gives a data-driven temperature.",
        SeparableDataWarning,
        stacklevel=4,
    )


class Temperature(Calibrator):
    r"""Temperature scaling: ``z / T`` with one scalar ``T > 0`` (Guo et al., 2017).

    ``T`` is parametrised as ``exp(log_temperature)`` so that it stays positive whether
    it is fitted post hoc or trained with COG. It starts at ``T = 1`` (identity).

    Post-hoc fitting is a MAP estimate with a Gaussian prior on :math:`u = \log T`:

    .. math::

        \hat u = \arg\min_u \Big[\sum_{i=1}^N \ell_i(e^{u}) + \frac{\lambda}{2} u^2\Big],
        \qquad \lambda = \texttt{l2} = 1/\sigma^2,

    with the default :math:`\lambda = 1` (:math:`\sigma = 1`: ``T`` within
    :math:`[e^{-2}, e^{2}]` at two prior standard deviations). On ordinary validation sets
    its effect is negligible (a relative shift of :math:`T` of order
    :math:`|\log T| / (N\,\mathcal I)`, :math:`\mathcal I` the per-sample Fisher
    information of :math:`u`). On separable sets -- every sample classified correctly,
    where the maximum-likelihood ``T`` is unbounded below -- it keeps ``T`` finite, at
    least :func:`separable_temperature_floor`, and ``fit`` raises a
    :class:`SeparableDataWarning` naming the cause and the sample count. ``l2=0`` gives
    the plain maximum-likelihood fit; ``l2="cv"`` chooses :math:`\lambda` by
    cross-validation as for the other calibrators.

    Parameters
    ----------
    max_iter : int
        L-BFGS iterations.
    l2 : float or "cv"
        Precision :math:`\lambda` of the prior on ``log T`` (default 1.0).
    cv, l2_grid
        As for :class:`Calibrator`, used with ``l2="cv"``.

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import Temperature
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> labels = torch.randint(0, 5, (4000,))
    >>> clean = torch.randn(4000, 5) + 3 * torch.nn.functional.one_hot(labels, 5)
    >>> y = torch.distributions.Categorical(logits=clean).sample()
    >>> t = Temperature().fit(clean * 2.0, y)   # logits twice too confident
    >>> abs(t.temperature - 2.0) < 0.15
    True
    >>> t(clean[:1] * 2.0).requires_grad       # fitted parameters are frozen
    False
    """

    def __init__(
        self,
        *,
        max_iter: int = 200,
        l2: float | str = DEFAULT_TEMPERATURE_L2,
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ) -> None:
        super().__init__(max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid)
        self.log_temperature = nn.Parameter(torch.zeros(()))

    @property
    def temperature(self) -> float:
        """The current temperature ``T`` as a float."""
        return float(self.log_temperature.detach().exp())

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / _cast(self.log_temperature.exp(), logits.dtype)

    def _deviations(self) -> list[tuple[str, Any, str]]:
        return [("log_temperature", 0.0, "weight")]

    def _closure(self, variables: dict[str, torch.Tensor], problem: _Problem) -> _Closure:
        """:math:`J_\\lambda` by hand (as :meth:`_ClassScaling._closure`): with
        ``z' = z e^{-\\log T}``, the gradient is ``-sum(G * z') + 2 weight log T``."""
        logits, labels, _, weight = problem
        log_t = variables["log_temperature"]
        onehot, z_cols = _one_hot_columns(labels, logits), logits.T.contiguous()

        @torch.no_grad()  # L-BFGS enables autograd around its closure: no graph is needed
        def closure() -> torch.Tensor:
            z = z_cols / log_t.exp()
            logp = torch.log_softmax(z, dim=0)
            g = logp.exp().div_(logits.shape[0]).sub_(onehot)
            loss = -(logp * onehot).sum() + weight * log_t**2
            log_t.grad = 2.0 * weight * log_t - (g * z).sum()
            return loss

        return closure

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        true = logits.gather(1, labels[:, None])[:, 0]
        others = logits.scatter(1, labels[:, None], float("-inf")).amax(1)
        _warn_separable(
            "Temperature",
            true - others,
            self.temperature,
            self.l2_,
            logits.shape[1],
            "validation samples",
        )

    def extra_repr(self) -> str:
        return f"temperature={self.temperature:.4g}"


class _LazyWidth(Calibrator):
    """A calibrator whose parameters depend on the number of outputs, possibly known only at fit."""

    def __init__(
        self,
        num_outputs: int | None,
        *,
        max_iter: int,
        l2: float | str,
        cv: int,
        l2_grid: Sequence[float],
        name: str,
    ) -> None:
        super().__init__(max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid)
        _check_positive_int(name, num_outputs, allow_none=True)
        if num_outputs is not None and num_outputs < 2 and not self.multilabel:
            raise ValueError(f"`{name}` must be at least 2 for a multiclass calibrator.")
        self.num_outputs: int | None = None
        if num_outputs is not None:
            self._build(num_outputs)

    def _build(self, num_outputs: int) -> None:
        if self.num_outputs is None:
            self.num_outputs = num_outputs
            self._init_params(num_outputs)

    def _init_params(self, k: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _device(self) -> torch.device:
        self._require_built()
        return super()._device()

    def _check_width(self, width: int) -> None:
        expected = self.num_outputs
        if expected is not None and width != expected:
            kind = "tasks" if self.multilabel else "classes"
            raise ValueError(
                f"`logits` has {width} columns but {type(self).__name__} was built for "
                f"{expected} {kind}; build it with the right size or with None to take it from "
                "fit."
            )

    def _require_built(self) -> None:
        if self.num_outputs is None:
            raise RuntimeError(
                f"{type(self).__name__} has no parameters yet: pass the number of classes to "
                "the constructor or call .fit(logits, labels) first."
            )

    _width_key = "bias"

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[override]
        key = prefix + self._width_key
        if self.num_outputs is None and key in state_dict:
            self._build(int(state_dict[key].shape[0]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


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
        self._target_temperature = (
            _temperature_map(logits, labels) if self._shrinks_to_temperature() else None
        )

    def _times(self, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return w @ v if self._full_matrix else w * v

    def _standardisation(self, logits: torch.Tensor, penalty_weight: float) -> Any:
        stats = _column_stats(logits, penalty_weight, self.multilabel)
        if stats is None or not self._full_matrix:
            return stats
        # matrix scaling: whiten instead (one network's logits are strongly correlated,
        # which per-column scaling leaves ill-conditioned; 2.5x fewer L-BFGS iterations)
        mu = stats[0]
        centred = logits - mu
        return mu, _matrix_roots(centred.T @ centred / centred.shape[0])

    def _encode(self, stats: Any) -> dict[str, torch.Tensor]:
        # Standardised logits x = (z - mu) / sd:  W z + b = (W diag(sd)) x + (W mu + b);
        # whitened ones (matrix scaling) x = (z - mu) S^(-1/2):  W z + b = (W S^(1/2)) x + ...
        w, b = self.weight.detach(), self.bias.detach()
        if stats is None:
            return {"weight": w, "bias": b}
        mu, scale = stats
        v = w @ scale[0] if isinstance(scale, tuple) else w * scale
        return {"weight": v, "bias": self._times(w, mu) + b}

    def _decode(self, variables: dict[str, torch.Tensor], stats: Any) -> dict[str, torch.Tensor]:
        if stats is None:
            return variables
        mu, scale = stats
        v = variables["weight"]
        w = v @ scale[1] if isinstance(scale, tuple) else v / scale
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


def _temperature_map(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature ``Temperature().fit`` gives (prior precision DEFAULT_TEMPERATURE_L2),
    without its checks or warnings; ``logits`` are float64 on the calibrator's device."""
    ts = Temperature().to(device=logits.device, dtype=torch.float64)
    ts._minimise(logits, labels, DEFAULT_TEMPERATURE_L2)
    return ts.temperature


_AFFINE_PARAMETERS_DOC = r"""
    Parameters
    ----------
    num_classes : int or None
        Number of classes ``K``; ``None`` takes it from :meth:`fit`.
    max_iter : int
        L-BFGS iterations per fit.
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

    def extra_repr(self) -> str:
        return f"num_classes={self.num_outputs}"

    def _weight_penalty_deviation(self, w: torch.Tensor, t0: float, identity: Any) -> torch.Tensor:
        """The penalised weight deviation of :meth:`_penalty_terms` for the hand-written
        closure, an orthogonal projection of ``t0 * w - identity`` (so the penalty's gradient
        in ``w`` is ``2 weight t0`` times it)."""
        d_w = t0 * w - identity
        return d_w - d_w.mean(0, keepdim=True) if self._full_matrix else d_w

    def _closure(self, variables: dict[str, torch.Tensor], problem: _Problem) -> _Closure:
        """:math:`J_\\lambda` and its gradient by hand, the same function as the autograd
        closure (tests check both against it): a fit is ~400 evaluations of a small
        objective, dominated by per-operation overhead, and this takes half the operations.

        In the variables ``(v, c)`` the calibrated logits are ``x v^T + c`` (``x * v + c``
        for a vector), ``x`` the standardised (whitened) logits; the data term's gradient
        is ``G^T x`` and ``G 1`` with ``G = (softmax - onehot) / n``. The penalty is
        ``weight * (|D_W|^2 + |D_b|^2)`` on the decoded ``W`` and ``b = c - W mu``, whose
        deviations are centred projections (:meth:`_penalty_terms`), so its gradient is
        ``2 weight D`` chained back through ``T_0 W``, ``b`` and ``W = v R``.
        """
        logits, labels, stats, weight = problem
        v, c = variables["weight"], variables["bias"]
        full, n = self._full_matrix, logits.shape[0]
        onehot = _one_hot_columns(labels, logits)
        mu, scale = stats if stats is not None else (None, None)
        if scale is None:
            x = logits
        elif isinstance(scale, tuple):
            x = (logits - mu) @ scale[1]  # whitened: W = v S^(-1/2), symmetric
        else:
            x = (logits - mu) / scale
        x_cols = x.T.contiguous()  # (K, n): see _one_hot_columns
        t0 = self._target_temperature if self._shrinks_to_temperature() else 1.0
        identity = self._identity() if self._weights_toward_identity else 0.0

        @torch.no_grad()  # L-BFGS enables autograd around its closure: no graph is needed
        def closure() -> torch.Tensor:
            z = torch.addmm(c[:, None], v, x_cols) if full else x_cols * v[:, None] + c[:, None]
            logp = torch.log_softmax(z, dim=0)
            loss = -(logp * onehot).sum()
            g = logp.exp().div_(n).sub_(onehot)
            grad_v, grad_c = (g @ x if full else (g * x_cols).sum(1)), g.sum(1)
            if weight:
                w = v if scale is None else (v @ scale[1] if full else v / scale)
                b = c if mu is None else c - self._times(w, mu)
                d_w = self._weight_penalty_deviation(w, t0, identity)
                d_b = b - b.mean()
                loss = loss + weight * (d_w**2).sum()
                grad_w, grad_b = (2.0 * weight * t0) * d_w, 2.0 * weight * d_b
                if self._penalize_bias:
                    loss = loss + weight * (d_b**2).sum()
                    grad_c = grad_c + grad_b
                    if mu is not None:
                        grad_w = grad_w - (torch.outer(grad_b, mu) if full else grad_b * mu)
                if scale is None:
                    grad_v = grad_v + grad_w
                else:
                    grad_v = grad_v + (grad_w @ scale[1] if full else grad_w / scale)
            v.grad, c.grad = grad_v, grad_c
            return loss

        return closure


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


class MatrixScaling(_ClassScaling):
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
            t0 = _temperature_map(logits, labels)
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


class TaskTemperature(_LazyWidth):
    r"""One temperature per binary task: ``z_t / T_t`` for (N, T) multi-label logits.

    ``T_t = exp(log_temperature[t])``, starting at 1. Fitting minimises the summed binary
    cross-entropy over all tasks plus, as for :class:`Temperature`, a Gaussian prior
    :math:`\tfrac{\lambda}{2}\sum_t (\log T_t)^2` (``l2`` :math:`=\lambda`, default 1);
    the tasks do not share parameters, so this equals T separate fits. A task whose
    validation samples are all on the right side of 0 raises a
    :class:`SeparableDataWarning` (its maximum-likelihood temperature is unbounded below).

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import TaskTemperature
    >>> g = torch.Generator().manual_seed(0)
    >>> true = 2 * torch.randn(20000, 2, generator=g)
    >>> y = torch.bernoulli(torch.sigmoid(true), generator=g)
    >>> tt = TaskTemperature().fit(true * torch.tensor([0.5, 3.0]), y)
    >>> [round(t, 1) for t in tt.temperature.tolist()]
    [0.5, 3.0]
    """

    multilabel = True
    _width_key = "log_temperature"

    def __init__(
        self,
        num_tasks: int | None = None,
        *,
        max_iter: int = 200,
        l2: float | str = DEFAULT_TEMPERATURE_L2,
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ):
        super().__init__(
            num_tasks, max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid, name="num_tasks"
        )

    def _init_params(self, k: int) -> None:
        self.log_temperature = nn.Parameter(torch.zeros(k))

    def _deviations(self) -> list[tuple[str, Any, str]]:
        return [("log_temperature", 0.0, "weight")]

    @property
    def temperature(self) -> torch.Tensor:
        """The per-task temperatures as a detached tensor of shape (T,)."""
        self._require_built()
        return self.log_temperature.detach().exp()

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        self._require_built()
        return logits / _cast(self.log_temperature.exp(), logits.dtype)

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        margins = (2.0 * labels.to(logits.dtype) - 1.0) * logits
        temps = self.log_temperature.detach().exp()
        for t in range(logits.shape[1]):
            _warn_separable(
                "TaskTemperature",
                margins[:, t],
                float(temps[t]),
                self.l2_,
                2,
                f"validation samples of task {t}",
            )

    def extra_repr(self) -> str:
        return f"num_tasks={self.num_outputs}"


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


def _check_eps(value: Any) -> None:
    if value is None:
        return
    if not _is_nonnegative_number(value) or not 0.0 < float(value) < 0.5:
        raise ValueError(
            f"`eps` must be a number in (0, 0.5) (the floor the calibrated probabilities are "
            f"clipped to) or None (1 / (2n) for n fitting samples), got {value!r}."
        )


def _tie_groups(xs: np.ndarray, resolution: float = 1e-15) -> np.ndarray:
    """Start indices of the groups of tied values in the sorted float64 ``xs``.

    As scikit-learn's isotonic regression does, a value within ``resolution`` (float64's
    ``np.finfo().resolution``) of its group's first value joins the group: probabilities
    that far apart differ by the rounding of the softmax, not by the data.
    """
    gaps = np.diff(xs)
    starts = np.flatnonzero(np.r_[True, gaps >= resolution])
    ends = np.r_[starts[1:], xs.size]
    extra = []
    # only a chain of sub-resolution steps spanning more than `resolution` needs a walk
    for r in np.flatnonzero(xs[ends - 1] - xs[starts] >= resolution):
        current = xs[starts[r]]
        for i in range(starts[r] + 1, ends[r]):
            if xs[i] - current >= resolution:
                extra.append(i)
                current = xs[i]
    return np.sort(np.r_[starts, extra]).astype(np.intp) if extra else starts


def _isotonic_knots(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knots ``(x_j, v_j)`` of the increasing isotonic regression of ``y`` on ``x``.

    Linear interpolation between the knots, clipped at the ends, is scikit-learn's
    ``IsotonicRegression(out_of_bounds="clip").predict`` (up to rounding). Tied ``x``
    (:func:`_tie_groups`) are one point with the mean of their ``y`` and their count as
    weight; pool-adjacent-
    violators then merges, in rounds, every maximal run of points whose means do not
    increase (by the PAV lemma such blocks share one value at the optimum), until the block
    means increase strictly. Each block gives the knots at its first and last ``x``.
    """
    order = np.argsort(x)
    xs, ys = x[order], y[order]
    starts = _tie_groups(xs)
    unique_x = xs[starts]
    sums, weights = np.add.reduceat(ys, starts), np.diff(np.r_[starts, xs.size]).astype(float)
    first = np.arange(unique_x.size)
    while first.size > 1:
        means = sums / weights
        pooled = means[:-1] >= means[1:]
        if not pooled.any():
            break
        keep = np.flatnonzero(np.r_[True, ~pooled])  # a block starts where no pooling joins
        sums, weights, first = (
            np.add.reduceat(sums, keep),
            np.add.reduceat(weights, keep),
            first[keep],
        )
    last = np.r_[first[1:] - 1, unique_x.size - 1]
    knots_x = np.stack([unique_x[first], unique_x[last]], 1).ravel()
    knots_v = np.repeat(sums / weights, 2)
    distinct = np.r_[True, knots_x[1:] != knots_x[:-1]]  # one-point blocks: one knot
    return knots_x[distinct], knots_v[distinct]


def _histogram_bins(x: np.ndarray, y: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """``(edges, frequencies)`` of equal-mass histogram binning of ``y`` on ``x``.

    The sorted ``x`` are dealt into ``n_bins`` runs as ``np.array_split`` does (sizes
    differing by at most one, the larger first); consecutive runs are separated at the
    midpoint of their neighbouring values, except that a cut inside a run of tied values
    is dropped (those bins merge). A sample belongs to the bin of the number of edges below
    it, ``(x > edges).sum()``; each bin predicts the fraction of its samples with ``y = 1``.
    """
    xs = np.sort(x)
    sizes = np.full(n_bins, xs.size // n_bins) + (np.arange(n_bins) < xs.size % n_bins)
    cuts = np.cumsum(sizes)[:-1]
    cuts = cuts[xs[cuts - 1] < xs[cuts]]
    below, above = xs[cuts - 1], xs[cuts]
    middle = below + 0.5 * (above - below)
    edges = np.where(middle < above, middle, below)
    bins = (x[:, None] > edges[None, :]).sum(1)
    counts = np.bincount(bins, minlength=edges.size + 1)
    return edges, np.bincount(bins, weights=y, minlength=edges.size + 1) / counts


class _NonParametric(Calibrator):
    """One-vs-rest maps of the class probabilities, fitted in closed form (no L-BFGS).

    A subclass's ``_fit_map(x, y)`` gives one class's map as two 1-D numpy arrays (the
    buffers ``knots`` and ``values`` of that class's row; rows of different lengths are
    padded by repeating their last entry) and ``_evaluate(p, knots, values)`` evaluates
    the maps on (R, N) probabilities.
    """

    def __init__(self, num_classes: int | None = None, *, eps: float | None = None) -> None:
        nn.Module.__init__(self)  # not Calibrator's: none of its L-BFGS hyperparameters apply
        _check_positive_int("num_classes", num_classes, allow_none=True)
        if num_classes is not None and num_classes < 2:
            raise ValueError("`num_classes` must be at least 2 for a multiclass calibrator.")
        self.num_outputs: int | None = num_classes
        self.eps = eps
        self._validate_hyperparameters()
        self.register_buffer("knots", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("values", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("floor", torch.zeros((), dtype=torch.float64))

    def _validate_hyperparameters(self) -> None:
        _check_eps(self.eps)

    def _fit_map(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError  # pragma: no cover - overridden

    def _evaluate(self, p: torch.Tensor, knots: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - overridden

    # -- prediction ---------------------------------------------------------------------
    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        self._require_built()
        k = logits.shape[-1]
        work = torch.promote_types(logits.dtype, self.values.dtype)
        knots, values, floor = (_cast(b, work) for b in (self.knots, self.values, self.floor))
        p = torch.softmax(logits.reshape(-1, k).to(work), dim=1)
        if k == 2:  # one map, of p_1: p_0 = 1 - p_1 exactly, nothing to renormalise
            q1 = self._evaluate(p[:, 1:].T, knots, values).T
            q1 = torch.minimum(torch.maximum(q1, floor), 1.0 - floor)
            q = torch.cat([1.0 - q1, q1], dim=1)
        else:
            q = torch.maximum(self._evaluate(p.T, knots, values).T, floor)
            q = q / q.sum(1, keepdim=True)
        return torch.log(q).reshape(logits.shape).to(logits.dtype)

    def _device(self) -> torch.device:
        return self.values.device

    def _require_built(self) -> None:
        if self.values.numel() == 0:
            raise RuntimeError(
                f"{type(self).__name__} is not fitted yet: call .fit(logits, labels) first "
                "(or load a fitted one's state_dict)."
            )

    def _check_width(self, width: int) -> None:
        expected = self.num_outputs
        if expected is not None and width != expected:
            raise ValueError(
                f"`logits` has {width} columns but {type(self).__name__} was built for "
                f"{expected} classes; build it with the right size or with None to take it "
                "from fit."
            )

    # -- fitting --------------------------------------------------------------------------
    def fit(self, logits: Any, labels: Any) -> _NonParametric:
        """Fit the one-vs-rest maps on the softmax of ``logits`` (closed form, float64).

        Parameters
        ----------
        logits : Tensor, ndarray or array-like of shape (N, K)
            Frozen logits of a held-out split, K >= 2, any floating dtype.
        labels : Tensor, ndarray, list or pandas Series
            (N,) class indices.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            For logits that are not a finite 2-D floating array with K >= 2 columns, labels
            of the wrong shape, dtype or range, or logits of another width than
            ``num_classes``.
        """
        self._validate_hyperparameters()
        z, y = self._check(logits, labels)
        warn_if_probabilities(
            z, "logits", f"{type(self).__name__}.fit needs logits (the model's outputs before "
            "softmax), not predict_proba's output: pass log-probabilities (np.log(p)), which "
            "are valid logits.", rows=True, stacklevel=3,
        )  # fmt: skip
        n, k = z.shape
        self._check_width(k)
        self._check_data(n)
        columns = torch.softmax(z.detach().cpu().double(), dim=1).T.contiguous().numpy()
        labels_np = y.cpu().numpy()
        maps = [
            self._fit_map(columns[c], (labels_np == c).astype(np.float64))
            for c in ([1] if k == 2 else range(k))
        ]
        device, dtype = self._device(), self.values.dtype
        for i, name in enumerate(("knots", "values")):
            # rows padded with their last entry: a knot or edge repeated changes nothing (a
            # class without bin edges gets edges above every probability)
            width = max(m[i].size for m in maps)
            rows = np.stack(
                [
                    np.pad(m[i], (0, width - m[i].size), mode="edge")
                    if m[i].size
                    else np.full(width, np.inf)
                    for m in maps
                ]
            )
            setattr(self, name, torch.as_tensor(rows, dtype=dtype, device=device))
        eps = 1.0 / (2.0 * n) if self.eps is None else float(self.eps)
        self.floor = torch.tensor(eps, dtype=dtype, device=device)
        self.num_outputs = k
        with torch.no_grad():
            z64 = z.detach().to(device=device, dtype=torch.float64)
            y = y.to(device)
            self.nll_before_ = float(F.cross_entropy(z64, y))
            self.nll_after_ = float(self._nll(z64, y))
        return self

    def _check_data(self, n: int) -> None:
        return None

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors
    ):  # type: ignore[override]  # noqa: E501
        # the fitted buffers' sizes depend on the data: take them from the state
        values = state_dict.get(prefix + "values")
        if isinstance(values, torch.Tensor) and values.ndim == 2 and values.numel() > 0:
            k = 2 if values.shape[0] == 1 else int(values.shape[0])
            if self.num_outputs is not None and k != self.num_outputs:
                errors.append(
                    f"{type(self).__name__} was built for {self.num_outputs} classes; the "
                    f"state holds maps for {k}."
                )
                return
            self.num_outputs = k
            for name in ("knots", "values"):
                value = state_dict.get(prefix + name)
                if isinstance(value, torch.Tensor) and value.ndim == 2:
                    self._buffers[name] = torch.empty(
                        value.shape, dtype=self._buffers[name].dtype, device=self._device()
                    )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing, unexpected, errors
        )

    def extra_repr(self) -> str:
        return f"num_classes={self.num_outputs}"


class Isotonic(_NonParametric):
    r"""Isotonic regression, one-vs-rest: a non-decreasing map of each class's probability.

    With :math:`p = \mathrm{softmax}(z)`, each class ``k`` gets the non-decreasing
    map :math:`f_k` that minimises :math:`\sum_i (f_k(p_{ik}) - [y_i = k])^2` (Zadrozny &
    Elkan, 2002), fitted by pool-adjacent-violators and evaluated by linear interpolation
    between its knots, clipped to the fitted range -- scikit-learn's
    ``IsotonicRegression(out_of_bounds="clip")``, implemented in numpy / torch. The
    calibrated probabilities are :math:`q_k = \max(f_k(p_k), \epsilon)` renormalised to sum
    to 1. Binary (``K = 2``) is exact: one map of :math:`p_1`, clipped to
    :math:`[\epsilon, 1 - \epsilon]`, and :math:`q_0 = 1 - q_1`, with no renormalisation.

    Non-parametric: :meth:`fit` computes the maps in closed form (no L-BFGS, no penalty);
    they live in buffers (``knots``, ``values``: one row per class, or one row for
    ``K = 2``; ``floor``: :math:`\epsilon`), so ``state_dict`` round-trips into a fresh
    instance. The output is :math:`\log q`, so ``softmax(output) == q``. An isotonic map can
    be exactly 0 or 1 (a run of validation samples of one label), and the floor
    :math:`\epsilon` keeps the log-loss of such a prediction finite.

    Parameters
    ----------
    num_classes : int or None
        Number of classes ``K``; ``None`` takes it from :meth:`fit`.
    eps : float in (0, 0.5) or None
        The floor :math:`\epsilon`; ``None`` (default) is :math:`1/(2n)` for ``n`` fitting
        samples, half the smallest non-zero frequency a fit on them can give.

    Attributes
    ----------
    nll_before_, nll_after_ : float
        Mean NLL on the fitting data of the uncalibrated and the calibrated probabilities.

    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import Isotonic
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 2000)
    >>> z = 3.0 * (rng.normal(size=(2000, 3)) + 1.5 * np.eye(3)[y])
    >>> iso = Isotonic().fit(z, y)
    >>> iso.predict_proba(z[:2]).sum(1)
    array([1., 1.])
    >>> bool(iso.nll_after_ < iso.nll_before_)
    True
    """

    def _fit_map(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        knots, values = _isotonic_knots(x, y)
        if knots.size == 1:  # one distinct probability: a constant map
            knots, values = np.repeat(knots, 2), np.repeat(values, 2)
        return knots, values

    def _evaluate(self, p: torch.Tensor, knots: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        x = torch.minimum(torch.maximum(p, knots[:, :1]), knots[:, -1:])
        lo, hi = knots[:, :-1], knots[:, 1:]
        width = hi - lo
        slopes = (values[:, 1:] - values[:, :-1]) / torch.where(width > 0, width, 1.0)
        if torch.onnx.is_in_onnx_export():
            # ONNX has no searchsorted: the piece is the number of inner knots at or below x
            # ((R, M - 2, N) comparisons), the same index searchsorted gives
            j = (x[:, None, :] >= knots[:, 1:-1, None]).sum(1)
        else:
            j = torch.searchsorted(knots, x.contiguous(), right=True).sub_(1)
            j = j.clamp_(max=knots.shape[1] - 2)
        return values.gather(1, j) + slopes.gather(1, j) * (x - lo.gather(1, j))


class HistogramBinning(_NonParametric):
    r"""Histogram binning, one-vs-rest, with equal-mass bins (Zadrozny & Elkan, 2001).

    With :math:`p = \mathrm{softmax}(z)`, each class's probabilities on the fitting data
    are split into ``n_bins`` bins holding equal numbers of samples (sizes differing by at
    most one; bins never split tied probabilities, so heavy ties can merge bins); new
    probabilities fall into bins by the midpoints between neighbouring bins, and each bin
    predicts the frequency of its class among its fitting samples, :math:`f_k(p_k)`. As for
    :class:`Isotonic`, :math:`q_k = \max(f_k(p_k), \epsilon)` renormalised, binary
    (``K = 2``) exact with one map of :math:`p_1` clipped to :math:`[\epsilon, 1 - \epsilon]`
    and :math:`q_0 = 1 - q_1`, and the output is :math:`\log q`.

    Non-parametric: :meth:`fit` computes the bins in closed form (no L-BFGS); they live in
    buffers (``knots``: the bin edges, ``values``: the frequencies, ``floor``:
    :math:`\epsilon`), so ``state_dict`` round-trips into a fresh instance.

    Parameters
    ----------
    num_classes : int or None
        Number of classes ``K``; ``None`` takes it from :meth:`fit`.
    n_bins : int
        Bins per class (default 15, the usual reliability-diagram resolution); ``fit``
        needs at least ``n_bins`` samples.
    eps : float in (0, 0.5) or None
        The floor :math:`\epsilon`; ``None`` (default) is :math:`1/(2n)` for ``n`` fitting
        samples.

    Attributes
    ----------
    nll_before_, nll_after_ : float
        Mean NLL on the fitting data of the uncalibrated and the calibrated probabilities.

    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import HistogramBinning
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 2, 3000)
    >>> z = 4.0 * (rng.normal(size=(3000, 2)) + np.eye(2)[y])
    >>> hb = HistogramBinning(n_bins=10).fit(z, y)
    >>> hb.values.shape                   # K = 2: one map, of p_1
    torch.Size([1, 10])
    >>> q = hb.predict_proba(z)
    >>> bool(abs(q[:, 1].mean() - y.mean()) < 1e-9)  # bins reproduce the base rate
    True
    """

    def __init__(
        self, num_classes: int | None = None, *, n_bins: int = 15, eps: float | None = None
    ) -> None:
        self.n_bins = n_bins
        super().__init__(num_classes, eps=eps)

    def _validate_hyperparameters(self) -> None:
        _check_positive_int("n_bins", self.n_bins)
        super()._validate_hyperparameters()

    def _check_data(self, n: int) -> None:
        if n < self.n_bins:
            raise ValueError(
                f"HistogramBinning with n_bins={self.n_bins} needs at least {self.n_bins} "
                f"samples to fit, got {n}; pass a smaller `n_bins`."
            )

    def _fit_map(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _histogram_bins(x, y, self.n_bins)

    def _evaluate(self, p: torch.Tensor, knots: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():  # ONNX has no searchsorted: count comparisons
            bins = (p[:, :, None] > knots[:, None, :]).sum(2)
        else:  # the number of edges below each probability, as above
            bins = torch.searchsorted(knots, p.contiguous())
        return values.gather(1, bins)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_outputs}, n_bins={self.n_bins}"


_KINDS = ("ts", "vs", "ms", "dirichlet", "isotonic", "histogram")
_MULTILABEL_KINDS = ("ts", "vs", "ms")


def make_calibrator(
    kind: str, task: str = "multiclass", num_outputs: int | None = None
) -> Calibrator:
    """A new calibrator of ``kind`` for ``task``.

    Multiclass kinds: ``"ts"`` (:class:`Temperature`), ``"vs"`` (:class:`VectorScaling`),
    ``"ms"`` (:class:`MatrixScaling`), ``"dirichlet"`` (:class:`Dirichlet`), and the
    non-parametric ``"isotonic"`` (:class:`Isotonic`) and ``"histogram"``
    (:class:`HistogramBinning`, 15 bins). For ``task="multilabel"``, ``"ts"`` is one
    temperature per task and ``"vs"``/``"ms"`` one affine map per task; the other kinds are
    multiclass only.

    ``num_outputs`` (classes, or tasks) builds the parameters now; ``None`` defers them
    to :meth:`Calibrator.fit`.

    >>> make_calibrator("ms", num_outputs=3)
    MatrixScaling(num_classes=3)
    >>> make_calibrator("isotonic")
    Isotonic(num_classes=None)
    """
    if kind not in _KINDS:
        raise ValueError(f"`kind` must be one of {', '.join(map(repr, _KINDS))}, got {kind!r}.")
    if task == "multilabel":
        if kind not in _MULTILABEL_KINDS:
            raise ValueError(
                f"`kind` {kind!r} is multiclass only; for task='multilabel' use one of "
                f"{', '.join(map(repr, _MULTILABEL_KINDS))}."
            )
        return TaskTemperature(num_outputs) if kind == "ts" else TaskAffine(num_outputs)
    if kind == "ts":
        return Temperature()
    classes: dict[str, Callable[[int | None], Calibrator]] = {
        "vs": VectorScaling,
        "ms": MatrixScaling,
        "dirichlet": Dirichlet,
        "isotonic": Isotonic,
        "histogram": HistogramBinning,
    }
    return classes[kind](num_outputs)


def default_latent_dim(num_classes: int) -> int:
    """TST latent size Z of docs/method.md §2: 128 for 10 classes, 512 for 100, 256 otherwise.

    Examples
    --------
    >>> from cogcal.calibrators import default_latent_dim
    >>> default_latent_dim(10), default_latent_dim(100), default_latent_dim(7)
    (128, 512, 256)
    """
    return {10: 128, 100: 512}.get(num_classes, 256)


class TSTHead(nn.Module):
    """The Two-Stage-Training head (Jordahn & Olmos, 2024): features to logits.

    ``Linear(d, 3Z) -> ReLU -> Linear(3Z, Z) -> Linear(Z, K)``. It replaces a network's
    final linear layer: post hoc in the ``tst`` method (stage 2, body frozen) or as the
    slow-learning-rate calibrator of ``cog-tst``.

    Parameters
    ----------
    in_features : int
        Feature dimension ``d`` entering the head.
    num_classes : int
        Number of outputs ``K``.
    latent_dim : int, optional
        ``Z``; default :func:`default_latent_dim` of ``num_classes``.

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import TSTHead
    >>> head = TSTHead(64, 10)
    >>> head(torch.randn(3, 64)).shape
    torch.Size([3, 10])
    >>> head.predict_proba(torch.randn(3, 64).numpy()).sum(1).round(4)
    array([1., 1., 1.], dtype=float32)
    """

    def __init__(self, in_features: int, num_classes: int, *, latent_dim: int | None = None):
        super().__init__()
        _check_positive_int("in_features", in_features)
        _check_positive_int("num_classes", num_classes)
        z = default_latent_dim(num_classes) if latent_dim is None else latent_dim
        _check_positive_int("latent_dim", z)
        self.in_features, self.out_features, self.latent_dim = in_features, num_classes, z
        self.encoder = nn.Sequential(nn.Linear(in_features, 3 * z), nn.ReLU(), nn.Linear(3 * z, z))
        self.classifier = nn.Linear(z, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.encoder(features))

    def predict_proba(self, features: Any) -> Any:
        """Softmax of the head's logits for ``(N, d)`` features, without gradients.

        Numpy in gives numpy out; a tensor gives a tensor on its own device, of its dtype.
        The module's mode is kept: call ``.eval()`` first for the V-TST predictive mean.
        """
        is_tensor = isinstance(features, torch.Tensor)
        x = as_float_tensor(_array_like(features), "features", 2)
        if x.shape[1] != self.in_features:
            raise ValueError(
                f"`features` must have {self.in_features} columns for this head, got {x.shape[1]}."
            )
        param = next(self.parameters())
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        with torch.no_grad():
            logits = self(x.to(device=param.device, dtype=param.dtype))
            probs = torch.softmax(logits.to(work), dim=1).to(x.dtype)
        return probs.to(x.device) if is_tensor else probs.cpu().numpy()


#: Seed of the fixed standard-normal draws of :class:`VTSTHead`'s predictive mean.
VTST_NOISE_SEED = 0


class VTSTHead(TSTHead):
    """The variational TST head (V-TST, Jordahn & Olmos, 2024).

    A mean head (the :class:`TSTHead` encoder) and a variance head
    ``Linear(d, 3Z) -> ReLU -> Linear(3Z, Z) -> logsigmoid`` give ``q(z|x) = N(mu, diag sigma^2)``
    with ``log sigma^2 <= 0``; the prior is ``N(0, I)``.

    * In training mode, :meth:`forward_with_kl` draws one reparameterised sample and returns
      its logits with the KL term (summed over Z, divided by Z, averaged over the batch).
    * In eval mode, :meth:`forward` returns the logits of the predictive mean over
      ``num_samples`` draws, ``logsumexp_m(log_softmax(z_m)) - log M``, so metrics and
      post-hoc steps take them like any other logits. The draws
      ``z_m = mu + eps_m * sigma`` use ``num_samples`` fixed standard-normal vectors
      ``eps_m`` (the buffer :attr:`noise`, the same for every input and every head of
      this size), so the prediction is deterministic: it does not depend on the global
      random state or on the other inputs of a batch, and an export
      (:meth:`cogcal.CalibratedModel.export`, ONNX) computes exactly it. In training mode
      ``forward`` returns the single-sample logits of a fresh draw.

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import VTSTHead
    >>> head = VTSTHead(16, 5, latent_dim=8).eval()
    >>> x = torch.randn(4, 16)
    >>> logits = head(x)                         # log of the mean of 10 softmaxes
    >>> torch.allclose(logits.exp().sum(1), torch.ones(4), atol=1e-5)
    True
    >>> torch.allclose(head(x[:2]), logits[:2], atol=1e-6)  # the same, whatever the batch
    True
    >>> _, kl = head.train().forward_with_kl(torch.randn(4, 16))
    >>> bool(kl >= 0)
    True
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        *,
        latent_dim: int | None = None,
        num_samples: int = 10,
    ):
        super().__init__(in_features, num_classes, latent_dim=latent_dim)
        _check_positive_int("num_samples", num_samples)
        self.num_samples = num_samples
        z = self.latent_dim
        self.log_var = nn.Sequential(
            nn.Linear(in_features, 3 * z), nn.ReLU(), nn.Linear(3 * z, z), nn.LogSigmoid()
        )
        # the predictive mean's draws: fixed, so that a prediction is a function of its input
        # (not saved in checkpoints: every head of this size has the same ones)
        g = torch.Generator().manual_seed(VTST_NOISE_SEED)
        self.register_buffer("noise", torch.randn(num_samples, z, generator=g), persistent=False)

    def forward_with_kl(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One-sample logits and ``KL(q(z|x) || N(0, I))`` (sum over Z / Z, batch mean)."""
        mu, log_var = self.encoder(features), self.log_var(features)
        sample = mu + torch.randn_like(mu) * (0.5 * log_var).exp()
        kl = 0.5 * (log_var.exp() + mu.pow(2) - 1.0 - log_var).sum(1) / self.latent_dim
        return self.classifier(sample), kl.mean()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mu, log_var = self.encoder(features), self.log_var(features)
        if self.training:
            return self.classifier(mu + torch.randn_like(mu) * (0.5 * log_var).exp())
        std = (0.5 * log_var).exp()
        eps = self.noise.to(dtype=mu.dtype).unsqueeze(1)  # (M, 1, Z): the same for every input
        logp = F.log_softmax(self.classifier(mu + eps * std).float(), dim=-1)
        return (torch.logsumexp(logp, dim=0) - math.log(self.num_samples)).to(mu.dtype)
