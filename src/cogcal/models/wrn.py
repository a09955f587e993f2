"""Wide ResNet (Zagoruyko & Komodakis, 2016), pre-activation, for 32x32 inputs."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from cogcal.models.registry import Backbone, image_shape, init_weights, register_model

__all__ = ["WideBasic", "WideResNet"]


class WideBasic(nn.Module):
    """Pre-activation block: BN-ReLU-conv3x3(stride)-BN-ReLU-dropout-conv3x3.

    When the shape changes the shortcut is a 1x1 convolution applied to the
    pre-activated input (as in pre-activation ResNets); otherwise it is the identity.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.relu = nn.ReLU(inplace=False)
        self.shortcut: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(pre)
        out = self.conv1(pre)
        out = self.conv2(self.dropout(self.relu(self.bn2(out))))
        return out + skip


class WideResNet(Backbone):
    """WRN-depth-k: 3x3 stem (16 channels), three groups of widths 16k-32k-64k.

    Parameters
    ----------
    num_classes : int
        Number of outputs.
    input_shape : tuple of int
        ``(C, H, W)`` with ``H, W >= 4``.
    depth : int, default 28
        ``6n + 4``; each group has ``n`` blocks.
    widen_factor : int, default 10
        ``k``; ``num_features = 64 k``.
    dropout : float, default 0.0
        Dropout between the two convolutions of each block.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        depth: int = 28,
        widen_factor: int = 10,
        dropout: float = 0.0,
    ) -> None:
        c_in, _, _ = image_shape(f"wrn{depth}_{widen_factor}", input_shape, min_size=4)
        if depth < 10 or (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n + 4 with n >= 1, got {depth}.")
        if widen_factor < 1:
            raise ValueError(f"widen_factor must be >= 1, got {widen_factor}.")
        n = (depth - 4) // 6
        widths = (16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        super().__init__(widths[-1], num_classes)
        self.stem = nn.Conv2d(c_in, 16, 3, padding=1, bias=False)
        groups, c = [], 16
        for i, w in enumerate(widths):
            blocks = []
            for j in range(n):
                blocks.append(WideBasic(c, w, 2 if (i > 0 and j == 0) else 1, dropout))
                c = w
            groups.append(nn.Sequential(*blocks))
        self.groups = nn.Sequential(*groups)
        self.bn = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        init_weights(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Stem, three groups, final BN-ReLU, global average pool."""
        return self.pool(self.relu(self.bn(self.groups(self.stem(x))))).flatten(1)


@register_model(
    "wrn28_10",
    default_input_shape=(3, 32, 32),
    input_check=partial(image_shape, "wrn28_10", min_size=4),
    description="Wide ResNet 28-10, pre-activation, dropout 0 by default",
)
def wrn28_10(num_classes: int, input_shape: tuple[int, ...], **kwargs) -> WideResNet:
    """Build a WRN-28-10 (``dropout=`` may be passed, default 0)."""
    return WideResNet(num_classes, input_shape, depth=28, widen_factor=10, **kwargs)
