r"""Split conformal prediction sets: THR/LAC, APS and RAPS, fitted on held-out data.

A classifier's probabilities become a *set* of classes per row that contains the true class
with probability at least :math:`1 - \alpha` (marginal coverage over exchangeable
calibration and test rows), whatever the model and however well it is calibrated:

1. a *conformity score* :math:`s(x, y)` says how badly class :math:`y` fits row :math:`x`;
2. :meth:`ConformalSets.fit` scores the true class of ``n`` held-out rows and keeps the
   :math:`\lceil (n+1)(1-\alpha) \rceil`-th smallest score as the threshold
   :math:`\hat q` (``threshold_``; :func:`conformal_quantile`), the empirical quantile of
   level :math:`\lceil (n+1)(1-\alpha) \rceil / n`;
3. :meth:`ConformalSets.predict` returns, per row, every class whose score is at most
   :math:`\hat q`: :math:`C(x) = \{y : s(x, y) \le \hat q\}`, a boolean ``(N, K)`` mask.

Then :math:`1 - \alpha \le P(Y \in C(X))`, and without ties among the scores also
:math:`P(Y \in C(X)) \le 1 - \alpha + 1/(n+1)`. The quantile is finite only when
:math:`(n+1)(1-\alpha) \le n`, that is with at least :func:`min_calibration_size` rows;
fewer raise ``ValueError``.

The scores (``method``), with :math:`p` the probabilities of a row, :math:`p_{(1)} \ge
p_{(2)} \ge \dots` sorted, :math:`r(y)` the 1-based rank of class :math:`y` and
:math:`c_j = p_{(1)} + \dots + p_{(j)}`:

* ``"lac"`` (THR in torch-uncertainty; Sadinle et al. 2019): :math:`s = 1 - p_y`, so
  :math:`C(x) = \{y : p_y \ge 1 - \hat q\}`;
* ``"aps"`` (adaptive prediction sets; Romano et al. 2020): :math:`s = c_{r(y)} - u\,
  p_y`, the probability mass of the classes ranked up to :math:`y`;
* ``"raps"`` (regularised APS; Angelopoulos et al. 2021): the APS score plus
  :math:`\lambda\,(r(y) - k_{reg})^+` (``lam``, ``k_reg``), which keeps sets small
  by penalising classes ranked after the first ``k_reg``.

:math:`u` is 0 by default (deterministic sets: the set of a row depends on its
probabilities only, and thresholds of two fits are comparable numbers); with
``randomized=True`` it is drawn uniformly in [0, 1], once per row, as in the references
(MAPIE and torch-uncertainty subtract :math:`u\,p_y` the same way): that breaks the ties
of the scores, so that coverage stays within :math:`1/(n+1)` of :math:`1 - \alpha` where
deterministic sets over-cover. LAC scores are continuous and never randomised.
Ties between probabilities rank the lower class index first.

A set may be empty (no class fits the row well enough at level :math:`\alpha`; e.g.
deterministic APS on a row whose top probability alone exceeds :math:`\hat q`);
``include_top=True`` always adds the arg-max class, as torch-uncertainty does, which keeps
the guarantee (coverage can only rise) but can over-cover. Scores are computed in float64
from ``probs=`` (e.g. a calibrator's :meth:`~cogcal.calibrators.Calibrator.predict_proba`)
or from the softmax of ``logits`` (calibrated or not), given by keyword as in
:func:`cogcal.metrics.evaluate`. Conformal sets are valid for any probabilities; better
calibrated ones give smaller, more adaptive sets.

The metrics of sets against labels: :func:`coverage`, :func:`mean_set_size` and
:func:`coverage_by_set_size`.

>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> y = torch.randint(0, 5, (2000,), generator=g)
>>> z = 3 * torch.eye(5)[y] + 2 * torch.randn(2000, 5, generator=g)
>>> sets = ConformalSets(method="aps", alpha=0.1).fit(z[:1000], y[:1000])
>>> s = sets.predict(z[1000:])
>>> s.shape, s.dtype
(torch.Size([1000, 5]), torch.bool)
>>> round(coverage(s, y[1000:]), 2), round(mean_set_size(s), 2)
(0.9, 2.81)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from cogcal._checks import (
    as_float_tensor,
    as_label_tensor,
    check_multiclass,
    input_error,
    multiclass_scores,
    warn_if_probabilities,
)
from cogcal._constraints import SEED, Boolean, Integer, Options, Real, check
from cogcal.metrics._inputs import _check_probs

__all__ = [
    "ALPHA",
    "DEFAULT_METHOD",
    "METHODS",
    "ConformalSets",
    "conformal_quantile",
    "conformity_scores",
    "coverage",
    "coverage_by_set_size",
    "mean_set_size",
    "min_calibration_size",
    "prediction_sets",
]

#: The conformity scores, by name: ``"lac"`` (THR), ``"aps"``, ``"raps"``.
METHODS: tuple[str, ...] = ("lac", "aps", "raps")
#: The conformity score unless one is named: ``"lac"``, the smallest sets.
DEFAULT_METHOD = "lac"

#: The miscoverage level :math:`\alpha`: a number strictly between 0 and 1.
ALPHA = Real(0.0, 1.0, closed="neither")

_METHOD = Options(METHODS)
_K_REG = Integer(0, noun="a rank")
_LAM = Real(0.0, None)

_BOTH = (
    "pass exactly one of `logits` and `probs` (by keyword, e.g. "
    "ConformalSets().fit(probs=p, labels=y)): got {}; probabilities are never guessed "
    "from the values."
)


# ------------------------------------------------------------------------------ inputs


def _scores_input(logits: Any, probs: Any) -> tuple[Any, str]:
    """The one given of ``logits`` / ``probs`` and its name."""
    if (logits is None) == (probs is None):
        raise ValueError(_BOTH.format("both" if logits is not None else "neither"))
    return (logits, "logits") if probs is None else (probs, "probs")


def _to_probabilities(z: torch.Tensor, name: str) -> torch.Tensor:
    """Checked ``(N, K)`` scores as float64 probabilities (softmax of logits)."""
    if name == "probs":
        _check_probs(z, name, rows=True)
        return z.to(torch.float64)
    fix = "If they are probabilities, pass them as `probs=` instead."
    warn_if_probabilities(z, name, fix, rows=True, stacklevel=5)
    return torch.softmax(z.to(torch.float64), dim=1)


def _probabilities(logits: Any, probs: Any) -> tuple[torch.Tensor, bool, torch.device]:
    """Probabilities (float64) of ``(N, K)`` input, whether it was a tensor, its device."""
    x, name = _scores_input(logits, probs)
    z = multiclass_scores(x, name)
    return _to_probabilities(z, name), isinstance(x, torch.Tensor), z.device


def _probabilities_and_labels(
    logits: Any, labels: Any, probs: Any
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Checked float64 probabilities, int64 labels, and whether the scores were a tensor."""
    x, name = _scores_input(logits, probs)
    if labels is None:
        raise input_error("labels", "is required but was not given", "class indices of shape (N,)")
    z, y = check_multiclass(x, labels, logits_name=name)
    return _to_probabilities(z, name), y, isinstance(x, torch.Tensor)


