r"""Temperature scaling with Laplace smoothing (:class:`LaplaceTemperature`) and structured
vector and matrix scaling (:class:`StructuredVectorScaling`, :class:`StructuredMatrixScaling`;
Berta et al., "Structured matrix scaling for multi-class calibration", AISTATS 2026).

All three start with temperature scaling and mix its probabilities with the uniform
distribution, :math:`q = (1 - a)\,\mathrm{softmax}(z / T) + a / K` with :math:`a = 1/(n + 1)`
for ``n`` fitting samples (a Laplace-style pseudo-count that keeps every probability above
:math:`a / K`). The structured maps then fit an affine map of :math:`x = \log q`, penalised
toward the identity with strengths that grow with the number of parameters they govern
(docs/method.md §2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cogcal.calibrators._base import (
    DEFAULT_L2_GRID,
    DEFAULT_TEMPERATURE_L2,
    _cast,
    _Closure,
    _LazyWidth,
    _Problem,
)
from cogcal.calibrators._newton import VectorProblem
from cogcal.calibrators.affine import (
    _CURVATURE_ROWS,
    _decode_rows,
    _encode_rows,
    _row_blocks,
    _row_closure,
    _row_curvature,
    reduced_dtype,
    row_conditioned,
)
from cogcal.calibrators.temperature import Temperature, fit_temperature


def _smoothed_log_probs(
    logits: torch.Tensor, log_temperature: torch.Tensor, smoothing: torch.Tensor
) -> torch.Tensor:
    """``log((1 - a) softmax(z / T) + a / K)``, computed stably (``a = 0`` gives ``log_softmax``)."""
    k = logits.shape[-1]
    a = _cast(smoothing, logits.dtype)
    logp = torch.log_softmax(logits / _cast(log_temperature.exp(), logits.dtype), dim=-1)
    x, y = logp + torch.log1p(-a), torch.log(a) - math.log(k)
    # logaddexp(x, y), written with operators ONNX exports (it has no logaddexp)
    high = torch.maximum(x, y)
    return high + torch.log1p(torch.exp(-(x - y).abs()))


class LaplaceTemperature(Temperature):
    r"""Temperature scaling with Laplace smoothing: ``log((1 - a) softmax(z / T) + a / K)``.

    The temperature is fitted exactly as by :class:`Temperature` (same prior on
    :math:`\log T`, same hyperparameters); the calibrated probabilities are then mixed with
    the uniform distribution with weight :math:`a = 1/(n + 1)`, ``n`` the number of fitting
    samples -- the probabilities an ``(n + 1)``-th pseudo-sample spread evenly over the
    classes would give. No probability falls below :math:`a / K`, so a confidently wrong test
    prediction costs at most :math:`\log(K (n + 1))` nats. This is Probmetrics' ``ts-mix``
    (Berta et al., 2026). The output is :math:`\log q`, valid logits whose softmax is ``q``.

    Parameters
    ----------
    max_iter, l2, cv, l2_grid
        As for :class:`Temperature`.

    Attributes
    ----------
    smoothing : Tensor
        The buffer holding :math:`a` (0 before fitting: plain temperature scaling).

    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import LaplaceTemperature
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 999)
    >>> z = 4.0 * (rng.normal(size=(999, 3)) + 2.0 * np.eye(3)[y])
    >>> ts = LaplaceTemperature().fit(z, y)
    >>> round(float(ts.smoothing), 6)              # 1 / (n + 1)
    0.001
    >>> bool(ts.predict_proba(100.0 * np.eye(3)).min() >= 0.001 / 3)
    True
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
        self.register_buffer("smoothing", torch.zeros(()))

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        return _smoothed_log_probs(logits, self.log_temperature, self.smoothing)

    def _reset_parameters(self) -> None:
        super()._reset_parameters()
        self.smoothing.zero_()

    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        self.smoothing.fill_(1.0 / (logits.shape[0] + 1.0))

    def extra_repr(self) -> str:
        return f"temperature={self.temperature:.4g}, smoothing={float(self.smoothing):.3g}"


