"""On-the-fly image corruptions with the CIFAR-10-C parameters, and batch rotation.

:func:`corrupt` applies one of the corruptions of Hendrycks & Dietterich (2019),
"Benchmarking Neural Network Robustness to Common Corruptions and Perturbations", at
severity 1..5 with the parameters of their *CIFAR-10-C* generation (not the ImageNet-C
ones), to a batch of ``uint8`` images ``(N, C, H, W)``. It is a reimplementation from the
published parameters with numpy/scipy/PIL only; see ``docs/robustness.md`` for the list of
corruptions covered, the ones that are not (they need external assets or ImageMagick), and
where the results differ from the official files.

:func:`rotate_images` rotates a batch by a fixed angle (bilinear, zero fill), as used for
rotated SVHN.
"""

from __future__ import annotations

import difflib
import io
import math
import zlib
from collections.abc import Callable
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F

from cogcal._constraints import Integer, check
from cogcal.data.images import pil_image

__all__ = [
    "CIFAR_C_CORRUPTIONS",
    "CORRUPTIONS",
    "NOT_COVERED",
    "corrupt",
    "rotate_images",
]

#: The 19 corruptions of CIFAR-10-C / CIFAR-100-C: the 15 benchmark corruptions, then the
#: 4 extra ones (speckle_noise, gaussian_blur, spatter, saturate). File ``<name>.npy``.
CIFAR_C_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
    "speckle_noise",
    "gaussian_blur",
    "spatter",
    "saturate",
)

#: CIFAR-C corruptions that :func:`corrupt` does not generate, and why.
NOT_COVERED: dict[str, str] = {
    "motion_blur": "the official generator uses ImageMagick's motion blur (Wand)",
    "snow": "the official generator uses ImageMagick's motion blur (Wand) for the snow layer",
    "frost": "the official generator overlays crops of frost photographs shipped with it",
    "spatter": "the official generator relies on OpenCV-specific operations (not reimplemented)",
    "elastic_transform": "not reimplemented yet (needs an OpenCV-compatible affine warp)",
}

# Severity parameters of the CIFAR-10-C generation (Hendrycks & Dietterich, 2019).
_GAUSSIAN_NOISE = (0.04, 0.06, 0.08, 0.09, 0.10)
_SHOT_NOISE = (500.0, 250.0, 100.0, 75.0, 50.0)
_IMPULSE_NOISE = (0.01, 0.02, 0.03, 0.05, 0.07)
_MULTIPLICATIVE_NOISE = (0.06, 0.10, 0.12, 0.16, 0.20)  # speckle_noise: x + x * N(0, c)
_GAUSSIAN_BLUR = (0.4, 0.6, 0.7, 0.8, 1.0)
# (sigma, max_delta, iterations)
_GLASS_BLUR = ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2))
# (disk radius, alias blur sigma)
_DEFOCUS_BLUR = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1))
# Number of zoom factors 1.00, 1.01, ...: the official np.arange(1, end, 0.01) sets for
# end = 1.06, 1.11, 1.16, 1.21, 1.26 (floating-point arange yields 7, 12, 16, 21, 26 values).
_ZOOM_BLUR = (7, 12, 16, 21, 26)
# (fog strength, plasma wibble decay)
_FOG = ((0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75))
_BRIGHTNESS = (0.05, 0.1, 0.15, 0.2, 0.3)
_CONTRAST = (0.75, 0.5, 0.4, 0.3, 0.15)
# (saturation factor, saturation offset)
_SATURATE = ((0.3, 0.0), (0.1, 0.0), (1.5, 0.0), (2.0, 0.1), (2.5, 0.2))
_JPEG_QUALITY = (80, 65, 58, 50, 40)
_PIXELATE = (0.95, 0.9, 0.85, 0.75, 0.65)

# Images are processed in chunks of this many (bounds the float working memory). The
# random draws depend on it, so it is part of the reproducibility contract.
_CHUNK = 2048

Array = np.ndarray
_Fn = Callable[[Array, int, np.random.Generator], Array]


# ----------------------------------------------------------------------------- noise


def _gaussian_noise(x: Array, severity: int, rng: np.random.Generator) -> Array:
    c = _GAUSSIAN_NOISE[severity - 1]
    return x + rng.normal(0.0, c, size=x.shape).astype(np.float32)


