"""The base class of the post-hoc-capable calibrators, its constants, warnings and
hyperparameter checks, and the pieces every penalised fit shares."""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lbfgs import _strong_wolfe  # a plain function: no optimiser, no dynamo

from cogcal._checks import (
    as_float_tensor,
    check_classes_present,
    check_multiclass,
    check_multilabel,
    warn_if_probabilities,
)
from cogcal._constraints import COUNT, CV_FOLDS, NON_NEGATIVE_REAL, check
from cogcal.calibrators._folds import _shuffled_folds, _stratified_folds
from cogcal.calibrators._newton import METRIC_DTYPE, VectorProblem, fit_vector

#: Penalty strengths :math:`\lambda` tried by ``l2="cv"``: 0 (maximum likelihood) and one
#: per decade from 1e-2 to 1e5. :math:`\lambda` is a prior precision per parameter, so the
#: grid spans "no penalty" to "the shrinkage target" for validation sets of 10^2-10^5 samples.
DEFAULT_L2_GRID: tuple[float, ...] = (0.0, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5)

# Cross-validation walks the grid from the strongest penalty down and stops once the pooled
# held-out NLL has failed to improve on its best at this many consecutive weaker strengths.
_CV_PATIENCE = 1

#: Where a fit stops (largest gradient entry; change of the objective in one step): the
#: final fit, and a cross-validation fit, whose only use is its held-out NLL
#: (:meth:`Calibrator._minimise`).
FINAL_TOLERANCES = {"tolerance_grad": 1e-8, "tolerance_change": 1e-15}
SCORING_TOLERANCES = {"tolerance_grad": 1e-4, "tolerance_change": 1e-12}
#: The arithmetic of an L-BFGS fit, where the calibrator's closure allows it
#: (:meth:`Calibrator._reduced_dtype`), until the gradient reaches the cross-validation's
#: tolerance (:data:`SCORING_TOLERANCES`; the objective is summed, and the iterates kept,
#: in float64): to a gradient of 1e-4, float32 rounding (1e-7 of the features) moved no
#: pooled score of docs/performance.md's sets by 1e-6, for matrix products and softmaxes at
#: half the memory traffic ("posthoc_peers" there). A final fit then goes on to 1e-8 in
#: float64 with the curvature pairs gathered so far, as does a fit stalled above 1e-4.
REDUCED_DTYPE = torch.float32

#: Precision of the Gaussian prior on ``log T`` (``sigma = 1``): the default ``l2`` of
#: :class:`Temperature` and :class:`TaskTemperature`, and the fixed prior on the temperature
#: of the shrinkage target of :class:`VectorScaling` and :class:`MatrixScaling`.
DEFAULT_TEMPERATURE_L2 = 1.0


class SeparableDataWarning(UserWarning):
    """A temperature was fitted to data whose samples are all classified correctly.

    The maximum-likelihood temperature of such data is unbounded below (``T -> 0``); the
    fitted value is then set by the prior on ``log T`` (``l2``), not by the data.

    Examples
    --------
    >>> import warnings, torch
    >>> from cogcal.calibrators import SeparableDataWarning, Temperature
    >>> z, y = torch.tensor([[3.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     t = Temperature().fit(z, y)
    >>> [w.category.__name__ for w in caught]
    ['SeparableDataWarning']
    >>> 0 < t.temperature < 1
    True
    """


class L2GridEdgeWarning(UserWarning):
    """Cross-validation chose the smallest positive or the largest strength of ``l2_grid``.

    The best strength may then lie outside the grid; extend ``l2_grid`` past that edge.

    Examples
    --------
    >>> from cogcal.calibrators import L2GridEdgeWarning
    >>> issubclass(L2GridEdgeWarning, UserWarning)
    True
    """


def _is_nonnegative_number(value: Any) -> bool:
    return NON_NEGATIVE_REAL.problem(value) is None


def _check_l2(value: Any) -> None:
    if isinstance(value, str):
        if value != "cv":
            raise ValueError(
                f"`l2` must be a non-negative number or the string 'cv', got {value!r}."
            )
        return
    if not _is_nonnegative_number(value):
        raise ValueError(
            f"`l2` must be a non-negative finite number (the penalty strength) or 'cv' "
            f"(choose it by cross-validation), got {value!r}."
        )


def _check_grid(grid: Any) -> tuple[float, ...]:
    if isinstance(grid, str) or not isinstance(grid, Sequence | np.ndarray):
        raise ValueError(
            f"`l2_grid` must be a sequence of non-negative numbers, got {type(grid).__name__}."
        )
    values = list(grid)
    bad = [v for v in values if not _is_nonnegative_number(v)]
    if bad:
        raise ValueError(
            f"`l2_grid` must hold non-negative finite numbers, got {bad[0]!r} among them."
        )
    distinct = tuple(sorted({float(v) for v in values}))
    if len(distinct) < 2:
        raise ValueError(
            f"`l2_grid` needs at least two distinct strengths to choose from, got {values!r}; "
            "for one fixed strength pass it as `l2=` instead."
        )
    return distinct


