"""Input checks shared by the core modules.

Every public entry point of the core (calibrators, metrics, losses) validates its
inputs through these helpers, so that bad input always raises the same kind of
``ValueError``, built by one template (:func:`input_error`)::

    `<argument>` <what it is>; expected <what was expected>. <how to fix it>

Arrays may be torch tensors, numpy arrays, (nested) lists or tuples, or anything
``numpy.asarray`` understands, such as a pandas Series or DataFrame (pandas itself is
never imported here).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from cogcal._constraints import Real

__all__ = [
    "ProbabilitiesAsLogitsWarning",
    "as_float_tensor",
    "as_label_tensor",
    "binary_scores",
    "check_finite",
    "check_multiclass",
    "check_multilabel",
    "check_binary",
    "check_classes_present",
    "check_eps",
    "check_task",
    "input_error",
    "multiclass_scores",
    "probability_tolerance",
    "warn_if_probabilities",
]

TASKS = ("multiclass", "binary", "multilabel")

_ARRAY_TYPES = "a torch.Tensor, numpy array, list or pandas Series"


def input_error(name: str, got: str, expected: str, fix: str = "") -> ValueError:
    """The one template of the core's input errors (dtype, shape and value problems).

    Parameters
    ----------
    name : str
        The Python argument, e.g. ``"labels"``.
    got : str
        What the argument is, starting with a verb: ``"has shape (3, 2)"``.
    expected : str
        What it should be: ``"1-D class indices of shape (N,)"``.
    fix : str, optional
        How to fix it, a full sentence.

    Returns
    -------
    ValueError
        To be raised by the caller.

    Examples
    --------
    >>> print(input_error("labels", "has shape (3, 2)", "1-D class indices of shape (N,)",
    ...                   "For one-hot labels pass `labels.argmax(1)`."))
    `labels` has shape (3, 2); expected 1-D class indices of shape (N,). For one-hot labels pass `labels.argmax(1)`.
    """
    msg = f"`{name}` {got}; expected {expected}."
    if fix:
        msg += f" {fix}"
    return ValueError(msg)


def _to_tensor(x: Any, name: str) -> torch.Tensor:
    """A tensor view (or copy) of ``x``: a tensor as is, anything else through numpy."""
    if isinstance(x, torch.Tensor):
        return x
    if x is None or isinstance(x, str | bytes | dict | set):
        raise input_error(
            name,
            f"has type {type(x).__name__}",
            _ARRAY_TYPES,
            f"Pass the values as an array, e.g. numpy.asarray({name}).",
        )
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as err:  # ragged lists, unconvertible objects
        raise input_error(
            name,
            f"of type {type(x).__name__} could not be converted to an array ({err})",
            _ARRAY_TYPES + " of numbers with a regular shape",
        ) from None
    if a.dtype.kind in "OUSVMm":
        what = "strings" if a.dtype.kind in "US" else "non-numeric values"
        raise input_error(
            name,
            f"has dtype {a.dtype} ({what})",
            "numbers (class indices, or real-valued scores)",
            "Encode string labels as integers first (e.g. with numpy.unique(..., "
            "return_inverse=True)) and drop missing values.",
        )
    if a.ndim == 0:
        raise input_error(name, f"is a scalar ({a.item()!r})", "an array with one entry per sample")
    if a.dtype.kind == "u" and a.dtype.itemsize > 1:  # torch lacks most uint16/32/64 ops
        a = a.astype(np.int64)
    if any(s < 0 for s in a.strides):  # reversed views; torch needs positive strides
        a = a.copy()
    if a.flags.writeable:
        return torch.as_tensor(a)
    # read-only arrays (e.g. pandas' copy-on-write views) are shared without a copy: the
    # core never writes into its inputs
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(a)


def as_float_tensor(x: Any, name: str, ndim: int | tuple[int, ...]) -> torch.Tensor:
    """Return ``x`` as a floating tensor after checking its rank, size and values.

    Raises ``ValueError`` for a non-floating dtype, a wrong number of dimensions,
    an empty tensor, or any NaN/Inf entry.
    """
    t = _to_tensor(x, name)
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if t.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise input_error(name, f"has shape {tuple(t.shape)}", f"a {want} array")
    if not t.is_floating_point():
        raise input_error(
            name,
            f"has dtype {t.dtype}",
            "a floating dtype (float16/bfloat16/float32/float64)",
            f"Pass real-valued scores, e.g. `{name}.float()`.",
        )
    if t.numel() == 0:
        raise input_error(name, f"is empty (shape {tuple(t.shape)})", "at least one sample")
    check_finite(t, name)
    return t


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` naming how many entries of ``t`` are NaN or infinite.

    One ``torch.aminmax`` pass (no temporary) decides; the exact count is only computed
    when something is wrong.
    """
    if t.numel() == 0:
        return
    lo, hi = torch.aminmax(t)
    if bool(torch.isfinite(lo)) and bool(torch.isfinite(hi)):
        return
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        n_nan = int(torch.isnan(t).sum())
        n_inf = int(bad.sum()) - n_nan
        raise input_error(
            name,
            f"contains {n_nan} NaN and {n_inf} infinite value(s)",
            "finite values everywhere",
            "Check the model output or the loss for divergence.",
        )


