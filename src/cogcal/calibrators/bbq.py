r"""Bayesian binning into quantiles (:class:`BBQ`; Naeini, Cooper & Hauskrecht, 2015)."""

from __future__ import annotations

import math

import numpy as np
import torch

from cogcal._constraints import COUNT, POSITIVE, check
from cogcal.calibrators.nonparametric import _keep_top_label, _NonParametric

_BINNINGS = ("quantile", "uniform")
_SCORES = ("bdeu", "bic")
_MULTICLASS = ("top-label", "one-vs-rest")


def bin_counts_range(n: int, spread: float = 10.0) -> range:
    r"""The numbers of bins BBQ averages over for ``n`` samples: from
    :math:`\lfloor n^{1/3} / C \rfloor` (at least 1) to
    :math:`\min(\lceil C n^{1/3} \rceil, \lceil n / 5 \rceil)`, :math:`C` = ``spread``.

    >>> bin_counts_range(1000)
    range(1, 101)
    """
    root = n ** (1.0 / 3.0)
    low = max(1, math.floor(root / spread))
    return range(low, max(low, min(math.ceil(root * spread), math.ceil(n / 5))) + 1)


def _quantile_edges(xs: np.ndarray, n_bins: int) -> np.ndarray:
    """Inner edges of ``n_bins`` equal-mass bins of the sorted ``xs`` (midpoints between
    neighbouring runs; a cut inside tied values is dropped, merging two bins)."""
    sizes = np.full(n_bins, xs.size // n_bins) + (np.arange(n_bins) < xs.size % n_bins)
    cuts = np.cumsum(sizes)[:-1]
    cuts = cuts[xs[cuts - 1] < xs[cuts]]
    below, above = xs[cuts - 1], xs[cuts]
    middle = below + 0.5 * (above - below)
    return np.where(middle < above, middle, below)


def _lgamma(x: np.ndarray) -> np.ndarray:
    return torch.special.gammaln(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()


def _binning_model(
    x: np.ndarray, y: np.ndarray, edges: np.ndarray, score: str, prior: float
) -> tuple[np.ndarray, float]:
    """One binning's per-bin predictions and log score (log marginal likelihood or -BIC/2).

    ``bdeu``: each bin ``b`` of score interval ``[lo, hi]`` has a Beta prior of strength
    ``prior / B`` centred on its midpoint; the prediction is the posterior mean and the
    score the log marginal likelihood of the bin's labels. ``bic``: the bin's frequency
    (its midpoint when empty) and the log-likelihood less ``B log(n) / 2``.
    """
    n_bins = edges.size + 1
    bins = np.searchsorted(edges, x, side="left")
    counts = np.bincount(bins, minlength=n_bins).astype(np.float64)
    positives = np.bincount(bins, weights=y, minlength=n_bins)
    bounds = np.r_[0.0, edges, 1.0]
    mid = 0.5 * (bounds[:-1] + bounds[1:])
    if score == "bdeu":
        strength = prior / n_bins
        alpha, beta = strength * mid, strength * (1.0 - mid)
        values = (positives + alpha) / (counts + strength)
        log_score = float(
            (
                _lgamma(strength)
                - _lgamma(counts + strength)
                + _lgamma(positives + alpha)
                - _lgamma(alpha)
                + _lgamma(counts - positives + beta)
                - _lgamma(beta)
            ).sum()
        )
        return values, log_score
    filled = counts > 0
    values = np.where(filled, positives / np.maximum(counts, 1.0), mid)
    with np.errstate(divide="ignore", invalid="ignore"):
        ll = positives * np.log(values) + (counts - positives) * np.log1p(-values)
    log_likelihood = float(np.where(filled, np.nan_to_num(ll, nan=0.0), 0.0).sum())
    return values, log_likelihood - 0.5 * n_bins * math.log(x.size)


class BBQ(_NonParametric):
    r"""Bayesian binning into quantiles (Naeini, Cooper & Hauskrecht, 2015), keeping each
    row's top label for K > 2 classes.

    For each class ``k`` with :math:`p_k = \mathrm{softmax}(z)_k`, BBQ builds one
    histogram-binning model of :math:`[y = k]` on :math:`p_k` for every number of bins
    ``B`` in :func:`bin_counts_range` (``n^{1/3} / 10`` to ``10 n^{1/3}``), each with
    ``B`` equal-mass bins (``binning="quantile"``), and averages their predictions weighted
    by their posterior probabilities under a uniform prior over the models. With
    ``score="bdeu"`` (the paper's) each bin has a Beta prior of total strength
    ``prior_strength / B`` centred on the midpoint of its score interval; a bin predicts its
    posterior mean (never exactly 0 or 1) and a model's weight is its marginal likelihood.
    ``score="bic"`` weights models by :math:`e^{-\mathrm{BIC}/2}` and predicts the bins'
    raw frequencies, and ``binning="uniform"`` uses bins of equal width -- together netcal's
    ``BBQ`` (which also drops low-scoring models by an elbow rule).

    The average of step functions is a step function, so the fitted map of each class is
    one histogram over the union of all the models' edges, kept in buffers as for
    :class:`HistogramBinning` (``knots``: edges, ``values``: predictions, ``floor``:
    :math:`\epsilon`). Two classes (``K = 2``) use one map of :math:`p_1`, as there.

    For K > 2 classes, ``multiclass="one-vs-rest"`` (the paper's) gives
    :math:`\max(f_k(p_k), \epsilon)` renormalised; the maps of different classes disagree
    near their top, and on over-confident logits many rows change their arg-max, mostly
    for the worse (100 classes: test accuracy 0.657 to 0.582; mnist1d 0.541 to 0.526;
    docs/method.md §2). ``multiclass="top-label"`` (default) keeps each row's top label, as
    :class:`HistogramBinning` does (Gupta & Ramdas, 2022): one more BBQ map ``g``, of the
    confidence :math:`c = \max_k p_k` to the accuracy of the rows predicted so, gives the
    predicted class :math:`g(c)`, and the other classes share the rest in proportion to
    their one-vs-rest :math:`\max(f_k(p_k), \epsilon)`, flattened toward uniform just
    enough that none reaches the top (:func:`~cogcal.calibrators.nonparametric._keep_top_label`).
    The buffers then hold ``K + 1`` maps, the top-label map last.

    Parameters
    ----------
    num_classes : int or None
        Number of classes ``K``; ``None`` takes it from :meth:`fit`.
    binning : {"quantile", "uniform"}
        Equal-mass (default) or equal-width bins.
    score : {"bdeu", "bic"}
        The models' weights: Bayesian marginal likelihood (default) or BIC.
    prior_strength : float
        The equivalent sample size of the BDeu prior (default 2, the paper's).
    multiclass : {"top-label", "one-vs-rest"}
        For K > 2: keep each row's top label (default) or the paper's renormalised
        one-vs-rest maps.
    eps : float in (0, 0.5) or None
        The floor :math:`\epsilon`; ``None`` (default) is :math:`1/(2n)`.

    Attributes
    ----------
    nll_before_, nll_after_ : float
        Mean NLL on the fitting data of the uncalibrated and the calibrated probabilities.

    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.calibrators import BBQ
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 2, 3000)
    >>> z = 4.0 * (rng.normal(size=(3000, 2)) + np.eye(2)[y])
    >>> bbq = BBQ().fit(z, y)
    >>> bool(bbq.nll_after_ < bbq.nll_before_), bbq.values.shape[0]   # K = 2: one map
    (True, 1)
    >>> y3 = rng.integers(0, 3, 3000)
    >>> z3 = 4.0 * (rng.normal(size=(3000, 3)) + np.eye(3)[y3])
    >>> bbq3 = BBQ().fit(z3, y3)          # K = 3: three one-vs-rest maps and the top label's
    >>> bbq3.values.shape[0], bool((bbq3.predict_proba(z3).argmax(1) == z3.argmax(1)).all())
    (4, True)
    """

    def __init__(
        self,
        num_classes: int | None = None,
        *,
        binning: str = "quantile",
        score: str = "bdeu",
        prior_strength: float = 2.0,
        multiclass: str = "top-label",
        eps: float | None = None,
    ) -> None:
        self.binning, self.score, self.prior_strength = binning, score, prior_strength
        self.multiclass = multiclass
        super().__init__(num_classes, eps=eps)

    def _validate_hyperparameters(self) -> None:
        if self.binning not in _BINNINGS:
            raise ValueError(f"`binning` must be one of {_BINNINGS}, got {self.binning!r}.")
        if self.score not in _SCORES:
            raise ValueError(f"`score` must be one of {_SCORES}, got {self.score!r}.")
        if self.multiclass not in _MULTICLASS:
            raise ValueError(f"`multiclass` must be one of {_MULTICLASS}, got {self.multiclass!r}.")
        check(self.prior_strength, POSITIVE, "prior_strength")
        super()._validate_hyperparameters()

    def _check_data(self, n: int) -> None:
        check(n, COUNT, "samples")

    def _fit_map(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        xs = np.sort(x)
        models = []
        for n_bins in bin_counts_range(x.size):
            if self.binning == "quantile":
                edges = _quantile_edges(xs, n_bins)
            else:
                edges = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
            values, log_score = _binning_model(x, y, edges, self.score, self.prior_strength)
            models.append((edges, values, log_score))
        log_scores = np.array([m[2] for m in models])
        weights = np.exp(log_scores - log_scores.max())
        weights /= weights.sum()
        union = np.unique(np.concatenate([m[0] for m in models]))
        combined = np.zeros(union.size + 1)
        for (edges, values, _), w in zip(models, weights, strict=True):
            # interval j of the union is (u_{j-1}, u_j]: model bin of u_j; the last is above all
            index = np.r_[np.searchsorted(edges, union, side="left"), edges.size]
            combined += w * values[index]
        return union, combined

    def _top_label(self, k: int) -> bool:
        return k > 2 and self.multiclass == "top-label"

    def _fit_maps(
        self, columns: np.ndarray, labels: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        maps = super()._fit_maps(columns, labels)
        if self._top_label(columns.shape[0]):  # and the confidence's, to the accuracy
            right = (columns.argmax(0) == labels).astype(np.float64)
            maps.append(self._fit_map(columns.max(0), right))
        return maps

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        k = logits.shape[-1]
        if not self._top_label(k):
            return super()._forward(logits)
        p, knots, values, floor = self._softmax_and_maps(logits)
        shares = torch.maximum(self._evaluate(p.T, knots[:k], values[:k]).T, floor)
        conf, top = p.max(1, keepdim=True)
        f = self._evaluate(conf.T, knots[k:], values[k:]).T
        q = _keep_top_label(f, top, shares, floor)
        return torch.log(q).reshape(logits.shape).to(logits.dtype)

    def _classes_of_maps(self, rows: int) -> int:
        if self.multiclass == "top-label" and rows > 1:
            return rows - 1  # the class maps and the top label's
        return super()._classes_of_maps(rows)

    def _maps_note(self) -> str:
        return f" (with multiclass={self.multiclass!r})"

    def _evaluate(self, p: torch.Tensor, knots: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():  # ONNX has no searchsorted: count comparisons
            bins = (p[:, :, None] > knots[:, None, :]).sum(2)
        else:  # the number of edges below each probability (bins are (e_{j-1}, e_j])
            bins = torch.searchsorted(knots, p.contiguous())
        return values.gather(1, bins)

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_outputs}, binning={self.binning!r}, score={self.score!r}, "
            f"multiclass={self.multiclass!r}"
        )
