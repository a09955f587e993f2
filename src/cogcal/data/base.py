"""Dataset container, registry, errors and split helpers shared by every dataset."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from cogcal._io import save_npz
from cogcal.data.transforms import augment_crop_flip, normalize

if TYPE_CHECKING:
    from cogcal.data.loader import BatchLoader

__all__ = [
    "SPLIT_SEED",
    "TASKS",
    "Dataset",
    "DatasetCorruptError",
    "DatasetNotFoundError",
    "Split",
    "list_datasets",
    "load_dataset",
    "register_dataset",
]

#: Seed of every train/validation(/test) split. Fixed and independent of the training
#: seed, so that every run of every method sees the same splits.
SPLIT_SEED = 20240917

#: Tasks a :class:`Dataset` can describe.
TASKS = ("multiclass", "multilabel")

#: Augmentations :meth:`Dataset.transform` knows.
AUGMENTATIONS = (None, "crop_flip", "flip")


class DatasetNotFoundError(ValueError):
    """A dataset's files are missing under the data root (nothing is ever downloaded)."""


class DatasetCorruptError(ValueError):
    """A dataset file exists but cannot be read or has unexpected content."""


@dataclass
class Split:
    """One split of a dataset, held in memory.

    Attributes
    ----------
    x : torch.Tensor
        Stored inputs, shape ``(N, *input_shape)``: ``uint8`` for images, ``float32`` for
        the CPU suites. Pass batches through :meth:`Dataset.transform` to get model inputs.
    y : torch.Tensor
        ``int64`` labels, shape ``(N,)`` (multiclass) or ``(N, T)`` 0/1 (multilabel).
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"Split has {self.x.shape[0]} inputs but {self.y.shape[0]} labels; "
                "they must describe the same samples."
            )

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass
class Dataset:
    """An in-memory dataset with fixed train/validation/test splits.

    Attributes
    ----------
    name : str
        Registry name, e.g. ``"cifar10"``.
    task : str
        ``"multiclass"`` or ``"multilabel"``.
    num_classes : int
        Number of classes (multiclass) or of binary tasks (multilabel).
    input_shape : tuple of int
        Per-sample shape of the *transformed* inputs, e.g. ``(40,)`` or ``(3, 32, 32)``.
    class_names : list of str
        One name per class (or per task).
    train, val, test : Split
        The three splits.
    mean, std : tuple of float
        Per-channel statistics used by :meth:`transform` (one value for inputs without a
        channel axis). For ``uint8`` images they refer to pixel values scaled to [0, 1].
    augment : str or None
        Training augmentation applied by ``transform(..., train=True)``: ``"flip"`` (random
        horizontal flip only, CelebA), ``"crop_flip"``
        (random 32x32 crop of the 4-pixel zero-padded image, random horizontal flip) or
        ``None``.
    info : dict
        JSON-serialisable description recorded into the run configuration: split seed,
        split sizes, normalisation statistics, source files, generator arguments.
    """

    name: str
    task: str
    num_classes: int
    input_shape: tuple[int, ...]
    class_names: list[str]
    train: Split
    val: Split
    test: Split
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"`task` must be one of {TASKS}, got {self.task!r}.")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"`augment` must be one of {AUGMENTATIONS}, got {self.augment!r}.")
        if len(self.mean) != len(self.std):
            raise ValueError("`mean` and `std` must have the same length.")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"`std` must be positive, got {self.std}.")

    def split(self, name: str) -> Split:
        """Return the split called ``name`` (``"train"``, ``"val"`` or ``"test"``)."""
        if name not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {name!r}.")
        return getattr(self, name)

    def transform(
        self,
        x: torch.Tensor,
        *,
        train: bool = False,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Turn a batch of stored inputs into a normalised float32 batch.

        Parameters
        ----------
        x : torch.Tensor
            A batch ``(B, *input_shape)`` as stored in a split (``uint8`` images are scaled
            to [0, 1] first). Inputs of another dataset with the same storage format
            (e.g. OOD images) are normalised with *this* dataset's statistics.
        train : bool, default False
            Apply the training augmentation (if the dataset has one).
        generator : torch.Generator, optional
            Source of randomness of the augmentation; the global torch RNG if omitted.

        Returns
        -------
        torch.Tensor
            ``float32`` tensor of shape ``(B, *input_shape)`` on ``x``'s device.
        """
        if train and self.augment == "crop_flip":
            x = augment_crop_flip(x, padding=4, generator=generator)
        elif train and self.augment == "flip":  # CelebA: horizontal flip only
            x = augment_crop_flip(x, padding=0, generator=generator)
        return normalize(x, self.mean, self.std)

    def loader(
        self,
        split: str,
        batch_size: int,
        *,
        shuffle: bool | None = None,
        train: bool | None = None,
        **kwargs: Any,
    ) -> BatchLoader:
        """Return a :class:`~cogcal.data.BatchLoader` over one split using :meth:`transform`.

        ``shuffle`` and ``train`` (augmentation) default to ``split == "train"``; other
        keyword arguments go to :class:`~cogcal.data.BatchLoader`.
        """
        from cogcal.data.loader import BatchLoader

        s = self.split(split)
        is_train = split == "train"
        return BatchLoader(
            s.x,
            s.y,
            batch_size=batch_size,
            shuffle=is_train if shuffle is None else shuffle,
            transform=self.transform,
            train=is_train if train is None else train,
            **kwargs,
        )

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, task={self.task!r}, num_classes={self.num_classes}, "
            f"input_shape={self.input_shape}, train={len(self.train)}, val={len(self.val)}, "
            f"test={len(self.test)})"
        )


# --------------------------------------------------------------------------- registry