def _shot_noise(x: Array, severity: int, rng: np.random.Generator) -> Array:
    c = _SHOT_NOISE[severity - 1]
    return (rng.poisson(x.astype(np.float64) * c) / c).astype(np.float32)


def _impulse_noise(x: Array, severity: int, rng: np.random.Generator) -> Array:
    # Salt-and-pepper on every value independently: a fraction `amount` is replaced, half
    # by 1 (salt), half by 0 (pepper).
    amount = _IMPULSE_NOISE[severity - 1]
    flipped = rng.random(x.shape) < amount
    salt = rng.random(x.shape) < 0.5
    out = x.copy()
    out[flipped & salt] = 1.0
    out[flipped & ~salt] = 0.0
    return out


def _speckle_noise(x: Array, severity: int, rng: np.random.Generator) -> Array:
    c = _MULTIPLICATIVE_NOISE[severity - 1]
    return x + x * rng.normal(0.0, c, size=x.shape).astype(np.float32)


# ----------------------------------------------------------------------------- blur


def _ndimage() -> ModuleType:
    """``scipy.ndimage``, imported on first use (start-up cost: most of a second by
    ``python -X importtime``, which ``cogcal --help`` and runs without shifts never need)."""
    import scipy.ndimage

    return scipy.ndimage


def _gauss(x: Array, sigma: float) -> Array:
    # Spatial axes only, edge pixels repeated (scikit-image's `gaussian` defaults).
    return _ndimage().gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode="nearest", truncate=4.0)


def _gaussian_blur(x: Array, severity: int, rng: np.random.Generator) -> Array:
    return _gauss(x, _GAUSSIAN_BLUR[severity - 1])


def _glass_blur(x: Array, severity: int, rng: np.random.Generator) -> Array:
    sigma, delta, iterations = _GLASS_BLUR[severity - 1]
    # The official generator quantises to uint8 (truncating) between the two blurs.
    q = (np.clip(_gauss(x, sigma), 0.0, 1.0) * 255.0).astype(np.uint8)
    n, h, w, _ = q.shape
    idx = np.arange(n)
    # Local pixel shuffling: visit pixels bottom-right to top-left, swap each with a
    # neighbour displaced by (dy, dx) in [-delta, delta - 1]^2 (an independent draw per
    # image); vectorised over the batch, sequential over pixels as in the original.
    for _ in range(iterations):
        for i in range(h - delta, delta, -1):
            for j in range(w - delta, delta, -1):
                d = rng.integers(-delta, delta, size=(2, n))
                ip, jp = i + d[0], j + d[1]
                a = q[idx, i, j].copy()
                q[idx, i, j] = q[idx, ip, jp]
                q[idx, ip, jp] = a
    return _gauss(q.astype(np.float32) / 255.0, sigma)


