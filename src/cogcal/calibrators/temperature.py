"""Temperature scaling: one temperature (:class:`Temperature`) or one per binary task
(:class:`TaskTemperature`), and the floor of a temperature fitted to separable data."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from cogcal.calibrators._base import (
    DEFAULT_L2_GRID,
    DEFAULT_TEMPERATURE_L2,
    Calibrator,
    SeparableDataWarning,
    _cast,
    _LazyWidth,
)
from cogcal.calibrators._newton import fit_log_temperature


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
            f"with l2=0 the fitted T = {temperature:.4g} is wherever the fit stopped: pass "
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
        Newton steps.
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
        #: K of the logits of the last :meth:`fit` (``None`` before: any width is taken,
        #: e.g. as the COG calibrator trained with the model).
        self.num_classes_: int | None = None

    def _build(self, num_outputs: int) -> None:
        self.num_classes_ = num_outputs  # each fit (re)sets the width it takes

    def _check_width(self, width: int) -> None:
        expected = self.num_classes_
        if expected is not None and width != expected:
            raise ValueError(
                f"`logits` has {width} columns but Temperature was fitted on {expected} "
                "classes; pass logits of the model it was fitted for, or fit it again on "
                "these."
            )

    @property
    def temperature(self) -> float:
        """The current temperature ``T`` as a float."""
        return float(self.log_temperature.detach().exp())

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / _cast(self.log_temperature.exp(), logits.dtype)

    def _deviations(self) -> list[tuple[str, Any, str]]:
        return [("log_temperature", 0.0, "weight")]

    def _fit_by_newton(
        self, logits: torch.Tensor, labels: torch.Tensor, weight: float,
        tolerances: dict[str, float],
    ) -> int:  # fmt: skip
        """Newton's method in ``log T`` (:func:`~cogcal.calibrators._newton.fit_log_temperature`):
        one parameter, whose second derivative costs no more than its first."""
        u, n_iter = fit_log_temperature(
            logits, labels, float(self.log_temperature.detach()), weight,
            max_iter=self.max_iter, **tolerances,
        )  # fmt: skip
        self._set_solution({"log_temperature": self.log_temperature.detach().new_tensor(u)})
        return n_iter

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


def fit_temperature(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    l2: float = DEFAULT_TEMPERATURE_L2,
    start: float | None = None,
) -> float:
    """The temperature ``Temperature(l2=l2).fit`` gives, without its checks or warnings.

    ``logits`` are (N, K) float64 with valid ``labels``, both on one device; ``l2=0`` gives
    the maximum-likelihood temperature (unbounded for separable or uninformative logits).
    ``start``: where Newton's method starts (default 1), e.g. the temperature of data
    overlapping these: fewer steps to the same minimiser (the fit stops at a gradient of
    1e-8 in ``log T``). The shrinkage target of vector and matrix scaling and the health
    check (:mod:`cogcal.health`) use it.
    """
    ts = Temperature().to(device=logits.device, dtype=torch.float64)
    if start is not None:
        ts.log_temperature.data.fill_(math.log(start))
    ts._minimise(logits, labels, l2)
    return ts.temperature
