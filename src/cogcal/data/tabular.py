"""The CPU suites: ``mnist1d`` (procedural, cached) and scikit-learn's ``digits``."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from cogcal._io import save_npz
from cogcal.data.base import (
    SPLIT_SEED,
    Dataset,
    DatasetCorruptError,
    Split,
    register_dataset,
    scalar_stats,
    stratified_split,
)

__all__ = [
    "MNIST1D_NUM_SAMPLES",
    "MNIST1D_SEED",
    "MNIST1D_DEFAULT_ARGS",
    "make_mnist1d",
    "mnist1d_args",
]

#: Samples generated for the mnist1d suite, and the generator seed (docs/method.md section 4).
MNIST1D_NUM_SAMPLES = 12_000
MNIST1D_SEED = 42
MNIST1D_VAL_FRACTION = 0.2
DIGITS_TEST_FRACTION = 0.2
DIGITS_VAL_FRACTION = 0.2

#: Defaults of ``mnist1d.data.get_dataset_args()`` (mnist1d 0.0.2+), without the
#: download url. ``num_samples`` and ``seed`` are set separately.
MNIST1D_DEFAULT_ARGS: dict[str, Any] = {
    "num_samples": MNIST1D_NUM_SAMPLES,
    "train_split": 0.8,
    "template_len": 12,
    "padding": [36, 60],
    "scale_coeff": 0.4,
    "max_translation": 48,
    "corr_noise_scale": 0.25,
    "iid_noise_scale": 2e-2,
    "shear_scale": 0.75,
    "shuffle_seq": False,
    "final_seq_length": 40,
    "seed": MNIST1D_SEED,
}

# Bump when the cache content or the generation procedure changes.
_CACHE_VERSION = 1


def _import_mnist1d() -> tuple[Any, Any]:
    # Imported here: only generation needs the package (which itself imports matplotlib
    # and requests, seconds of start-up); loading from the cache does not.
    from mnist1d.data import get_templates
    from mnist1d.transform import transform

    return get_templates, transform


def mnist1d_args(
    args_overrides: dict[str, Any] | None = None,
    num_samples: int = MNIST1D_NUM_SAMPLES,
    seed: int = MNIST1D_SEED,
) -> dict[str, Any]:
    """Return the mnist1d generator arguments used by cogcal, with overrides applied.

    Starts from :data:`MNIST1D_DEFAULT_ARGS` (the defaults of
    ``mnist1d.data.get_dataset_args()``, pinned here so that a change of the package's
    defaults cannot silently change the benchmark, and so that loading from the cache
    does not import the package), sets
    ``num_samples`` and ``seed``, then applies ``args_overrides`` (e.g.
    ``{"iid_noise_scale": 0.1, "shear_scale": 1.5, "max_translation": 60}`` for
    covariate shift).

    Raises
    ------
    ValueError
        An override names an argument the generator does not have.
    """
    args = {k: (list(v) if isinstance(v, list) else v) for k, v in MNIST1D_DEFAULT_ARGS.items()}
    args["num_samples"] = int(num_samples)
    args["seed"] = int(seed)
    for key, value in (args_overrides or {}).items():
        if key not in args or key in ("num_samples", "seed"):
            allowed = sorted(k for k in args if k not in ("num_samples", "seed"))
            raise ValueError(
                f"unknown mnist1d generator argument {key!r} in `args_overrides`; "
                f"known: {', '.join(allowed)} (num_samples and seed are separate arguments)."
            )
        args[key] = value
    if int(args["num_samples"]) < 10:
        raise ValueError(f"`num_samples` must be at least 10, got {num_samples}.")
    return args


def _generate_raw(args: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Run the mnist1d generator; return the *unstandardised* signals and labels.

    Reproduces ``mnist1d.data.make_dataset`` draw for draw (same seeding, same order of
    random calls, same final shuffle) but stops before its dataset-wide standardisation,
    so that shifted sets can be standardised with the clean set's constants. The global
    ``random``/``numpy.random`` states, which the package seeds, are restored afterwards.
    """
    get_templates, transform = _import_mnist1d()
    ns = SimpleNamespace(**args)
    templates = get_templates()
    # The package draws from the global RNGs: seed them as it does, restore them after.
    py_state, np_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    try:
        random.seed(ns.seed)
        np.random.seed(ns.seed)  # noqa: NPY002
        per_class = ns.num_samples // len(templates["y"])
        xs, ys = [], []
        for label in range(len(templates["y"])):
            for _ in range(per_class):
                x, _t = transform(templates["x"][label], templates["t"], ns)
                xs.append(x)
                ys.append(templates["y"][label])
        perm = np.random.permutation(len(ys))  # noqa: NPY002
        x_all = np.stack(xs)[perm]
        y_all = np.asarray(ys, dtype=np.int64)[perm]
        if ns.shuffle_seq:
            x_all = x_all[..., np.random.permutation(ns.final_seq_length)]  # noqa: NPY002
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)  # noqa: NPY002
    return x_all, y_all