def _check_u(u: Any, n: int, device: torch.device, method: str) -> torch.Tensor | None:
    """``u`` as float64 draws in [0, 1] of shape (N,), or ``None`` (deterministic)."""
    if u is None:
        return None
    if method == "lac":
        raise ValueError(
            "`u` (randomised scores) applies to method='aps' and 'raps'; LAC scores "
            "(1 - p_y) are never randomised."
        )
    t = as_float_tensor(u, "u", 1)
    if t.shape[0] != n:
        raise input_error("u", f"has {t.shape[0]} entries", f"one draw per row ({n})")
    lo, hi = (float(v) for v in torch.aminmax(t))
    if lo < 0.0 or hi > 1.0:
        raise input_error("u", f"has values in [{lo:.4g}, {hi:.4g}]", "uniform draws in [0, 1]")
    return t.to(device=device, dtype=torch.float64)


def _check_score(method: Any, k_reg: Any, lam: Any) -> tuple[str, int, float]:
    return check(method, _METHOD, "method"), check(k_reg, _K_REG, "k_reg"), check(lam, _LAM, "lam")


def _output(x: torch.Tensor, as_tensor: bool, device: torch.device) -> Any:
    return x.to(device) if as_tensor else x.cpu().numpy()


# ------------------------------------------------------------------------------ scores


