"""Batched input transforms: normalisation and the CIFAR-style training augmentation.

Every function works on a whole batch with tensor operations (no per-sample Python
loop) and on whatever device the batch lives on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["augment_crop_flip", "normalize", "to_float"]


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