def _array_like(x: Any) -> Any:
    """Turn pandas objects and other ``__array__`` providers into (writable) numpy arrays.

    Tensors, lists and tuples pass through for :mod:`cogcal._checks`; anything else
    without ``__array__`` also passes through, to be refused there by name.
    """
    if isinstance(x, torch.Tensor | list | tuple):
        return x
    if isinstance(x, np.ndarray) or hasattr(x, "__array__"):
        array = np.asarray(x)
        # read-only arrays (pandas' copy-on-write views, np.broadcast_to) cannot back a tensor
        return array if array.flags.writeable else array.copy()
    return x


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the call when it would be a no-op (the training step's path)."""
    return t if t.dtype == dtype else t.to(dtype)


class _Problem(NamedTuple):
    """One penalised fit: the logits and labels, the conditioning statistics of
    :meth:`Calibrator._standardisation`, the penalty's weight ``l2 / (2 n)`` and the dtype
    of the closure's arithmetic (``None``: the logits')."""

    logits: torch.Tensor
    labels: torch.Tensor
    stats: Any
    weight: float
    dtype: torch.dtype | None = None


#: An L-BFGS closure: returns the objective, leaves the gradient in the variables' ``.grad``.
_Closure = Callable[[], torch.Tensor]

#: The objective on a flat vector: ``x -> (value, gradient)``.
_Objective = Callable[[torch.Tensor], tuple[float, torch.Tensor]]


def _two_loop(
    g: torch.Tensor, history: list[tuple[torch.Tensor, torch.Tensor, float]], h0: float
) -> torch.Tensor:
    """The L-BFGS direction ``-H g`` from the ``(y, s, 1 / y.s)`` pairs, oldest first."""
    q = g.neg()
    alphas = []
    for y, s, rho in reversed(history):
        a = float(s.dot(q)) * rho
        q.add_(y, alpha=-a)
        alphas.append(a)
    r = q.mul_(h0)
    for (y, s, rho), a in zip(history, reversed(alphas), strict=True):
        r.add_(s, alpha=a - float(y.dot(r)) * rho)
    return r


class _LBFGSRun(NamedTuple):
    """Where :func:`_lbfgs` stopped: the point, the iterations, the largest gradient entry
    there, and the curvature pairs ``(y, s, 1 / y.s)`` (oldest first) with the initial
    inverse-Hessian scale ``h0`` that a run continuing from there can start with."""

    x: torch.Tensor
    iterations: int
    largest_gradient: float
    pairs: list[tuple[torch.Tensor, torch.Tensor, float]]
    h0: float


def _lbfgs(
    objective: _Objective,
    x: torch.Tensor,
    *,
    max_iter: int,
    tolerance_grad: float,
    tolerance_change: float,
    history_size: int = 20,
    continuing: _LBFGSRun | None = None,
) -> _LBFGSRun:
    """Minimise ``objective`` from ``x`` by L-BFGS with a strong-Wolfe line search.

    The algorithm of ``torch.optim.LBFGS(lr=1, line_search_fn="strong_wolfe")`` step for
    step (its stopping rules, first step ``min(1, 1 / |g|_1)``, at most ``1.25 max_iter``
    evaluations), on one flat vector and without an optimiser object: the first
    ``torch.optim`` optimiser of a process imports ``torch._dynamo`` (about 1 s), which a
    post-hoc fit need not pay. ``continuing``: an earlier run that ended at ``x`` (on the
    same objective in another precision, :data:`REDUCED_DTYPE`), whose curvature pairs
    give the first step, a unit one, as they would its next.
    """
    loss, g = objective(x)
    history = list(continuing.pairs) if continuing is not None else []
    h0 = continuing.h0 if continuing is not None else 1.0
    if float(g.abs().max()) <= tolerance_grad:
        return _LBFGSRun(x, 0, float(g.abs().max()), history, h0)
    evals, n_iter = 1, 0
    d, t, prev_g = g.neg(), 1.0, g
    while n_iter < max_iter:
        n_iter += 1
        if n_iter > 1:
            y, s = g - prev_g, d * t
            ys = float(y.dot(s))
            if ys > 1e-10:
                if len(history) == history_size:
                    history.pop(0)
                history.append((y, s, 1.0 / ys))
                h0 = ys / float(y.dot(y))
        if n_iter > 1 or history:
            d = _two_loop(g, history, h0)
        prev_g, prev_loss = g, loss
        t = 1.0 if n_iter > 1 or history else min(1.0, 1.0 / float(g.abs().sum()))
        gtd = float(g.dot(d))
        if gtd > -tolerance_change:
            break
        loss, g, t, ls_evals = _strong_wolfe(
            lambda x0, step, direction: objective(x0 + step * direction), x, t, d, loss, g, gtd
        )
        x = x + t * d
        evals += ls_evals
        if (
            n_iter == max_iter
            or evals >= max_iter * 5 // 4
            or float(g.abs().max()) <= tolerance_grad
            or float((d * t).abs().max()) <= tolerance_change
            or abs(loss - prev_loss) < tolerance_change
        ):
            break
    return _LBFGSRun(x, n_iter, float(g.abs().max()), history, h0)


class Calibrator(nn.Module):
    r"""Base class of the post-hoc-capable calibrators.

    Subclasses define ``_forward`` (logits to calibrated logits), ``_deviations`` (each
    parameter with its value at the shrinkage centre) and, when their size is only known
    from data, ``_build(num_outputs)``. :meth:`fit` then runs full-batch L-BFGS in float64
    (subclasses of few parameters fit by Newton's method instead, through
    :meth:`_fit_by_newton` or :meth:`_vector_problem`) and writes the result back in the
    parameters' own dtype.

    Parameters
    ----------
    max_iter : int
        L-BFGS iterations per fit.
    l2 : float or "cv"
        Strength :math:`\lambda \ge 0` of the penalty
        :math:`\tfrac{\lambda}{2}\lVert\theta-\theta_0\rVert^2` added to the summed NLL
        (see the module docstring), or ``"cv"`` to choose it from ``l2_grid``.
    cv : int
        Number of cross-validation folds for ``l2="cv"`` (at least 2).
    l2_grid : sequence of float
        Strengths tried by ``l2="cv"`` (default :data:`DEFAULT_L2_GRID`).

    Attributes
    ----------
    n_iter_ : int
        L-BFGS iterations of the final fit.
    nll_before_, nll_after_ : float
        Mean NLL on the fitting data of the identity map (the uncalibrated logits) and of
        the fitted calibrator.
    l2_ : float
        Penalty strength used for the final fit (``l2`` itself, or the one CV chose).
    l2_grid_ : ndarray or None
        The distinct strengths CV tried, ascending (``None`` for a fixed ``l2``).
    cv_scores_ : ndarray or None
        Pooled mean held-out NLL of each strength of ``l2_grid_`` (every sample is held out
        exactly once; ``nan`` for strengths the early stop skipped, see :meth:`fit`); CV
        picks the smallest (the strongest penalty among exact ties).
    cv_fold_scores_ : ndarray or None
        Mean held-out NLL per fold and strength, shape ``(cv, len(l2_grid_))`` (``inf``
        where a fit diverged, ``nan`` where skipped).
    cv_seconds_ : ndarray or None
        Wall-clock seconds the folds' fits and scoring took at each strength of
        ``l2_grid_`` (``nan`` where skipped): where a cross-validated fit spends its time
        (the weak strengths, whose fits take the most steps, usually).
    cv_sample_nll_ : ndarray or None
        Each sample's held-out NLL at the chosen strength, shape ``(N,)``: from the fit on
        the folds that did not hold it out (multi-label: the mean over its tasks); its mean
        is that strength's ``cv_scores_`` entry. ``cogcal.calibrate(method="auto")`` pairs
        it with another model's NLL on the same samples.
    l2_at_edge_ : {None, "lower", "upper"}
        Where in ``l2_grid_`` the chosen strength lies, if at an end. An edge raises an
        :class:`L2GridEdgeWarning` when a strength beyond it could give a different map:
        not for ``"lower"`` at 0 (no weaker penalty exists) and not for ``"upper"`` when the
        fitted map already equals the penalty's centre (every penalised deviation below
        1e-3, so a stronger penalty changes nothing).

    Examples
    --------
    Numpy in, numpy out; tensors in, tensors out:

    >>> import numpy as np, torch
    >>> from cogcal.calibrators import Temperature
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 600)
    >>> z = rng.normal(size=(600, 3)) + 2.0 * np.eye(3)[y]
    >>> t = Temperature().fit(3.0 * z, y)              # three times too confident
    >>> out = t(3.0 * z[:2].astype(np.float32))
    >>> type(out).__name__, out.dtype
    ('ndarray', dtype('float32'))
    >>> t.predict_proba(torch.tensor(3.0 * z[:2])).sum(1)
    tensor([1.0000, 1.0000], dtype=torch.float64)
    """

    multilabel: bool = False
    # Test hooks (private): centre the weight penalty at 0 instead of the identity, and
    # leave the biases unpenalised -- the form of scikit-learn's L2 LogisticRegression.
    _weights_toward_identity: bool = True
    _penalize_bias: bool = True
    # fit refuses labels missing a class (check_classes_present); only the fold fits of
    # cogcal.posthoc's cross-validation, scored on held-out data, switch it off
    _require_every_class: bool = True
    # a fit whose only use is its held-out NLL (cogcal.posthoc's cross-validation folds):
    # minimised to SCORING_TOLERANCES, as the folds of l2="cv", and nll_before_/nll_after_
    # (a pass over the data each) left nan
    _scoring_only: bool = False

    def __init__(
        self,
        *,
        max_iter: int = 200,
        l2: float | str = 0.0,
        cv: int = 5,
        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    ) -> None:
        super().__init__()
        self.max_iter = max_iter
        self.l2 = l2
        self.cv = cv
        grid_like = isinstance(l2_grid, Sequence | np.ndarray) and not isinstance(l2_grid, str)
        self.l2_grid = tuple(l2_grid) if grid_like else l2_grid
        self._validate_hyperparameters()

    def _validate_hyperparameters(self) -> None:
        check(self.max_iter, COUNT, "max_iter")
        _check_l2(self.l2)
        check(self.cv, CV_FOLDS, "cv")
        _check_grid(self.l2_grid)

    # -- to be provided by subclasses -------------------------------------------------
    def _build(self, num_outputs: int) -> None:  # pragma: no cover - overridden when needed
        return None

    def _forward(self, logits: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _map(self, logits: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """``forward`` with ``params`` in place of the parameters (the fit's objective)."""
        return torch.func.functional_call(self, params, (logits,))

    def _deviations(self) -> list[tuple[str, Any, str]]:  # pragma: no cover
        """``(parameter name, identity value, "weight" | "bias")`` for every parameter."""
        raise NotImplementedError

    def _after_fit(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        return None

    def _prepare(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Fix data-dependent parts of the penalty from the training data of one fit."""
        return None

    def _fit_by_newton(
        self, logits: torch.Tensor, labels: torch.Tensor, weight: float,
        tolerances: dict[str, float],
    ) -> int | None:  # fmt: skip
        """Minimise :math:`J_\\lambda` from the current parameters by this calibrator's own
        Newton's method (the penalty is ``weight`` times the squares of
        :meth:`_penalty_terms`), leave the solution set (:meth:`_set_solution`) and return the
        steps; ``None``: it has none (:meth:`_minimise` then fits a vector map by Newton's
        method or anything else by L-BFGS)."""
        return None

    def _vector_problem(
        self, logits: torch.Tensor, labels: torch.Tensor, weight: float
    ) -> VectorProblem | None:
        """For a map ``x * w + b`` with a quadratic penalty (parameters ``weight`` and
        ``bias``), its fit as a :class:`VectorProblem`, solved by Newton's method
        (:mod:`cogcal.calibrators._newton`) instead of L-BFGS; ``None``: L-BFGS."""
        return None

    # The optimisation runs on variables v = encode(theta) in which L-BFGS is well
    # conditioned; each evaluation decodes the parameters, so the objective is unchanged.
    def _standardisation(self, logits: torch.Tensor, penalty_weight: float) -> Any:
        return None

    def _encode(self, stats: Any) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name).detach() for name, _, _ in self._deviations()}

    def _decode(self, variables: dict[str, torch.Tensor], stats: Any) -> dict[str, torch.Tensor]:
        return variables

    def _canonical(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The representative of ``params`` that the fit returns (for maps with symmetries)."""
        return params

    def _penalty_terms(self, params: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The penalised deviations ``theta - theta_0`` (their squares sum to the penalty)."""
        terms = []
        for name, identity, kind in self._deviations():
            if kind == "bias" and not self._penalize_bias:
                continue
            centre = identity if (kind == "bias" or self._weights_toward_identity) else 0.0
            terms.append(params[name] - centre)
        return terms

    # -- prediction ---------------------------------------------------------------------
    def forward(self, logits: Any) -> Any:
        """Calibrated logits. A tensor gives a tensor (differentiable, as in COG training);
        a numpy array (or anything with ``__array__``) gives a numpy array of its dtype."""
        if isinstance(logits, torch.Tensor):
            if logits.ndim >= 1:  # a width mismatch must not broadcast (or fail inside torch)
                self._check_width(int(logits.shape[-1]))
            return self._forward(logits)
        z = self._prediction_input(logits)
        with torch.no_grad():
            return self._forward(z.to(self._device())).cpu().numpy()

    def predict_proba(self, logits: Any) -> Any:
        """Calibrated probabilities, without gradients.

        Softmax over the classes for multiclass calibrators, one sigmoid per task for the
        multi-label ones. Numpy in gives numpy out; a tensor gives a tensor on its own
        device. The output has the input's dtype (half precision is computed in float32).
        """
        is_tensor = isinstance(logits, torch.Tensor)
        z = self._prediction_input(logits)
        work = torch.float32 if z.dtype in (torch.float16, torch.bfloat16) else z.dtype
        with torch.no_grad():
            out = self._forward(z.to(self._device())).to(work)
            probs = torch.sigmoid(out) if self.multilabel else torch.softmax(out, dim=1)
        probs = probs.to(z.dtype)
        return probs.to(z.device) if is_tensor else probs.cpu().numpy()

    def _prediction_input(self, logits: Any) -> torch.Tensor:
        z = as_float_tensor(_array_like(logits), "logits", 2)
        if not self.multilabel and z.shape[1] < 2:
            raise ValueError(
                f"`logits` has {z.shape[1]} column(s); a multiclass calibrator needs K >= 2 "
                "columns (for independent binary tasks use TaskTemperature or TaskAffine)."
            )
        self._require_built()
        self._check_width(z.shape[1])
        return z

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    # -- fitting --------------------------------------------------------------------------
    def _check(self, logits: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        logits, labels = _array_like(logits), _array_like(labels)
        if self.multilabel:
            return check_multilabel(logits, labels)
        return check_multiclass(logits, labels)

    def _check_labels_cover(self, labels: torch.Tensor, width: int) -> None:
        """Refuse labels missing a class (multi-label: a task's 0s or 1s) after the shape
        checks. Labels of a single class are the degenerate case the penalty (or, for the
        non-parametric maps, the floor) keeps finite and are fitted as before;
        :func:`cogcal.posthoc.calibrate` refuses them too."""
        one_class = not self.multilabel and bool((labels == labels[0]).all())
        if self._require_every_class and labels.numel() and not one_class:
            check_classes_present(labels, width, multilabel=self.multilabel)

    def _check_cv_samples(self, n: int) -> None:
        if self.l2 == "cv" and n < self.cv:
            raise ValueError(
                f"`l2='cv'` with cv={self.cv} folds needs at least {self.cv} samples, got {n}; "
                "pass a smaller `cv` or a fixed `l2`."
            )

    @torch.no_grad()
    def _fitting_nll(self, logits: torch.Tensor, labels: torch.Tensor) -> float:
        """``nll_before_`` / ``nll_after_``: the mean NLL of the fitting data as the
        calibrator maps them now (``nan`` for a scoring-only fit)."""
        return math.nan if self._scoring_only else float(self._nll(logits, labels))

    def _nll(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self._nll_of(self._forward(logits), labels)

    def _sample_nll(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each row's NLL as the calibrator maps it now (multi-label: the mean over the
        row's tasks), whose mean is :meth:`_nll`."""
        z = self._forward(logits)
        if self.multilabel:
            terms = F.binary_cross_entropy_with_logits(z, labels.to(z.dtype), reduction="none")
            return terms.mean(1)
        return F.cross_entropy(z, labels, reduction="none")

    def _nll_of(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.multilabel:
            return F.binary_cross_entropy_with_logits(z, labels.to(z.dtype), reduction="mean")
        return F.cross_entropy(z, labels)

    def _reset_parameters(self) -> None:
        with torch.no_grad():
            for name, identity, _ in self._deviations():
                param = getattr(self, name)
                param.copy_(torch.as_tensor(identity, dtype=param.dtype).expand_as(param))

    def _minimise(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        l2: float,
        *,
        scoring: bool = False,
        metric: torch.Tensor | None = None,
        start: tuple[float, torch.Tensor] | None = None,
    ) -> int:
        """Minimise :math:`J_\\lambda` from the current parameters; return the iterations.

        ``scoring``: a cross-validation fit, whose only use is its held-out NLL; it stops at
        a gradient of 1e-4 instead of 1e-8 (:data:`SCORING_TOLERANCES`: against 1e-5, the
        same choices of strength and of ``method="auto"`` on docs/performance.md's four sets,
        every pooled score within 3e-5, a thousandth of its standard error or less, at 21%
        fewer L-BFGS evaluations for matrix scaling on 100 classes).
        ``metric``: for a Newton fit, the data term's Hessian at a nearby point;
        ``start``: for a Newton fit, the data term and its gradient at the current
        parameters, and a Newton fit leaves them at its solution in ``self._data_term``
        (:func:`~cogcal.calibrators._newton.fit_vector`; L-BFGS ignores both).
        The decoded parameters are also left (detached) in ``self._solution``.
        """
        n_terms = logits.numel() if self.multilabel else logits.shape[0]
        weight = float(l2) / (2.0 * n_terms)
        tolerances = SCORING_TOLERANCES if scoring else FINAL_TOLERANCES
        self._data_term = None
        steps = self._fit_by_newton(logits, labels, weight, tolerances)
        if steps is not None:
            return steps
        vector = self._vector_problem(logits, labels, weight)
        if vector is not None:
            fit = fit_vector(
                vector, self.weight.detach(), self.bias.detach(), max_iter=self.max_iter,
                metric=metric, start=start, dtype=METRIC_DTYPE if scoring else None,
                **tolerances,
            )  # fmt: skip
            self._set_solution(self._canonical({"weight": fit.weight, "bias": fit.bias}))
            # (the softmax, so the data term, is the same at the canonical representative)
            self._data_term = (fit.data_loss, fit.data_grad)
            return fit.steps
        stats = self._standardisation(logits, weight)
        variables = {
            k: v.detach().clone().requires_grad_(True) for k, v in self._encode(stats).items()
        }
        problem = _Problem(logits, labels, stats, weight, self._reduced_dtype(logits))
        x = torch.cat([v.detach().reshape(-1) for v in variables.values()])
        with torch.enable_grad():
            run = None
            if problem.dtype is not None:  # to the cross-validation's tolerance in it
                objective = self._flat(variables, self._closure(variables, problem))
                run = _lbfgs(objective, x, max_iter=self.max_iter, **SCORING_TOLERANCES)
                x = run.x
            if run is None or run.largest_gradient > tolerances["tolerance_grad"]:
                # in the logits' precision: the whole fit, a final fit's last steps, or a
                # fit that stalled in the reduced one, with the curvature pairs it gathered
                closure = self._closure(variables, problem._replace(dtype=None))
                used = run.iterations if run is not None else 0
                rest = _lbfgs(
                    self._flat(variables, closure), x, max_iter=max(1, self.max_iter - used),
                    continuing=run, **tolerances,
                )  # fmt: skip
                x, run = rest.x, rest._replace(iterations=used + rest.iterations)
            self._flat(variables, None)(x)  # leave the variables at the minimiser
        with torch.no_grad():
            self._set_solution(self._canonical(self._decode(variables, stats)))
        return run.iterations

    def _reduced_dtype(self, logits: torch.Tensor) -> torch.dtype | None:
        """The dtype in which an L-BFGS fit of these logits runs until the gradient reaches
        the cross-validation's tolerance (:data:`REDUCED_DTYPE` where the closure supports
        it); ``None`` by default: the whole fit in the logits' dtype (the generic closure)."""
        return None

    @torch.no_grad()
    def _set_solution(self, params: dict[str, torch.Tensor]) -> None:
        """Write ``params`` into the parameters and keep them (detached) in ``_solution``."""
        solution = {k: v.detach() for k, v in params.items()}
        for name, value in solution.items():
            getattr(self, name).copy_(value)
        self._solution = solution

    @staticmethod
    def _flat(variables: dict[str, torch.Tensor], closure: _Closure | None) -> _Objective:
        """``closure`` as a function of the variables laid end to end (``None``: only set
        them)."""
        sizes = [v.numel() for v in variables.values()]

        def objective(x: torch.Tensor) -> tuple[float, torch.Tensor]:
            with torch.no_grad():
                for v, part in zip(variables.values(), x.split(sizes), strict=True):
                    v.copy_(part.view_as(v))
            if closure is None:
                return 0.0, x
            loss = float(closure().detach())
            return loss, torch.cat([v.grad.reshape(-1) for v in variables.values()])

        return objective

    def _closure(self, variables: dict[str, torch.Tensor], problem: _Problem) -> _Closure:
        """The L-BFGS closure: :math:`J_\\lambda` at ``variables``, their ``.grad`` set."""
        logits, labels, stats, weight, _ = problem

        def closure() -> torch.Tensor:
            for v in variables.values():
                v.grad = None
            params = self._decode(variables, stats)
            loss = self._nll_of(self._map(logits, params), labels)
            if weight:
                loss = loss + weight * sum((d**2).sum() for d in self._penalty_terms(params))
            loss.backward()
            return loss

        return closure

    def _folds(self, labels: torch.Tensor) -> torch.Tensor:
        if self.multilabel:
            return _shuffled_folds(labels.shape[0], self.cv)
        return _stratified_folds(labels, self.cv)

    def _fold_share(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        """What the calibrators of a cross-validation's folds over ``logits`` can share,
        computed once on all of it: attributes set on each fold's calibrator before its fit
        (:func:`cogcal.posthoc.cross_validated_nll`); by default nothing."""
        return {}

    def _fold_models(
        self, logits: torch.Tensor, labels: torch.Tensor, held_out: list[torch.Tensor]
    ) -> list[Calibrator]:
        """One copy of the calibrator per fold, reset and prepared on that fold's complement."""
        models = []
        for held in held_out:
            model = copy.deepcopy(self)
            model._reset_parameters()
            model._prepare(logits[~held], labels[~held])
            models.append(model)
        return models

    def _fit_folds(
        self,
        models: list[Calibrator],
        logits: torch.Tensor,
        labels: torch.Tensor,
        held_out: list[torch.Tensor],
        l2: float,
    ) -> None:
        """Fit each fold's copy on its complement at strength ``l2`` (a scoring fit, from
        that copy's solution at the previous strength)."""
        for model, held in zip(models, held_out, strict=True):
            model._minimise(logits[~held], labels[~held], l2, scoring=True)

    def _final_start(self, l2: float) -> dict[str, Any]:
        """Where the final fit at ``l2`` starts, after :meth:`_prepare`: keyword arguments
        of :meth:`_minimise` (and the parameters set), from what the cross-validation
        learnt; by default nothing (the fit starts where :meth:`_prepare` put it)."""
        return {}

    def _cross_validate(self, logits: torch.Tensor, labels: torch.Tensor) -> float:
        self._check_cv_samples(labels.shape[0])
        grid = np.asarray(_check_grid(self.l2_grid))
        folds = self._folds(labels).to(labels.device)
        held_out = [folds == f for f in range(self.cv)]
        sizes = np.array([float(h.sum()) for h in held_out])
        models = self._fold_models(logits, labels, held_out)
        fold_scores = np.full((self.cv, grid.size), np.nan)
        samples = np.full((grid.size, labels.shape[0]), np.nan)  # held-out NLL per sample
        pooled, seconds = np.full(grid.size, np.nan), np.full(grid.size, np.nan)
        best_score, worse_in_a_row = np.inf, 0
        for j in reversed(range(grid.size)):  # strongest first, each fit warm-starts the next
            began = time.perf_counter()
            self._fit_folds(models, logits, labels, held_out, float(grid[j]))
            for f, (model, held) in enumerate(zip(models, held_out, strict=True)):
                with torch.no_grad():
                    per_sample = model._sample_nll(logits[held], labels[held]).cpu().numpy()
                score = float(per_sample.mean())
                finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
                fold_scores[f, j] = score if math.isfinite(score) and finite else np.inf
                samples[j, held.cpu().numpy()] = (
                    per_sample if np.isfinite(fold_scores[f, j]) else np.inf
                )
            pooled[j] = float((fold_scores[:, j] * sizes).sum() / sizes.sum())
            seconds[j] = time.perf_counter() - began
            if pooled[j] < best_score:
                best_score, worse_in_a_row = pooled[j], 0
            else:
                worse_in_a_row += 1
            if worse_in_a_row == _CV_PATIENCE:
                break
        if not np.isfinite(best_score):
            raise RuntimeError(
                f"{type(self).__name__}.fit: every strength of `l2_grid` diverged in "
                "cross-validation; check the logits for extreme values."
            )
        best = int(np.flatnonzero(pooled == best_score).max())  # ties: stronger penalty
        self.l2_grid_, self.cv_scores_, self.cv_fold_scores_ = grid, pooled, fold_scores
        self.cv_seconds_ = seconds
        self.cv_sample_nll_ = samples[best]
        self.l2_at_edge_ = "upper" if best == grid.size - 1 else "lower" if best == 0 else None
        return float(grid[best])

    def _warn_edge(self) -> None:
        name, grid = type(self).__name__, self.l2_grid_
        if self.l2_at_edge_ == "upper":
            deviation = max(float(d.abs().max()) for d in self._penalty_terms(self._solution))
            if deviation >= 1e-3:
                warnings.warn(
                    f"{name}.fit: cross-validation chose the strongest penalty in `l2_grid` "
                    f"(l2={grid[-1]:g}, its upper edge) and the fitted map is still "
                    f"{deviation:.2g} away from the penalty's centre; a stronger penalty may "
                    "be better: extend `l2_grid` upwards.",
                    L2GridEdgeWarning,
                    stacklevel=3,
                )
        elif self.l2_at_edge_ == "lower" and grid[0] > 0:
            warnings.warn(
                f"{name}.fit: cross-validation chose the weakest penalty in `l2_grid` "
                f"(l2={grid[0]:g}, its lower edge); a weaker one may be better: add smaller "
                "strengths (or 0) to `l2_grid`.",
                L2GridEdgeWarning,
                stacklevel=3,
            )

    def fit(self, logits: Any, labels: Any) -> Calibrator:
        r"""Fit the calibrator post hoc by full-batch float64 L-BFGS (or Newton's method, for
        the maps of few parameters) on the penalised NLL.

        Minimises :math:`J_\lambda(\theta) = \frac1n\big[\sum_i \ell_i(\theta) +
        \frac{\lambda}{2}\lVert\theta-\theta_0\rVert^2\big]` (module docstring; each class
        documents its :math:`\theta_0`) starting from the identity map (``fit`` always
        starts afresh), with :math:`\lambda` = ``l2``.

        With ``l2="cv"``, :math:`\lambda` is chosen by ``cv``-fold cross-validation **inside
        the data given here**: the folds are stratified by class (multi-label: shuffled rows)
        with the fixed seed :data:`CV_SEED`. Walking ``l2_grid`` from the strongest penalty
        down, the calibrator is fitted on each fold's complement (each fit starting from that
        fold's previous solution) and scored by the mean NLL of the held-out fold; the scores
        are pooled over all samples. The walk stops early at the first weaker strength
        whose pooled score fails to improve on the best (those fits are the slowest and,
        past the minimum of the usual U-shaped curve, cannot win; the skipped strengths
        score ``nan``). The strength with the smallest pooled held-out NLL is
        refitted on all the data. A choice at an edge of the grid is recorded in
        ``l2_at_edge_`` (see the class docstring).

        After fitting, the parameters are frozen (``requires_grad=False``), so the
        calibrator's outputs carry no gradient and ``.numpy()`` works on them. To train
        the fitted calibrator further -- e.g. as the COG calibrator of
        :class:`cogcal.CalibratedModel` -- unfreeze it with ``.requires_grad_(True)``.

        Parameters
        ----------
        logits : Tensor, ndarray or array-like of shape (N, K) or (N, T)
            Frozen logits of a held-out split (never the test split): (N, K) for multiclass,
            (N, T) for multi-label. Any floating dtype; the optimisation runs in float64.
        labels : Tensor, ndarray, list or pandas Series
            (N,) class indices for multiclass, (N, T) 0/1 targets for multi-label.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            For logits that are not a finite 2-D floating array, labels of the wrong shape,
            dtype or range, labels in which a class never occurs (multi-label: a task
            without both 0s and 1s), or ``l2="cv"`` with fewer than ``cv`` samples.
        RuntimeError
            If the fit diverges to non-finite parameters.
        """
        self._validate_hyperparameters()
        z, y = self._check(logits, labels)
        warn_if_probabilities(
            z, "logits", f"{type(self).__name__}.fit needs logits (the model's outputs before "
            "softmax/sigmoid), not predict_proba's output: pass log-probabilities "
            "(np.log(p)), which are valid logits.", rows=not self.multilabel, stacklevel=3,
        )  # fmt: skip
        width = z.shape[1]
        self._build(width)
        self._check_width(width)
        self._check_cv_samples(z.shape[0])
        self._check_labels_cover(y, width)
        device = self._device()
        original_dtype = next(self.parameters()).dtype
        z64 = z.detach().to(device=device, dtype=torch.float64)
        y = y.to(device)
        self.to(torch.float64)
        self.train(False)
        try:
            for p in self.parameters():
                p.requires_grad_(True)
            self._reset_parameters()
            self.nll_before_ = self._fitting_nll(z64, y)
            if self.l2 == "cv":
                self.l2_ = self._cross_validate(z64, y)
            else:
                self.l2_ = float(self.l2)
                self.l2_grid_ = self.cv_scores_ = self.cv_fold_scores_ = None
                self.cv_seconds_ = None
                self.cv_sample_nll_ = None
                self.l2_at_edge_ = None
            self._reset_parameters()
            self._prepare(z64, y)
            start = self._final_start(self.l2_) if self.l2 == "cv" else {}
            self.n_iter_ = self._minimise(z64, y, self.l2_, scoring=self._scoring_only, **start)
            self.nll_after_ = self._fitting_nll(z64, y)
            if not all(bool(torch.isfinite(p).all()) for p in self.parameters()):
                raise RuntimeError(
                    f"{type(self).__name__}.fit diverged (non-finite parameters); the logits "
                    "may be extreme or the classes perfectly separable: try l2 > 0 or 'cv'."
                )
            self._warn_edge()
            self._after_fit(z64, y)
        finally:
            self.to(original_dtype)
        for p in self.parameters():
            p.requires_grad_(False)
        return self

    def _check_width(self, width: int) -> None:
        """Refuse logits of the wrong width (a calibrator without a width takes any)."""

    def _require_built(self) -> None:
        """Refuse to run before the parameters exist (a calibrator without a width has them)."""


class _LazyWidth(Calibrator):
    """A calibrator whose parameters depend on the number of outputs, possibly known only at fit."""

    def __init__(
        self,
        num_outputs: int | None,
        *,
        max_iter: int,
        l2: float | str,
        cv: int,
        l2_grid: Sequence[float],
        name: str,
    ) -> None:
        super().__init__(max_iter=max_iter, l2=l2, cv=cv, l2_grid=l2_grid)
        if num_outputs is not None:
            check(num_outputs, COUNT, name)
        if num_outputs is not None and num_outputs < 2 and not self.multilabel:
            raise ValueError(f"`{name}` must be at least 2 for a multiclass calibrator.")
        self.num_outputs: int | None = None
        if num_outputs is not None:
            self._build(num_outputs)

    def _build(self, num_outputs: int) -> None:
        if self.num_outputs is None:
            self.num_outputs = num_outputs
            self._init_params(num_outputs)

    def _init_params(self, k: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _device(self) -> torch.device:
        self._require_built()
        return super()._device()

    def _check_width(self, width: int) -> None:
        expected = self.num_outputs
        if expected is not None and width != expected:
            kind = "tasks" if self.multilabel else "classes"
            raise ValueError(
                f"`logits` has {width} columns but {type(self).__name__} was built for "
                f"{expected} {kind}; build it with the right size or with None to take it from "
                "fit."
            )

    def _require_built(self) -> None:
        if self.num_outputs is None:
            raise RuntimeError(
                f"{type(self).__name__} has no parameters yet: pass the number of classes to "
                "the constructor or call .fit(logits, labels) first."
            )

    _width_key = "bias"

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[override]
        key = prefix + self._width_key
        if self.num_outputs is None and key in state_dict:
            self._build(int(state_dict[key].shape[0]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