def _disk_kernel(radius: float, alias_blur: float) -> Array:
    # An aliased disk on a 17x17 grid, normalised, then smoothed by a 3x3 Gaussian with
    # mirrored borders; cropped to its non-zero support (exact: the rest is zero).
    r = np.arange(-8, 9, dtype=np.float64)
    xx, yy = np.meshgrid(r, r)
    disk = (xx**2 + yy**2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    g = np.exp(-(np.arange(-1, 2) ** 2) / (2.0 * alias_blur**2))
    g /= g.sum()
    nd = _ndimage()
    k = nd.correlate1d(nd.correlate1d(disk, g, axis=0, mode="mirror"), g, axis=1, mode="mirror")
    rows, cols = np.nonzero(k > 0)
    return k[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]


def _defocus_blur(x: Array, severity: int, rng: np.random.Generator) -> Array:
    radius, alias = _DEFOCUS_BLUR[severity - 1]
    k = _disk_kernel(radius, alias).astype(np.float32)
    return _ndimage().correlate(x, k[None, :, :, None], mode="mirror")


def _clipped_zoom(x: Array, factor: float) -> Array:
    # Zoom into the centre by `factor` with bilinear interpolation, keeping the size. The
    # output size is round(crop * factor) and end points map onto end points, as in
    # scipy.ndimage.zoom(order=1), which torch's align_corners=True reproduces (faster).
    _, h, w, _ = x.shape
    ch, cw = math.ceil(h / factor), math.ceil(w / factor)
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = torch.from_numpy(np.ascontiguousarray(x[:, top : top + ch, left : left + cw]))
    size = (round(ch * factor), round(cw * factor))
    z = F.interpolate(crop.permute(0, 3, 1, 2), size=size, mode="bilinear", align_corners=True)
    z = z.permute(0, 2, 3, 1).numpy()
    t, lft = (size[0] - h) // 2, (size[1] - w) // 2
    return z[:, t : t + h, lft : lft + w]


def _zoom_blur(x: Array, severity: int, rng: np.random.Generator) -> Array:
    factors = 1.0 + 0.01 * np.arange(_ZOOM_BLUR[severity - 1])
    out = np.zeros_like(x)
    for f in factors:
        out += _clipped_zoom(x, float(f))
    return (x + out) / (len(factors) + 1)


# ----------------------------------------------------------------------------- weather


def _plasma(n: int, size: int, decay: float, rng: np.random.Generator) -> Array:
    """Diamond-square fractal noise on a periodic ``size`` x ``size`` grid, in [0, 1].

    The perturbation amplitude starts at ``w * U(-w, w)`` with ``w = 100`` and ``w`` is
    divided by ``decay`` at every halving of the step (the parametrisation used by the
    CIFAR-C fog); ``n`` independent maps.
    """
    m = np.zeros((n, size, size))
    step, w = size, 100.0
    while step >= 2:
        half = step // 2
        corners = m[:, 0:size:step, 0:size:step]
        # Square step: centre of each square = mean of its 4 corners + noise.
        acc = corners + np.roll(corners, -1, axis=1)
        acc = acc + np.roll(acc, -1, axis=2)
        m[:, half:size:step, half:size:step] = acc / 4 + w * rng.uniform(-w, w, acc.shape)
        centres = m[:, half:size:step, half:size:step]
        # Diamond step: each edge midpoint = mean of its 2 corners and 2 centres + noise.
        horiz = corners + np.roll(corners, -1, axis=2) + centres + np.roll(centres, 1, axis=1)
        m[:, 0:size:step, half:size:step] = horiz / 4 + w * rng.uniform(-w, w, horiz.shape)
        vert = corners + np.roll(corners, -1, axis=1) + centres + np.roll(centres, 1, axis=2)
        m[:, half:size:step, 0:size:step] = vert / 4 + w * rng.uniform(-w, w, vert.shape)
        step = half
        w /= decay
    m -= m.min(axis=(1, 2), keepdims=True)
    m /= np.maximum(m.max(axis=(1, 2), keepdims=True), 1e-12)
    return m


def _fog(x: Array, severity: int, rng: np.random.Generator) -> Array:
    strength, decay = _FOG[severity - 1]
    n, h, w, _ = x.shape
    size = 1 << max(5, math.ceil(math.log2(max(h, w))))  # 32 for CIFAR
    fog = _plasma(n, size, decay, rng)[:, :h, :w, None].astype(np.float32)
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    return (x + strength * fog) * peak / (peak + strength)


# ----------------------------------------------------------------------------- digital


def _brightness(x: Array, severity: int, rng: np.random.Generator) -> Array:
    # HSV value + c with hue and saturation unchanged, i.e. every channel scaled by
    # V'/V (V = max over channels); black pixels become grey V'.
    c = _BRIGHTNESS[severity - 1]
    v = x.max(axis=3, keepdims=True)
    v_new = np.minimum(v + c, 1.0)
    scale = np.divide(v_new, v, out=np.zeros_like(v), where=v > 0)
    return np.where(v > 0, x * scale, v_new)


def _contrast(x: Array, severity: int, rng: np.random.Generator) -> Array:
    c = _CONTRAST[severity - 1]
    means = x.mean(axis=(1, 2), keepdims=True)
    return (x - means) * c + means


def _saturate(x: Array, severity: int, rng: np.random.Generator) -> Array:
    # HSV saturation S' = clip(a S + b) with hue and value unchanged: each channel moves
    # towards/away from V by S'/S. Grey pixels (S = 0, hue 0 = red) get (V, V(1-S'), V(1-S')).
    if x.shape[3] != 3:
        raise ValueError(f"'saturate' needs RGB images (3 channels), got {x.shape[3]}.")
    a, b = _SATURATE[severity - 1]
    v = x.max(axis=3, keepdims=True)
    lo = x.min(axis=3, keepdims=True)
    s = np.divide(v - lo, v, out=np.zeros_like(v), where=v > 0)
    s_new = np.clip(s * a + b, 0.0, 1.0)
    ratio = np.divide(s_new, s, out=np.zeros_like(s), where=s > 0)
    colour = v - (v - x) * ratio
    grey = np.concatenate([v, v * (1 - s_new), v * (1 - s_new)], axis=3)
    return np.where(s > 0, colour, grey)


def _pil_map(x: Array, fn: Callable[[object], object]) -> Array:
    q = np.rint(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)
    out = np.empty_like(q)
    image = pil_image()
    for i in range(q.shape[0]):
        img = image.fromarray(q[i, :, :, 0], "L") if q.shape[3] == 1 else image.fromarray(q[i])
        res = np.asarray(fn(img), dtype=np.uint8)
        out[i] = res.reshape(q.shape[1:])
    return out.astype(np.float32) / 255.0


def _jpeg_compression(x: Array, severity: int, rng: np.random.Generator) -> Array:
    quality = _JPEG_QUALITY[severity - 1]

    def jpeg(img: object) -> object:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)  # type: ignore[attr-defined]
        buf.seek(0)
        with pil_image().open(buf) as out:
            out.load()
            return out.copy()

    return _pil_map(x, jpeg)


