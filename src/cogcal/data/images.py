"""Image decoding shared by the CelebA and ``folder:`` loaders (PIL, resize, centre crop)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["GRAYSCALE_MODES", "IMAGE_EXTENSIONS", "pil_image", "resize_center_crop"]

#: File extensions read as images (torchvision's ``IMG_EXTENSIONS``), lower case.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

#: PIL modes holding one grey channel (``LA``: grey plus alpha, the alpha is dropped).
GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


def pil_image() -> ModuleType:
    """``PIL.Image``, imported on first use (start-up cost: about 12 ms of CPU after torch,
    which a run on arrays, such as mnist1d or a table, never needs)."""
    from PIL import Image

    return Image


def resize_center_crop(image: Any, size: int, *, mode: str = "RGB") -> np.ndarray:
    """Convert, resize (shorter side to ``size``) and centre-crop one PIL image.

    Equivalent to torchvision's ``Compose([Resize(size), CenterCrop(size)])`` on a PIL
    image with the default bilinear interpolation (PIL's ``resize``, which antialiases
    when downscaling); the longer side becomes ``int(size * long / short)`` and the crop
    offsets are ``round((side - size) / 2)``, as torchvision computes them.

    Parameters
    ----------
    image : PIL.Image.Image
        Any mode.
    size : int
        Side of the square output.
    mode : {"RGB", "L"}, default "RGB"
        Colour mode of the output (PIL's ``convert``; 16-bit grey images are first mapped
        from 0..65535 to 0..255, other modes are converted as PIL does).

    Returns
    -------
    numpy.ndarray
        ``uint8`` array of shape ``(3, size, size)`` (``"RGB"``) or ``(1, size, size)``.

    Examples
    --------
    >>> from PIL import Image
    >>> resize_center_crop(Image.new("RGB", (40, 20), (255, 0, 0)), 8).shape
    (3, 8, 8)
    >>> resize_center_crop(Image.new("L", (20, 40), 7), 8, mode="L")[0, 0, :3].tolist()
    [7, 7, 7]
    """
    if mode not in ("RGB", "L"):
        raise ValueError(f"`mode` must be 'RGB' or 'L', got {mode!r}.")
    if image.mode.startswith("I;16"):
        # 16-bit grey (e.g. 16-bit PNGs): map 0..65535 to 0..255 (PIL's convert would clip).
        arr = np.asarray(image, dtype=np.float64) / 257.0
        image = pil_image().fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), "L")
    image = image.convert(mode)
    w, h = image.size
    if w <= h:
        new_w, new_h = size, int(size * h / w)
    else:
        new_w, new_h = int(size * w / h), size
    if (new_w, new_h) != (w, h):
        image = image.resize((new_w, new_h), pil_image().Resampling.BILINEAR)
    top = int(round((new_h - size) / 2.0))
    left = int(round((new_w - size) / 2.0))
    image = image.crop((left, top, left + size, top + size))
    arr = np.array(image, dtype=np.uint8)  # a writable copy
    return np.ascontiguousarray(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1))
