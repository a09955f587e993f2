"""Datasets of the cogcal benchmarks, with fixed splits, and an in-memory batch loader.

>>> from cogcal.data import list_datasets
>>> {"mnist1d", "digits", "cifar10", "cifar100", "svhn"} <= set(list_datasets())
True

Nothing is ever downloaded: image datasets are read from their standard on-disk layouts
under a data root, ``mnist1d`` is generated once and cached under ``root/mnist1d/``,
``digits`` ships with scikit-learn. See ``docs/data.md``.
"""

from __future__ import annotations

from cogcal.data import multitask as _multitask  # noqa: F401  (registers celeba, mnist1d-mtl, ...)
from cogcal.data import tabular as _tabular  # noqa: F401  (registers mnist1d, digits)
from cogcal.data import vision as _vision  # noqa: F401  (registers cifar10, cifar100, svhn)
from cogcal.data.base import (
    SPLIT_SEED,
    Dataset,
    DatasetCorruptError,
    DatasetNotFoundError,
    Split,
    list_datasets,
    load_dataset,
    register_dataset,
    stratified_split,
)
from cogcal.data.loader import BatchLoader
from cogcal.data.robustness import CORRUPTIONS, corrupt, ood_sets, rotate_images, shift_sets
from cogcal.data.tabular import MNIST1D_DEFAULT_ARGS, make_mnist1d, mnist1d_args
from cogcal.data.transforms import augment_crop_flip, normalize

#: TEMPORARY (replaced by the data layer's own default_model): backbone per dataset.
_DEFAULT_MODELS = {
    "mnist1d": "mlp",
    "digits": "cnn",
    "cifar10": "resnet18",
    "cifar100": "resnet18",
    "svhn": "resnet18",
    "mnist1d-mtl": "mlp",
    "digits-mtl": "cnn",
    "celeba": "resnet18",
}


def default_model(name: str) -> str | None:
    """The default backbone of a dataset, without loading it."""
    return _DEFAULT_MODELS.get(name.lower())


__all__ = [
    "default_model",
    "SPLIT_SEED",
    "BatchLoader",
    "Dataset",
    "DatasetCorruptError",
    "DatasetNotFoundError",
    "MNIST1D_DEFAULT_ARGS",
    "Split",
    "augment_crop_flip",
    "list_datasets",
    "load_dataset",
    "make_mnist1d",
    "mnist1d_args",
    "normalize",
    "register_dataset",
    "stratified_split",
    "CORRUPTIONS",
    "corrupt",
    "ood_sets",
    "rotate_images",
    "shift_sets",
]
