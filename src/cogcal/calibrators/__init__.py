r"""Calibrators: ``nn.Module`` maps from logits (or features, for the TST heads) to logits.

Each parametric calibrator serves both ways the paper uses it (docs/method.md §1-§2):

* **post hoc**: ``.fit(val_logits, val_labels)`` fits it on frozen logits of a held-out
  split by full-batch L-BFGS (Newton's method for the maps of few parameters), computed
  in float64, and returns ``self`` with its
  parameters frozen (``requires_grad=False``), so that
  ``Temperature().fit(v, y)(test_logits).numpy()`` works;
* **in one go** (COG): placed after a network by :class:`cogcal.CalibratedModel`, its
  parameters are trained by the network's own optimiser on a slower learning rate.

Multiclass calibrators take ``(N, K)`` logits; the multi-label ones take ``(N, T)`` logits of
``T`` independent binary tasks and keep one temperature (:class:`TaskTemperature`) or one
affine map ``a * z + b`` (Platt form, :class:`TaskAffine`) per task. The parametric
multiclass ones are :class:`Temperature`, :class:`VectorScaling`, :class:`MatrixScaling`
and :class:`Dirichlet` (an affine map of the log-probabilities).

Three non-parametric multiclass calibrators, :class:`Isotonic`, :class:`HistogramBinning`
and :class:`BBQ` (Bayesian binning into quantiles), are post hoc only and fitted
differently: no parameters and no L-BFGS, ``fit`` computes maps of the class
probabilities in closed form (one-vs-rest, and for the binning methods over K > 2 classes
the top label's, which keeps every row's predicted class) and keeps them in buffers; their
output is the log of the clipped, renormalised calibrated probabilities (docs/method.md §2).

:class:`LaplaceTemperature` (temperature scaling mixed with the uniform distribution) and
the structured maps :class:`StructuredVectorScaling` and :class:`StructuredMatrixScaling`
(SVS, SMS: vector or matrix scaling of its log-probabilities, penalised toward the
identity) follow Berta et al. (2026). :class:`Platt` and :class:`BetaCalibration` take two
classes only.

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

The package holds one concept per module: :mod:`~cogcal.calibrators._base` (the base class
:class:`Calibrator`, its penalised L-BFGS fit and cross-validation of ``l2``),
:mod:`~cogcal.calibrators.temperature`, :mod:`~cogcal.calibrators.affine` (vector and matrix
scaling, per-task affine maps), :mod:`~cogcal.calibrators.dirichlet`,
:mod:`~cogcal.calibrators.nonparametric` (isotonic regression, histogram binning),
:mod:`~cogcal.calibrators.bbq`, :mod:`~cogcal.calibrators.structured` (Laplace-smoothed
temperature scaling, SVS, SMS), :mod:`~cogcal.calibrators.binary` (Platt, Beta),
:mod:`~cogcal.calibrators.heads` (the TST heads) and the registry of kinds behind
:func:`make_calibrator` (:data:`KINDS`, :func:`auto_candidates`).
"""

from __future__ import annotations

from cogcal._checks import ProbabilitiesAsLogitsWarning
from cogcal.calibrators._base import (
    DEFAULT_L2_GRID,
    DEFAULT_TEMPERATURE_L2,
    Calibrator,
    L2GridEdgeWarning,
    SeparableDataWarning,
)
from cogcal.calibrators._factory import KINDS as KINDS
from cogcal.calibrators._factory import auto_candidates, make_calibrator
from cogcal.calibrators._folds import CV_SEED
from cogcal.calibrators.affine import MatrixScaling, TaskAffine, VectorScaling
from cogcal.calibrators.bbq import BBQ
from cogcal.calibrators.binary import BetaCalibration, Platt
from cogcal.calibrators.dirichlet import Dirichlet
from cogcal.calibrators.heads import TSTHead, VTSTHead, default_latent_dim
from cogcal.calibrators.nonparametric import HistogramBinning, Isotonic
from cogcal.calibrators.structured import (
    LaplaceTemperature,
    StructuredMatrixScaling,
    StructuredVectorScaling,
)
from cogcal.calibrators.temperature import (
    TaskTemperature,
    Temperature,
    separable_temperature_floor,
)

__all__ = [
    "Calibrator",
    "Temperature",
    "VectorScaling",
    "MatrixScaling",
    "Dirichlet",
    "Isotonic",
    "HistogramBinning",
    "LaplaceTemperature",
    "StructuredVectorScaling",
    "StructuredMatrixScaling",
    "BBQ",
    "Platt",
    "BetaCalibration",
    "TaskTemperature",
    "TaskAffine",
    "TSTHead",
    "VTSTHead",
    "default_latent_dim",
    "make_calibrator",
    "auto_candidates",
    "separable_temperature_floor",
    "DEFAULT_L2_GRID",
    "CV_SEED",
    "DEFAULT_TEMPERATURE_L2",
    "SeparableDataWarning",
    "L2GridEdgeWarning",
    "ProbabilitiesAsLogitsWarning",
]