def make_mnist1d(
    args_overrides: dict[str, Any] | None = None,
    num_samples: int = MNIST1D_NUM_SAMPLES,
    seed: int = MNIST1D_SEED,
    *,
    standardize: bool | tuple[float, float] = True,
) -> dict[str, Any]:
    """Generate an mnist1d set with (optionally) modified generator arguments.

    Parameters
    ----------
    args_overrides : dict, optional
        Generator arguments to change, e.g. ``{"iid_noise_scale": 0.1}``,
        ``{"corr_noise_scale": 0.5}``, ``{"shear_scale": 1.5}``, ``{"max_translation": 60}``
        (see :func:`mnist1d_args`).
    num_samples : int
        Samples to generate (rounded down to a multiple of 10 by the generator).
    seed : int
        Generator seed (use one different from 42 for a fresh test set).
    standardize : bool or (mean, std), default True
        ``True``: standardise with the set's own global mean/std, exactly like
        ``mnist1d.data.make_dataset``. ``(mean, std)``: standardise with given constants,
        e.g. the clean set's ``info["raw_mean"]``, ``info["raw_std"]`` of
        ``load_dataset("mnist1d")``, so a shift is not normalised away. ``False``: raw.

    Returns
    -------
    dict
        ``x`` (float32, ``(N, 40)``), ``y`` (int64), the ``args`` used, and ``raw_mean``,
        ``raw_std`` (the set's own statistics before standardisation). The package's own
        80/20 train/test split is ``x[: int(N * train_split)]`` / the rest.
    """
    args = mnist1d_args(args_overrides, num_samples, seed)
    x, y = _generate_raw(args)
    raw_mean, raw_std = float(x.mean()), float(x.std())
    if standardize is True:
        x = (x - raw_mean) / raw_std
    elif standardize is not False:
        try:
            m, s = (float(v) for v in standardize)
        except (TypeError, ValueError):
            raise ValueError(
                f"`standardize` must be True, False or a (mean, std) pair, got {standardize!r}."
            ) from None
        x = (x - m) / s
    return {
        "x": x.astype(np.float32),
        "y": y,
        "args": args,
        "raw_mean": raw_mean,
        "raw_std": raw_std,
    }


def _cache_key(args: dict[str, Any]) -> tuple[str, str]:
    text = json.dumps({"version": _CACHE_VERSION, "args": args}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16], text


