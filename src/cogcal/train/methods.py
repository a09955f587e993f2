"""The training loss of a method (the methods themselves: :mod:`cogcal.runs.methods`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from cogcal import losses
from cogcal.runs.methods import SMOOTHING, Method

__all__ = ["loss_function"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def loss_function(method: Method, task: str = "multiclass") -> LossFn:
    """The training loss of ``method`` on logits (hot path: inputs are not re-validated).

    Multi-label (T binary tasks): the sum over tasks of each task's mean binary
    cross-entropy, with binary label smoothing for ``ls``; the focal loss is multiclass only.
    The V-TST KL term is added by the training module.
    """
    if task == "multilabel":
        if method.loss == "focal":
            raise ValueError(f"method {method.name!r} (focal loss) supports multiclass tasks only.")
        eps = SMOOTHING if method.loss == "ls" else 0.0
        return partial(losses.multilabel_bce, smoothing=eps, check=False)
    if method.loss == "ls":
        return partial(losses.label_smoothing_cross_entropy, smoothing=SMOOTHING, check=False)
    if method.loss == "focal":
        return partial(losses.flsd53_loss, check=False)
    return F.cross_entropy