def _label_scores(
    p: torch.Tensor, method: str, k_reg: int, lam: float, u: torch.Tensor | None
) -> torch.Tensor:
    """The score of every class of every row, ``(N, K)`` float64 (one ``u`` per row)."""
    if method == "lac":
        return 1.0 - p
    order = torch.argsort(p, dim=1, descending=True, stable=True)
    p_sorted = p.gather(1, order)
    s = p_sorted.cumsum(1)
    if u is not None:
        s = s - u[:, None] * p_sorted
    if method == "raps":
        rank = torch.arange(1, p.shape[1] + 1, dtype=p.dtype, device=p.device)
        s = s + lam * (rank - k_reg).clamp_min(0.0)
    return torch.empty_like(s).scatter_(1, order, s)


def conformity_scores(
    logits: Any = None,
    labels: Any = None,
    *,
    probs: Any = None,
    method: str = DEFAULT_METHOD,
    k_reg: int = 1,
    lam: float = 0.1,
    u: Any = None,
) -> Any:
    r"""The conformity score of each row's true class (the module's definitions).

    Parameters
    ----------
    logits : array-like of shape (N, K), optional
        Unnormalised scores; the scores use their softmax. Exactly one of ``logits`` and
        ``probs``.
    labels : array-like of shape (N,)
        Class indices in ``[0, K)``.
    probs : array-like of shape (N, K), optional
        Probabilities (rows summing to 1).
    method : {"lac", "aps", "raps"}
        The score.
    k_reg : int
        RAPS: the number of top-ranked classes without penalty (>= 0).
    lam : float
        RAPS: the penalty :math:`\lambda` per rank after ``k_reg`` (>= 0).
    u : array-like of shape (N,), optional
        APS / RAPS: uniform draws in [0, 1], one per row, for randomised scores
        :math:`c_{r(y)} - u\,p_y`; ``None`` (the default) means :math:`u = 0`.

    Returns
    -------
    Tensor or ndarray of shape (N,)
        Float64 scores; a tensor for tensor input, else a numpy array.

    Examples
    --------
    >>> p = [[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]
    >>> conformity_scores(probs=p, labels=[1, 2]).round(3).tolist()
    [0.7, 0.7]
    >>> conformity_scores(probs=p, labels=[1, 2], method="aps").round(3).tolist()
    [0.8, 0.9]
    >>> conformity_scores(probs=p, labels=[1, 2], method="raps", lam=0.5).round(3).tolist()
    [1.3, 1.4]
    """
    method, k_reg, lam = _check_score(method, k_reg, lam)
    p, y, as_tensor = _probabilities_and_labels(logits, labels, probs)
    u_ = _check_u(u, p.shape[0], p.device, method)
    s = _label_scores(p, method, k_reg, lam, u_).gather(1, y[:, None])[:, 0]
    return _output(s, as_tensor, p.device)


# ------------------------------------------------------------------------------ threshold


def _check_alpha(alpha: Any) -> float:
    return check(alpha, ALPHA, "alpha")


def _rank(n: int, alpha: float) -> int:
    r"""`ceil((n + 1)(1 - alpha))`, float noise just above an integer ignored."""
    return max(1, math.ceil((n + 1) * (1.0 - alpha) - 1e-9))


def min_calibration_size(alpha: float) -> int:
    r"""The fewest calibration rows with a finite threshold at level ``alpha``.

    The smallest ``n`` with :math:`\lceil (n+1)(1-\alpha) \rceil \le n`, i.e.
    :math:`n \ge (1-\alpha)/\alpha`.

    Examples
    --------
    >>> min_calibration_size(0.1), min_calibration_size(0.05), min_calibration_size(0.01)
    (9, 19, 99)
    """
    alpha = _check_alpha(alpha)
    n = max(1, math.floor((1.0 - alpha) / alpha))
    while _rank(n, alpha) > n:
        n += 1
    return n


def conformal_quantile(scores: Any, alpha: float) -> float:
    r"""The split-conformal threshold: the :math:`\lceil (n+1)(1-\alpha) \rceil`-th
    smallest of ``n`` scores.

    This is the empirical quantile of level :math:`\lceil (n+1)(1-\alpha) \rceil / n`
    (numpy's ``method="lower"``, as MAPIE computes it).

    Parameters
    ----------
    scores : array-like of shape (n,)
        Conformity scores of the true classes of the calibration rows.
    alpha : float
        Miscoverage level in (0, 1).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        When ``n < min_calibration_size(alpha)`` (the quantile would be infinite).

    Examples
    --------
    >>> conformal_quantile([0.1, 0.4, 0.2, 0.3, 0.5, 0.9, 0.6, 0.8, 0.7, 0.0], 0.2)
    0.8
    """
    alpha = _check_alpha(alpha)
    s = as_float_tensor(scores, "scores", 1)
    n = s.shape[0]
    k = _rank(n, alpha)
    if k > n:
        need = min_calibration_size(alpha)
        raise ValueError(
            f"{n} calibration row(s) are too few for alpha={alpha:g}: the conformal "
            f"threshold (the ceil((n + 1)(1 - alpha))-th smallest score) needs at least "
            f"{need} rows, else it is infinite and every set holds every class. Use more "
            "calibration rows or a larger alpha."
        )
    return float(torch.kthvalue(s.to(torch.float64).cpu(), k).values)


