"""CPU-sized backbones: ``mlp`` and ``cnn1d`` for mnist1d, ``cnn`` for digits and small images."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from cogcal.models.registry import (
    Backbone,
    check_batch,
    image_shape,
    init_weights,
    register_model,
    sequence_shape,
)

__all__ = ["MLP", "CNN1d", "SmallCNN"]


class MLP(Backbone):
    """Multi-layer perceptron on the flattened input.

    Parameters
    ----------
    num_classes : int
        Number of outputs.
    input_shape : tuple of int
        Per-sample input shape; any shape, flattened to ``math.prod(input_shape)`` features.
    hidden : sequence of int, default (256, 256)
        Widths of the hidden layers (Linear then ReLU); ``num_features = hidden[-1]``.
    dropout : float, default 0.0
        Dropout after each hidden activation.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        hidden: Sequence[int] = (256, 256),
        dropout: float = 0.0,
    ) -> None:
        widths = [math.prod(input_shape), *(int(h) for h in hidden)]
        if len(widths) < 2 or min(widths[1:]) < 1:
            raise ValueError(f"mlp needs at least one hidden layer of width >= 1, got {hidden!r}.")
        super().__init__(widths[-1], num_classes)
        layers: list[nn.Module] = []
        for d_in, d_out in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Linear(d_in, d_out), nn.ReLU(inplace=True)]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
        self.features = nn.Sequential(*layers)
        self._in_features = widths[0]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Flatten each sample and apply the hidden layers."""
        x = x.flatten(1)
        if x.shape[1] != self._in_features:
            raise ValueError(
                f"mlp was built for {self._in_features} input features per sample, got a "
                f"batch of shape {tuple(x.shape)} after flattening."
            )
        return self.features(x)


def _conv1d_block(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv1d(c_in, c_out, kernel_size=5, stride=stride, padding=2, bias=False),
        nn.BatchNorm1d(c_out),
        nn.ReLU(inplace=True),
    )


class CNN1d(Backbone):
    """Small 1-D CNN over a sequence (mnist1d: 40 steps, one channel).

    Three convolutions (kernel 5, channels 32-64-64, strides 1-2-2, BatchNorm, ReLU);
    the final feature map is flattened (position matters in mnist1d), so
    ``num_features = 64 * ceil(L / 4)`` (640 for ``L = 40``).

    Parameters
    ----------
    num_classes : int
        Number of outputs.
    input_shape : tuple of int
        ``(L,)`` or ``(C, L)``. With ``(L,)`` or ``C == 1`` the model takes
        batches of shape ``(N, L)`` as well as ``(N, 1, L)``.
    channels : sequence of int, default (32, 64, 64)
        Output channels of the three convolutions.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        channels: Sequence[int] = (32, 64, 64),
    ) -> None:
        c_in, length = sequence_shape("cnn1d", input_shape)
        strides = (1, 2, 2)
        if len(channels) != len(strides):
            raise ValueError(f"cnn1d takes {len(strides)} channel counts, got {channels!r}.")
        out_len = length
        for s in strides:
            out_len = (out_len - 1) // s + 1
        super().__init__(int(channels[-1]) * out_len, num_classes)
        blocks, c = [], c_in
        for c_out, s in zip(channels, strides, strict=True):
            blocks.append(_conv1d_block(c, int(c_out), s))
            c = int(c_out)
        self.features = nn.Sequential(*blocks)
        self._seq_shape = (c_in, length)
        init_weights(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve and flatten; ``x`` is ``(N, L)`` (one channel) or ``(N, C, L)``."""
        if x.ndim == 2 and self._seq_shape[0] == 1:
            x = x.unsqueeze(1)
        check_batch("cnn1d", x, self._seq_shape)
        return self.features(x).flatten(1)


def _conv2d_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class SmallCNN(Backbone):
    """Small 2-D CNN for small images (digits 1x8x8; also 3x32x32, 1x28x28, 3x64x64, ...).

    conv32 - conv64 - maxpool2 - conv128 - global average pool (3x3 convolutions with
    BatchNorm and ReLU), so ``num_features = 128`` whatever the image size, and any image
    of at least 2x2 pixels works (the default model of ``folder:`` datasets).

    Parameters
    ----------
    num_classes : int
        Number of outputs.
    input_shape : tuple of int
        ``(C, H, W)``, or ``(H, W)`` for one channel (batches then may be ``(N, H, W)``).
    channels : sequence of int, default (32, 64, 128)
        Output channels of the three convolutions.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, ...],
        channels: Sequence[int] = (32, 64, 128),
    ) -> None:
        shape = (1, *input_shape) if len(input_shape) == 2 else input_shape
        c_in, _, _ = image_shape("cnn", shape, min_size=2)
        if len(channels) != 3:
            raise ValueError(f"cnn takes 3 channel counts, got {channels!r}.")
        c1, c2, c3 = (int(c) for c in channels)
        super().__init__(c3, num_classes)
        self.features = nn.Sequential(
            _conv2d_block(c_in, c1),
            _conv2d_block(c1, c2),
            nn.MaxPool2d(2),
            _conv2d_block(c2, c3),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(1),
        )
        self._one_channel_2d = len(input_shape) == 2
        self._channels = c_in
        init_weights(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve and globally average-pool; ``x`` is ``(N, C, H, W)``."""
        if x.ndim == 3 and self._one_channel_2d:
            x = x.unsqueeze(1)
        if x.ndim != 4 or x.shape[1] != self._channels:
            raise ValueError(
                f"cnn was built for images of shape (N, {self._channels}, H, W), got a batch "
                f"of shape {tuple(x.shape)}."
            )
        return self.features(x)


@register_model(
    "mlp",
    default_input_shape=(40,),
    description="MLP 2x256 hidden, ReLU (mnist1d); flattens any input",
)
def mlp(num_classes: int, input_shape: tuple[int, ...], **kwargs) -> MLP:
    """Build :class:`MLP`."""
    return MLP(num_classes, input_shape, **kwargs)


def _cnn_input(shape: tuple[int, ...]) -> None:
    image_shape("cnn", (1, *shape) if len(shape) == 2 else shape, min_size=2)


def _cnn1d_input(shape: tuple[int, ...]) -> None:
    sequence_shape("cnn1d", shape)


@register_model(
    "cnn1d",
    default_input_shape=(40,),
    input_check=_cnn1d_input,
    description="1-D CNN, 3 convs (32-64-64, kernel 5), flattened (mnist1d)",
)
def cnn1d(num_classes: int, input_shape: tuple[int, ...], **kwargs) -> CNN1d:
    """Build :class:`CNN1d`."""
    return CNN1d(num_classes, input_shape, **kwargs)


@register_model(
    "cnn",
    default_input_shape=(1, 8, 8),
    input_check=_cnn_input,
    description="2-D CNN, 3 convs (32-64-128), global average pool (digits)",
)
def cnn(num_classes: int, input_shape: tuple[int, ...], **kwargs) -> SmallCNN:
    """Build :class:`SmallCNN`."""
    return SmallCNN(num_classes, input_shape, **kwargs)
