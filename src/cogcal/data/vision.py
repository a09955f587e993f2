"""CIFAR-10, CIFAR-100 and SVHN read from their standard on-disk layouts.

The files are read directly (not through torchvision's dataset classes, which verify
the MD5 sums of the full official files), so small files in the same format work too.
``load_dataset(..., download=True)`` fetches the official files first
(:mod:`cogcal.data.downloads`, MD5-verified).

The CIFAR batch files are Python pickles written by the dataset authors. As torchvision
does, we unpickle them with ``encoding="latin1"``, but only the known file names under
the user's data root, and through a restricted unpickler that can build nothing but
numpy arrays, lists, dicts, strings and numbers: a file that asks for anything else is
rejected as corrupt instead of executing it.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cogcal.data.base import (
    SPLIT_SEED,
    Dataset,
    DatasetCorruptError,
    Split,
    channel_stats_uint8,
    missing_files_error,
    register_dataset,
    stratified_split,
)
from cogcal.data.downloads import describe

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100_MEAN", "CIFAR100_STD"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.247, 0.243, 0.261)
CIFAR100_MEAN = (0.5074, 0.4867, 0.4411)
CIFAR100_STD = (0.2011, 0.1987, 0.2025)

VAL_FRACTION = {"cifar10": 0.2, "cifar100": 0.05, "svhn": 0.2}

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
CIFAR10_TEST = "test_batch"
CIFAR10_META = "batches.meta"
CIFAR100_DIR = "cifar-100-python"
SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}

# (module, name) pairs a CIFAR pickle may reference: numpy array reconstruction only.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _ArrayOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if module.startswith("numpy.core") and hasattr(np, "_core"):
            module = "numpy._core" + module[len("numpy.core") :]  # avoid the deprecated alias
        return getattr(importlib.import_module(module), name)


def _read_pickle(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            obj = _ArrayOnlyUnpickler(f, encoding="latin1").load()
    except Exception as err:
        raise DatasetCorruptError(
            f"cannot read {path}: {type(err).__name__}: {err}. The file is truncated, "
            "corrupt or not a CIFAR python-version batch file; extract the archive again."
        ) from None
    if not isinstance(obj, dict):
        raise DatasetCorruptError(f"{path} does not hold a dict (got {type(obj).__name__}).")
    # Python 2 pickles may have bytes keys when read with another encoding: normalise.
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _cifar_batch(path: Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    d = _read_pickle(path)
    if "data" not in d or label_key not in d:
        raise DatasetCorruptError(
            f"{path} lacks the keys 'data' and {label_key!r} (found {sorted(map(str, d))})."
        )
    data = np.asarray(d["data"])
    labels = np.asarray(d[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DatasetCorruptError(
            f"{path}: 'data' must be uint8 of shape (n, 3072), got {data.dtype} {data.shape}."
        )
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetCorruptError(
            f"{path}: {label_key!r} must hold {data.shape[0]} integer labels, "
            f"got dtype {labels.dtype} shape {labels.shape}."
        )
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DatasetCorruptError(
            f"{path}: labels must lie in [0, {num_classes - 1}], "
            f"got [{labels.min()}, {labels.max()}]."
        )
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _class_names(path: Path, key: str, num_classes: int) -> list[str]:
    names = _read_pickle(path).get(key)
    if not isinstance(names, list | tuple) or len(names) != num_classes:
        raise DatasetCorruptError(f"{path}: {key!r} must list {num_classes} class names.")
    return [n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names]


def _check_present(dataset: str, root: Path, files: list[Path], layout: str, fix: str) -> None:
    missing = [p for p in files if not p.is_file()]
    if missing:
        raise missing_files_error(dataset, root, missing, layout, fix, download=describe(dataset))


def _build(
    name: str,
    *,
    x_train_full: np.ndarray,
    y_train_full: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    class_names: list[str],
    mean: tuple[float, ...] | None,
    std: tuple[float, ...] | None,
    files: list[Path],
) -> Dataset:
    frac = VAL_FRACTION[name]
    tr_idx, val_idx = stratified_split(y_train_full, frac, SPLIT_SEED)
    x_train = x_train_full[tr_idx]
    stats_source = "fixed (docs/method.md section 4)"
    if mean is None or std is None:
        mean, std = channel_stats_uint8(x_train)
        stats_source = "computed on the training split (after the validation split)"

    def split(xs: np.ndarray, ys: np.ndarray) -> Split:
        return Split(torch.from_numpy(np.ascontiguousarray(xs)), torch.from_numpy(ys))

    train = split(x_train, y_train_full[tr_idx])
    val = split(x_train_full[val_idx], y_train_full[val_idx])
    test = split(x_test, y_test)
    info = {
        "dataset": name,
        "split_seed": SPLIT_SEED,
        "val_fraction": frac,
        "stratified_val": True,
        "sizes": {"train": len(train), "val": len(val), "test": len(test)},
        "mean": list(mean),
        "std": list(std),
        "normalization": f"per-channel on [0, 1] pixels, {stats_source}",
        "augmentation": "random 32x32 crop of the 4-pixel zero-padded image + horizontal flip",
        "source_files": [str(p) for p in files],
    }
    return Dataset(
        name=name,
        task="multiclass",
        num_classes=len(class_names),
        input_shape=(3, 32, 32),
        class_names=class_names,
        train=train,
        val=val,
        test=test,
        mean=tuple(mean),
        std=tuple(std),
        augment="crop_flip",
        info=info,
    )


@register_dataset("cifar10", default_model="resnet18", augment="crop_flip")
def _load_cifar10(root: Path) -> Dataset:
    """CIFAR-10 from ``root/cifar-10-batches-py/`` (20% of train as validation)."""
    base = root / CIFAR10_DIR
    train_files = [base / f for f in CIFAR10_TRAIN]
    files = [*train_files, base / CIFAR10_TEST, base / CIFAR10_META]
    layout = (
        f"  {root}/{CIFAR10_DIR}/\n      data_batch_1 ... data_batch_5, test_batch, batches.meta"
    )
    _check_present(
        "cifar10",
        root,
        files,
        layout,
        "download the CIFAR-10 python version (cifar-10-python.tar.gz from "
        f"https://www.cs.toronto.edu/~kriz/cifar.html) and extract it under {root}",
    )
    parts = [_cifar_batch(p, "labels", 10) for p in train_files]
    x_tr = np.concatenate([p[0] for p in parts])
    y_tr = np.concatenate([p[1] for p in parts])
    x_te, y_te = _cifar_batch(base / CIFAR10_TEST, "labels", 10)
    names = _class_names(base / CIFAR10_META, "label_names", 10)
    return _build(
        "cifar10",
        x_train_full=x_tr,
        y_train_full=y_tr,
        x_test=x_te,
        y_test=y_te,
        class_names=names,
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
        files=files,
    )


@register_dataset("cifar100", default_model="resnet18", augment="crop_flip")
def _load_cifar100(root: Path) -> Dataset:
    """CIFAR-100 (fine labels) from ``root/cifar-100-python/`` (5% of train as validation)."""
    base = root / CIFAR100_DIR
    files = [base / "train", base / "test", base / "meta"]
    layout = f"  {root}/{CIFAR100_DIR}/\n      train, test, meta"
    _check_present(
        "cifar100",
        root,
        files,
        layout,
        "download the CIFAR-100 python version (cifar-100-python.tar.gz from "
        f"https://www.cs.toronto.edu/~kriz/cifar.html) and extract it under {root}",
    )
    x_tr, y_tr = _cifar_batch(base / "train", "fine_labels", 100)
    x_te, y_te = _cifar_batch(base / "test", "fine_labels", 100)
    names = _class_names(base / "meta", "fine_label_names", 100)
    return _build(
        "cifar100",
        x_train_full=x_tr,
        y_train_full=y_tr,
        x_test=x_te,
        y_test=y_te,
        class_names=names,
        mean=CIFAR100_MEAN,
        std=CIFAR100_STD,
        files=files,
    )


def _read_svhn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import scipy.io  # here: only SVHN needs it, and it costs ~0.5 s of start-up (importtime)

    try:
        mat = scipy.io.loadmat(str(path), variable_names=["X", "y"])
    except Exception as err:
        raise DatasetCorruptError(
            f"cannot read {path}: {type(err).__name__}: {err}. The file is truncated or not "
            "an SVHN cropped-digits (format 2) .mat file; download it again."
        ) from None
    if "X" not in mat or "y" not in mat:
        raise DatasetCorruptError(f"{path} lacks the variables 'X' and 'y'.")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"])
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise DatasetCorruptError(
            f"{path}: 'X' must be uint8 of shape (32, 32, 3, n), got {x.dtype} {x.shape}."
        )
    n = x.shape[3]
    y = y.reshape(-1)
    if y.shape != (n,):
        raise DatasetCorruptError(f"{path}: 'y' must hold {n} labels, got shape {mat['y'].shape}.")
    y = y.astype(np.int64)
    if n and (y.min() < 0 or y.max() > 10):
        raise DatasetCorruptError(f"{path}: labels must lie in 0..10, got [{y.min()}, {y.max()}].")
    y[y == 10] = 0  # SVHN stores digit 0 as label 10 (torchvision maps it to 0 too)
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y  # (n, C, H, W)


@register_dataset("svhn", default_model="resnet18", augment="crop_flip")
def _load_svhn(root: Path) -> Dataset:
    """SVHN cropped digits from ``root/svhn/*.mat`` or ``root/*.mat`` (20% of train as val)."""
    candidates = [root / "svhn", root]
    base = next(
        (d for d in candidates if all((d / f).is_file() for f in SVHN_FILES.values())),
        candidates[0],
    )
    files = [base / SVHN_FILES["train"], base / SVHN_FILES["test"]]
    layout = (
        f"  {root}/svhn/train_32x32.mat, {root}/svhn/test_32x32.mat\n"
        f"  (or torchvision's SVHN(root={str(root)!r}) layout: {root}/train_32x32.mat, "
        f"{root}/test_32x32.mat)"
    )
    _check_present(
        "svhn",
        root,
        files,
        layout,
        "download train_32x32.mat and test_32x32.mat (format 2, cropped digits) from "
        f"http://ufldl.stanford.edu/housenumbers/ into {root / 'svhn'}",
    )
    x_tr, y_tr = _read_svhn(files[0])
    x_te, y_te = _read_svhn(files[1])
    return _build(
        "svhn",
        x_train_full=x_tr,
        y_train_full=y_tr,
        x_test=x_te,
        y_test=y_te,
        class_names=[str(i) for i in range(10)],
        mean=None,
        std=None,
        files=files,
    )