def _load_cache(path: Path, key_text: str) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
        if str(data["key"]) != key_text:
            raise DatasetCorruptError("cache key mismatch")
        n = data["x"].shape[0]
        if data["x"].ndim != 2 or data["y"].shape != (n,):
            raise DatasetCorruptError("unexpected shapes")
        return data
    except Exception as err:  # unreadable, truncated or foreign file: regenerate
        warnings.warn(
            f"ignoring unreadable mnist1d cache {path} ({err}); regenerating it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


@register_dataset("mnist1d", default_model="mlp")
def _load_mnist1d(root: Path) -> Dataset:
    """MNIST-1D: 12,000 generated samples (seed 42); package split 80/20; 20% of train as val."""
    args = mnist1d_args(num_samples=MNIST1D_NUM_SAMPLES, seed=MNIST1D_SEED)
    key, key_text = _cache_key(args)
    path = root / "mnist1d" / f"mnist1d_{key}.npz"
    data = _load_cache(path, key_text) if path.exists() else None
    cache_hit = data is not None
    gen_seconds = None
    if data is None:
        t0 = time.perf_counter()
        gen = make_mnist1d(num_samples=args["num_samples"], seed=args["seed"])
        gen_seconds = time.perf_counter() - t0
        data = {
            "x": gen["x"],
            "y": gen["y"],
            "raw_mean": np.float64(gen["raw_mean"]),
            "raw_std": np.float64(gen["raw_std"]),
            "key": np.asarray(key_text),
        }
        try:
            save_npz(path, **data)
        except OSError as err:
            warnings.warn(
                f"could not write the mnist1d cache {path} ({err}); continuing without it.",
                RuntimeWarning,
                stacklevel=2,
            )
    x = np.asarray(data["x"], dtype=np.float32)
    y = np.asarray(data["y"], dtype=np.int64)
    n_train_full = int(len(y) * float(args["train_split"]))
    x_tr_full, y_tr_full = x[:n_train_full], y[:n_train_full]
    x_test, y_test = x[n_train_full:], y[n_train_full:]
    tr_idx, val_idx = stratified_split(y_tr_full, MNIST1D_VAL_FRACTION, SPLIT_SEED)
    x_train = x_tr_full[tr_idx]
    mean, std = scalar_stats(x_train)

    def split(xs: np.ndarray, ys: np.ndarray) -> Split:
        return Split(torch.from_numpy(np.ascontiguousarray(xs)), torch.from_numpy(ys.copy()))

    train = split(x_train, y_tr_full[tr_idx])
    val = split(x_tr_full[val_idx], y_tr_full[val_idx])
    test = split(x_test, y_test)
    info = {
        "dataset": "mnist1d",
        "split_seed": SPLIT_SEED,
        "val_fraction": MNIST1D_VAL_FRACTION,
        "stratified_val": True,
        "sizes": {"train": len(train), "val": len(val), "test": len(test)},
        "mean": list(mean),
        "std": list(std),
        "normalization": "global mean/std of the training split (after the generator's own "
        "dataset-wide standardisation)",
        "generator_args": args,
        "raw_mean": float(data["raw_mean"]),
        "raw_std": float(data["raw_std"]),
        "source_files": [str(path)],
        "cache_hit": cache_hit,
        "generation_seconds": gen_seconds,
    }
    return _ten_digits("mnist1d", (int(x.shape[1]),), (train, val, test), (mean, std), info)


def _ten_digits(
    name: str,
    input_shape: tuple[int, ...],
    splits: tuple[Split, Split, Split],
    stats: tuple[Any, Any],
    info: dict[str, Any],
) -> Dataset:
    """A dataset of the ten digit classes ``"0"``..``"9"``, without augmentation."""
    train, val, test = splits
    mean, std = stats
    return Dataset(
        name=name,
        task="multiclass",
        num_classes=10,
        input_shape=input_shape,
        class_names=[str(i) for i in range(10)],
        train=train,
        val=val,
        test=test,
        mean=mean,
        std=std,
        augment=None,
        info=info,
    )


def _read_digits() -> tuple[np.ndarray, np.ndarray, str]:
    """Read scikit-learn's bundled digits file, as ``load_digits`` does.

    The file is read directly (without importing ``sklearn.datasets``, which imports
    pandas when installed); ``load_digits`` is the fallback if the file is not found.
    Returns images ``(1797, 1, 8, 8)`` float32 with values 0..16, labels, and the source.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ImportError(
            "the digits dataset needs scikit-learn: pip install scikit-learn "
            "(or pip install 'cogcal[cli]')."
        )
    path = None
    for loc in spec.submodule_search_locations or []:
        candidate = Path(loc) / "datasets" / "data" / "digits.csv.gz"
        if candidate.is_file():
            path = candidate
            break
    if path is not None:
        table = np.loadtxt(path, delimiter=",")
        images, target, source = table[:, :-1], table[:, -1], str(path)
    else:  # pragma: no cover - other scikit-learn layouts
        # Here: sklearn.datasets costs seconds of start-up (it imports pandas).
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images, target, source = bunch.data, bunch.target, "sklearn.datasets.load_digits"
    if images.shape != (1797, 64):
        raise DatasetCorruptError(f"{source}: expected 1797 rows of 64 pixels, got {images.shape}.")
    x = np.ascontiguousarray(images.reshape(-1, 1, 8, 8), dtype=np.float32)
    return x, target.astype(np.int64), source


@register_dataset("digits", default_model="cnn")
def _load_digits(root: Path) -> Dataset:
    """scikit-learn's 8x8 digits: stratified 20% test, then 20% of the rest as validation."""
    del root  # bundled with scikit-learn
    x, y, source = _read_digits()
    rest_idx, test_idx = stratified_split(y, DIGITS_TEST_FRACTION, SPLIT_SEED)
    tr_rel, val_rel = stratified_split(y[rest_idx], DIGITS_VAL_FRACTION, SPLIT_SEED + 1)
    tr_idx, val_idx = rest_idx[tr_rel], rest_idx[val_rel]
    mean, std = scalar_stats(x[tr_idx])

    def split(idx: np.ndarray) -> Split:
        return Split(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))

    train, val, test = split(tr_idx), split(val_idx), split(test_idx)
    info = {
        "dataset": "digits",
        "split_seed": SPLIT_SEED,
        "test_fraction": DIGITS_TEST_FRACTION,
        "val_fraction": DIGITS_VAL_FRACTION,
        "stratified": True,
        "sizes": {"train": len(train), "val": len(val), "test": len(test)},
        "mean": list(mean),
        "std": list(std),
        "normalization": "global mean/std of the training split (raw pixel values 0..16)",
        "source_files": [source],
    }
    return _ten_digits("digits", (1, 8, 8), (train, val, test), (mean, std), info)
