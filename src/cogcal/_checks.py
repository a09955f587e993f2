"""Input checks shared by the core modules.

Every public entry point of the core (calibrators, metrics, losses) validates its
inputs through these helpers, so that bad input always raises the same kind of
``ValueError``: what was wrong, what was expected, and how to fix it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "as_float_tensor",
    "as_label_tensor",
    "check_finite",
    "check_multiclass",
    "check_multilabel",
    "check_binary",
]

TASKS = ("multiclass", "binary", "multilabel")


def _to_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray | list | tuple):
        try:
            return torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as err:
            raise ValueError(f"`{name}` could not be converted to a tensor: {err}") from None
    raise ValueError(
        f"`{name}` must be a torch.Tensor or a numpy array, got {type(x).__name__}; "
        "convert it with torch.as_tensor(...)."
    )


def as_float_tensor(x: Any, name: str, ndim: int | tuple[int, ...]) -> torch.Tensor:
    """Return ``x`` as a floating tensor after checking its rank, size and values.

    Raises ``ValueError`` for a non-floating dtype, a wrong number of dimensions,
    an empty tensor, or any NaN/Inf entry.
    """
    t = _to_tensor(x, name)
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if t.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"`{name}` must be {want}, got shape {tuple(t.shape)}.")
    if not t.is_floating_point():
        raise ValueError(
            f"`{name}` must be a floating tensor (float16/bfloat16/float32/float64), "
            f"got dtype {t.dtype}; pass real-valued scores, e.g. `{name}.float()`."
        )
    if t.numel() == 0:
        raise ValueError(f"`{name}` is empty (shape {tuple(t.shape)}); pass at least one sample.")
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
        raise ValueError(
            f"`{name}` contains {n_nan} NaN and {n_inf} infinite value(s); "
            "every entry must be finite (check the model output or the loss for divergence)."
        )


def as_label_tensor(y: Any, name: str = "labels") -> torch.Tensor:
    """Return ``y`` as an integer (int64) tensor; floats are accepted only if integral."""
    t = _to_tensor(y, name)
    if t.dtype == torch.bool:
        return t.long()
    if t.is_floating_point():
        check_finite(t, name)
        if not bool((t == t.round()).all()):
            raise ValueError(
                f"`{name}` must hold integer class indices, got non-integral floats; "
                "pass class indices (e.g. `labels.long()`), not probabilities or one-hot rows."
            )
    elif t.is_complex():
        raise ValueError(f"`{name}` must hold integer class indices, got dtype {t.dtype}.")
    return t.long()


def check_multiclass(
    logits: Any, labels: Any, *, logits_name: str = "logits", labels_name: str = "labels"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate (N, K) logits with N integer labels in [0, K)."""
    z = as_float_tensor(logits, logits_name, 2)
    if z.shape[1] < 2:
        raise ValueError(
            f"`{logits_name}` has {z.shape[1]} column(s); a multiclass problem needs K >= 2 "
            "columns. For one logit per sample use task='binary'."
        )
    y = as_label_tensor(labels, labels_name)
    if y.ndim != 1:
        raise ValueError(
            f"`{labels_name}` must be 1-D class indices of shape (N,), got shape {tuple(y.shape)}; "
            "for one-hot labels pass `labels.argmax(1)`."
        )
    if y.shape[0] != z.shape[0]:
        raise ValueError(
            f"`{logits_name}` has {z.shape[0]} rows but `{labels_name}` has {y.shape[0]} entries; "
            "they must describe the same samples."
        )
    ylo, yhi = torch.aminmax(y)
    lo, hi = int(ylo), int(yhi)
    if lo < 0 or hi >= z.shape[1]:
        raise ValueError(
            f"`{labels_name}` must lie in [0, {z.shape[1] - 1}] for {z.shape[1]} classes, "
            f"got values in [{lo}, {hi}]."
        )
    return z, y.to(z.device)


def _check_binary_targets(y: torch.Tensor, name: str) -> None:
    if not bool(((y == 0) | (y == 1)).all()):
        bad = sorted(set(y.unique().tolist()) - {0, 1})[:5]
        raise ValueError(f"`{name}` must be 0/1 for binary tasks, got other values such as {bad}.")


def check_binary(
    logits: Any, labels: Any, *, logits_name: str = "logits", labels_name: str = "labels"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate N binary logits (shape (N,) or (N, 1)) with 0/1 labels; returns 1-D tensors."""
    z = as_float_tensor(logits, logits_name, (1, 2))
    if z.ndim == 2:
        if z.shape[1] != 1:
            raise ValueError(
                f"binary `{logits_name}` must have shape (N,) or (N, 1), got {tuple(z.shape)}; "
                "for several binary tasks use task='multilabel'."
            )
        z = z[:, 0]
    y = as_label_tensor(labels, labels_name)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or y.shape[0] != z.shape[0]:
        raise ValueError(
            f"`{labels_name}` must have {z.shape[0]} entries to match `{logits_name}`, "
            f"got shape {tuple(y.shape)}."
        )
    _check_binary_targets(y, labels_name)
    return z, y.to(z.device)


def check_multilabel(
    logits: Any, labels: Any, *, logits_name: str = "logits", labels_name: str = "labels"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate (N, T) logits of T binary tasks with (N, T) 0/1 labels."""
    z = as_float_tensor(logits, logits_name, 2)
    y = as_label_tensor(labels, labels_name)
    if tuple(y.shape) != tuple(z.shape):
        raise ValueError(
            f"multilabel `{labels_name}` must have the shape of `{logits_name}` {tuple(z.shape)} "
            f"(N samples x T tasks), got {tuple(y.shape)}."
        )
    _check_binary_targets(y, labels_name)
    return z, y.to(z.device)


def check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {', '.join(map(repr, TASKS))}, got {task!r}.")
    return task
