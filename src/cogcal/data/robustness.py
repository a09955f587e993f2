"""OOD sets and covariate-shift sets for every cogcal dataset (docs/method.md section 4).

- :func:`ood_sets`: inputs of other datasets, in the in-distribution dataset's stored
  format (so that ``dataset.transform`` normalises them with the ID statistics).
- :func:`shift_sets`: labelled test sets under covariate shift, per condition and
  severity 1..5: CIFAR-10-C / CIFAR-100-C read from the official files (or generated on
  the fly with :mod:`cogcal.data.corruptions`), rotated SVHN, and documented analogues
  for the CPU suites (mnist1d generator parameters, digits corruptions/rotations).

Sets whose files are missing are returned in a second dict, condition -> reason (a ``str``
whose ``cli_message`` attribute holds the command-line form), unless ``download=True``
fetches them first (:mod:`cogcal.data.downloads`: SVHN 235 MiB, CIFAR-10 163 MiB,
CIFAR-100 161 MiB, CIFAR-10-C / CIFAR-100-C 2.7 GiB each). See ``docs/robustness.md``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cogcal._constraints import COUNT
from cogcal._io import save_npz
from cogcal.data import downloads as _downloads
from cogcal.data import tabular as _tabular
from cogcal.data import vision as _vision
from cogcal.data.base import (
    Dataset,
    DatasetCorruptError,
    DatasetNotFoundError,
    Split,
    missing_files_error,
)
from cogcal.data.corruptions import (
    CIFAR_C_CORRUPTIONS,
    CORRUPTIONS,
    NOT_COVERED,
    _ndimage,
    corrupt,
    rotate_images,
)

__all__ = [
    "CIFAR_C_DIRS",
    "DIGITS_SHIFTS",
    "MNIST1D_SHIFTS",
    "MNIST1D_SHIFT_SAMPLES",
    "OOD_PAIRS",
    "ROBUSTNESS_DATASETS",
    "ROTATION_DEGREES",
    "SHIFT_SEED",
    "ood_sets",
    "shift_conditions",
    "shift_sets",
]

#: Seed of every random draw of the OOD/shift sets (generated samples, corruptions,
#: subsampling). Differs from the mnist1d training seed (42) and the split seed.
SHIFT_SEED = 7_193

#: OOD datasets per image dataset (docs/method.md section 4); their *test* splits are used.
OOD_PAIRS: dict[str, tuple[str, ...]] = {
    "cifar10": ("svhn", "cifar100"),
    "cifar100": ("svhn", "cifar10"),
    "svhn": ("cifar10", "cifar100"),
}

#: Directory of the official corrupted test sets under the data root.
CIFAR_C_DIRS = {"cifar10": "CIFAR-10-C", "cifar100": "CIFAR-100-C"}

#: Rotated SVHN (severities 1..5) and the ``rotation`` condition of digits, in degrees.
ROTATION_DEGREES = (10.0, 45.0, 90.0, 135.0, 180.0)

#: mnist1d covariate shift: condition -> (generator argument, values at severity 1..5).
#: Training data uses iid_noise_scale 0.02, corr_noise_scale 0.25, shear_scale 0.75,
#: max_translation 48 (MNIST1D_DEFAULT_ARGS).
MNIST1D_SHIFTS: dict[str, tuple[str, tuple[float, ...]]] = {
    "iid_noise": ("iid_noise_scale", (0.05, 0.1, 0.15, 0.2, 0.3)),
    "corr_noise": ("corr_noise_scale", (0.5, 0.75, 1.0, 1.5, 2.0)),
    "shear": ("shear_scale", (1.25, 1.75, 2.5, 3.25, 4.0)),
    "translation": ("max_translation", (52, 56, 62, 67, 72)),
}

#: Samples generated per mnist1d shift severity (unless ``max_per_severity`` is smaller).
MNIST1D_SHIFT_SAMPLES = 2_000

#: digits covariate shift: condition -> values at severity 1..5 (pixel values 0..16).
DIGITS_SHIFTS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (1.0, 2.0, 3.0, 4.5, 6.0),  # noise std, in pixel units (0..16)
    "gaussian_blur": (0.4, 0.6, 0.8, 1.0, 1.3),  # Gaussian sigma in pixels, zero border
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # (x - mean) * c + mean, as CIFAR-C
    "rotation": ROTATION_DEGREES,  # degrees counter-clockwise, bilinear, fill 0
}

#: OOD set names of the CPU suites.
CPU_OOD = {
    "mnist1d": ("mnist1d-shuffled", "noise"),
    "digits": ("mnist1d-rendered", "digits-shuffled"),
}

#: Datasets :func:`ood_sets` and :func:`shift_sets` know.
ROBUSTNESS_DATASETS = ("cifar10", "cifar100", "svhn", "mnist1d", "digits")

# Bump when the content of the mnist1d shift cache changes.
_SHIFT_CACHE_VERSION = 1


def _check_dataset(dataset: object) -> str:
    if not isinstance(dataset, Dataset):
        raise ValueError(
            f"`dataset` must be a cogcal.data.Dataset (from load_dataset), got "
            f"{type(dataset).__name__}."
        )
    if dataset.name not in ROBUSTNESS_DATASETS:
        raise ValueError(
            f"no OOD/shift sets are defined for dataset {dataset.name!r}; supported: "
            f"{', '.join(ROBUSTNESS_DATASETS)}."
        )
    return dataset.name


def _check_max(max_per_severity: int | None) -> int | None:
    if max_per_severity is None:
        return None
    if COUNT.problem(max_per_severity) is not None:
        raise ValueError(
            f"`max_per_severity` must be a positive integer or None (all), got "
            f"{max_per_severity!r}."
        )
    return int(max_per_severity)


def _subsample(n: int, k: int | None) -> np.ndarray:
    """Sorted indices of a fixed random subset of ``k`` of ``n`` rows (all if k is None)."""
    if k is None or k >= n:
        return np.arange(n)
    rng = np.random.default_rng([SHIFT_SEED, n, k])
    return np.sort(rng.choice(n, size=k, replace=False))


class Reason(str):
    """Why a set is unavailable: the Python-form message, with ``cli_message`` for the CLI."""

    cli_message: str

    def __new__(cls, err: BaseException) -> Reason:
        obj = super().__new__(cls, str(err))
        obj.cli_message = getattr(err, "cli_message", str(err))
        return obj


# ============================================================================= OOD


def _svhn_test(root: Path) -> np.ndarray:
    name = _vision.SVHN_FILES["test"]
    candidates = [root / "svhn" / name, root / name]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise missing_files_error(
            "svhn",
            root,
            [candidates[0]],
            f"  {root}/svhn/{name} (or {root}/{name})",
            "download test_32x32.mat (format 2, cropped digits) from "
            f"http://ufldl.stanford.edu/housenumbers/ into {root / 'svhn'}",
            download=_downloads.describe("svhn"),
            function="ood_sets",
        )
    return _vision._read_svhn(path)[0]


def _cifar_test(name: str, root: Path) -> np.ndarray:
    if name == "cifar10":
        base, fname, key, k = root / _vision.CIFAR10_DIR, _vision.CIFAR10_TEST, "labels", 10
        archive = "CIFAR-10 python version (cifar-10-python.tar.gz"
    else:
        base, fname, key, k = root / _vision.CIFAR100_DIR, "test", "fine_labels", 100
        archive = "CIFAR-100 python version (cifar-100-python.tar.gz"
    path = base / fname
    if not path.is_file():
        raise missing_files_error(
            name,
            root,
            [path],
            f"  {base}/{fname}",
            f"download the {archive} from https://www.cs.toronto.edu/~kriz/cifar.html) and "
            f"extract it under {root}",
            download=_downloads.describe(name),
            function="ood_sets",
        )
    return _vision._cifar_batch(path, key, k)[0]


def _ood_image_set(name: str, root: Path) -> torch.Tensor:
    x = _svhn_test(root) if name == "svhn" else _cifar_test(name, root)
    return torch.from_numpy(np.ascontiguousarray(x))


def _render_sequences(seq: np.ndarray, size: int = 8, peak: float = 16.0) -> np.ndarray:
    """Render 1-D sequences ``(N, L)`` as ``size`` x ``size`` line plots ``(N, 1, size, size)``.

    Each sequence is average-pooled to ``size`` columns, rescaled to its own [0, 1] range
    and drawn as an anti-aliased curve (one row unit = one pixel), high values at the
    top, with intensity ``peak`` on the curve.
    """
    n, length = seq.shape
    cols = np.stack(
        [
            seq[:, int(j * length / size) : int((j + 1) * length / size)].mean(1)
            for j in range(size)
        ],
        axis=1,
    )
    lo, hi = cols.min(1, keepdims=True), cols.max(1, keepdims=True)
    v = (cols - lo) / np.maximum(hi - lo, 1e-12)
    pos = (1.0 - v) * (size - 1)  # (N, size): row of the curve in each column
    rows = np.arange(size, dtype=np.float64)[None, :, None]  # (1, rows, 1)
    img = np.clip(1.0 - np.abs(rows - pos[:, None, :]), 0.0, 1.0) * peak
    return img[:, None].astype(np.float32)


def gaussian_smooth(x: np.ndarray, sigma: float, *, truncate: float = 4.0) -> np.ndarray:
    """Gaussian smoothing of the rows of a 2-D array, ends mirrored (``d c b a | a b c d``).

    The same as ``scipy.ndimage.gaussian_filter1d(x, sigma, axis=1, mode="reflect",
    truncate=truncate)`` (to rounding, tested), in numpy: importing ``scipy.ndimage``
    costs a fresh ``cogcal train`` a tenth of a second or more of start-up
    (docs/performance.md).

    >>> y = gaussian_smooth(np.array([[0.0, 0.0, 3.0, 0.0, 0.0]]), sigma=0.5)
    >>> y.round(2).tolist(), round(float(y.sum()), 12)  # mirrored ends keep the sum
    ([[0.0, 0.32, 2.36, 0.32, 0.0]], 3.0)
    """
    radius = int(truncate * sigma + 0.5)
    offsets = np.arange(-radius, radius + 1, dtype=np.float64)
    weights = np.exp(-0.5 * (offsets / sigma) ** 2)
    weights /= weights.sum()
    padded = np.pad(x, [(0, 0), (radius, radius)], mode="symmetric")
    n = x.shape[1]
    out = np.zeros(x.shape, dtype=np.result_type(x, np.float64))
    for i, w in enumerate(weights):
        out += w * padded[:, i : i + n]
    return out


def _cpu_ood(dataset: Dataset) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    rng = np.random.default_rng([SHIFT_SEED, 1])
    x_test = dataset.test.x.numpy()
    n = x_test.shape[0]
    sets: dict[str, torch.Tensor] = {}
    missing: dict[str, str] = {}
    if dataset.name == "mnist1d":
        # Each sequence's time steps permuted independently: same values, no shape.
        perm = np.argsort(rng.random(x_test.shape), axis=1)
        sets["mnist1d-shuffled"] = torch.from_numpy(np.take_along_axis(x_test, perm, 1))
        # Smoothed Gaussian noise with the training split's global mean and std.
        noise = gaussian_smooth(rng.standard_normal(x_test.shape), sigma=1.5)
        noise = (noise - noise.mean()) / noise.std()
        x_tr = dataset.train.x.numpy().astype(np.float64)
        sets["noise"] = torch.from_numpy((noise * x_tr.std() + x_tr.mean()).astype(np.float32))
    else:  # digits
        gen = _tabular.make_mnist1d(
            num_samples=10 * math.ceil(n / 10), seed=SHIFT_SEED, standardize=True
        )
        sets["mnist1d-rendered"] = torch.from_numpy(_render_sequences(gen["x"][:n]))
        flat = x_test.reshape(n, -1)
        perm = np.argsort(rng.random(flat.shape), axis=1)
        shuffled = np.take_along_axis(flat, perm, 1).reshape(x_test.shape)
        sets["digits-shuffled"] = torch.from_numpy(np.ascontiguousarray(shuffled))
    return sets, missing


def ood_sets(
    dataset: Dataset,
    *,
    root: str | Path,
    download: bool = False,
    mirror: str | None = None,
    progress: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Return the OOD inputs of ``dataset`` in its stored format.

    Image datasets get the *test* splits of their docs/method.md section 4 partners (CIFAR-10 ->
    SVHN + CIFAR-100; CIFAR-100 -> SVHN + CIFAR-10; SVHN -> CIFAR-10 + CIFAR-100), read
    from the standard layouts under ``root`` as ``uint8`` ``(N, 3, 32, 32)``. The CPU
    suites get documented analogues (``docs/robustness.md``): ``mnist1d`` ->
    ``mnist1d-shuffled`` (each test sequence's 40 steps permuted) and ``noise`` (smoothed
    Gaussian noise with the training mean/std); ``digits`` -> ``mnist1d-rendered``
    (mnist1d sequences drawn as 8x8 line plots, values 0..16) and ``digits-shuffled``
    (each test image's 64 pixels permuted). All draws are seeded (:data:`SHIFT_SEED`).

    Feed them through ``dataset.transform`` so they are normalised with the
    in-distribution statistics.

    Parameters
    ----------
    dataset : Dataset
        The in-distribution dataset (from :func:`~cogcal.data.load_dataset`).
    root : str or Path
        Data root holding the OOD datasets' files.
    download : bool, default False
        Image datasets: first download the partner datasets that are missing
        (:func:`cogcal.data.download`; SVHN 235 MiB, CIFAR-10 163 MiB, CIFAR-100 161 MiB).
    mirror : str, optional
        Mirror for the downloads (see :func:`cogcal.data.download`).
    progress : bool, default True
        Download progress bars on stderr.

    Returns
    -------
    sets : dict of str to torch.Tensor
        OOD set name -> inputs, same dtype and per-sample shape as ``dataset.test.x``.
    unavailable : dict of str to str
        OOD set name -> why it could not be loaded (the missing-file message, naming the
        expected file, the layout and ``download=True``; its ``cli_message`` attribute
        holds the command-line form).

    Raises
    ------
    ValueError
        ``dataset`` is not one of :data:`ROBUSTNESS_DATASETS`.
    DatasetCorruptError
        An OOD file exists but cannot be read.
    DownloadError
        ``download=True`` and a download failed.
    """
    name = _check_dataset(dataset)
    if name in CPU_OOD:
        return _cpu_ood(dataset)
    root = Path(root).expanduser()
    if download:
        _downloads.ensure(OOD_PAIRS[name], root, mirror=mirror, progress=progress)
    sets: dict[str, torch.Tensor] = {}
    missing: dict[str, str] = {}
    for other in OOD_PAIRS[name]:
        try:
            sets[other] = _ood_image_set(other, root)
        except DatasetNotFoundError as err:
            missing[other] = Reason(err)
    return sets, missing