class _StructuredScaling(_LazyWidth):
    """Laplace-smoothed temperature scaling, then ``W x + b`` on ``x = log q`` (vector or
    full ``W``), penalised toward ``W = I``, ``b = 0`` with per-block strengths."""

    _full_matrix = False

    def __init__(
        self,
        num_classes: int | None = None,
        *,
        max_iter: int = 500,
        l2: float | str = 1.0,
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ) -> None:
        super().__init__(
            num_classes, max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid, name="num_classes"
        )
        self.register_buffer("log_temperature", torch.zeros(()))
        self.register_buffer("smoothing", torch.zeros(()))

    def _init_params(self, k: int) -> None:
        self.weight = nn.Parameter(torch.eye(k) if self._full_matrix else torch.ones(k))
        self.bias = nn.Parameter(torch.zeros(k))

    @property
    def temperature(self) -> float:
        """The temperature ``T`` of the first (temperature-scaling) step."""
        return float(self.log_temperature.exp())

    def extra_repr(self) -> str:
        return f"num_classes={self.num_outputs}"

    def _identity(self) -> Any:
        w = self.weight
        return torch.eye(w.shape[0], dtype=w.dtype, device=w.device) if self._full_matrix else 1.0

    def _deviations(self) -> list[tuple[str, Any, str]]:
        return [("weight", self._identity(), "weight"), ("bias", 0.0, "bias")]

    def _reset_parameters(self) -> None:
        super()._reset_parameters()
        self.log_temperature.zero_()
        self.smoothing.zero_()
        self._feature_cache = None

    def _features(self, logits: torch.Tensor) -> torch.Tensor:
        return _smoothed_log_probs(logits, self.log_temperature, self.smoothing)

    def _fit_features(self, logits: torch.Tensor) -> torch.Tensor:
        """:meth:`_features` of the logits being fitted, once the first step is fitted
        (:meth:`_prepare`): kept for the fit's closure, which needs them again."""
        cached = getattr(self, "_feature_cache", None)
        if cached is None or cached[0] is not logits:
            cached = self._feature_cache = (logits, self._features(logits).detach())
        return cached[1]

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        super()._after_fit(logits, labels)
        self._feature_cache = None

    def _affine(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        weight, bias = _cast(weight, x.dtype), _cast(bias, x.dtype)
        return F.linear(x, weight, bias) if self._full_matrix else x * weight + bias

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        self._require_built()
        return self._affine(self._features(logits), self.weight, self.bias)

    # -- fitting ---------------------------------------------------------------------------
    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        self.log_temperature.fill_(math.log(fit_temperature(logits, labels)))
        self.smoothing.fill_(1.0 / (logits.shape[0] + 1.0))

    def _penalty_terms(self, params: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        # weight * (c_d |diag - 1|^2 + c_d |b|^2 + c_o |offdiag|^2) with c_d = 2K and
        # c_o = 2K(K - 1): with weight = l2 / (2n), the penalty of the class docstring
        k = params["bias"].shape[0]
        diagonal = math.sqrt(2.0 * k)
        if not self._full_matrix:
            return [diagonal * (params["weight"] - 1.0), diagonal * params["bias"]]
        w = params["weight"]
        eye = torch.eye(k, dtype=w.dtype, device=w.device)
        off = math.sqrt(2.0 * k * (k - 1)) * (w * (1.0 - eye))
        return [diagonal * (w.diagonal() - 1.0), diagonal * params["bias"], off]

    def _vector_problem(
        self, logits: torch.Tensor, labels: torch.Tensor, weight: float
    ) -> VectorProblem | None:
        """Structured vector scaling's fit for Newton's method on ``x = log q``: the penalty
        ``weight 2K (|w - 1|^2 + |b|^2)`` is ``a = 4 K weight`` around 1 and
        ``B = 4 K weight I``."""
        if self._full_matrix:
            return None
        k = logits.shape[1]
        like = dict(dtype=logits.dtype, device=logits.device)
        x = self._fit_features(logits)
        curvature = 4.0 * k * weight
        return VectorProblem(
            x, labels, torch.full((k,), curvature, **like), torch.ones(k, **like),
            curvature * torch.eye(k, **like),
        )  # fmt: skip

    def _coefficients(self, k: int, like: torch.Tensor) -> torch.Tensor:
        """Per-entry multipliers of ``weight`` in the penalty on ``W``: 2K on the diagonal
        (and for vector scaling), 2K(K - 1) off it."""
        if not self._full_matrix:
            return torch.full((k,), 2.0 * k, dtype=like.dtype, device=like.device)
        eye = torch.eye(k, dtype=like.dtype, device=like.device)
        return 2.0 * k * eye + 2.0 * k * (k - 1) * (1.0 - eye)


_STRUCTURED_DOC = r"""
    Parameters
    ----------
    num_classes : int or None
        Number of classes ``K``; ``None`` takes it from :meth:`fit`.
    max_iter : int
        Iterations per fit (L-BFGS; Newton steps for structured vector scaling).
    l2 : float or "cv"
        The strength :math:`\lambda` (default 1, Berta et al.'s choice), or ``"cv"`` to
        choose it from ``l2_grid`` by stratified ``cv``-fold cross-validation.
    cv, l2_grid
        As for :class:`Calibrator`, used with ``l2="cv"``.

    Attributes
    ----------
    temperature : float
        :math:`T`, fitted as by :class:`Temperature`; the buffers ``log_temperature`` and
        ``smoothing`` (:math:`a`) hold the first step. The other fitted attributes are those
        of :class:`Calibrator`.
"""


class StructuredVectorScaling(_StructuredScaling):
    __doc__ = (
        r"""Structured vector scaling (SVS; Berta et al., 2026): ``w * log q + b``.

    ``q = (1 - a) softmax(z / T) + a / K`` is Laplace-smoothed temperature scaling
    (:class:`LaplaceTemperature`, fitted first, then held fixed); vector scaling with one
    weight and one bias per class then acts on :math:`\log q`. With ``n`` fitting samples,
    ``w`` and ``b`` minimise

    .. math::

        \frac1n\Big[\sum_{i=1}^n \ell_i(w, b)
            + \lambda K \Big(\sum_k (w_k - 1)^2 + \sum_k b_k^2\Big)\Big],

    a penalty toward the identity that scales with ``K`` (the paper's ridge penalty with
    its default exponents), so a strong penalty gives smoothed temperature scaling.
"""
        + _STRUCTURED_DOC
        + r"""
    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import StructuredVectorScaling
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 4, 800)
    >>> z = 3.0 * (rng.normal(size=(800, 4)) + 1.5 * np.eye(4)[y])
    >>> svs = StructuredVectorScaling().fit(z, y)
    >>> svs.weight.shape, bool(svs.nll_after_ < svs.nll_before_)
    (torch.Size([4]), True)
    """
    )


def _sms_curvature(x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """:func:`~cogcal.calibrators.affine._row_curvature` of structured matrix scaling's
    features ``x = log q`` at ``probs``. Its K (K+1)^2 work per row costs, for 100 classes
    and 2,500 rows, more than the fit: above 2^27 / K^3 rows (but at least 1,024) it reads a
    strided subset, for the same iterations on 100 classes (bench/posthoc_peers.py's
    gauss100)."""
    rows = min(_CURVATURE_ROWS, max(1024, 2**27 // x.shape[1] ** 3))
    return _row_curvature(x, probs, rows)


class StructuredMatrixScaling(_StructuredScaling):
    __doc__ = (
        r"""Structured matrix scaling (SMS; Berta et al., 2026): ``W log q + b``, full ``W``.

    As :class:`StructuredVectorScaling`, with a full K x K matrix: with ``n`` fitting
    samples, ``W`` and ``b`` minimise

    .. math::

        \frac1n\Big[\sum_{i=1}^n \ell_i(W, b)
            + \lambda K \Big(\sum_k (W_{kk} - 1)^2 + \sum_k b_k^2\Big)
            + \lambda K (K - 1) \sum_{j \ne k} W_{jk}^2\Big],

    the off-diagonal block, with ``K (K - 1)`` parameters, penalised ``K - 1`` times more
    strongly than the diagonal and the biases. The fit is one L-BFGS run (no
    cross-validation with the default fixed ``l2``) from the identity, preconditioned by
    one Cholesky block per row of ``[W | b]`` as :class:`MatrixScaling`'s.
"""
        + _STRUCTURED_DOC
        + r"""
    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import StructuredMatrixScaling
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 4, 800)
    >>> z = 3.0 * (rng.normal(size=(800, 4)) + 1.5 * np.eye(4)[y])
    >>> sms = StructuredMatrixScaling().fit(z, y)
    >>> sms.weight.shape
    torch.Size([4, 4])
    >>> sms.predict_proba(z[:2]).sum(1).round(6).tolist()
    [1.0, 1.0]
    """
    )

    _full_matrix = True

    # -- block-Jacobi conditioning, as matrix scaling's (:class:`MatrixScaling`) ----------
    # The fit starts at temperature scaling (W = I / T, b = 0: softmax(log p / T) =
    # softmax(z / T)), and one Cholesky block per row of [W | b] is the objective's
    # curvature in that row there: 17-22x fewer L-BFGS evaluations than on features
    # centred and scaled per class (632 -> 37 on mnist1d, 535 -> 24 on 100 classes;
    # bench/posthoc_peers.py); from the identity map instead, logits far from calibrated
    # took 300-400 evaluations at 10^5 rows (the convex problem has one optimum either way).
    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        super()._prepare(logits, labels)
        x = self._fit_features(logits)
        t0 = self.temperature
        with torch.no_grad():
            self.weight.copy_(torch.eye(x.shape[1], dtype=self.weight.dtype) / t0)
            self.bias.zero_()
        shared, self._fold_curvature = getattr(self, "_fold_curvature", None), None
        if shared is not None and shared.shape[0] == x.shape[1]:
            self._data_curvature = shared  # all the data's (:meth:`_fold_share`)
        elif row_conditioned(x.shape[1]):
            self._data_curvature = _sms_curvature(x, F.softmax(logits / t0, dim=1))
        else:
            self._data_curvature = None

    def _fold_share(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        """The preconditioner of the folds' fits: the curvature of all the data at its
        temperature, and its row blocks per penalty weight, instead of one of each per fold
        (for 100 classes 65 of a fold's 130 ms); as :class:`MatrixScaling`'s folds, a
        preconditioner changes the path of a fit, not its solution."""
        if not row_conditioned(logits.shape[1]):
            return {}
        z = logits.detach().to(torch.float64)
        t0 = fit_temperature(z, labels)
        smoothing = torch.tensor(1.0 / (z.shape[0] + 1.0), dtype=z.dtype)
        x = _smoothed_log_probs(z, torch.tensor(math.log(t0), dtype=z.dtype), smoothing)
        return {
            "_fold_curvature": _sms_curvature(x, F.softmax(z / t0, dim=1)),
            "_shared_blocks": {},
        }

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        super()._after_fit(logits, labels)
        # (K, K+1, K+1) each: a fitted calibrator need not carry them
        self._data_curvature = self._shared_blocks = None

    def _standardisation(self, logits: torch.Tensor, penalty_weight: float) -> Any:
        """The row blocks: the data term's curvature plus the penalty's on each entry
        (``None``, unconditioned, above :data:`~cogcal.calibrators.affine.BLOCK_MAX_CLASSES`);
        the folds of a cross-validation share them (:meth:`_fold_share`; folds of unequal
        sizes have penalty weights within 0.5%)."""
        curvature = self._data_curvature
        if curvature is None:
            return None
        shared = getattr(self, "_shared_blocks", None)
        key = float(f"{penalty_weight:.3g}")
        if shared is not None and key in shared:
            return shared[key]
        k = curvature.shape[0]
        coefficients = 2.0 * self._coefficients(k, curvature)  # of W: 2 weight C
        penalised = torch.cat([coefficients, torch.full((k, 1), 4.0 * k).to(curvature)], 1)
        blocks = _row_blocks(curvature, penalty_weight * penalised)
        if shared is not None:
            shared[key] = blocks
        return blocks

    def _encode(self, stats: Any) -> dict[str, torch.Tensor]:
        if stats is None:  # unconditioned (tests): the parameters themselves
            return super()._encode(stats)
        return _encode_rows(self.weight.detach(), self.bias.detach(), stats)

    def _decode(self, variables: dict[str, torch.Tensor], stats: Any) -> dict[str, torch.Tensor]:
        if stats is None:
            return variables
        w, b = _decode_rows(variables["weight"], variables["bias"], stats)
        return {"weight": w, "bias": b}

    def _closure(self, variables: dict[str, torch.Tensor], problem: _Problem) -> _Closure:
        """The penalised mean NLL and its gradient by hand (:func:`_row_closure`): the
        penalty ``weight (C * (W - I)^2).sum() + 2 K weight |b|^2`` has the gradient
        ``2 weight C (W - I)`` and ``4 K weight b``."""
        logits, labels, blocks, weight, _ = problem
        k = logits.shape[1]
        coef = 2.0 * weight * self._coefficients(k, logits)
        identity = self._identity()

        def penalty(w: torch.Tensor, b: torch.Tensor) -> tuple[Any, Any, Any]:
            d_w = w - identity
            value = 0.5 * (coef * d_w**2).sum() + 2.0 * k * weight * (b**2).sum()
            return value, coef * d_w, 4.0 * k * weight * b

        x = self._fit_features(logits)
        return _row_closure(
            x, labels, variables, blocks, penalty if weight else None, problem.dtype
        )  # fmt: skip

    def _reduced_dtype(self, logits: torch.Tensor) -> torch.dtype | None:
        return reduced_dtype(self._fit_features(logits))
