"""Datasets of the cogcal benchmarks and user data, with fixed splits, and a batch loader.

>>> from cogcal.data import list_datasets
>>> {"mnist1d", "digits", "cifar10", "cifar100", "svhn"} <= set(list_datasets())
True

Image datasets are read from their standard on-disk layouts under a data root and
downloaded there on request (``load_dataset(..., download=True)``, :func:`download`:
resumable, MD5-verified, mirrors); ``mnist1d`` is generated once and cached under
``root/mnist1d/``; ``digits`` ships with scikit-learn. User data: ``folder:PATH`` (image
class folders), ``csv:PATH`` (a table), ``package.module:function`` (a plugin), or
:func:`dataset_from_splits`. See ``docs/data.md``.
"""

from __future__ import annotations

from cogcal.data import multitask as _multitask  # noqa: F401  (registers celeba, mnist1d-mtl, ...)
from cogcal.data import procedural as _procedural  # noqa: F401  (registers blobs-100, breast-cancer)
from cogcal.data import tabular as _tabular  # noqa: F401  (registers mnist1d, digits)
from cogcal.data import vision as _vision  # noqa: F401  (registers cifar10, cifar100, svhn)
from cogcal.data.base import (
    AUGMENTATIONS,
    NORMALIZATIONS,
    SPLIT_SEED,
    Dataset,
    DatasetCorruptError,
    DatasetNotFoundError,
    Split,
    default_augment,
    default_model,
    list_datasets,
    register_dataset,
    stratified_split,
    with_augment,
)
from cogcal.data.custom import DatasetPluginError, dataset_from_splits
from cogcal.data.downloads import ChecksumError, DownloadError, download, download_names
from cogcal.data.loader import BatchLoader
from cogcal.data.loading import load_dataset
from cogcal.data.robustness import CORRUPTIONS, corrupt, ood_sets, rotate_images, shift_sets
from cogcal.data.tabular import MNIST1D_DEFAULT_ARGS, make_mnist1d, mnist1d_args
from cogcal.data.transforms import Preprocess, augment_crop_flip, normalize

__all__ = [
    "AUGMENTATIONS",
    "NORMALIZATIONS",
    "SPLIT_SEED",
    "BatchLoader",
    "Preprocess",
    "ChecksumError",
    "Dataset",
    "DatasetCorruptError",
    "DatasetNotFoundError",
    "DatasetPluginError",
    "DownloadError",
    "MNIST1D_DEFAULT_ARGS",
    "Split",
    "augment_crop_flip",
    "dataset_from_splits",
    "default_augment",
    "default_model",
    "download",
    "download_names",
    "list_datasets",
    "load_dataset",
    "make_mnist1d",
    "mnist1d_args",
    "normalize",
    "register_dataset",
    "stratified_split",
    "with_augment",
    "CORRUPTIONS",
    "corrupt",
    "ood_sets",
    "rotate_images",
    "shift_sets",
]