# ============================================================================= shift


def _select(available: Sequence[str], conditions: Sequence[str] | None, dataset: str) -> list[str]:
    if conditions is None:
        return list(available)
    if isinstance(conditions, str):
        conditions = [conditions]
    out = []
    for c in conditions:
        if c not in available:
            close = difflib.get_close_matches(str(c), available, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown shift condition {c!r} for {dataset!r}; known: "
                f"{', '.join(available)}.{hint}"
            )
        out.append(c)
    return out


def _split(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor) -> Split:
    xt = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    yt = y if isinstance(y, torch.Tensor) else torch.from_numpy(np.asarray(y, dtype=np.int64))
    return Split(xt, yt.to(torch.int64))


# ----------------------------------------------------------------------------- CIFAR-C


def _cifar_c_layout(root: Path, dirname: str) -> str:
    return (
        f"  {root}/{dirname}/\n      labels.npy ({dirname}'s labels, (50000,) integers)\n"
        f"      <corruption>.npy for each of: {', '.join(CIFAR_C_CORRUPTIONS)}\n"
        "      (each uint8 (50000, 32, 32, 3): rows [10000*(s-1), 10000*s) are severity s)"
    )


def _cifar_c_fix(name: str, root: Path, dirname: str, condition: str) -> tuple[str, str]:
    """How to get a missing CIFAR-C file: (Python form, command-line form)."""
    record = "2535967" if name == "cifar10" else "3555552"
    fix = (
        f"download {dirname}.tar from https://zenodo.org/records/{record} and extract it "
        f"under {root}"
    )
    if condition in CORRUPTIONS:
        py = (
            "; or call shift_sets(..., generate_missing=True) to generate this corruption "
            "on the fly from the clean test set (cogcal.data.corruptions, CIFAR-10-C "
            "parameters; see docs/robustness.md)"
        )
        cli = (
            "; or have cogcal generate this corruption on the fly from the clean test set "
            "(cogcal.data.shift_sets(..., generate_missing=True); see docs/robustness.md)"
        )
    else:
        py = cli = f" ({condition!r} cannot be generated on the fly: {NOT_COVERED[condition]})"
    return fix + py, fix + cli


