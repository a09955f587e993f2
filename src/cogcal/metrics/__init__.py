r"""Evaluation metrics: accuracy, NLL, Brier, calibration errors, AURC, OOD detection.

The definitions follow docs/method.md §3 and are part of the API:

* ``acc`` -- fraction of samples whose arg-max class equals the label;
* ``nll`` -- mean of ``-log p_y``, computed in float64 from ``log_softmax`` of the logits;
* ``brier`` -- mean over samples of ``sum_k (p_k - 1[y = k])**2`` (a *sum* over classes,
  not divided by ``K``); for a binary task ``(p - y)**2`` with ``p = sigmoid(z)``;
* ``ece_B``, ``rmsce_B``, ``mce_B`` -- calibration errors of the top-label confidence
  ``c = max_k p_k`` on ``B`` equal-width bins ``[b/B, (b+1)/B)``, the last bin closed
  so that ``c = 1.0`` lands in bin ``B - 1``;
* ``ece_positive_B``, ``rmsce_positive_B``, ``mce_positive_B`` -- for two classes (binary
  tasks and two-class multiclass input), the same errors of ``P(y = 1)`` against the
  fraction of positives (scikit-learn's ``calibration_curve`` convention);
* ``cwece_15`` (classwise ECE), ``adaece_15`` (equal-mass ECE), ``smece`` (smooth ECE,
  as ``relplot.smECE``) and ``aurc`` (area under the risk-coverage curve); with
  ``intervals=True``, ``ece_15_low`` / ``ece_15_high`` (a seeded bootstrap interval, also
  :func:`ece_interval`).

Every public function validates its input and raises ``ValueError`` naming what was wrong
(one template for every dtype / shape problem: :func:`cogcal._checks.input_error`).
Probabilities, confidences, NLL and Brier are computed in float64 whatever the input
dtype (float16 / bfloat16 / float32 input is upcast chunk by chunk, so memory stays
bounded) and accumulated in float64.

The one-shot :func:`evaluate`, the streaming :class:`StreamingMetrics` and the
torchmetrics adapter :func:`as_torchmetric` share the same private stages: argument
checks, tensor checks, ``_update`` (sufficient statistics per bin, O(bins x classes x
tasks) memory, independent of the number of samples) and ``_compute`` (metrics from
those statistics).

The package holds one concept per module: ``_inputs`` (argument and tensor checks),
``_chunks`` (per-sample float64 statistics), ``binning`` (the binned ECE family and its
sufficient statistics), ``sample`` (metrics that need every sample), ``oneshot``
(:func:`evaluate`, :func:`ece_interval`, :func:`reliability_bins`), ``streaming``
(:class:`StreamingMetrics`), ``temperature`` (the NLL after the best temperature,
:func:`temperature_scaled_nll`), ``adapters`` (torchmetrics) and ``ood_detection``.

Definitions
-----------
Inputs: logits, probabilities and labels may be tensors (of any floating dtype for
scores), numpy arrays, lists, or anything ``numpy.asarray`` accepts (e.g. a pandas
DataFrame or Series); integral float and boolean labels are accepted. Logits that look
like probabilities (all in [0, 1], multiclass rows summing to 1) are used unchanged, with
a warning naming ``probs=``. Multiclass ``probs=`` rows must sum to 1 within
``max(1e-4, 4 eps(dtype))``. With ``eps=None`` (no clipping) a true class of
probability 0 gives ``nll = inf``; scikit-learn's ``log_loss`` clips at the machine
epsilon of the dtype (``eps=numpy.finfo(numpy.float64).eps``). For multilabel, the plain
keys hold the unweighted mean over tasks (the plain interval keys are the interval of the
mean over tasks) and every metric is also given per task under
``"{metric}/{task_name}"``.

With :math:`p = \mathrm{softmax}(z)`, top-label confidence :math:`c_i = \max_k p_{ik}`
and prediction :math:`\hat y_i = \arg\max_k p_{ik}` (first index on ties):

.. math::

    \mathrm{acc} = \frac1N \sum_i 1[\hat y_i = y_i], \quad
    \mathrm{nll} = -\frac1N \sum_i \log p_{i y_i}, \quad
    \mathrm{brier} = \frac1N \sum_i \Big(\sum_{k \ne y_i} p_{ik}^2
        + (1 - p_{i y_i})^2\Big) .

Everything is computed in float64 whatever the input dtype: :math:`\log p` by
``log_softmax`` of the upcast logits, and :math:`1 - p_y = -\mathrm{expm1}(\log p_y)`,
so Brier keeps its relative precision for confident predictions (logits ``[9, 0]``,
label 0: ``2 (1 - \sigma(9))^2 = 3.05e-8``).

Equal-width bin :math:`b \in \{0..B-1\}` holds :math:`b/B \le c < (b+1)/B`, the last bin
closed (``c = 1.0`` is in bin ``B - 1``); the index is ``floor(c B)`` in float64. With
:math:`n_b` samples, mean accuracy :math:`a_b` and mean confidence :math:`\bar c_b` in
bin ``b``:

.. math::

    \mathrm{ECE} = \sum_b \frac{n_b}{N} |a_b - \bar c_b|, \quad
    \mathrm{RMSCE} = \sqrt{\sum_b \frac{n_b}{N} (a_b - \bar c_b)^2}, \quad
    \mathrm{MCE} = \max_{b:\, n_b > 0} |a_b - \bar c_b| .

Empty bins contribute nothing (MCE skips them). Equal-mass bins sort the confidences
and start bin ``b`` at the ``floor(b N / B)``-th smallest value; a sample equal to an
edge goes to the upper bin, so tied confidences always share a bin (some bins may be
empty when there are ties or fewer than ``B`` samples). Classwise ECE is the mean
over the K classes (absent classes included) of the ECE of :math:`p_{\cdot k}` against
:math:`1[y = k]`, each on its own bins; ``cwece_15`` (always reported) is this
with 15 equal-width bins.

``adaece_15``, ``smece`` and ``aurc`` need every sample at once (so
:class:`StreamingMetrics` does not report them). ``adaece_15`` is the ECE on 15
equal-mass bins of the sorted confidences, cut with the group sizes of
``numpy.array_split`` (the first :math:`N \bmod 15` groups hold
:math:`\lceil N/15 \rceil` samples, the others :math:`\lfloor N/15 \rfloor`); when a
cut falls inside a run of tied confidences, each side gets its share of the run's
correct predictions, so the value does not depend on the order of tied samples
(unlike ``ece_mass_15``, whose ties share one bin). ``smece`` is the smooth ECE of
Błasiok & Nakkiran (2023) computed exactly as ``relplot.smECE(c, correct)``: the
residuals :math:`c_i - 1[\hat y_i = y_i]` and the sample mass are spread linearly
onto a grid of at least 1001 points, smoothed with a Gaussian kernel of width
:math:`\sigma` reflected at 0 and 1, and

.. math::

    \mathrm{smECE}_\sigma = \frac{\sum_t |\hat r_\sigma(t)|\, \hat\delta_\sigma(t)}
        {\sum_t \hat\delta_\sigma(t)}

over at least 200 evaluation points (:math:`\hat r = ` smoothed residual / smoothed
density, :math:`\hat\delta` = smoothed density + 1e-4); :math:`\sigma^*` is the
fixed point :math:`\mathrm{smECE}_\sigma = \sigma`, found by 10 bisection steps on
``[0, 1]`` (the smallest tried :math:`\sigma \ge \mathrm{smECE}_\sigma`), and
``smece`` :math:`= \mathrm{smECE}_{\sigma^*}`. ``aurc``: with the samples sorted by
decreasing confidence, the risk at coverage :math:`i/N` is the error rate of the
:math:`i` most confident ones, and

.. math::

    \mathrm{AURC} = \frac1N \sum_{i=1}^N \frac1i \sum_{j \le i} 1[\hat y_{(j)}
        \ne y_{(j)}] ,

with ties broken in expectation (the mean over every order of the tied samples: a run
of tied confidences contributes its mean error rate at each position).

Binary tasks use :math:`p = \sigma(z)`, top-label confidence :math:`\max(p, 1 - p)`,
prediction ``z > 0`` (``p > 0.5`` for ``probs=``; a tie predicts 0), and with the
margin against the truth :math:`s = (1 - 2y) z`: NLL :math:`\log(1 + e^{s})` and Brier
:math:`(p - y)^2 = \sigma(s)^2`; classwise ECE uses the two classes ``1 - p`` and ``p``;
``adaece_15``, ``smece`` and ``aurc`` use the top-label confidence and correctness.
The positive-class errors bin :math:`p = P(y = 1)` (column 1 of two-class
multiclass input) and compare each bin's mean :math:`p` with its fraction of
positives :math:`\frac{1}{n_b}\sum_{i \in b} y_i`. Top-label and positive-class
errors differ in general: with ``P(y = 1) = 0.3`` for ten samples (one positive) and
``0.7`` for ten (five positive), every top-label confidence is 0.7 and 14 of 20
predictions are right, so ``ece_10 = 0``, while ``ece_positive_10 = 0.2``.

With ``probs=``: :math:`\mathrm{nll} = -\frac1N\sum_i \log \max(p_{i y_i}, \epsilon)`
(no clipping when ``eps`` is None) and Brier as above from the given values.

>>> from cogcal.metrics import evaluate
>>> p1 = [0.3] * 10 + [0.7] * 10
>>> y = [1] + [0] * 9 + [1] * 5 + [0] * 5
>>> m = evaluate(labels=y, probs=p1, task="binary", n_bins=10)
>>> round(m["ece_10"], 4), round(m["ece_positive_10"], 4)
(0.0, 0.2)
"""

from __future__ import annotations

from typing import Any

from cogcal._checks import ProbabilitiesAsLogitsWarning
from cogcal.metrics._inputs import DEFAULT_N_BINS
from cogcal.metrics.adapters import as_torchmetric, torchmetric_class
from cogcal.metrics.oneshot import ece_interval, evaluate, reliability_bins
from cogcal.metrics.ood_detection import ood, ood_scores
from cogcal.metrics.streaming import StreamingMetrics
from cogcal.metrics.temperature import TemperatureScaledNLL, temperature_scaled_nll

__all__ = [
    "DEFAULT_N_BINS",
    "ProbabilitiesAsLogitsWarning",
    "StreamingMetrics",
    "TemperatureScaledNLL",
    "as_torchmetric",
    "ece_interval",
    "evaluate",
    "ood",
    "ood_scores",
    "reliability_bins",
    "temperature_scaled_nll",
]


def __getattr__(name: str) -> Any:
    if name == "CalibrationMetric":  # built, and torchmetrics imported, on first access
        return torchmetric_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
