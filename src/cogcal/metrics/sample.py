"""Metrics that need every sample at once: the equal-mass ``adaece_15``, the smooth ECE
``smece``, ``aurc`` and the bootstrap interval of ``ece_15``."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from cogcal.metrics._inputs import _check_task_names
from cogcal.metrics.binning import _finish, _hist, _width_bin

#: Bins of ``adaece_15``, ``cwece_15`` and of the bootstrap interval of ``ece_15``.
_FIXED_BINS = 15
#: Elements of one (bootstrap replicates x samples) weight matrix of the bootstrap.
_BOOT_ELEMS = 1 << 22


def _run_means(srt: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` (n, T) with each value replaced by its mean over its run of equal ``srt``.

    ``srt`` is sorted along dim 0 (either direction) and ``x`` is aligned with it; a run
    is a maximal block of equal values in one column.
    """
    n, t = srt.shape
    new = torch.ones_like(srt, dtype=torch.bool)
    new[1:] = srt[1:] != srt[:-1]  # row 0 starts a run in every column
    ids = new.T.reshape(-1).cumsum(0) - 1  # run ids, column after column
    size = int(ids[-1]) + 1
    sums = torch.bincount(ids, weights=x.T.reshape(-1).double(), minlength=size)
    counts = torch.bincount(ids, minlength=size).double()
    return (sums / counts)[ids].view(t, n).T