def _read_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:
        raise DatasetCorruptError(
            f"cannot read {path}: {type(err).__name__}: {err}. The file is truncated or not "
            "a .npy array; extract the CIFAR-C archive again."
        ) from None


def _cifar_c_sets(
    dataset: Dataset,
    root: Path,
    conditions: list[str],
    max_per_severity: int | None,
    generate_missing: bool,
    seed: int,
    download: bool = False,
    mirror: str | None = None,
    progress: bool = True,
) -> tuple[dict[str, dict[int, Split]], dict[str, str]]:
    name = dataset.name
    dirname = CIFAR_C_DIRS[name]
    base = root / dirname
    labels_path = base / "labels.npy"
    wanted = [base / f"{c}.npy" for c in conditions] + [labels_path]
    if download and not all(p.is_file() for p in wanted):
        _downloads.download(f"{name}-c", root, mirror=mirror, progress=progress)
    labels: np.ndarray | None = None
    sets: dict[str, dict[int, Split]] = {}
    missing: dict[str, str] = {}
    for cond in conditions:
        path = base / f"{cond}.npy"
        absent = [p for p in (path, labels_path) if not p.is_file()]
        if not absent:
            if labels is None:
                labels = np.asarray(_read_npy(labels_path))
            sets[cond] = _read_cifar_c(path, labels, labels_path, dataset, max_per_severity)
        elif generate_missing and cond in CORRUPTIONS:
            idx = _subsample(len(dataset.test), max_per_severity)
            x_clean = dataset.test.x[torch.from_numpy(idx)]
            y = dataset.test.y[torch.from_numpy(idx)]
            sets[cond] = {
                s: _split(corrupt(x_clean, cond, s, seed=seed), y.clone()) for s in range(1, 6)
            }
        else:
            fix, cli_fix = _cifar_c_fix(name, root, dirname, cond)
            err = missing_files_error(
                f"{name} {cond} ({dirname})",
                root,
                absent,
                _cifar_c_layout(root, dirname),
                fix,
                cli_fix=cli_fix,
                download=_downloads.describe(f"{name}-c"),
                function="shift_sets",
            )
            missing[cond] = Reason(err)
    return sets, missing


