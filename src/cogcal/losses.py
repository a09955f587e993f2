"""Training losses of the paper's methods (docs/method.md §1-§2, §4).

All take logits, never probabilities, and return the batch mean (multi-label: the sum
over tasks of each task's batch mean, i.e. linear scalarisation with equal weights).
Inputs are validated unless ``check=False`` (for training loops that validated their data
once and must not pay a device synchronisation per step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cogcal._checks import check_multiclass, check_multilabel
from cogcal._constraints import Real, check

#: Label smoothing: a share of the target moved to the uniform distribution.
_SMOOTHING = Real(0, 1, closed="left")


def _check_smoothing(smoothing: float) -> None:
    """(The losses' own ``check`` argument hides :func:`~cogcal._constraints.check`.)"""
    check(smoothing, _SMOOTHING, "smoothing")


__all__ = [
    "cross_entropy",
    "label_smoothing_cross_entropy",
    "focal_loss",
    "flsd53_loss",
    "vtst_loss",
    "multilabel_bce",
]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy ``-log softmax(z)_y``; validates its inputs."""
    z, y = check_multiclass(logits, labels)
    return F.cross_entropy(z, y)


def label_smoothing_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, smoothing: float = 0.1, check: bool = True
) -> torch.Tensor:
    """Cross-entropy against ``(1 - eps) * onehot(y) + eps / K`` (the eps/K form of docs/method.md §2).

    Identical to ``F.cross_entropy(logits, labels, label_smoothing=eps)``.
    """
    _check_smoothing(smoothing)
    z, y = check_multiclass(logits, labels) if check else (logits, labels)
    return F.cross_entropy(z, y, label_smoothing=smoothing)


def _focal(z: torch.Tensor, y: torch.Tensor, gamma: torch.Tensor | float) -> torch.Tensor:
    logp_t = F.log_softmax(z.float(), dim=1).gather(1, y[:, None])[:, 0]
    p_t = logp_t.exp()
    return (-((1.0 - p_t) ** gamma) * logp_t).mean()


def focal_loss(logits: torch.Tensor, labels: torch.Tensor, *, gamma: float = 3.0) -> torch.Tensor:
    """Focal loss ``-(1 - p_y)^gamma log p_y`` with a fixed ``gamma`` (Lin et al., 2017).

    ``gamma = 0`` is the cross-entropy.

    Examples
    --------
    >>> import torch
    >>> from cogcal.losses import focal_loss
    >>> z, y = torch.tensor([[2.0, 0.0]]), torch.tensor([0])
    >>> p = torch.softmax(z, 1)[0, 0]
    >>> torch.allclose(focal_loss(z, y, gamma=2.0), -(1 - p) ** 2 * p.log())
    True
    """
    if not gamma >= 0:
        raise ValueError(f"`gamma` must be >= 0, got {gamma!r}.")
    z, y = check_multiclass(logits, labels)
    return _focal(z, y, gamma)


def flsd53_loss(logits: torch.Tensor, labels: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Focal loss with sample-dependent gamma, FLSD-53 (Mukhoti et al., 2020).

    ``gamma = 5`` for samples with ``p_y < 0.2`` and ``gamma = 3`` otherwise; ``gamma`` is
    chosen from the current prediction without a gradient through the choice.
    """
    z, y = check_multiclass(logits, labels) if check else (logits, labels)
    with torch.no_grad():
        p_t = F.softmax(z.float(), dim=1).gather(1, y[:, None])[:, 0]
        gamma = torch.where(p_t < 0.2, 5.0, 3.0)
    return _focal(z, y, gamma)


def vtst_loss(logits: torch.Tensor, labels: torch.Tensor, kl: torch.Tensor) -> torch.Tensor:
    """V-TST training loss: cross-entropy of one reparameterised sample plus the KL term.

    ``kl`` is :meth:`cogcal.calibrators.VTSTHead.forward_with_kl`'s second output (already
    summed over the latent dimensions, divided by Z and averaged over the batch).
    """
    z, y = check_multiclass(logits, labels)
    return F.cross_entropy(z, y) + kl


def multilabel_bce(
    logits: torch.Tensor, targets: torch.Tensor, *, smoothing: float = 0.0, check: bool = True
) -> torch.Tensor:
    """Sum over the T tasks of each task's mean binary cross-entropy (linear scalarisation).

    ``smoothing`` applies binary label smoothing, ``y * (1 - eps) + eps / 2``.

    Examples
    --------
    >>> import torch
    >>> from cogcal.losses import multilabel_bce
    >>> z, t = torch.zeros(4, 3), torch.ones(4, 3)
    >>> round(float(multilabel_bce(z, t)), 4)   # 3 tasks x log 2
    2.0794
    """
    _check_smoothing(smoothing)
    z, y = check_multilabel(logits, targets) if check else (logits, targets)
    target = y.to(z.dtype) * (1.0 - smoothing) + smoothing / 2.0
    per_task = F.binary_cross_entropy_with_logits(z, target, reduction="none").mean(0)
    return per_task.sum()