# ------------------------------------------------------------------------------ sets


def _sets(
    p: torch.Tensor,
    threshold: float,
    spec: tuple[str, int, float],
    u: torch.Tensor | None,
    include_top: bool,
) -> torch.Tensor:
    mask = _label_scores(p, *spec, u) <= threshold
    if include_top:
        mask.scatter_(1, p.argmax(1, keepdim=True), True)
    return mask


def prediction_sets(
    logits: Any = None,
    *,
    probs: Any = None,
    threshold: float,
    method: str = DEFAULT_METHOD,
    k_reg: int = 1,
    lam: float = 0.1,
    u: Any = None,
    include_top: bool = False,
) -> Any:
    r"""The set :math:`\{y : s(x, y) \le` ``threshold`` :math:`\}` of every row.

    Parameters
    ----------
    logits, probs : array-like of shape (N, K)
        Exactly one, by keyword for ``probs``, as in :func:`conformity_scores`.
    threshold : float
        :math:`\hat q`, e.g. from :func:`conformal_quantile` on the same kind of scores.
    method, k_reg, lam, u
        As in :func:`conformity_scores` (``u``: one draw per row, shared by its classes).
    include_top : bool
        Always include the arg-max class (first index on ties).

    Returns
    -------
    Tensor or ndarray of shape (N, K), bool
        ``True`` for the classes in the set; a tensor for tensor input (on its device),
        else a numpy array.

    Examples
    --------
    >>> p = [[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]
    >>> prediction_sets(probs=p, threshold=0.75).tolist()
    [[True, True, False], [False, True, True]]
    >>> prediction_sets(probs=p, threshold=0.45, method="aps", include_top=True).tolist()
    [[True, False, False], [False, True, False]]
    """
    spec = _check_score(method, k_reg, lam)
    include_top = check(include_top, Boolean(), "include_top")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.number):
        raise ValueError(f"`threshold` must be a number, got {threshold!r}.")
    p, as_tensor, device = _probabilities(logits, probs)
    u_ = _check_u(u, p.shape[0], p.device, spec[0])
    return _output(_sets(p, float(threshold), spec, u_, include_top), as_tensor, device)


# ------------------------------------------------------------------------------ estimator


