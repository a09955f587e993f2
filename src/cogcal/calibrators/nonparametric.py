"""Non-parametric multiclass calibrators, fitted in closed form: isotonic regression
(:class:`Isotonic`) and histogram binning (:class:`HistogramBinning`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cogcal._checks import (
    check_eps,
    warn_if_probabilities,
)
from cogcal._constraints import COUNT, check
from cogcal.calibrators._base import Calibrator, _cast

_EPS_MESSAGE = (
    "`eps` must be a number in (0, 0.5) (the floor the calibrated probabilities are clipped "
    "to) or None (1 / (2n) for n fitting samples), got {eps}."
)


#: Relative margin by which :class:`HistogramBinning` keeps a row's top label ahead.
_TOP_MARGIN = 1e-6


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


def _keep_top_label(
    f: torch.Tensor, top: torch.Tensor, weights: torch.Tensor, floor: torch.Tensor
) -> torch.Tensor:
    r"""Top-label calibrated probabilities (Gupta & Ramdas, 2022) that keep each row's top
    label: the predicted class :math:`\hat y` (``top``, (N, 1)) gets the top-label map's
    value ``f`` (N, 1), clipped to :math:`[(1 + 10^{-6})/K, 1 - \epsilon]`; the other
    classes share the rest in proportion to ``weights`` (N, K; the entry of :math:`\hat y`
    is ignored), flattened toward uniform, :math:`s_k \leftarrow \alpha s_k +
    (1 - \alpha)/(K - 1)`, with the largest :math:`\alpha \le 1` that keeps every other
    class below :math:`\hat y` by a relative :math:`10^{-6}`; then floored at
    :math:`\epsilon` (``floor``) and renormalised. So the arg-max never changes, the other
    classes keep the order of their weights, and where the map's accuracy is low the rest
    is spread more evenly."""
    k = weights.shape[1]
    # above chance (1 / K) by a hair, so that the others can stay below it
    q_top = f.clamp(min=(1.0 + _TOP_MARGIN) / k, max=1.0 - float(floor))
    q_top = torch.maximum(q_top, floor)
    others = weights.scatter(1, top, 0.0)
    share = others / others.sum(1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    # flatten the others' shares toward uniform just enough that none reaches q_top
    uniform = 1.0 / (k - 1)
    limit = q_top * (1.0 - _TOP_MARGIN) / (1.0 - q_top)
    peak = share.amax(1, keepdim=True)
    mix = ((limit - uniform) / (peak - uniform).clamp_min(1e-300)).clamp(0.0, 1.0)
    mix = torch.where(peak <= limit, torch.ones_like(mix), mix)
    q = (1.0 - q_top) * (mix * share + (1.0 - mix) * uniform)
    q = q.scatter(1, top, q_top)
    q = torch.maximum(q, floor)
    return q / q.sum(1, keepdim=True)


class _NonParametric(Calibrator):
    """One-vs-rest maps of the class probabilities, fitted in closed form (no L-BFGS).

    A subclass's ``_fit_map(x, y)`` gives one class's map as two 1-D numpy arrays (the
    buffers ``knots`` and ``values`` of that class's row; rows of different lengths are
    padded by repeating their last entry) and ``_evaluate(p, knots, values)`` evaluates
    the maps on (R, N) probabilities.
    """

    def __init__(self, num_classes: int | None = None, *, eps: float | None = None) -> None:
        nn.Module.__init__(self)  # not Calibrator's: none of its L-BFGS hyperparameters apply
        if num_classes is not None:
            check(num_classes, COUNT, "num_classes")
        if num_classes is not None and num_classes < 2:
            raise ValueError("`num_classes` must be at least 2 for a multiclass calibrator.")
        self.num_outputs: int | None = num_classes
        self.eps = eps
        self._validate_hyperparameters()
        self.register_buffer("knots", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("values", torch.zeros(0, 0, dtype=torch.float64))
        self.register_buffer("floor", torch.zeros((), dtype=torch.float64))

    def _validate_hyperparameters(self) -> None:
        check_eps(self.eps, upper=0.5, message=_EPS_MESSAGE)

    def _fit_map(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError  # pragma: no cover - overridden

    def _evaluate(self, p: torch.Tensor, knots: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - overridden

    # -- prediction ---------------------------------------------------------------------
    def _softmax_and_maps(
        self, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows' probabilities (N, K) and the buffers ``knots``, ``values`` and
        ``floor``, all in the wider of the logits' and the buffers' dtypes."""
        self._require_built()
        work = torch.promote_types(logits.dtype, self.values.dtype)
        knots, values, floor = (_cast(b, work) for b in (self.knots, self.values, self.floor))
        p = torch.softmax(logits.reshape(-1, logits.shape[-1]).to(work), dim=1)
        return p, knots, values, floor

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        k = logits.shape[-1]
        p, knots, values, floor = self._softmax_and_maps(logits)
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
            of the wrong shape, dtype or range or missing a class, or logits of another
            width than ``num_classes``.
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
        self._check_labels_cover(y, k)
        columns = torch.softmax(z.detach().cpu().double(), dim=1).T.contiguous().numpy()
        labels_np = y.cpu().numpy()
        maps = self._fit_maps(columns, labels_np)
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
        z64, y = z.detach().to(device=device, dtype=torch.float64), y.to(device)
        self.nll_before_ = math.nan if self._scoring_only else float(F.cross_entropy(z64, y))
        self.nll_after_ = self._fitting_nll(z64, y)
        return self

    def _fit_maps(
        self, columns: np.ndarray, labels: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The maps of ``(K, N)`` probabilities: one of ``p_1`` for ``K = 2``, else one per
        class, one-vs-rest."""
        k = columns.shape[0]
        return [
            self._fit_map(columns[c], (labels == c).astype(np.float64))
            for c in ([1] if k == 2 else range(k))
        ]

    def _check_data(self, n: int) -> None:
        return None

    def _classes_of_maps(self, rows: int) -> int:
        """The number of classes whose fitted maps are ``rows`` rows of the buffers (one
        map of ``p_1`` for two classes, else one per class)."""
        return 2 if rows == 1 else rows

    def _maps_note(self) -> str:
        """What a mismatch of classes and maps adds to its error (a layout option's name)."""
        return ""

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors
    ):  # type: ignore[override]  # noqa: E501
        # the fitted buffers' sizes depend on the data: take them from the state
        values = state_dict.get(prefix + "values")
        if isinstance(values, torch.Tensor) and values.ndim == 2 and values.numel() > 0:
            k = self._classes_of_maps(int(values.shape[0]))
            if self.num_outputs is not None and k != self.num_outputs:
                errors.append(
                    f"{type(self).__name__} was built for {self.num_outputs} classes; the "
                    f"state holds maps for {k}{self._maps_note()}."
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
    r"""Histogram binning with equal-mass bins (Zadrozny & Elkan, 2001), of the top-label
    confidence for K > 2 classes (Gupta & Ramdas, 2022).

    With :math:`p = \mathrm{softmax}(z)`, probabilities on the fitting data are split into
    ``n_bins`` bins holding equal numbers of samples (sizes differing by at most one; bins
    never split tied probabilities, so heavy ties can merge bins); new probabilities fall
    into bins by the midpoints between neighbouring bins, and each bin predicts a frequency
    of its fitting samples.

    * Binary (``K = 2``): the bins are those of :math:`p_1`, each predicting the frequency
      of class 1, :math:`q_1 = f(p_1)` clipped to :math:`[\epsilon, 1 - \epsilon]` and
      :math:`q_0 = 1 - q_1`.
    * Multiclass (``K > 2``): **top-label** binning (Gupta & Ramdas, 2022). The bins are
      those of the confidence :math:`c = \max_k p_k`, each predicting the accuracy of its
      samples (the fraction whose label is their arg-max class :math:`\hat y`):
      :math:`q_{\hat y} = f(c)`, clipped to :math:`[(1 + 10^{-6})/K, 1 - \epsilon]`. The
      other classes share the rest, :math:`q_k = (1 - q_{\hat y})\,s_k`, in shares
      :math:`s_k = p_k / (1 - c)` flattened toward uniform,
      :math:`s_k \leftarrow \alpha s_k + (1 - \alpha)/(K - 1)`, with the largest
      :math:`\alpha \le 1` that keeps every :math:`q_k` below :math:`q_{\hat y}` (by a
      relative :math:`10^{-6}`). So a row's top label never changes (accuracy is the
      model's), the others keep their order, and where the bin's accuracy is low the rest
      is spread more evenly. One-vs-rest binning with equal-mass bins (this class's older
      form) puts most of each class's bins near :math:`p_k = 0`; after renormalising,
      rows tie between classes and a tie goes to the lowest index, which cost up to half
      the accuracy (docs/method.md §2). One map serves every predicted class; its bins are
      stored once per class (rows of ``knots`` and ``values``, row :math:`\hat y` applied
      to rows predicted as :math:`\hat y`).

    The output is :math:`\log q` (floored at :math:`\epsilon`, renormalised).

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
        check(self.n_bins, COUNT, "n_bins")
        super()._validate_hyperparameters()

    def _check_data(self, n: int) -> None:
        if n < self.n_bins:
            raise ValueError(
                f"HistogramBinning with n_bins={self.n_bins} needs at least {self.n_bins} "
                f"samples to fit, got {n}; pass a smaller `n_bins`."
            )

    def _fit_map(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _histogram_bins(x, y, self.n_bins)

    def _fit_maps(
        self, columns: np.ndarray, labels: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        k = columns.shape[0]
        if k == 2:
            return super()._fit_maps(columns, labels)
        top = columns.argmax(0)
        edges, freq = _histogram_bins(
            columns.max(0), (top == labels).astype(np.float64), self.n_bins
        )
        return [(edges, freq)] * k

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:
        k = logits.shape[-1]
        if k == 2:
            return super()._forward(logits)
        p, knots, values, floor = self._softmax_and_maps(logits)
        conf, top = p.max(1, keepdim=True)
        f = self._evaluate_rows(conf, top, knots, values)
        return torch.log(_keep_top_label(f, top, p, floor)).reshape(logits.shape).to(logits.dtype)

    def _evaluate_rows(
        self, conf: torch.Tensor, top: torch.Tensor, knots: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        """The map of each row's predicted class at its confidence, shape (N, 1): the
        number of that class's edges below the confidence picks the bin (comparisons, which
        ONNX exports as they are)."""
        row_knots = knots.index_select(0, top[:, 0])  # (N, B - 1)
        row_values = values.index_select(0, top[:, 0])  # (N, B)
        bins = (conf > row_knots).sum(1, keepdim=True)
        return row_values.gather(1, bins)

    def _evaluate(self, p: torch.Tensor, knots: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():  # ONNX has no searchsorted: count comparisons
            bins = (p[:, :, None] > knots[:, None, :]).sum(2)
        else:  # the number of edges below each probability, as above
            bins = torch.searchsorted(knots, p.contiguous())
        return values.gather(1, bins)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_outputs}, n_bins={self.n_bins}"
