"""Batched input transforms: normalisation and the CIFAR-style training augmentation.

Every function works on a whole batch with tensor operations (no per-sample Python
loop) and on whatever device the batch lives on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["Preprocess", "augment_crop_flip", "normalize", "to_float"]


def to_float(x: torch.Tensor) -> torch.Tensor:
    """Return ``x`` as float32; ``uint8`` images are scaled from [0, 255] to [0, 1]."""
    if x.dtype == torch.uint8:
        return x.to(torch.float32).div_(255.0)
    if not x.is_floating_point():
        raise ValueError(f"inputs must be uint8 images or floating tensors, got dtype {x.dtype}.")
    return x.to(torch.float32)


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Scale a batch to float32 and standardise it per channel.

    Parameters
    ----------
    x : torch.Tensor
        Batch ``(B, C, ...)`` (``len(mean) == C``) or any batch when ``mean`` has one value.
    mean, std : sequence of float
        Per-channel statistics (on the [0, 1] scale for ``uint8`` input).

    Returns
    -------
    torch.Tensor
        ``(to_float(x) - mean) / std`` as float32.
    """
    xf = to_float(x)
    if len(mean) == 1:
        return (xf - float(mean[0])) / float(std[0])
    if xf.ndim < 2 or xf.shape[1] != len(mean):
        raise ValueError(
            f"batch of shape {tuple(xf.shape)} does not have {len(mean)} channels on axis 1."
        )
    view = (1, len(mean)) + (1,) * (xf.ndim - 2)
    m = torch.tensor(mean, dtype=torch.float32, device=xf.device).view(view)
    s = torch.tensor(std, dtype=torch.float32, device=xf.device).view(view)
    return (xf - m) / s


