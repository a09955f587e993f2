r"""Two-class calibrators: Platt scaling (:class:`Platt`) and Beta calibration
(:class:`BetaCalibration`, Kull et al., 2017).

Both take (N, 2) logits and refuse any other width. Each fits one calibrated logit
:math:`s` of class 1 and outputs the logits ``[0, s]``, so that the calibrated probability
of class 1 is :math:`\sigma(s)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from cogcal.calibrators._base import (
    DEFAULT_L2_GRID,
    Calibrator,
    _cast,
)
from cogcal.calibrators._newton import fit_logistic

#: The calibrators the refusals of a two-class one suggest for K > 2 classes.
MULTICLASS_ALTERNATIVES = ("ts", "svs", "sms")


def two_class_error(name: str, width: int) -> ValueError:
    """The one-line refusal of a two-class calibrator given ``width`` != 2 classes."""
    *first, last = (repr(k) for k in MULTICLASS_ALTERNATIVES)
    return ValueError(
        f"{name} is a two-class calibrator: `logits` has {width} columns, it needs 2; for "
        f"K > 2 classes use {', '.join(first)} or {last}."
    )


class _TwoClass(Calibrator):
    """A calibrator of (N, 2) logits whose output is ``[0, s]`` for one calibrated logit
    ``s`` of class 1."""

    num_outputs = 2

    def __init__(
        self,
        *,
        max_iter: int = 200,
        l2: float | str = 1.0,
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ) -> None:
        super().__init__(max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid)

    def _check_width(self, width: int) -> None:
        if width != 2:
            raise two_class_error(type(self).__name__, width)

    def _score(self, logits: torch.Tensor) -> torch.Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def _design(self, logits: torch.Tensor) -> torch.Tensor:  # pragma: no cover - overridden
        """The features (N, m) whose weights are ``weight`` (``s = features @ weight + bias``)."""
        raise NotImplementedError

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        s = self._score(logits)
        return torch.stack([torch.zeros_like(s), s], dim=-1)

    def _fit_by_newton(
        self, logits: torch.Tensor, labels: torch.Tensor, weight: float,
        tolerances: dict[str, float],
    ) -> int:  # fmt: skip
        """The map is a logistic regression on :meth:`_design`'s features: 2-3 parameters
        whose Hessian costs one pass (:func:`~cogcal.calibrators._newton.fit_logistic`;
        5-10 steps where L-BFGS through autograd took 20-40 evaluations)."""
        x = self._design(logits)
        m = x.shape[1]
        like = dict(dtype=x.dtype, device=x.device)
        curvature = torch.full((m + 1,), 2.0 * weight, **like)  # the penalty weight |.|^2
        curvature[m] *= float(self._penalize_bias)
        centre = torch.zeros(m + 1, **like)
        centre[:m] = float(self._weights_toward_identity)
        theta = torch.cat([self.weight.detach().reshape(-1), self.bias.detach().reshape(1)])
        theta, n_iter = fit_logistic(
            x, labels.to(x.dtype), theta.to(**like), curvature, centre, max_iter=self.max_iter,
            **tolerances,
        )  # fmt: skip
        self._set_solution(
            {"weight": theta[:m].reshape(self.weight.shape), "bias": theta[m].reshape(())}
        )
        return n_iter


class Platt(_TwoClass):
    r"""Platt scaling: :math:`P(y = 1) = \sigma(a\,(z_1 - z_0) + b)` (Platt, 1999).

    Logistic regression of the label on the logit difference :math:`d = z_1 - z_0` (the
    log-odds the model gives class 1), two parameters starting at the identity ``a = 1``,
    ``b = 0``. Fitting minimises the mean NLL plus, as for the other parametric calibrators
    (docs/method.md §2), :math:`\tfrac{\lambda}{2n}\big[(a - 1)^2 + b^2\big]`: with the
    default :math:`\lambda = 1` (a unit-variance Gaussian prior around the identity) the
    fit stays finite on separable data and is otherwise maximum likelihood in all but name;
    ``l2=0`` is plain logistic regression. (Platt's original targets
    :math:`(N_+ + 1)/(N_+ + 2)` are not used.)

    Parameters
    ----------
    max_iter : int
        Newton steps.
    l2 : float or "cv"
        Penalty strength :math:`\lambda` (default 1), or ``"cv"``.
    cv, l2_grid
        As for :class:`Calibrator`, used with ``l2="cv"``.

    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import Platt
    >>> rng = np.random.default_rng(0)
    >>> d = rng.normal(size=4000) * 2.0
    >>> y = (rng.random(4000) < 1 / (1 + np.exp(-d))).astype(int)
    >>> z = np.stack([np.zeros(4000), 3.0 * d + 1.0], 1)     # over-confident, shifted
    >>> platt = Platt().fit(z, y)
    >>> round(platt.a, 1), round(platt.b, 1)
    (0.3, -0.3)
    """

    def __init__(
        self,
        *,
        max_iter: int = 200,
        l2: float | str = 1.0,
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ) -> None:
        super().__init__(max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid)
        self.weight = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(()))

    @property
    def a(self) -> float:
        """The slope ``a``."""
        return float(self.weight)

    @property
    def b(self) -> float:
        """The intercept ``b``."""
        return float(self.bias)

    def _deviations(self) -> list[tuple[str, Any, str]]:
        return [("weight", 1.0, "weight"), ("bias", 0.0, "bias")]

    def _design(self, logits: torch.Tensor) -> torch.Tensor:
        return (logits[:, 1] - logits[:, 0])[:, None]

    def _score(self, logits: torch.Tensor) -> torch.Tensor:
        d = logits[..., 1] - logits[..., 0]
        return _cast(self.weight, d.dtype) * d + _cast(self.bias, d.dtype)

    def extra_repr(self) -> str:
        return f"a={self.a:.4g}, b={self.b:.4g}"


class BetaCalibration(_TwoClass):
    r"""Beta calibration (Kull, Silva Filho & Flach, 2017): three parameters on
    :math:`\log p` and :math:`\log(1 - p)`.

    With :math:`p = \mathrm{softmax}(z)_1`, the calibrated probability is

    .. math::

        P(y = 1) = \sigma\big(a \log p - b \log(1 - p) + c\big),

    the family of maps a beta-distributed score per class gives; it contains the identity
    (``a = b = 1``, ``c = 0``, where it starts), Platt scaling of :math:`\log\frac{p}{1-p}`
    (``a = b``) and maps no logistic curve can draw (``a != b``: S-shaped or inverse-S
    around the diagonal). Fitting is logistic regression on the two features, penalised
    toward the identity by :math:`\tfrac{\lambda}{2n}\big[(a - 1)^2 + (b - 1)^2 + c^2\big]`
    (default :math:`\lambda = 1`; ``l2=0`` is maximum likelihood). ``a`` and ``b`` are not
    constrained to be non-negative (Kull et al. refit without a feature whose coefficient
    comes out negative, to keep the map monotone); on calibration data from a reasonable
    model they come out positive.

    Parameters
    ----------
    max_iter : int
        Newton steps.
    l2 : float or "cv"
        Penalty strength :math:`\lambda` (default 1), or ``"cv"``.
    cv, l2_grid
        As for :class:`Calibrator`, used with ``l2="cv"``.

    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import BetaCalibration
    >>> rng = np.random.default_rng(0)
    >>> d = rng.normal(size=4000) * 2.0
    >>> y = (rng.random(4000) < 1 / (1 + np.exp(-d))).astype(int)
    >>> beta = BetaCalibration().fit(np.stack([np.zeros(4000), 3.0 * d], 1), y)
    >>> [round(v, 1) for v in beta.weight.tolist()]       # a = b: a temperature
    [0.3, 0.3]
    """

    def __init__(
        self,
        *,
        max_iter: int = 200,
        l2: float | str = 1.0,
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ) -> None:
        super().__init__(max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid)
        self.weight = nn.Parameter(torch.ones(2))  # (a, b)
        self.bias = nn.Parameter(torch.zeros(()))  # c

    def _deviations(self) -> list[tuple[str, Any, str]]:
        return [("weight", 1.0, "weight"), ("bias", 0.0, "bias")]

    def _design(self, logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, dim=1)
        return torch.stack([logp[:, 1], -logp[:, 0]], 1)

    def _score(self, logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, dim=-1)
        a, b = _cast(self.weight, logp.dtype).unbind()
        return a * logp[..., 1] - b * logp[..., 0] + _cast(self.bias, logp.dtype)

    def extra_repr(self) -> str:
        a, b = self.weight.tolist()
        return f"a={a:.4g}, b={b:.4g}, c={float(self.bias):.4g}"