def _adaptive_ece(conf: torch.Tensor, hit: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-mass ECE (``adaece_B``) of each column of (n, T) confidences and hits.

    The sorted confidences are cut into ``n_bins`` consecutive groups with the sizes of
    ``numpy.array_split`` (the first ``n mod B`` groups one larger); a run of tied
    confidences cut by a group boundary gives each group its share of the run's hits.
    """
    n, t = conf.shape
    srt, order = conf.double().sort(0)
    h = _run_means(srt, hit.double().gather(0, order))
    q, r = divmod(n, n_bins)
    i = torch.arange(n, device=conf.device)
    big = (q + 1) * r  # positions in the r larger groups
    b = torch.where(i < big, i // (q + 1), r + (i - big) // max(q, 1))
    idx = b[:, None] + torch.arange(t, device=conf.device)[None, :] * n_bins
    resid = _hist(idx, h - srt, t * n_bins).view(t, n_bins)  # sum of (hit - conf) per group
    return resid.abs().sum(-1) / n


def _aurc(conf: torch.Tensor, hit: torch.Tensor) -> torch.Tensor:
    """Area under the risk-coverage curve of each column (ties broken in expectation)."""
    n = conf.shape[0]
    srt, order = conf.double().sort(0, descending=True)
    err = _run_means(srt, 1.0 - hit.double().gather(0, order))
    cover = torch.arange(1, n + 1, dtype=torch.float64, device=conf.device)[:, None]
    return (err.cumsum(0) / cover).mean(0)


def _reflected_spectrum(grid: np.ndarray) -> tuple[np.ndarray, int]:
    """The spectrum of the rows of ``grid`` (values on ``m`` points of [0, 1]) mirrored at
    both ends, and its FFT length: the part of :func:`_reflected_smooth` that does not
    depend on the kernel width, computed once per grid."""
    m = grid.shape[-1]
    ext = np.concatenate([grid[:, :0:-1], grid, grid[:, -2::-1]], axis=1)  # 3m - 2
    size = 1 << (ext.shape[1] + m - 2).bit_length()
    return np.fft.rfft(ext, size), size


@functools.lru_cache(maxsize=128)  # 128 x 33 kB (m = 1001)
def _gaussian_spectrum(m: int, size: int, sigma: float) -> np.ndarray:
    """The spectrum of the Gaussian of width ``sigma`` sampled on the offsets of ``m`` grid
    points within ``[-1/2, 1/2]``; cached: the bisections of successive sets (the 20 shift
    sets of a run) mostly visit the same widths."""
    t = np.linspace(0.0, 1.0, m)
    ker = np.exp(-((t - 0.5) ** 2) / (2 * sigma**2)) / (math.sqrt(2 * math.pi) * sigma)
    out = np.fft.rfft(ker, size)
    out.flags.writeable = False
    return out


def _reflected_smooth(spectrum: tuple[np.ndarray, int], m: int, sigma: float) -> np.ndarray:
    """Rows of a grid (values on ``m`` points of [0, 1]) convolved with a reflected Gaussian.

    The kernel is the Gaussian of width ``sigma`` sampled on the grid's offsets within
    ``[-1/2, 1/2]`` (``m`` is odd), the rows are mirrored at both ends, and the ``m``
    central outputs of the convolution are kept (relplot's ``ReflectedGaussianKernel``),
    computed by FFT from the mirrored rows' ``spectrum`` (:func:`_reflected_spectrum`).
    """
    ext, size = spectrum
    full = np.fft.irfft(ext * _gaussian_spectrum(m, size, sigma), size)
    start = m - 1 + m // 2  # 'valid' starts at m - 1; relplot keeps [m // 2, m // 2 + m)
    return full[:, start : start + m]


@functools.lru_cache(maxsize=64)
def _interpolation(m: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid index ``i`` and weights ``1 - w``, ``w`` of ``n`` evenly spaced points of [0, 1]
    between grid points ``i`` and ``i + 1`` of an ``m``-point grid (read only: cached)."""
    te = np.linspace(0.0, 1.0, n)
    inds = np.clip((te * (m - 1)).astype(np.int64), 0, m - 2)
    w = (te - inds * (1 / (m - 1))) / (1 / (m - 1))
    out = (inds, 1 - w, w)
    for a in out:
        a.flags.writeable = False
    return out


def _smooth_ece_1d(f: np.ndarray, resid: np.ndarray) -> float:
    """smECE of confidences ``f`` with residuals ``f - y`` (relplot's ``smECE``, see Notes)."""
    spectra: dict[int, tuple[np.ndarray, int]] = {}
    values: dict[float, float] = {}

    def rounded(m: int) -> tuple[np.ndarray, int]:
        # mass and residual of each sample shared linearly between its two grid points;
        # the grid's spectrum serves every sigma of this m (one grid for sigma >= 0.01)
        if m not in spectra:
            pos = f * (m - 1)
            i = np.clip(pos.astype(np.int64), 0, m - 2)
            frac = pos - i
            grid = np.stack(
                [
                    np.bincount(i, resid * (1 - frac), m) + np.bincount(i + 1, resid * frac, m),
                    np.bincount(i, 1 - frac, m) + np.bincount(i + 1, frac, m),
                ]
            )
            spectra[m] = _reflected_spectrum(grid)
        return spectra[m]

    def at(sigma: float) -> float:
        if sigma not in values:
            m = max(2000, round(20 / sigma)) // 2 + 1
            smooth = _reflected_smooth(rounded(m), m, sigma)
            inds, w0, w1 = _interpolation(m, max(round(10 / sigma), 200))
            ys, dens = smooth[:, inds] * w0 + smooth[:, inds + 1] * w1
            dens = dens + 1e-4
            values[sigma] = float(np.sum(np.abs(ys / dens) * dens) / np.sum(dens))
        return values[sigma]

    def below_fixed_point(sigma: float) -> bool:
        return sigma < 1e-3 or sigma < at(sigma)

    if below_fixed_point(1.0):
        return at(1.0)
    hi, lo = 1.0, 0.0
    for _ in range(10):  # bisection: sigma* within 2**-10
        mid = (hi + lo) / 2
        if below_fixed_point(mid):
            lo = mid
        else:
            hi = mid
    return at(hi)


def _smece(conf: torch.Tensor, hit: torch.Tensor) -> torch.Tensor:
    """smECE of each column of (n, T) confidences and hits."""
    f = conf.detach().cpu().double().numpy()
    resid = f - hit.detach().cpu().double().numpy()
    vals = [_smooth_ece_1d(f[:, j], resid[:, j]) for j in range(f.shape[1])]
    return torch.tensor(vals, dtype=torch.float64)


def _ece_bootstrap(
    conf: torch.Tensor, hit: torch.Tensor, n_bins: int, n_boot: int, seed: int
) -> np.ndarray:
    """ECE of ``n_boot`` bootstrap resamples of the rows of (n, T) values: (n_boot, T).

    Each resample draws n rows with replacement (the same rows for every task) from
    ``numpy.random.default_rng(seed)``; a chunk of resamples is a matrix of draw counts
    ``W`` (resamples x n), and the per-bin sums of ``hit - conf`` are ``W @ F`` with ``F``
    the (n, B) residuals placed in their bins (ECE = sum_b |sum_{i in b} (hit_i -
    conf_i)| / n).
    """
    c = conf.detach().cpu().double()
    n, t = c.shape
    bins = _width_bin(c, n_bins).numpy()
    resid = (hit.detach().cpu().double() - c).numpy()
    rng = np.random.default_rng(seed)
    rows = np.arange(n)
    out = np.empty((n_boot, t))
    step = max(1, _BOOT_ELEMS // n)
    for start in range(0, n_boot, step):
        cc = min(step, n_boot - start)
        draws = rng.integers(0, n, size=(cc, n)) + (np.arange(cc) * n)[:, None]
        weights = np.bincount(draws.ravel(), minlength=cc * n).reshape(cc, n).astype(np.float64)
        for j in range(t):
            feats = np.zeros((n, n_bins))
            feats[rows, bins[:, j]] = resid[:, j]
            out[start : start + cc, j] = np.abs(weights @ feats).sum(1) / n
    return out


def _sample_metrics(
    samples: dict[str, torch.Tensor],
    task: str,
    task_names: list[str] | None,
) -> dict[str, float]:
    """``adaece_15``, ``smece`` and ``aurc`` (per task for multilabel) from the samples."""
    conf = samples["conf"].detach().cpu().double()
    hit = samples["correct"].detach().cpu()
    per = {
        f"adaece_{_FIXED_BINS}": _adaptive_ece(conf, hit, _FIXED_BINS),
        "smece": _smece(conf, hit),
        "aurc": _aurc(conf, hit),
    }
    return _finish(per, task, task_names, conf.shape[1])


def _interval_keys(
    samples: dict[str, torch.Tensor],
    task: str,
    task_names: list[str] | None,
    *,
    level: float,
    n_boot: int,
    seed: int,
) -> dict[str, float]:
    """``ece_15_low`` / ``ece_15_high`` (and per task for multilabel): percentile bootstrap."""
    boot = _ece_bootstrap(samples["conf"], samples["correct"], _FIXED_BINS, n_boot, seed)
    qs = [(1 - level) / 2, (1 + level) / 2]
    lo, hi = np.quantile(boot.mean(1), qs)  # the plain key: the mean over tasks
    key = f"ece_{_FIXED_BINS}"
    out = {f"{key}_low": float(lo), f"{key}_high": float(hi)}
    if task == "multilabel":
        names = task_names if task_names is not None else _check_task_names(None, boot.shape[1])
        for end, vals in zip(("low", "high"), np.quantile(boot, qs, axis=0), strict=True):
            for name, val in zip(names, vals.tolist(), strict=True):
                out[f"{key}_{end}/{name}"] = float(val)
    return out