def augment_crop_flip(
    x: torch.Tensor,
    *,
    padding: int = 4,
    flip: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random crop of the zero-padded images plus random horizontal flip, batched.

    Equivalent to torchvision's ``RandomCrop(H, padding=padding)`` followed by
    ``RandomHorizontalFlip()`` applied independently to every image, done with one
    gather over the whole batch.

    Parameters
    ----------
    x : torch.Tensor
        Images ``(B, C, H, W)`` of any dtype (apply it before normalisation, so that the
        padding is black as in torchvision).
    padding : int, default 4
        Zero padding on each side; crop offsets are uniform in ``[0, 2 * padding]``.
    flip : bool, default True
        Also flip each image horizontally with probability 1/2.
    generator : torch.Generator, optional
        Source of randomness (the random numbers are drawn on the generator's device);
        the global torch RNG if omitted. The result is deterministic given the generator
        state.

    Returns
    -------
    torch.Tensor
        Augmented images, same shape, dtype and device as ``x``.
    """
    if x.ndim != 4:
        raise ValueError(f"expected images of shape (B, C, H, W), got {tuple(x.shape)}.")
    b, c, h, w = x.shape
    if b == 0:
        return x
    gen_device = generator.device if generator is not None else torch.device("cpu")
    offsets = torch.randint(0, 2 * padding + 1, (2, b), generator=generator, device=gen_device)
    flips = torch.rand(b, generator=generator, device=gen_device) < 0.5
    offsets, flips = offsets.to(x.device), flips.to(x.device)

    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    ar_h = torch.arange(h, device=x.device)
    ar_w = torch.arange(w, device=x.device)
    rows = offsets[0, :, None] + ar_h  # (B, H)
    cols_fwd = ar_w if not flip else torch.where(flips[:, None], ar_w.flip(0), ar_w)
    cols = offsets[1, :, None] + cols_fwd  # (B, W)
    bi = torch.arange(b, device=x.device)[:, None, None, None]
    ci = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]


class Preprocess(torch.nn.Module):
    """A run's input preprocessing as a module: raw stored inputs in, model inputs out.

    What :meth:`cogcal.data.Dataset.transform` does at evaluation time, held as buffers so
    that it travels with an exported model (and into ONNX): the inputs are cast to float32,
    multiplied by ``scale`` (``1/255`` for datasets that store ``uint8`` pixels), resized
    when they are images of another size (shorter side to ``image_size`` with antialiased
    bilinear interpolation, then the centre crop; the run's own images were resized once by
    PIL when loaded, which this matches up to interpolation rounding), and standardised with
    the run's ``mean`` and ``std`` (per channel, per column, or one value for all entries).

    Parameters
    ----------
    mean, std : sequence of float
        The run's statistics: one value, or one per channel (axis 1 of the inputs).
    input_shape : sequence of int
        Per-sample shape of the model inputs, e.g. ``(13,)`` or ``(3, 32, 32)``.
    scale : float, default 1.0
        Multiplies the raw inputs first (``1/255``: pixels stored as 0..255).
    image_size : int, optional
        Side of the square images the run trained on; other sizes are resized.

    Examples
    --------
    >>> import torch
    >>> pre = Preprocess(mean=(1.0, 2.0), std=(2.0, 4.0), input_shape=(2,))
    >>> pre(torch.tensor([[3.0, 6.0]]))
    tensor([[1., 1.]])
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        input_shape: Sequence[int],
        scale: float = 1.0,
        image_size: int | None = None,
    ) -> None:
        super().__init__()
        shape = tuple(int(s) for s in input_shape)
        if len(mean) != len(std) or not mean:
            raise ValueError("`mean` and `std` must be non-empty and of the same length.")
        if any(not float(s) > 0 for s in std):
            raise ValueError(f"`std` must be positive, got {tuple(std)}.")
        view = (1,) if len(mean) == 1 else (1, len(mean)) + (1,) * (len(shape) - 1)
        if len(mean) > 1 and (not shape or shape[0] != len(mean)):
            raise ValueError(
                f"{len(mean)} mean/std values do not fit inputs of shape {shape} (one per "
                "channel on the first axis)."
            )
        self._stats = ([float(v) for v in mean], [float(v) for v in std])  # as given (float64)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(view))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(view))
        self.input_shape = shape
        self.scale = float(scale)
        self.image_size = None if image_size is None else int(image_size)

    def record(self) -> dict[str, object]:
        """A JSON-serialisable description (:meth:`from_record` rebuilds the module)."""
        return {
            "input_shape": list(self.input_shape),
            "scale": self.scale,
            "image_size": self.image_size,
            "mean": list(self._stats[0]),
            "std": list(self._stats[1]),
        }

    @classmethod
    def from_record(cls, record: dict) -> Preprocess:
        """The module described by :meth:`record` (as stored in a run's ``config.json``)."""
        return cls(
            record["mean"],
            record["std"],
            input_shape=record["input_shape"],
            scale=record.get("scale", 1.0),
            image_size=record.get("image_size"),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = tuple(x.shape[1:])
        other_size = x.ndim == 4 and shape[1:] != self.input_shape[1:]
        if self.image_size is not None and other_size and shape[0] == self.input_shape[0]:
            x = _resize_center_crop(x.to(torch.float32), self.image_size)
            shape = tuple(x.shape[1:])
        if shape != self.input_shape:
            raise ValueError(
                f"inputs of shape {tuple(x.shape)}; the run's model takes (N, "
                f"{', '.join(map(str, self.input_shape))})"
                + (" images: check the number of channels" if self.image_size else "")
                + "."
            )
        x = x.to(torch.float32)
        if self.scale != 1.0:
            x = x * self.scale
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        size = f", image_size={self.image_size}" if self.image_size else ""
        return f"input_shape={self.input_shape}, scale={self.scale:g}{size}"


def _resize_center_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """Shorter side to ``size`` (antialiased bilinear), then the centre ``size x size`` crop."""
    h, w = int(x.shape[-2]), int(x.shape[-1])
    new_h, new_w = (int(size * h / w), size) if w <= h else (size, int(size * w / h))
    x = torch.nn.functional.interpolate(
        x, size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True
    )
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return x[..., top : top + size, left : left + size]