def _pixelate(x: Array, severity: int, rng: np.random.Generator) -> Array:
    c = _PIXELATE[severity - 1]
    h, w = x.shape[1:3]
    small = (int(w * c), int(h * c))
    box = pil_image().Resampling.BOX

    def pixelate(img: object) -> object:
        down = img.resize(small, box)  # type: ignore[attr-defined]
        return down.resize((w, h), box)

    return _pil_map(x, pixelate)


_FUNCS: dict[str, _Fn] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "speckle_noise": _speckle_noise,
    "gaussian_blur": _gaussian_blur,
    "glass_blur": _glass_blur,
    "defocus_blur": _defocus_blur,
    "zoom_blur": _zoom_blur,
    "fog": _fog,
    "brightness": _brightness,
    "contrast": _contrast,
    "saturate": _saturate,
    "jpeg_compression": _jpeg_compression,
    "pixelate": _pixelate,
}

#: Corruptions :func:`corrupt` generates (a subset of :data:`CIFAR_C_CORRUPTIONS`).
CORRUPTIONS: tuple[str, ...] = tuple(n for n in CIFAR_C_CORRUPTIONS if n in _FUNCS)


#: The severity of a CIFAR-C corruption.
SEVERITY = Integer(1, 5)


def _check_severity(severity: object) -> int:
    return check(severity, SEVERITY, "severity")


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"corruption name must be a string, got {type(name).__name__}.")
    if name in _FUNCS:
        return name
    if name in NOT_COVERED:
        raise ValueError(
            f"corruption {name!r} is not generated on the fly: {NOT_COVERED[name]}. "
            f"Use the official CIFAR-C files for it; covered: {', '.join(CORRUPTIONS)}."
        )
    close = difflib.get_close_matches(name, CORRUPTIONS, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown corruption {name!r}; covered: {', '.join(CORRUPTIONS)}.{hint}")


def corrupt(
    x: torch.Tensor | np.ndarray, name: str, severity: int, *, seed: int
) -> torch.Tensor | np.ndarray:
    """Corrupt a batch of ``uint8`` images with a CIFAR-10-C corruption.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray
        ``uint8`` images ``(N, C, H, W)`` with ``C`` = 1 or 3 (the stored format of
        cogcal's image datasets).
    name : str
        One of :data:`CORRUPTIONS`.
    severity : int
        1 (mildest) .. 5 (strongest), with the CIFAR-10-C parameters.
    seed : int
        Seed of the random draws. The result is a deterministic function of ``x``,
        ``name``, ``severity`` and ``seed`` (the streams of different names/severities
        are independent).

    Returns
    -------
    torch.Tensor or numpy.ndarray
        The corrupted ``uint8`` batch, same type, shape (and device) as ``x``; values are
        rounded to the nearest integer.

    Raises
    ------
    ValueError
        Unknown or not-covered name, severity outside 1..5, or ``x`` not a ``uint8``
        ``(N, C, H, W)`` batch.

    Examples
    --------
    >>> import numpy as np
    >>> from cogcal.data.corruptions import corrupt
    >>> x = np.full((2, 3, 32, 32), 128, dtype=np.uint8)
    >>> y = corrupt(x, "gaussian_noise", 3, seed=0)
    >>> y.shape, y.dtype, bool((y != x).any())
    ((2, 3, 32, 32), dtype('uint8'), True)
    """
    name = _check_name(name)
    severity = _check_severity(severity)
    device = None
    if isinstance(x, torch.Tensor):
        device = x.device
        arr = x.detach().cpu().numpy()
    elif isinstance(x, np.ndarray):
        arr = x
    else:
        raise ValueError(f"`x` must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}.")
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[1] not in (1, 3):
        raise ValueError(
            "`x` must be uint8 images of shape (N, C, H, W) with C = 1 or 3, got "
            f"{arr.dtype} {tuple(arr.shape)}; convert float images with "
            "(x * 255).round().clip(0, 255) first."
        )
    fn = _FUNCS[name]
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode()), severity])
    out = np.empty_like(arr)
    for start in range(0, arr.shape[0], _CHUNK):
        chunk = arr[start : start + _CHUNK].transpose(0, 2, 3, 1).astype(np.float32) / 255.0
        res = fn(chunk, severity, rng)
        res = np.rint(np.clip(res, 0.0, 1.0) * 255.0).astype(np.uint8)
        out[start : start + _CHUNK] = res.transpose(0, 3, 1, 2)
    if device is not None:
        return torch.from_numpy(out).to(device)
    return out


