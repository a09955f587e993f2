r"""Post-hoc calibration of a model trained elsewhere: :func:`calibrate` (docs/method.md §2).

A model's held-out (validation) logits and labels go in; a fitted calibrator comes out,
wrapped in a :class:`Calibration` that says which calibrator it is and how it was chosen.
``method="auto"`` chooses among :data:`POSTHOC_METHODS` by **cross-validated NLL on the data
given** (``cv`` stratified folds, fixed seed): each candidate is fitted on the other folds
and scored on the held-out fold, the pooled mean NLL over all samples is compared, and the
winner is refitted on all of it. The candidates that choose their penalty by the same
cross-validation (vector and matrix scaling, Dirichlet: ``l2="cv"``) are not cross-validated
twice: each is fitted once on all the data, and its score is the pooled held-out NLL of the
strength it chose (so ``auto`` costs about the sum of the candidates' own fits; that score
is the minimum over the penalty grid, a little optimistic next to a nested estimate). The
test split is never an input.

>>> import torch, cogcal
>>> g = torch.Generator().manual_seed(0)
>>> y = torch.randint(0, 3, (600,), generator=g)
>>> z = 3.0 * (2.0 * torch.nn.functional.one_hot(y, 3) + torch.randn(600, 3, generator=g))
>>> cal = cogcal.calibrate(z, y, method="ts")   # over-confident logits: T > 1
>>> cal.method, round(cal.calibrator.temperature, 1) > 1
('ts', True)
>>> cal.predict_proba(z[:2].numpy()).sum(1).round(6).tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cogcal._checks import check_classes_present, check_multiclass, warn_if_probabilities
from cogcal._constraints import CV_FOLDS, check
from cogcal.calibrators import KINDS, auto_candidates, make_calibrator
from cogcal.calibrators._folds import _stratified_folds
from cogcal.conformal import DEFAULT_METHOD, ConformalSets

__all__ = [
    "AUTO",
    "POSTHOC_METHODS",
    "Calibration",
    "calibrate",
    "conformal_split",
    "cross_validated_nll",
    "held_out_nlls",
]

#: A function told, as each step of a fit starts, what it is (``"ms, fold 3/5"``).
Progress = Callable[[str], None]
#: The seed of the stratified split of ``calibrate(conformal=...)``: calibrator / threshold.
CONFORMAL_SPLIT_SEED = 0

#: The post-hoc calibrators :func:`calibrate` fits, simplest first (the order breaks ties):
#: temperature, vector and matrix scaling, Dirichlet calibration, isotonic regression and
#: histogram binning (docs/method.md §2): every kind of the calibrators' registry
#: (:data:`cogcal.calibrators.KINDS`), in its order.
POSTHOC_METHODS: tuple[str, ...] = tuple(KINDS.names())
#: The ``method`` that chooses among :data:`POSTHOC_METHODS` by cross-validated NLL.
AUTO = "auto"
#: Samples per fold that ``method="auto"`` needs at the least.
_MIN_PER_FOLD = 10


@dataclass
class Calibration:
    """A post-hoc calibrator fitted by :func:`calibrate` (or read back by
    :func:`cogcal.load_calibrator`), and how it was chosen.

    Attributes
    ----------
    method : str
        The calibrator fitted, one of :data:`POSTHOC_METHODS`.
    calibrator : nn.Module
        The fitted calibrator (:mod:`cogcal.calibrators`), fitted on all the data given:
        logits in, calibrated logits out.
    num_classes : int
        K, the width of the logits it takes.
    cv_nll : dict of str to float
        With ``method="auto"``: the pooled held-out NLL of each candidate (``inf`` for
        one that failed to fit on a fold; for ``l2="cv"`` candidates, that of the penalty
        strength their own cross-validation chose); empty when ``method`` was given.
    folds : int or None
        The number of cross-validation folds of ``method="auto"`` (``None`` otherwise).
    nll_before, nll_after : float
        Mean NLL on the fitting data of the logits as given and after calibration (the
        latter is in-sample: ``cv_nll`` is the honest estimate).
    conformal : ConformalSets or None
        With ``calibrate(conformal=alpha)`` (``cogcal calibrate --conformal ALPHA``): the
        split conformal sets whose threshold was fitted on the calibrated probabilities of
        validation rows the calibrator did not see (:meth:`predict_sets`); else ``None``.
    held_out_nll : Tensor or None
        With ``method="auto"``: each fitting sample's NLL under ``method`` fitted on the
        folds that did not hold it out (float64, CPU), whose mean is ``cv_nll[method]``
        (the default path pairs it with COG-FC's NLL on the same samples); ``None``
        otherwise, and when read back from disk.
    """

    method: str
    calibrator: nn.Module
    num_classes: int
    cv_nll: dict[str, float] = field(default_factory=dict)
    folds: int | None = None
    nll_before: float = math.nan
    nll_after: float = math.nan
    conformal: ConformalSets | None = None
    held_out_nll: torch.Tensor | None = field(default=None, repr=False)

    def __call__(self, logits: Any) -> Any:
        """Calibrated logits: a tensor gives a tensor, a numpy array a numpy array."""
        return self.calibrator(logits)

    def predict_proba(self, logits: Any) -> Any:
        """Calibrated probabilities (softmax of the calibrated logits), without gradients."""
        return self.calibrator.predict_proba(logits)

    def predict_sets(self, logits: Any) -> Any:
        """The conformal prediction set of each row (a boolean ``(N, K)`` mask) from the
        calibrated probabilities of ``logits``: :attr:`conformal`'s
        :meth:`~cogcal.conformal.ConformalSets.predict`."""
        if self.conformal is None:
            raise RuntimeError(
                "this calibration has no conformal sets: fit it with "
                "cogcal.calibrate(..., conformal=alpha) or `cogcal calibrate --conformal ALPHA`."
            )
        return self.conformal.predict(probs=self.predict_proba(logits))


def _mean_nll(cal: nn.Module, z: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        out = cal(z)
    nll = float(F.cross_entropy(out.double(), y))
    return nll if math.isfinite(nll) else math.inf


def fold_calibrator(method: str, shared: dict[str, Any] | None = None) -> nn.Module:
    """A fresh calibrator of ``method`` for one fold of a cross-validation, whose only use
    is its held-out NLL (:func:`held_out_nlls`, :func:`cross_validated_nll`):
    fitted to the tolerance of the folds of ``l2="cv"`` (a gradient of 1e-4, not 1e-8),
    and accepting a class missing from the fold's training part (a class with one sample:
    that fit is scored honestly on its held-out fold; ``calibrate`` refuses classes absent
    from all the data). ``shared``: what the folds share (:func:`fold_share`)."""
    cal = make_calibrator(method)
    cal._require_every_class = False
    cal._scoring_only = True
    for name, value in (shared or {}).items():
        setattr(cal, name, value)
    return cal


def fold_share(method: str, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """What the :func:`fold_calibrator` s of a cross-validation of ``method`` over these
    logits share, computed once on all of them (structured matrix scaling: its
    preconditioner; the other methods: nothing)."""
    return fold_calibrator(method)._fold_share(logits, labels)


def cross_validated_nll(
    logits: torch.Tensor,
    labels: torch.Tensor,
    method: str,
    *,
    cv: int = 5,
    seed: int = 0,
    progress: Progress | None = None,
) -> float:
    r"""Pooled held-out NLL of post-hoc ``method`` by ``cv``-fold cross-validation.

    The folds are stratified by class with the fixed ``seed``; for each fold :math:`f` a
    fresh calibrator is fitted on the other folds and scored on :math:`f`:

    .. math::

        \mathrm{CV}(\text{method}) = \frac{1}{N}\sum_{f=1}^{k}\sum_{i\in f}
            -\log \hat p^{(-f)}_{y_i}(z_i),

    where :math:`\hat p^{(-f)}` is the calibrator fitted without fold :math:`f` (a
    :func:`fold_calibrator`: to the tolerance of the folds of ``l2="cv"``). A fit
    that fails (non-finite parameters) scores ``inf``. Warnings of the fold fits (a
    penalty at the edge of its grid, separable data) are not shown: only the final fit's.
    ``progress`` is called with ``"METHOD, fold F/CV"`` as each fold's fit starts.

    >>> import torch
    >>> y = torch.arange(100) % 2
    >>> z = torch.nn.functional.one_hot(y, 2).double() * 3 + torch.randn(100, 2) * 0.5
    >>> cross_validated_nll(z, y, "ts") < cross_validated_nll(z * 0, y, "ts")
    True
    """
    return _pooled(held_out_nlls(logits, labels, method, cv=cv, seed=seed, progress=progress))


def _pooled(terms: torch.Tensor) -> float:
    """The mean of held-out NLLs (:func:`held_out_nlls`), ``inf`` unless finite."""
    nll = float(terms.mean())
    return nll if math.isfinite(nll) else math.inf


def held_out_nlls(
    logits: torch.Tensor,
    labels: torch.Tensor,
    method: str,
    *,
    cv: int = 5,
    seed: int = 0,
    progress: Progress | None = None,
) -> torch.Tensor:
    """Each sample's NLL under ``method`` fitted on the other folds, the terms of
    :func:`cross_validated_nll` (float64, on the CPU; ``inf`` throughout when a fold's fit
    diverged, since the candidate cannot then be trusted)."""
    folds = _stratified_folds(labels, cv, seed).to(labels.device)
    shared = fold_share(method, logits, labels)
    out = torch.full((labels.shape[0],), math.inf, dtype=torch.float64)
    for f in range(cv):
        held = folds == f
        if progress is not None:
            progress(f"{method}, fold {f + 1}/{cv}")
        cal = fold_calibrator(method, shared)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cal.fit(logits[~held], labels[~held])
        except RuntimeError:  # diverged on this fold
            return out.fill_(math.inf)
        with torch.no_grad():
            terms = F.cross_entropy(cal(logits[held]).double(), labels[held], reduction="none")
        out[held.cpu()] = terms.cpu()
    return out.nan_to_num_(nan=math.inf)


def _score_candidates(
    z: torch.Tensor,
    y: torch.Tensor,
    candidates: Sequence[str],
    cv: int,
    progress: Progress | None = None,
) -> tuple[dict[str, float], dict[str, tuple[nn.Module, list]], dict[str, torch.Tensor]]:
    """The cross-validated NLL of each candidate, those fitted on all the data, and each
    candidate's held-out NLL per sample (:func:`held_out_nlls`).

    A calibrator that chooses its penalty by cross-validation (``l2="cv"``) on the same
    ``cv`` stratified folds (seed 0) already computes, while fitting on all the data, the
    pooled held-out NLL of each strength: its score is that of the strength it chose (and
    its terms, ``cv_sample_nll_``), and the fit is kept (with its warnings) for the case it
    wins. The others are scored by :func:`held_out_nlls`.
    """
    scores: dict[str, float] = {}
    fitted: dict[str, tuple[nn.Module, list]] = {}
    terms: dict[str, torch.Tensor] = {}
    for name in dict.fromkeys(candidates):
        cal = make_calibrator(name)
        if getattr(cal, "l2", None) != "cv":
            terms[name] = held_out_nlls(z, y, name, cv=cv, progress=progress)
            scores[name] = _pooled(terms[name])
            continue
        if progress is not None:  # its folds run inside its own fit
            progress(f"{name}, penalty by {cv}-fold cross-validation (folds 1-{cv}/{cv})")
        cal.cv = cv
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cal.fit(z, y)
        except RuntimeError:  # diverged: the candidate cannot be trusted
            scores[name] = math.inf
            continue
        chosen = cal.cv_scores_[list(cal.l2_grid_).index(cal.l2_)]
        scores[name] = float(chosen) if math.isfinite(chosen) else math.inf
        fitted[name] = (cal, list(caught))
        terms[name] = torch.from_numpy(cal.cv_sample_nll_)
    return scores, fitted, terms


def _checked_method(method: Any, candidates: Sequence[str], cv: Any) -> str:
    """``method`` normalised, after checking it, ``candidates`` and ``cv``."""
    names = (AUTO, *POSTHOC_METHODS)
    if not isinstance(method, str) or method.strip().lower() not in names:
        raise ValueError(f"`method` must be one of {', '.join(names)}; got {method!r}.")
    unknown = [c for c in candidates if c not in POSTHOC_METHODS]
    if isinstance(candidates, str) or not candidates or unknown:
        raise ValueError(
            f"`candidates` must be a non-empty sequence of {', '.join(POSTHOC_METHODS)}; "
            f"got {candidates!r}."
        )
    check(cv, CV_FOLDS, "cv")
    return method.strip().lower()


def _choose(
    z: torch.Tensor, y: torch.Tensor, candidates: Sequence[str], cv: int,
    progress: Progress | None,
) -> tuple[str, dict[str, float], dict[str, tuple[nn.Module, list]], torch.Tensor]:  # fmt: skip
    """``method="auto"``: the candidate of least cross-validated NLL, every score, the
    candidates already fitted on all the data, and the chosen one's held-out NLL per
    sample (:func:`_score_candidates`)."""
    n = int(y.shape[0])
    if n < _MIN_PER_FOLD * cv:
        raise ValueError(
            f"`method='auto'` with cv={cv} folds needs at least {_MIN_PER_FOLD * cv} "
            f"samples ({_MIN_PER_FOLD} per fold), got {n}: pass a smaller `cv` or a "
            "method (e.g. method='ts')."
        )
    scores, fitted, terms = _score_candidates(z, y, candidates, cv, progress)
    finite = {c: s for c, s in scores.items() if math.isfinite(s)}
    if not finite:
        raise ValueError(
            "every candidate calibrator failed to fit in cross-validation; check the "
            "logits for extreme values."
        )
    best = min(finite, key=finite.__getitem__)  # ties: the simpler
    return best, scores, fitted, terms[best]


def _fit(
    z: torch.Tensor, y: torch.Tensor, method: str, cv: int, candidates: Sequence[str],
    progress: Progress | None,
) -> Calibration:  # fmt: skip
    """:func:`calibrate` on checked float64 logits ``z`` and labels ``y``."""
    check_classes_present(y, int(z.shape[1]))
    scores: dict[str, float] = {}
    fitted: dict[str, tuple[nn.Module, list]] = {}
    folds, terms = None, None
    if method == AUTO:
        method, scores, fitted, terms = _choose(z, y, candidates, cv, progress)
        folds = cv
    if method in fitted:  # fitted on all the data while scoring it: its warnings now
        cal, caught = fitted[method]
        for w in caught:
            warnings.warn(w.message, w.category, stacklevel=3)
    else:
        if progress is not None:
            progress(f"{method}, fit on all {int(y.shape[0])} rows")
        cal = make_calibrator(method).fit(z, y)
    return Calibration(
        method=method, calibrator=cal, num_classes=int(z.shape[1]), cv_nll=scores,
        folds=folds, nll_before=float(F.cross_entropy(z, y)), nll_after=_mean_nll(cal, z, y),
        held_out_nll=terms,
    )  # fmt: skip


def conformal_split(labels: Any, seed: int = CONFORMAL_SPLIT_SEED) -> torch.Tensor:
    """The rows of ``calibrate(conformal=...)`` whose calibrated probabilities fit the
    conformal threshold (a boolean mask, about half of each class, seeded); the calibrator
    is fitted on the others.

    >>> conformal_split([0, 0, 1, 1, 1, 0]).int().tolist()
    [1, 0, 1, 0, 1, 0]
    """
    y = torch.as_tensor(labels)
    return _stratified_folds(y, 2, seed) == 1


def calibrate(
    logits: Any,
    labels: Any,
    method: str = AUTO,
    *,
    cv: int = 5,
    candidates: Sequence[str] | None = None,
    conformal: float | None = None,
    conformal_method: str = DEFAULT_METHOD,
    progress: Progress | None = None,
) -> Calibration:
    r"""Fit a post-hoc calibrator to held-out ``logits`` of a trained model.

    Parameters
    ----------
    logits : Tensor, ndarray or array-like of shape (N, K)
        Logits of a held-out split (validation; never the test split), K >= 2. For
        probabilities pass ``np.log(p)``: they are valid logits (probabilities themselves
        warn, :class:`~cogcal.calibrators.ProbabilitiesAsLogitsWarning`).
    labels : array-like of shape (N,)
        Class indices in ``[0, K)``; at least two classes must occur.
    method : str
        ``"auto"`` (default) or one of :data:`POSTHOC_METHODS`.
    cv : int
        Folds of ``method="auto"`` (at least 2; stratified by class, seed 0). Each fold
        must hold at least 10 samples.
    candidates : sequence of str
        The calibrators ``"auto"`` chooses among (default:
        :func:`~cogcal.calibrators.auto_candidates` of K: every kind, the two-class ones and
        BBQ for K = 2 only).
    conformal : float, optional
        A miscoverage level :math:`\alpha` in (0, 1): also fit split conformal prediction
        sets (:class:`~cogcal.conformal.ConformalSets`). The rows are split in two halves,
        stratified by class (:func:`conformal_split`): the calibrator is chosen and fitted on
        one, and the threshold on the calibrated probabilities of the other, which the
        calibrator never saw (a threshold fitted on the calibrator's own rows under-covers).
    conformal_method : {"lac", "aps", "raps"}
        The conformity score of ``conformal`` (default ``"lac"``: the smallest sets on
        average, exact coverage; :mod:`cogcal.conformal`).
    progress : callable, optional
        Called with a short description (``"ms, fold 3/5"``) as each fit starts: each
        candidate's folds, and the final fit.

    Returns
    -------
    Calibration
        The calibrator fitted on all of ``logits`` (on its half with ``conformal``), with
        ``cv_nll`` for ``"auto"`` and ``conformal`` with ``conformal``. Ties in ``cv_nll``
        go to the earlier candidate (the simpler map).

    Raises
    ------
    ValueError
        Logits that are not a finite (N, K) float array, labels out of range, of one
        class only or missing a class (every class ``0 .. K-1`` must occur, in each half
        with ``conformal``), an unknown method, too few samples for ``cv`` folds, or for
        the conformal threshold at level ``conformal``.

    Examples
    --------
    >>> import numpy as np, cogcal
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 4, 800)
    >>> z = 3.0 * np.eye(4)[y] + rng.normal(size=(800, 4)) * 1.5
    >>> cal = cogcal.calibrate(z, y, candidates=("ts", "ms"))
    >>> cal.method in ("ts", "ms"), sorted(cal.cv_nll), cal.folds
    (True, ['ms', 'ts'], 5)
    >>> cal = cogcal.calibrate(z, y, method="ts", conformal=0.1)
    >>> cal.conformal.n_calibration_, cal.predict_sets(z[:2]).shape
    (400, (2, 4))
    """
    z, y = check_multiclass(np.asarray(logits) if isinstance(logits, list) else logits, labels)
    if candidates is None:
        candidates = auto_candidates(int(z.shape[1]))
    method = _checked_method(method, candidates, cv)
    sets = None if conformal is None else ConformalSets(method=conformal_method, alpha=conformal)
    warn_if_probabilities(
        z, "logits", "calibrate needs logits (the model's outputs before softmax), not "
        "probabilities: pass np.log(p), which are valid logits.", rows=True, stacklevel=3,
    )  # fmt: skip
    present = torch.unique(y)
    if present.numel() < 2:
        raise ValueError(
            f"`labels` hold one class only ({int(present[0])}); a calibrator needs held-out "
            "samples of at least two classes."
        )
    check_classes_present(y, int(z.shape[1]))
    z = z.detach().to(torch.float64)
    if sets is None:
        return _fit(z, y, method, cv, candidates, progress)
    held = conformal_split(y).to(y.device)
    cal = _fit(z[~held], y[~held], method, cv, candidates, progress)
    if progress is not None:
        progress(f"conformal threshold on {int(held.sum())} held-out rows")
    with torch.no_grad():
        cal.conformal = sets.fit(probs=cal.predict_proba(z[held]), labels=y[held])
    return cal