def as_label_tensor(y: Any, name: str = "labels") -> torch.Tensor:
    """Return ``y`` as an integer (int64) tensor; floats are accepted only if integral."""
    t = _to_tensor(y, name)
    if t.dtype == torch.bool:
        return t.long()
    if t.is_complex():
        raise input_error(
            name, f"has dtype {t.dtype} (complex)", "integer class indices", "Pass real labels."
        )
    if t.is_floating_point():
        check_finite(t, name)
        frac = t != t.round()
        if bool(frac.any()):
            example = float(t[frac].reshape(-1)[0])
            raise input_error(
                name,
                f"has non-integral float values (e.g. {example:g})",
                "integer class indices",
                "Pass class indices (e.g. `labels.long()`), not probabilities or one-hot rows.",
            )
    return t.long()


def _check_length(y: torch.Tensor, n: int, labels_name: str, logits_name: str) -> None:
    if y.shape[0] != n:
        raise input_error(
            labels_name,
            f"has {y.shape[0]} entries but `{logits_name}` has {n} rows",
            "one label per row (the same samples)",
        )


def multiclass_scores(x: Any, name: str, what: str = "a multiclass problem") -> torch.Tensor:
    """``x`` as an (N, K) float tensor with K >= 2 (logits or probabilities of ``what``)."""
    z = as_float_tensor(x, name, 2)
    if z.shape[1] < 2:
        raise input_error(
            name,
            f"has shape {tuple(z.shape)} ({z.shape[1]} column)",
            f"K >= 2 columns for {what}",
            "For one score per sample use task='binary'.",
        )
    return z


def binary_scores(x: Any, name: str) -> torch.Tensor:
    """``x`` of shape (N,) or (N, 1) as a 1-D float tensor of one binary score per sample."""
    z = as_float_tensor(x, name, (1, 2))
    if z.ndim == 2:
        if z.shape[1] != 1:
            raise input_error(
                name,
                f"has shape {tuple(z.shape)}",
                "shape (N,) or (N, 1) for a binary task",
                "For several binary tasks use task='multilabel'.",
            )
        z = z[:, 0]
    return z