def _read_cifar_c(
    path: Path,
    labels: np.ndarray,
    labels_path: Path,
    dataset: Dataset,
    max_per_severity: int | None,
) -> dict[int, Split]:
    x = _read_npy(path)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (32, 32, 3) or x.shape[0] % 5:
        raise DatasetCorruptError(
            f"{path}: expected uint8 of shape (5 * n, 32, 32, 3) (n images per severity, "
            f"severity-major), got {x.dtype} {x.shape}."
        )
    if labels.shape != (x.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetCorruptError(
            f"{labels_path}: expected {x.shape[0]} integer labels (as many as rows of "
            f"{path.name}), got {labels.dtype} {labels.shape}."
        )
    if labels.size and (labels.min() < 0 or labels.max() >= dataset.num_classes):
        raise DatasetCorruptError(
            f"{labels_path}: labels must lie in [0, {dataset.num_classes - 1}], got "
            f"[{labels.min()}, {labels.max()}]."
        )
    n = x.shape[0] // 5
    idx = _subsample(n, max_per_severity)
    out = {}
    for s in range(1, 6):
        rows = (s - 1) * n + idx
        # Fancy indexing a memory map reads only the selected rows.
        xs = np.ascontiguousarray(np.asarray(x[rows]).transpose(0, 3, 1, 2))
        out[s] = _split(xs, labels[rows].astype(np.int64))
    return out


# ----------------------------------------------------------------------------- mnist1d


def _mnist1d_shift_key(args: dict[str, Any], standardize: tuple[float, float]) -> tuple[str, str]:
    text = json.dumps(
        {"version": _SHIFT_CACHE_VERSION, "args": args, "standardize": list(standardize)},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16], text


def _load_shift_cache(path: Path, key_text: str, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as f:
            x, y, key = f["x"], f["y"], str(f["key"])
        if key != key_text or x.ndim != 2 or y.shape != (x.shape[0],) or x.shape[0] < n:
            raise DatasetCorruptError("unexpected key or shapes")
        return x, y
    except Exception as err:
        warnings.warn(
            f"ignoring unreadable mnist1d shift cache {path} ({err}); regenerating it.",
            RuntimeWarning,
            stacklevel=4,
        )
        return None


def _mnist1d_sets(
    dataset: Dataset, root: Path, conditions: list[str], max_per_severity: int | None, seed: int
) -> tuple[dict[str, dict[int, Split]], dict[str, str]]:
    info = dataset.info
    if "raw_mean" not in info or "raw_std" not in info:
        raise ValueError(
            "the mnist1d dataset's `info` lacks 'raw_mean'/'raw_std' (the clean generator "
            "statistics); load it with cogcal.data.load_dataset('mnist1d')."
        )
    stats = (float(info["raw_mean"]), float(info["raw_std"]))
    n = MNIST1D_SHIFT_SAMPLES if max_per_severity is None else max_per_severity
    n_gen = 10 * math.ceil(n / 10)  # the generator makes a multiple of 10 samples
    sets: dict[str, dict[int, Split]] = {}
    for cond in conditions:
        arg, values = MNIST1D_SHIFTS[cond]
        sets[cond] = {}
        for s, value in enumerate(values, start=1):
            args = _tabular.mnist1d_args({arg: value}, num_samples=n_gen, seed=seed)
            key, key_text = _mnist1d_shift_key(args, stats)
            path = root / "mnist1d" / f"shift-{cond}-s{s}-{key}.npz"
            cached = _load_shift_cache(path, key_text, n) if path.exists() else None
            if cached is None:
                t0 = time.perf_counter()
                gen = _tabular.make_mnist1d(
                    {arg: value}, num_samples=n_gen, seed=seed, standardize=stats
                )
                x, y = gen["x"], gen["y"]
                seconds = time.perf_counter() - t0
                try:
                    save_npz(path, x=x, y=y, key=np.asarray(key_text), seconds=np.float64(seconds))
                except OSError as err:
                    warnings.warn(
                        f"could not write the mnist1d shift cache {path} ({err}); continuing "
                        "without it.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            else:
                x, y = cached
            sets[cond][s] = _split(np.asarray(x[:n], dtype=np.float32), y[:n])
    return sets, {}


# ----------------------------------------------------------------------------- digits


def _digits_shift(x: np.ndarray, cond: str, severity: int, seed: int) -> np.ndarray:
    value = DIGITS_SHIFTS[cond][severity - 1]
    if cond == "rotation":
        return rotate_images(torch.from_numpy(x), value).numpy()
    if cond == "gaussian_noise":
        rng = np.random.default_rng([seed, 2, severity])
        out = x + rng.normal(0.0, value, size=x.shape)
    elif cond == "gaussian_blur":
        out = _ndimage().gaussian_filter(
            x.astype(np.float64), sigma=(0, 0, value, value), mode="constant"
        )
    else:  # contrast
        means = x.mean(axis=(2, 3), keepdims=True)
        out = (x - means) * value + means
    return np.clip(out, 0.0, 16.0).astype(np.float32)


# ----------------------------------------------------------------------------- public


def shift_conditions(dataset_name: str) -> tuple[str, ...]:
    """Return the names of the covariate-shift conditions of a dataset."""
    if dataset_name in CIFAR_C_DIRS:
        return CIFAR_C_CORRUPTIONS
    table = {
        "svhn": ("rotation",),
        "mnist1d": tuple(MNIST1D_SHIFTS),
        "digits": tuple(DIGITS_SHIFTS),
    }
    if dataset_name not in table:
        raise ValueError(
            f"no shift sets are defined for dataset {dataset_name!r}; supported: "
            f"{', '.join(ROBUSTNESS_DATASETS)}."
        )
    return table[dataset_name]


def shift_sets(
    dataset: Dataset,
    *,
    root: str | Path,
    conditions: Sequence[str] | None = None,
    max_per_severity: int | None = None,
    generate_missing: bool = False,
    seed: int = SHIFT_SEED,
    download: bool = False,
    mirror: str | None = None,
    progress: bool = True,
) -> tuple[dict[str, dict[int, Split]], dict[str, str]]:
    """Return the labelled covariate-shift test sets of ``dataset``.

    - ``cifar10`` / ``cifar100``: the 19 CIFAR-C corruptions read from
      ``root/CIFAR-10-C/<corruption>.npy`` (``CIFAR-100-C``) and ``labels.npy``,
      memory-mapped, converted to ``uint8`` ``(N, 3, 32, 32)``. Missing files make the
      condition unavailable, unless ``generate_missing=True`` and
      :mod:`cogcal.data.corruptions` covers it: then it is generated from the clean test
      set.
    - ``svhn``: ``rotation``, the test set rotated by 10, 45, 90, 135, 180 degrees.
    - ``mnist1d``: fresh samples from the generator with one parameter raised
      (:data:`MNIST1D_SHIFTS`), standardised with the clean set's constants, cached under
      ``root/mnist1d/shift-*.npz``.
    - ``digits``: noise, blur, contrast and rotation of the test set (:data:`DIGITS_SHIFTS`).

    Parameters
    ----------
    dataset : Dataset
        The in-distribution dataset (from :func:`~cogcal.data.load_dataset`).
    root : str or Path
        Data root (CIFAR-C files; mnist1d shift cache).
    conditions : sequence of str, optional
        Only these conditions (all by default; see :func:`shift_conditions`). Loading
        CIFAR-10-C condition by condition bounds memory (150 MB per condition in full).
    max_per_severity : int, optional
        At most this many samples per severity: a fixed random subset of the test rows,
        the same for every severity and condition (mnist1d: samples generated, default
        :data:`MNIST1D_SHIFT_SAMPLES`). ``None``: all.
    generate_missing : bool, default False
        CIFAR only: generate missing corruptions on the fly when covered.
    seed : int, default SHIFT_SEED
        Seed of generated samples and corruptions.
    download : bool, default False
        CIFAR only: download ``CIFAR-10-C.tar`` / ``CIFAR-100-C.tar`` (2.7 GiB each, 2.9 GB
        extracted; the archive is deleted after extraction) when a requested file is missing
        (:func:`cogcal.data.download`).
    mirror : str, optional
        Mirror for the download (see :func:`cogcal.data.download`).
    progress : bool, default True
        Download progress bars on stderr.

    Returns
    -------
    sets : dict
        condition -> severity (1..5) -> :class:`Split` in the stored format of
        ``dataset.test`` with the original labels.
    unavailable : dict of str to str
        condition -> why it is missing (names the expected files, the layout and
        ``download=True``; its ``cli_message`` attribute holds the command-line form).

    Raises
    ------
    ValueError
        Unsupported dataset, unknown condition, bad ``max_per_severity``.
    DatasetCorruptError
        A CIFAR-C file exists but is unreadable or malformed.
    DownloadError
        ``download=True`` and the download failed.
    """
    name = _check_dataset(dataset)
    max_per_severity = _check_max(max_per_severity)
    selected = _select(shift_conditions(name), conditions, name)
    root = Path(root).expanduser()
    if name in CIFAR_C_DIRS:
        return _cifar_c_sets(
            dataset,
            root,
            selected,
            max_per_severity,
            generate_missing,
            seed,
            download=download,
            mirror=mirror,
            progress=progress,
        )
    if name == "mnist1d":
        return _mnist1d_sets(dataset, root, selected, max_per_severity, seed)
    return _test_set_shifts(dataset, name, selected, max_per_severity, seed), {}


def _test_set_shifts(
    dataset: Dataset, name: str, selected: list[str], max_per_severity: int | None, seed: int
) -> dict[str, dict[int, Split]]:
    """svhn's rotations and digits' shifts, made from (a fixed subset of) the test set."""
    idx = torch.from_numpy(_subsample(len(dataset.test), max_per_severity))
    x, y = dataset.test.x[idx], dataset.test.y[idx]
    sets: dict[str, dict[int, Split]] = {}
    for cond in selected:
        if name == "svhn":
            sets[cond] = {
                s: _split(rotate_images(x, d), y.clone()) for s, d in enumerate(ROTATION_DEGREES, 1)
            }
        else:
            sets[cond] = {
                s: _split(_digits_shift(x.numpy(), cond, s, seed), y.clone()) for s in range(1, 6)
            }
    return sets
