"""The one-shot metrics of a whole set of predictions: :func:`evaluate`,
:func:`ece_interval` and :func:`reliability_bins`."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from cogcal._checks import (
    check_eps,
    check_task,
)
from cogcal._constraints import COUNT, check
from cogcal.metrics._inputs import (
    _EPS_MESSAGE,
    DEFAULT_N_BINS,
    _check_binning,
    _check_bootstrap,
    _check_n_bins,
    _check_positive_class,
    _check_task_names,
    _check_tensors,
)
from cogcal.metrics.binning import _compute, _compute_mass, _State, _update
from cogcal.metrics.sample import _FIXED_BINS, _ece_bootstrap, _interval_keys, _sample_metrics


def evaluate(
    logits: Any = None,
    labels: Any = None,
    *,
    task: str = "multiclass",
    n_bins: int | Sequence[int] = DEFAULT_N_BINS,
    binning: str = "width",
    classwise: bool = False,
    probs: Any = None,
    task_names: Sequence[str] | None = None,
    positive_class: bool | None = None,
    eps: float | None = None,
    intervals: bool = False,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    r"""Accuracy, NLL, Brier score, calibration errors and AURC of a classifier.

    Call it as ``evaluate(logits, labels)``, ``evaluate(labels=y, logits=z)`` or
    ``evaluate(labels=y, probs=p)``: exactly one of ``logits`` and ``probs``. The
    definitions (float64 throughout, bins, ties, the classwise, equal-mass and smooth ECE,
    AURC, binary tasks, ``probs=``) and the inputs accepted are those of the module
    :mod:`cogcal.metrics`, section "Definitions".

    Parameters
    ----------
    logits : array-like, shape (N, K), (N,) / (N, 1) or (N, T)
        Unnormalised scores: (N, K) for ``task="multiclass"``, (N,) or (N, 1) for
        ``"binary"`` (``p = sigmoid(z)``), (N, T) for ``"multilabel"`` (T binary tasks).
    labels : array-like
        Class indices of shape (N,) (multiclass), 0/1 of shape (N,) (binary) or (N, T)
        (multilabel).
    task : {"multiclass", "binary", "multilabel"}
        Kind of problem.
    n_bins : int or sequence of int
        Bin counts ``B`` of the calibration errors; default ``(5, 10, 15, 20, 50, 100)``.
    binning : {"width", "mass"}
        Equal-width bins (keys ``ece_B``...) or equal-mass bins (keys ``ece_mass_B``...).
    classwise : bool
        Also report the classwise ECE under ``cwece_B`` (``cwece_mass_B``).
    probs : array-like, optional
        Probabilities instead of logits ((N, K) rows summing to 1; ``P(y = 1)`` for
        binary / multilabel), never inferred from the values of ``logits``.
    task_names : sequence of str, optional
        Names of the T multilabel tasks for the per-task keys; default ``t0 ... t{T-1}``.
    positive_class : bool, optional
        Also report ``ece_positive_B``, ``rmsce_positive_B``, ``mce_positive_B``. Default
        (None): for binary and two-class multiclass input; True gives them per task for
        multilabel (and raises for K > 2).
    eps : float in (0, 1), optional
        For ``probs=`` only: the NLL uses ``max(p_true, eps)``. Default None: no
        clipping (a true class of probability 0 gives ``nll = inf``, with a warning).
    intervals : bool
        Also report ``ece_15_low`` and ``ece_15_high``, a 95% percentile bootstrap
        interval of ``ece_15`` (see :func:`ece_interval`).
    n_boot, seed : int
        Resamples (default 1000) and seed (default 0) of the bootstrap interval.

    Returns
    -------
    dict of str to float
        ``acc``, ``nll``, ``brier`` and, for each ``B``, ``ece_B``, ``rmsce_B``, ``mce_B``,
        then ``ece_positive_B``, ``rmsce_positive_B``, ``mce_positive_B`` for two classes
        (``*_mass_B`` with equal-mass bins), ``cwece_B`` for each ``B`` when
        ``classwise``, then always ``cwece_15``, ``adaece_15``, ``smece``, ``aurc``, then
        ``ece_15_low``, ``ece_15_high`` when ``intervals``. For multilabel, the mean over
        tasks, and each task's value under ``"{metric}/{task_name}"``.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    >>> labels = torch.tensor([0, 2, 2])
    >>> m = evaluate(logits, labels, n_bins=(10,))
    >>> list(m)
    ['acc', 'nll', 'brier', 'ece_10', 'rmsce_10', 'mce_10', 'cwece_15', 'adaece_15', 'smece', 'aurc']
    >>> round(m["acc"], 4), round(m["nll"], 4), round(m["brier"], 4)
    (0.6667, 0.6286, 0.3594)
    >>> round(m["ece_10"], 4), round(m["mce_10"], 4)
    (0.2932, 0.5761)
    """
    task = check_task(task)
    bins, mass = _check_n_bins(n_bins), _check_binning(binning) == "mass"
    positive_class = _check_positive_class(positive_class, task)
    eps = check_eps(eps, message=_EPS_MESSAGE)
    level, n_boot, seed = _check_bootstrap(0.95, n_boot, seed)
    scores, y, is_prob = _check_tensors(logits, labels, probs, task, eps)
    names = _check_task_names(task_names, scores.shape[1]) if task == "multilabel" else None
    state = _evaluation_state(task, bins, mass, bool(classwise), positive_class)
    samples = _update(state, scores, y, is_prob=is_prob, eps=eps, return_samples=True,
                      return_probs=mass and classwise)  # fmt: skip
    out = _compute(state, names)
    if mass:
        out.update(_compute_mass(samples, state, bins, names))
    out.update(_sample_metrics(samples, task, names))
    if intervals:
        out.update(_interval_keys(samples, task, names, level=level, n_boot=n_boot, seed=seed))
    if task == "multilabel":  # keep the plain keys before the per-task keys
        out = {k: out[k] for k in sorted(out, key=lambda k: "/" in k)}
    return out


def _evaluation_state(
    task: str, bins: tuple[int, ...], mass: bool, classwise: bool, positive: bool | None
) -> _State:
    """The empty statistics :func:`evaluate` fills: width bins unless ``mass`` (those are
    computed from the samples), and the classwise bins, 15 always among them."""
    cw_bins = bins if classwise and not mass else ()
    if _FIXED_BINS not in cw_bins:
        cw_bins += (_FIXED_BINS,)  # cwece_15 is always reported
    return _State(
        task=task, n_bins=() if mass else bins, classwise=classwise, num_classes=None,
        num_tasks=None, positive=positive, cw_bins=cw_bins,
    )  # fmt: skip


def ece_interval(
    logits: Any = None,
    labels: Any = None,
    *,
    probs: Any = None,
    task: str = "multiclass",
    n_bins: int = 15,
    level: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    r"""Percentile bootstrap interval of the equal-width top-label ECE.

    Parameters
    ----------
    logits, labels, probs, task
        As in :func:`evaluate` (exactly one of ``logits`` and ``probs``).
    n_bins : int
        Number of equal-width bins ``B`` of the ECE (as ``ece_B`` of :func:`evaluate`).
    level : float in (0, 1)
        Coverage of the interval; default 0.95.
    n_boot : int
        Number of bootstrap resamples; default 1000.
    seed : int
        Seed of ``numpy.random.default_rng``: the same data, ``n_boot`` and ``seed`` give
        the same interval.

    Returns
    -------
    tuple of float
        ``(low, high)``, the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles
        (``numpy.quantile``, linear interpolation) of the ECE of the resamples; for
        multilabel, of the mean ECE over tasks.

    Notes
    -----
    Each resample draws :math:`N` samples with replacement (whole rows: the same samples
    for every task). The bins stay those of the full data (fixed edges), so a resample's
    ECE is :math:`rac1N \sum_b ig|\sum_i w_i\, 1[i \in b]\, (1[\hat y_i = y_i] -
    c_i)ig|` with :math:`w_i` the number of times sample :math:`i` is drawn. The
    interval describes the sampling variability of the ECE of this model on data like
    the test set; ECE is biased upwards on finite samples, so the point value may lie
    near or below ``low`` for a well-calibrated model. :func:`evaluate` with
    ``intervals=True`` reports the same interval for ``B = 15`` as ``ece_15_low`` and
    ``ece_15_high``.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> logits = torch.randn(2000, 10, generator=g) * 3
    >>> labels = torch.randint(0, 10, (2000,), generator=g)
    >>> low, high = ece_interval(logits, labels, n_boot=200)
    >>> low < evaluate(logits, labels, n_bins=15)["ece_15"] < high
    True
    >>> (low, high) == ece_interval(logits, labels, n_boot=200)  # seeded
    True
    """
    task = check_task(task)
    check(n_bins, COUNT, "n_bins")
    level, n_boot, seed = _check_bootstrap(level, n_boot, seed)
    scores, y, is_prob = _check_tensors(logits, labels, probs, task)
    state = _State(task=task, n_bins=(), classwise=False, num_classes=None, num_tasks=None)
    with warnings.catch_warnings():  # a zero true-class probability only matters to the NLL
        warnings.filterwarnings("ignore", message=r".*true class probability 0")
        samples = _update(state, scores, y, is_prob=is_prob, return_samples=True)
    boot = _ece_bootstrap(samples["conf"], samples["correct"], int(n_bins), n_boot, seed)
    low, high = np.quantile(boot.mean(1), [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def reliability_bins(
    logits: Any = None,
    labels: Any = None,
    *,
    n_bins: int = 15,
    task: str = "multiclass",
    probs: Any = None,
) -> dict[str, np.ndarray]:
    """Per-bin counts, mean confidence and accuracy of equal-width bins (reliability diagram).

    Parameters
    ----------
    logits, labels, task, probs
        As in :func:`evaluate` (exactly one of ``logits`` and ``probs``).
    n_bins : int
        Number of equal-width bins ``B`` (last bin closed, as in :func:`evaluate`).

    Returns
    -------
    dict of str to ndarray
        ``count`` (samples per bin), ``confidence`` (mean top-label confidence, NaN where
        empty), ``accuracy`` (fraction correct, NaN where empty), each of shape (B,) --
        (T, B) for multilabel -- and ``edges`` of shape (B + 1,).
        Then ``ece = nansum(count * |accuracy - confidence|) / count.sum()``.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[3.0, 0.0], [0.0, 0.1]])  # confidences 0.95 and 0.52
    >>> b = reliability_bins(logits, torch.tensor([0, 0]), n_bins=4)
    >>> b["count"].tolist(), b["accuracy"].tolist()
    ([0.0, 0.0, 1.0, 1.0], [nan, nan, 0.0, 1.0])
    >>> b["edges"].tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    task = check_task(task)
    b = check(n_bins, COUNT, "n_bins")
    scores, y, is_prob = _check_tensors(logits, labels, probs, task)
    state = _State(task=task, n_bins=(b,), classwise=False, num_classes=None, num_tasks=None)
    with warnings.catch_warnings():  # a zero true-class probability only matters to the NLL
        warnings.filterwarnings("ignore", message=r".*true class probability 0")
        _update(state, scores, y, is_prob=is_prob)
    s = {k: v.cpu().numpy() for k, v in state.tensors.items()}
    count = s[f"count_{b}"]
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.where(count > 0, s[f"conf_{b}"] / count, np.nan)
        acc = np.where(count > 0, s[f"acc_{b}"] / count, np.nan)
    out = {"count": count, "confidence": conf, "accuracy": acc}
    if task != "multilabel":
        out = {k: v[0] for k, v in out.items()}
    out["edges"] = np.arange(b + 1, dtype=np.float64) / b
    return out