class ConformalSets:
    r"""Split conformal prediction sets at level :math:`1 - \alpha` (the module's definitions).

    Parameters
    ----------
    method : {"lac", "aps", "raps"}
        The conformity score: ``"lac"`` (THR, :math:`1 - p_y`), ``"aps"`` (cumulative
        probability up to :math:`y`) or ``"raps"`` (APS plus a rank penalty).
    alpha : float
        Miscoverage level in (0, 1): the sets contain the true class with probability at
        least ``1 - alpha``.
    k_reg : int
        RAPS: the number of top-ranked classes without penalty (>= 0; default 1).
    lam : float
        RAPS: the penalty per rank after ``k_reg`` (>= 0; default 0.1, torch-uncertainty's).
    randomized : bool
        APS / RAPS: randomised scores (one uniform draw per row, at ``fit`` and at
        ``predict``), exact coverage in expectation; the default ``False`` gives
        deterministic sets and comparable thresholds. ``method="lac"`` refuses ``True``.
    include_top : bool
        Always include the arg-max class in every set (no empty sets; coverage can then
        exceed ``1 - alpha``).
    random_state : int or None
        Seed of the draws when ``randomized``; each call of ``fit`` / ``predict`` starts
        from it (``None``: fresh draws each call).

    Attributes
    ----------
    threshold_ : float
        The fitted threshold :math:`\hat q` (:func:`conformal_quantile` of the
        calibration scores).
    n_classes_ : int
        The number of classes seen by ``fit``.
    n_calibration_ : int
        The number of calibration rows.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(4), size=3000)
    >>> y = (rng.random((3000, 1)) > p.cumsum(1)).sum(1).clip(max=3)  # y ~ p: calibrated
    >>> cs = ConformalSets(method="lac", alpha=0.1).fit(probs=p[:1500], labels=y[:1500])
    >>> round(cs.threshold_, 3), cs.n_calibration_
    (0.86, 1500)
    >>> sets = cs.predict(probs=p[1500:])
    >>> round(coverage(sets, y[1500:]), 3), round(mean_set_size(sets), 2)
    (0.906, 2.54)
    """

    def __init__(
        self,
        *,
        method: str = DEFAULT_METHOD,
        alpha: float = 0.1,
        k_reg: int = 1,
        lam: float = 0.1,
        randomized: bool = False,
        include_top: bool = False,
        random_state: int | None = None,
    ) -> None:
        self.method, self.k_reg, self.lam = _check_score(method, k_reg, lam)
        self.alpha = _check_alpha(alpha)
        self.randomized = check(randomized, Boolean(), "randomized")
        self.include_top = check(include_top, Boolean(), "include_top")
        if random_state is not None:
            random_state = check(random_state, SEED, "random_state")
        self.random_state = random_state
        if self.randomized and self.method == "lac":
            raise ValueError(
                "`randomized=True` applies to method='aps' and 'raps'; LAC scores "
                "(1 - p_y) are continuous and never randomised."
            )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def get_params(self) -> dict[str, Any]:
        """The hyperparameters, by name (as passed to the constructor)."""
        names = ("method", "alpha", "k_reg", "lam", "randomized", "include_top")
        return {n: getattr(self, n) for n in (*names, "random_state")}

    def _draws(self, n: int, device: torch.device) -> torch.Tensor | None:
        if not self.randomized:
            return None
        g = torch.Generator()
        if self.random_state is None:
            g.seed()
        else:
            g.manual_seed(self.random_state)
        return torch.rand(n, generator=g, dtype=torch.float64).to(device)

    def fit(self, logits: Any = None, labels: Any = None, *, probs: Any = None) -> ConformalSets:
        """Fit the threshold on held-out rows (not the model's training rows).

        Parameters
        ----------
        logits : array-like of shape (N, K), optional
            Logits of the calibration rows (the scores use their softmax); exactly one of
            ``logits`` and ``probs``.
        labels : array-like of shape (N,)
            Their class indices.
        probs : array-like of shape (N, K), optional
            Their probabilities, e.g. a fitted calibrator's ``predict_proba``.

        Returns
        -------
        ConformalSets
            ``self``, with ``threshold_``, ``n_classes_`` and ``n_calibration_``.
        """
        p, y, _ = _probabilities_and_labels(logits, labels, probs)
        spec = (self.method, self.k_reg, self.lam)
        s = _label_scores(p, *spec, self._draws(p.shape[0], p.device))
        self.threshold_ = conformal_quantile(s.gather(1, y[:, None])[:, 0], self.alpha)
        self.n_classes_ = int(p.shape[1])
        self.n_calibration_ = int(p.shape[0])
        return self

    def predict(self, logits: Any = None, *, probs: Any = None) -> Any:
        """The prediction set of every row, as a boolean ``(N, K)`` mask.

        Parameters
        ----------
        logits, probs : array-like of shape (N, K)
            Exactly one, of the same kind as given to ``fit`` (``probs`` by keyword).

        Returns
        -------
        Tensor or ndarray of shape (N, K), bool
            A tensor for tensor input (on its device), else a numpy array.
        """
        if not hasattr(self, "threshold_"):
            raise RuntimeError(
                f"{type(self).__name__} is not fitted yet: call .fit(logits, labels) (or "
                ".fit(probs=p, labels=y)) on held-out rows first."
            )
        p, as_tensor, device = _probabilities(logits, probs)
        if p.shape[1] != self.n_classes_:
            raise input_error(
                "probs" if probs is not None else "logits",
                f"has {p.shape[1]} columns",
                f"the {self.n_classes_} classes seen by fit",
            )
        spec = (self.method, self.k_reg, self.lam)
        mask = _sets(p, self.threshold_, spec, self._draws(p.shape[0], p.device), self.include_top)
        return _output(mask, as_tensor, device)

    def to_dict(self) -> dict[str, Any]:
        """The hyperparameters and fitted state as JSON-ready values (see :meth:`from_dict`).

        >>> p = [[0.9, 0.1]] * 4 + [[0.2, 0.8]]
        >>> cs = ConformalSets(alpha=0.2).fit(probs=p, labels=[0, 0, 0, 0, 0])
        >>> cs.to_dict()["threshold_"], ConformalSets.from_dict(cs.to_dict()).threshold_
        (0.8, 0.8)
        """
        state = self.get_params()
        if hasattr(self, "threshold_"):
            state.update(
                threshold_=self.threshold_,
                n_classes_=self.n_classes_,
                n_calibration_=self.n_calibration_,
            )
        return state

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> ConformalSets:
        """A :class:`ConformalSets` from :meth:`to_dict`'s output (hyperparameters checked)."""
        fitted = ("threshold_", "n_classes_", "n_calibration_")
        unknown = sorted(set(state) - {*cls().get_params(), *fitted})
        if unknown:
            raise ValueError(f"unknown ConformalSets state key(s): {', '.join(unknown)}.")
        out = cls(**{k: v for k, v in state.items() if k not in fitted})
        if "threshold_" in state:
            threshold = check(state["threshold_"], Real(), "threshold_")
            n_classes = check(state.get("n_classes_"), Integer(2), "n_classes_")
            n_calibration = check(state.get("n_calibration_"), Integer(1), "n_calibration_")
            out.threshold_, out.n_classes_, out.n_calibration_ = (
                threshold,
                n_classes,
                n_calibration,
            )
        return out


