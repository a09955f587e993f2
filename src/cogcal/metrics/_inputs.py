"""Argument and tensor checks of the metrics: every public entry point validates through
these, so the same problem raises the same message everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cogcal._checks import (
    check_binary,
    check_multiclass,
    check_multilabel,
    input_error,
    probability_tolerance,
    warn_if_probabilities,
)
from cogcal._constraints import COUNT, SEED, Boolean, Integer, Real, check

#: The default sweep of bin counts (docs/method.md §3).
DEFAULT_N_BINS: tuple[int, ...] = (5, 10, 15, 20, 50, 100)


_BINNINGS = ("width", "mass")


def _check_n_bins(n_bins: Any) -> tuple[int, ...]:
    items = [n_bins] if Integer().problem(n_bins) is None else n_bins
    try:
        items = list(items)
    except TypeError:
        raise ValueError(
            f"`n_bins` must be a positive integer or a sequence of them, got {n_bins!r}."
        ) from None
    out: list[int] = []
    for b in items:
        if COUNT.problem(b) is not None:
            raise ValueError(
                f"`n_bins` must hold positive integers (e.g. (5, 10, 15)), got {n_bins!r}."
            )
        if int(b) not in out:
            out.append(int(b))
    if not out:
        raise ValueError("`n_bins` is empty; pass at least one bin count, e.g. n_bins=15.")
    return tuple(out)


def _check_binning(binning: str) -> str:
    if binning not in _BINNINGS:
        raise ValueError(
            f"`binning` must be 'width' (equal-width bins) or 'mass' (equal-mass bins), "
            f"got {binning!r}."
        )
    return binning


def _check_task_names(task_names: Sequence[str] | None, n_tasks: int) -> list[str]:
    if task_names is None:
        return [f"t{i}" for i in range(n_tasks)]
    names = [str(n) for n in task_names]
    if len(names) != n_tasks:
        raise ValueError(
            f"`task_names` has {len(names)} name(s) but the input has {n_tasks} task column(s); "
            "pass one name per column."
        )
    if len(set(names)) != len(names):
        raise ValueError(f"`task_names` must be unique, got {names}.")
    return names


#: The message of a bad ``eps`` (checked by :func:`cogcal._checks.check_eps`).
_EPS_MESSAGE = (
    "`eps` must be None (no clipping) or a number in (0, 1), got {eps}; e.g. "
    "eps=1e-15 clips the probability of the true class at 1e-15 in the NLL."
)


#: The confidence level of an interval (``0.95``: a 95% interval).
LEVEL = Real(0, 1, closed="neither")
#: The number of classes of a multi-class problem.
CLASSES = Integer(2)


def _check_bootstrap(level: Any, n_boot: Any, seed: Any) -> tuple[float, int, int]:
    return (
        check(level, LEVEL, "level"),
        check(n_boot, COUNT, "n_boot"),
        check(seed, SEED, "seed"),
    )


def _check_positive_class(positive_class: Any, task: str) -> bool | None:
    return None if positive_class is None else check(positive_class, Boolean(), "positive_class")


def _check_num_classes(num_classes: Any) -> int | None:
    return None if num_classes is None else check(num_classes, CLASSES, "num_classes")


# --------------------------------------------------------------------------------------
# tensor checks
# --------------------------------------------------------------------------------------


_prob_tolerance = probability_tolerance  # how far from 1 a row of probabilities may sum


def _check_probs(p: torch.Tensor, name: str, *, rows: bool) -> None:
    """Probabilities lie in [0, 1]; with ``rows``, every row sums to 1 within tolerance."""
    lo, hi = (float(v) for v in torch.aminmax(p))
    if lo < 0.0 or hi > 1.0:
        alt = name.replace("probs", "logits")
        raise input_error(
            name,
            f"has values in [{lo:.4g}, {hi:.4g}]",
            "probabilities in [0, 1]",
            f"If these are logits, pass them as `{alt}` instead.",
        )
    if rows:
        dev = (p.sum(1, dtype=torch.float64) - 1.0).abs()
        tol = _prob_tolerance(p.dtype)
        if float(dev.max()) > tol:
            i = int(dev.argmax())
            raise input_error(
                name,
                f"has row {i} summing to {float(p[i].sum(dtype=torch.float64)):.6g} "
                f"({int((dev > tol).sum())} bad row(s))",
                f"rows that sum to 1 (tolerance {tol:.1e})",
                "Pass normalised probabilities, or pass logits as `logits`.",
            )


def _warn_if_probabilities(z: torch.Tensor, name: str, alt: str, rows: bool) -> None:
    """Warn (never convert) when logits look like probabilities (:func:`warn_if_probabilities`)."""
    warn_if_probabilities(
        z, name, f"If they are probabilities, pass them as `{alt}=` instead.", rows=rows,
        stacklevel=5,
    )  # fmt: skip


def _check_tensors(
    logits: Any, labels: Any, probs: Any, task: str, eps: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate the inputs; return ``(scores, labels, is_prob)``.

    ``scores`` is (N, K) for multiclass and (N, T) for binary (T = 1) / multilabel.
    """
    if (logits is None) == (probs is None):
        raise ValueError(
            "pass exactly one of `logits` and `probs` (by keyword, e.g. "
            "evaluate(labels=y, probs=p)): got "
            + ("both" if logits is not None else "neither")
            + "; probabilities are never guessed from the values."
        )
    if labels is None:
        raise input_error(
            "labels",
            "is required but was not given",
            "class indices (multiclass) or 0/1 targets (binary, multilabel)",
            "Call e.g. evaluate(logits, labels) or evaluate(labels=y, probs=p).",
        )
    is_prob = probs is not None
    if eps is not None and not is_prob:
        raise ValueError(
            "`eps` clips probabilities and applies to `probs=` input only; the NLL of logits "
            "is computed exactly from log-softmax / log-sigmoid, so drop `eps`."
        )
    x = probs if is_prob else logits
    name = "probs" if is_prob else "logits"
    if task == "multiclass":
        z, y = check_multiclass(x, labels, logits_name=name)
    elif task == "binary":
        z, y = check_binary(x, labels, logits_name=name)
        z, y = z[:, None], y[:, None]
    else:
        z, y = check_multilabel(x, labels, logits_name=name)
    if is_prob:
        _check_probs(z, name, rows=task == "multiclass")
    else:
        _warn_if_probabilities(z, name, "probs", rows=task == "multiclass")
    return z, y, is_prob
