"""CIFAR-style ResNets (He et al., 2016): 3x3 stride-1 stem, no max-pool.

Four stages of 64-128-256-512 base channels with strides 1-2-2-2, global average
pooling, then the linear head. Basic blocks for ``resnet18``; bottleneck blocks
(expansion 4, stride on the 3x3 convolution) for ``resnet50`` and ``resnet101``.
Projection shortcuts (1x1 convolution + BatchNorm) where the shape changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

from cogcal.models.registry import Backbone, image_shape, init_weights, register_model

__all__ = ["BasicBlock", "Bottleneck", "CifarResNet"]


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
    )


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm, ReLU after the residual sum."""

    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.shortcut = _shortcut(c_in, width, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4, BatchNorm after each."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.shortcut = _shortcut(c_in, c_out, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(Backbone):
    """ResNet for small images: 3x3 stride-1 stem, no max-pool, four stages.

    Parameters
    ----------
    block : type
        :class:`BasicBlock` or :class:`Bottleneck`.
    layers : sequence of int
        Blocks per stage, e.g. ``(2, 2, 2, 2)`` for ResNet-18.
    num_classes : int
        Number of outputs.
    input_shape : tuple of int
        ``(C, H, W)`` with ``H, W >= 8``; ``C`` sets the stem's input channels.
    widths : sequence of int, default (64, 128, 256, 512)
        Base widths of the four stages; ``num_features = widths[-1] * block.expansion``.
    name : str, default "resnet"
        Name used in error messages.
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: Sequence[int],
        num_classes: int,
        input_shape: tuple[int, ...],
        widths: Sequence[int] = (64, 128, 256, 512),
        name: str = "resnet",
    ) -> None:
        c_in, _, _ = image_shape(name, input_shape, min_size=8)
        if len(layers) != len(widths):
            raise ValueError(f"need one block count per stage ({len(widths)}), got {layers!r}.")
        super().__init__(widths[-1] * block.expansion, num_classes)
        self.stem = nn.Sequential(
            nn.Conv2d(c_in, widths[0], 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        stages, c = [], widths[0]
        for i, (n, w) in enumerate(zip(layers, widths, strict=True)):
            blocks = []
            for j in range(n):
                blocks.append(block(c, w, stride=2 if (i > 0 and j == 0) else 1))
                c = w * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        init_weights(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Stem, four stages, global average pool: ``(N, num_features)``."""
        return self.pool(self.stages(self.stem(x))).flatten(1)


@register_model(
    "resnet18",
    default_input_shape=(3, 32, 32),
    input_check=partial(image_shape, "resnet18", min_size=8),
    description="CIFAR ResNet-18, basic blocks [2, 2, 2, 2]",
)
def resnet18(num_classes: int, input_shape: tuple[int, ...], **kwargs) -> CifarResNet:
    """Build a CIFAR ResNet-18."""
    return CifarResNet(
        BasicBlock, (2, 2, 2, 2), num_classes, input_shape, name="resnet18", **kwargs
    )


@register_model(
    "resnet50",
    default_input_shape=(3, 32, 32),
    input_check=partial(image_shape, "resnet50", min_size=8),
    description="CIFAR ResNet-50, bottleneck blocks [3, 4, 6, 3]",
)
def resnet50(num_classes: int, input_shape: tuple[int, ...], **kwargs) -> CifarResNet:
    """Build a CIFAR ResNet-50."""
    return CifarResNet(
        Bottleneck, (3, 4, 6, 3), num_classes, input_shape, name="resnet50", **kwargs
    )


@register_model(
    "resnet101",
    default_input_shape=(3, 32, 32),
    input_check=partial(image_shape, "resnet101", min_size=8),
    description="CIFAR ResNet-101, bottleneck blocks [3, 4, 23, 3] (the paper's backbone)",
)
def resnet101(num_classes: int, input_shape: tuple[int, ...], **kwargs) -> CifarResNet:
    """Build a CIFAR ResNet-101."""
    return CifarResNet(
        Bottleneck, (3, 4, 23, 3), num_classes, input_shape, name="resnet101", **kwargs
    )