# ------------------------------------------------------------------------------ metrics


def _check_sets(sets: Any, labels: Any | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sets`` as an (N, K) bool tensor (0/1 accepted), ``labels`` as (N,) indices."""
    t = as_label_tensor(sets, "sets")
    if t.ndim != 2 or t.shape[0] == 0:
        raise input_error(
            "sets", f"has shape {tuple(t.shape)}", "a boolean mask of shape (N, K), N >= 1"
        )
    if not bool(((t == 0) | (t == 1)).all()):
        raise input_error("sets", "has values other than 0/1", "a boolean (N, K) mask")
    t = t.bool()
    if labels is None:
        return t, None
    y = as_label_tensor(labels, "labels").to(t.device)
    if y.ndim != 1 or y.shape[0] != t.shape[0]:
        raise input_error(
            "labels",
            f"has shape {tuple(y.shape)}",
            f"one class index per row of `sets` ({t.shape[0]},)",
        )
    lo, hi = (int(v) for v in torch.aminmax(y))
    if lo < 0 or hi >= t.shape[1]:
        raise input_error(
            "labels", f"has values in [{lo}, {hi}]", f"class indices in [0, {t.shape[1] - 1}]"
        )
    return t, y


def coverage(sets: Any, labels: Any) -> float:
    """Empirical coverage: the fraction of rows whose set contains the label.

    >>> coverage([[True, True, False], [False, False, True]], [1, 0])
    0.5
    """
    t, y = _check_sets(sets, labels)
    return float(t.gather(1, y[:, None]).double().mean())


def mean_set_size(sets: Any) -> float:
    """The mean number of classes per set.

    >>> mean_set_size([[True, True, False], [False, False, False]])
    1.0
    """
    t, _ = _check_sets(sets)
    return float(t.sum(1).double().mean())


def coverage_by_set_size(sets: Any, labels: Any) -> dict[int, dict[str, float]]:
    """Coverage of the rows grouped by the size of their set (size-stratified coverage).

    Returns
    -------
    dict
        ``{size: {"count": rows, "fraction": rows / N, "coverage": covered / rows}}`` for
        each set size that occurs, in increasing order of size (``count`` is an ``int``).

    Examples
    --------
    >>> by_size = coverage_by_set_size([[1, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 0]], [0, 0, 1, 2])
    >>> for size, row in by_size.items():
    ...     print(size, row)
    0 {'count': 1, 'fraction': 0.25, 'coverage': 0.0}
    1 {'count': 1, 'fraction': 0.25, 'coverage': 1.0}
    2 {'count': 2, 'fraction': 0.5, 'coverage': 0.5}
    """
    t, y = _check_sets(sets, labels)
    sizes = t.sum(1)
    hit = t.gather(1, y[:, None])[:, 0]
    n = t.shape[0]
    table: dict[int, dict[str, float]] = {}
    for size in torch.unique(sizes).tolist():
        rows = sizes == size
        count = int(rows.sum())
        table[int(size)] = {
            "count": count,
            "fraction": count / n,
            "coverage": float(hit[rows].double().mean()),
        }
    return table