def check_multiclass(
    logits: Any, labels: Any, *, logits_name: str = "logits", labels_name: str = "labels"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate (N, K) logits with N integer labels in [0, K)."""
    z = multiclass_scores(logits, logits_name)
    y = as_label_tensor(labels, labels_name)
    if y.ndim != 1:
        raise input_error(
            labels_name,
            f"has shape {tuple(y.shape)}",
            "1-D class indices of shape (N,)",
            "For one-hot labels pass `labels.argmax(1)`.",
        )
    _check_length(y, z.shape[0], labels_name, logits_name)
    ylo, yhi = torch.aminmax(y)
    lo, hi = int(ylo), int(yhi)
    if lo < 0 or hi >= z.shape[1]:
        raise input_error(
            labels_name,
            f"has values in [{lo}, {hi}]",
            f"class indices in [0, {z.shape[1] - 1}] for {z.shape[1]} classes",
        )
    return z, y.to(z.device)


def _check_binary_targets(y: torch.Tensor, name: str) -> None:
    if not bool(((y == 0) | (y == 1)).all()):
        bad = sorted(set(y.unique().tolist()) - {0, 1})[:5]
        raise input_error(
            name,
            f"has values other than 0/1 (e.g. {bad})",
            "0/1 targets for binary tasks",
        )


def check_binary(
    logits: Any, labels: Any, *, logits_name: str = "logits", labels_name: str = "labels"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate N binary logits (shape (N,) or (N, 1)) with 0/1 labels; returns 1-D tensors."""
    z = binary_scores(logits, logits_name)
    y = as_label_tensor(labels, labels_name)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise input_error(labels_name, f"has shape {tuple(y.shape)}", "0/1 labels of shape (N,)")
    _check_length(y, z.shape[0], labels_name, logits_name)
    _check_binary_targets(y, labels_name)
    return z, y.to(z.device)


def check_multilabel(
    logits: Any, labels: Any, *, logits_name: str = "logits", labels_name: str = "labels"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate (N, T) logits of T binary tasks with (N, T) 0/1 labels."""
    z = as_float_tensor(logits, logits_name, 2)
    y = as_label_tensor(labels, labels_name)
    if tuple(y.shape) != tuple(z.shape):
        raise input_error(
            labels_name,
            f"has shape {tuple(y.shape)}",
            f"the shape of `{logits_name}` {tuple(z.shape)} (N samples x T tasks) for "
            "multilabel targets",
        )
    _check_binary_targets(y, labels_name)
    return z, y.to(z.device)


def _listed(values: list[int], limit: int = 10) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def check_classes_present(
    labels: torch.Tensor, width: int, *, multilabel: bool = False, name: str = "labels"
) -> None:
    """Refuse held-out labels that miss a class (or, multi-label, a task's 0s or 1s).

    A calibrator fitted on labels in which class ``k < K`` never occurs learns to give
    ``k`` almost no probability, and a test sample of class ``k`` then costs an NLL in the
    hundreds. Multiclass: every class ``0 .. width - 1`` must occur (for ``K = 2``, both 0
    and 1); multi-label: every task must have both a 0 and a 1.

    >>> check_classes_present(torch.tensor([0, 2, 2, 0]), 3)
    Traceback (most recent call last):
    ...
    ValueError: `labels` has no sample of class 1 (of 3 classes); expected every class among the held-out labels a calibrator is fitted on. Hold out samples of every class (e.g. a stratified validation split) or pass logits with one column per class that occurs.
    """
    if multilabel:
        positives = labels.sum(0)
        bad = torch.nonzero((positives == 0) | (positives == labels.shape[0])).flatten()
        if bad.numel():
            tasks = bad.tolist()
            raise input_error(
                name,
                f"has only 0s or only 1s in task{'s' if len(tasks) > 1 else ''} "
                f"{_listed(tasks)} (of {width} tasks)",
                "both 0s and 1s in every task of the held-out labels a calibrator is fitted on",
                "Hold out samples with both outcomes of every task, or leave such a task out.",
            )
        return
    counts = torch.bincount(labels.detach().flatten().cpu(), minlength=width)
    missing = torch.nonzero(counts[:width] == 0).flatten().tolist()
    if missing:
        raise input_error(
            name,
            f"has no sample of class{'es' if len(missing) > 1 else ''} {_listed(missing)} "
            f"(of {width} classes)",
            "every class among the held-out labels a calibrator is fitted on",
            "Hold out samples of every class (e.g. a stratified validation split) or pass "
            "logits with one column per class that occurs.",
        )


def check_eps(eps: Any, *, upper: float = 1.0, message: str = "") -> float | None:
    """``eps`` as a float in ``(0, upper)``, or ``None``; anything else raises ``ValueError``.

    The probability floor of the core: the metrics clip ``probs=`` input at it in the NLL
    (``upper=1``), the non-parametric calibrators clip their calibrated probabilities at it
    (``upper=0.5``). ``message`` (a ``str.format`` template with the field ``eps``, the
    value's repr) replaces the default message.

    >>> check_eps(None), check_eps(1e-3), check_eps(0.25, upper=0.5)
    (None, 0.001, 0.25)
    >>> check_eps(0.7, upper=0.5)
    Traceback (most recent call last):
    ...
    ValueError: `eps` must be None or a number in (0, 0.5), got 0.7.
    """
    if eps is None:
        return None
    if Real(0.0, upper, closed="neither").problem(eps) is not None:
        template = message or f"`eps` must be None or a number in (0, {upper:g}), got {{eps}}."
        raise ValueError(template.format(eps=repr(eps)))
    return float(eps)


def check_task(task: str) -> str:
    """Return ``task`` if it is one of ``"multiclass"``, ``"binary"``, ``"multilabel"``."""
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {', '.join(map(repr, TASKS))}, got {task!r}.")
    return task


class ProbabilitiesAsLogitsWarning(UserWarning):
    """Values passed as logits look like probabilities.

    Raised as a warning (the values are used unchanged, never converted) by the calibrators'
    ``fit`` and by :func:`cogcal.metrics.evaluate` / :func:`cogcal.metrics.ood` when every
    value lies in [0, 1] and, for multiclass input, every row sums to 1: fitting or scoring
    probabilities as logits silently gives wrong answers (a temperature fitted to
    ``predict_proba`` output, for example).

    Examples
    --------
    >>> import warnings, torch
    >>> from cogcal.calibrators import ProbabilitiesAsLogitsWarning, Temperature
    >>> p = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = Temperature().fit(p, torch.tensor([0, 1, 1]))
    >>> caught[0].category is ProbabilitiesAsLogitsWarning
    True
    """


def probability_tolerance(dtype: torch.dtype) -> float:
    """How far from 1 a row of probabilities of ``dtype`` may sum."""
    return max(1e-4, 4.0 * torch.finfo(dtype).eps)


def warn_if_probabilities(
    z: torch.Tensor, name: str, fix: str, *, rows: bool, stacklevel: int = 4
) -> None:
    """Warn (never convert) when ``z``, passed as logits, looks like probabilities.

    Multiclass (``rows``): every value in [0, 1] and every row summing to 1 within
    :func:`probability_tolerance`. Binary / multi-label: every value in [0, 1], not all
    equal. ``fix`` says what to pass instead.
    """
    if z.numel() == 0:
        return
    lo, hi = (float(v) for v in torch.aminmax(z.detach()))
    if lo < 0.0 or hi > 1.0:
        return
    if rows:
        dev = (z.detach().sum(1, dtype=torch.float64) - 1.0).abs()
        if float(dev.max()) > probability_tolerance(z.dtype):
            return
        what = "every value lies in [0, 1] and every row sums to 1"
    else:
        if lo == hi:
            return
        what = "every value lies in [0, 1]"
    warnings.warn(
        f"`{name}` look like probabilities ({what}); they are used as logits, unchanged. {fix}",
        ProbabilitiesAsLogitsWarning,
        stacklevel=stacklevel,
    )