# ----------------------------------------------------------------------------- rotation


def rotate_images(x: torch.Tensor, degrees: float, *, chunk: int = 4096) -> torch.Tensor:
    """Rotate a batch of images counter-clockwise about their centre (bilinear, fill 0).

    The direction and pixel-centre convention match
    ``torchvision.transforms.functional.rotate(x, degrees)``; pixels that come from
    outside the image are 0. ``uint8`` inputs are rotated in float and rounded back to
    ``uint8``; float inputs keep their dtype. Multiples of 90 degrees are exact.

    Parameters
    ----------
    x : torch.Tensor
        Images ``(N, C, H, W)``, ``uint8`` or floating point.
    degrees : float
        Rotation angle in degrees (counter-clockwise).
    chunk : int, default 4096
        Images rotated at once (bounds the working memory).

    Returns
    -------
    torch.Tensor
        The rotated batch, same dtype, shape and device as ``x``.
    """
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise ValueError("`x` must be a torch.Tensor of shape (N, C, H, W).")
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise ValueError(f"`x` must be uint8 or floating point, got {x.dtype}.")
    angle = math.radians(float(degrees))
    c, s = math.cos(angle), math.sin(angle)
    # Snap the exact multiples of 90 degrees so that they permute pixels exactly.
    c, s = (
        (round(c) if abs(c - round(c)) < 1e-12 else c),
        (round(s) if abs(s - round(s)) < 1e-12 else s),
    )
    h, w = x.shape[2], x.shape[3]
    # Output pixel (u, v) (normalised coords, y down) samples input R^-1 (u, v), with
    # the aspect ratio accounted for so that the rotation is rigid in pixel units.
    theta = torch.tensor([[c, -s * h / w, 0.0], [s * w / h, c, 0.0]], dtype=torch.float32)
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], chunk):
        xb = x[start : start + chunk]
        xf = xb.float() if xb.dtype == torch.uint8 else xb.to(torch.float32)
        grid = F.affine_grid(
            theta.to(xf.device).expand(xf.shape[0], 2, 3), list(xf.shape), align_corners=False
        )
        r = F.grid_sample(xf, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        if x.dtype == torch.uint8:
            r = r.round().clamp_(0, 255)
        out[start : start + chunk] = r.to(x.dtype)
    return out