DatasetBuilder = Callable[[Path], Dataset]
_REGISTRY: dict[str, DatasetBuilder] = {}


def register_dataset(name: str) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Register a dataset builder under ``name`` (a decorator).

    The builder takes the data root (a :class:`~pathlib.Path`) and returns a
    :class:`Dataset`.

    Parameters
    ----------
    name : str
        Registry name (lower case).
    """
    key = name.lower()

    def decorator(fn: DatasetBuilder) -> DatasetBuilder:
        if key in _REGISTRY and _REGISTRY[key] is not fn:
            raise ValueError(f"a dataset named {key!r} is already registered.")
        _REGISTRY[key] = fn
        return fn

    return decorator


def list_datasets() -> list[str]:
    """Return the names of all registered datasets, sorted."""
    return sorted(_REGISTRY)


def load_dataset(name: str, *, root: str | Path = "data", **options: Any) -> Dataset:
    """Load a registered dataset with its fixed train/validation/test splits.

    Parameters
    ----------
    name : str
        One of :func:`list_datasets` (case-insensitive).
    root : str or Path, default "data"
        Data root: image datasets are read from their standard torchvision layouts under
        it; ``mnist1d`` caches its generated samples in ``root/mnist1d/``.

    Returns
    -------
    Dataset

    Raises
    ------
    ValueError
        Unknown name (the message lists the known ones and suggests the closest).
    DatasetNotFoundError
        Missing files (the message names them and the expected layout).
    DatasetCorruptError
        Unreadable files or unexpected content (the message names the file).

    Examples
    --------
    >>> from cogcal.data import load_dataset
    >>> ds = load_dataset("digits")
    >>> ds.input_shape, len(ds.train), len(ds.val), len(ds.test)
    ((1, 8, 8), 1149, 288, 360)
    >>> batch = ds.transform(ds.train.x[:4], train=True)
    >>> batch.dtype, tuple(batch.shape)
    (torch.float32, (4, 1, 8, 8))
    """
    if not isinstance(name, str):
        raise ValueError(f"dataset name must be a string, got {type(name).__name__}.")
    key = name.lower().strip()
    if key not in _REGISTRY:
        known = list_datasets()
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(known)}.{hint}")
    data = _REGISTRY[key](Path(root).expanduser())
    from cogcal.data import default_model  # TEMPORARY until the data layer sets it

    data.default_model = default_model(key)
    return data


# --------------------------------------------------------------------------- helpers


def stratified_split(
    labels: np.ndarray, fraction: float, seed: int = SPLIT_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Split indices ``0..N-1`` into (kept, held-out) with class proportions preserved.

    The held-out part has ``ceil(fraction * N)`` samples (scikit-learn's convention for a
    test fraction), allocated to the classes by largest remainder. Both index arrays are
    sorted, so the split does not reorder the data.

    Parameters
    ----------
    labels : numpy.ndarray
        Integer class labels, shape ``(N,)``.
    fraction : float
        Held-out fraction in (0, 1).
    seed : int
        Seed of the split (the fixed :data:`SPLIT_SEED` by default).
    """
    labels = np.asarray(labels)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"`fraction` must lie in (0, 1), got {fraction}.")
    n = labels.shape[0]
    n_out = int(np.ceil(fraction * n - 1e-9))
    classes, counts = np.unique(labels, return_counts=True)
    quota = fraction * counts
    take = np.floor(quota).astype(np.int64)
    rest = n_out - int(take.sum())
    if rest > 0:
        # Largest remainders first; stable sort keeps ties in class order.
        order = np.argsort(-(quota - take), kind="stable")
        take[order[:rest]] += 1
    rng = np.random.default_rng(seed)
    held = []
    for c, k in zip(classes, take, strict=True):
        idx = np.flatnonzero(labels == c)
        held.append(rng.permutation(idx)[:k])
    held_idx = np.sort(np.concatenate(held)) if held else np.empty(0, np.int64)
    mask = np.ones(n, dtype=bool)
    mask[held_idx] = False
    return np.flatnonzero(mask), held_idx


def channel_stats_uint8(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean/std of ``uint8`` images ``(N, C, H, W)`` scaled to [0, 1].

    Uses a 256-bin histogram per channel, so it needs no float copy of the data.
    """
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for c in range(x.shape[1]):
        hist = np.bincount(x[:, c].reshape(-1), minlength=256).astype(np.float64)
        n = hist.sum()
        m = float((hist * values).sum() / n)
        var = float((hist * (values - m) ** 2).sum() / n)
        means.append(m)
        stds.append(float(np.sqrt(var)))
    return tuple(means), tuple(stds)


def scalar_stats(x: np.ndarray) -> tuple[tuple[float], tuple[float]]:
    """Mean/std over every entry of a float array (one 'channel'), in float64."""
    x64 = np.asarray(x, dtype=np.float64)
    return (float(x64.mean()),), (float(x64.std()),)


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write ``arrays`` to ``path`` as an ``.npz`` atomically (see :mod:`cogcal._io`)."""
    save_npz(path, **arrays)


def missing_files_error(
    dataset: str, root: Path, missing: Sequence[Path], layout: str, fix: str
) -> DatasetNotFoundError:
    """Build the one error raised when a dataset's files are missing."""
    files = "\n".join(f"  - {p}" for p in missing)
    return DatasetNotFoundError(
        f"dataset {dataset!r} not found under data root {str(root)!r}; missing file(s):\n"
        f"{files}\nExpected layout under the data root:\n{layout}\n"
        f"How to fix: {fix} (nothing is downloaded automatically). "
        "Or point the data root elsewhere (root=... in load_dataset)."
    )
