"""Dataset container, registry, errors and split helpers shared by every dataset."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from cogcal._constraints import FRACTION, Boolean, check
from cogcal._errors import ArgumentError
from cogcal._registry import Registry
from cogcal.data.loader import BatchLoader
from cogcal.data.transforms import Preprocess, augment_crop_flip, normalize

if TYPE_CHECKING:
    from cogcal.data.loader import BatchLoader

__all__ = [
    "AUGMENTATIONS",
    "NORMALIZATIONS",
    "SPLIT_SEED",
    "TASKS",
    "Dataset",
    "DatasetCorruptError",
    "DatasetNotFoundError",
    "Split",
    "default_augment",
    "default_model",
    "list_datasets",
    "register_dataset",
    "with_augment",
]

#: Seed of every train/validation(/test) split. Fixed and independent of the training
#: seed, so that every run of every method sees the same splits.
SPLIT_SEED = 20240917

#: Tasks a :class:`Dataset` can describe.
TASKS = ("multiclass", "multilabel")

#: Augmentations :meth:`Dataset.transform` knows.
AUGMENTATIONS = (None, "flip", "crop_flip")

#: Values of ``load_dataset(..., normalization=...)``. The last two are for feature vectors
#: (1-D inputs: a ``csv:`` table, mnist1d, a plugin's): each column standardised with its
#: own training-split mean/std, or every column with one over all the training split's
#: cells, the two rules ``"auto"`` chooses between for a ``csv:`` table
#: (:func:`cogcal.data.tables.one_scale`), for when that choice is wrong for the data.
NORMALIZATIONS = ("auto", "none", "imagenet", "per-column", "one-scale")

#: Per-channel statistics of ImageNet (torchvision's pretrained-model constants), on [0, 1].
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: Prefixes of the user-data kinds of :func:`load_dataset`.
FOLDER_PREFIX = "folder:"
CSV_PREFIX = "csv:"


class DatasetNotFoundError(ArgumentError):
    """A dataset's files are missing under the data root (a ``ValueError``).

    ``str(err)`` names Python arguments (``root=``, ``download=True``); ``err.cli_message``
    names the command-line flags (``--data-root``, ``--download``).
    """


class DatasetCorruptError(ArgumentError):
    """A dataset file exists but cannot be read or has unexpected content (a ``ValueError``)."""


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
        split sizes, normalisation statistics, source files, generator arguments (for user
        data also the split rule and a content fingerprint).
    default_model : str or None
        Name of the backbone (:func:`cogcal.models.create_model`) that suits the data:
        ``"mlp"``, ``"cnn"``, ``"resnet18"``, ...; ``None`` when there is no default.
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
    default_model: str | None = None

    def __post_init__(self) -> None:
        if self.default_model is not None and not isinstance(self.default_model, str):
            raise ValueError(
                f"`default_model` must be a model name or None, got {self.default_model!r}."
            )
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

    def preprocess(self) -> Preprocess:
        """The evaluation-time :meth:`transform` as a module (:class:`~cogcal.data.Preprocess`):
        stored (raw) inputs in, model inputs out; ``uint8`` images of another size are
        resized to the stored side first."""
        pixels = self.train.x.dtype == torch.uint8
        square = len(self.input_shape) == 3 and self.input_shape[1] == self.input_shape[2]
        return Preprocess(
            self.mean,
            self.std,
            input_shape=self.input_shape,
            scale=1 / 255 if pixels else 1.0,
            image_size=self.input_shape[2] if pixels and square else None,
        )

    def input_record(self) -> dict[str, Any]:
        """What a run records about its inputs, so that a loaded run can take raw inputs
        without the data: the :meth:`preprocess` record, the stored dtype, and for tables the
        feature columns (in order) and the target column."""
        record: dict[str, Any] = {
            **self.preprocess().record(),
            "dtype": "uint8" if self.train.x.dtype == torch.uint8 else "float32",
        }
        for key in ("features", "target"):
            if key in self.info:
                record[key] = self.info[key]
        return record

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
            f"test={len(self.test)}, default_model={self.default_model!r})"
        )


# --------------------------------------------------------------------------- registry

DatasetBuilder = Callable[[Path], Dataset]


@dataclass(frozen=True)
class DatasetEntry:
    """What the registry knows about one dataset: its builder and its defaults."""

    builder: DatasetBuilder
    default_model: str | None = None
    augment: str = "none"


#: The registered datasets, name (lower case) -> :class:`DatasetEntry`.
DATASETS: Registry[DatasetEntry] = Registry(
    "dataset", unknown="unknown {kind} {name!r}; known datasets: {known}.{hint}", cutoff=0.5
)

#: Values of ``augment`` in a training configuration (``"none"``: no augmentation).
AUGMENT_CHOICES = ("none", "flip", "crop_flip")
#: What each augmentation does, as recorded in ``Dataset.info["augmentation"]``.
AUGMENT_TEXT = {
    "none": "none",
    "flip": "random horizontal flip (training only)",
    "crop_flip": "random crop of the 4-pixel zero-padded image + horizontal flip (training only)",
}


def register_dataset(
    name: str, *, default_model: str | None = None, augment: str = "none"
) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Register a dataset builder under ``name`` (a decorator).

    The builder takes the data root (a :class:`~pathlib.Path`) and returns a
    :class:`Dataset`.

    Parameters
    ----------
    name : str
        Registry name (matched case-insensitively; must not contain ``":"``, which marks
        the ``folder:``/``csv:``/plugin forms of :func:`load_dataset`).
    default_model : str, optional
        Backbone that suits the dataset (:func:`default_model` returns it without loading
        the data; :func:`load_dataset` sets :attr:`Dataset.default_model` from it when the
        builder leaves it ``None``).
    augment : {"none", "flip", "crop_flip"}
        The training augmentation a run uses unless told otherwise (:func:`default_augment`).
    """
    key = name.lower()
    if ":" in key or not key.strip():
        raise ValueError(f"a dataset name must be non-empty and contain no ':', got {name!r}.")

    def decorator(fn: DatasetBuilder) -> DatasetBuilder:
        same = DATASETS.key(key)
        if same is not None and DATASETS.get(same).builder is not fn:
            raise ValueError(f"a dataset named {key!r} is already registered.")
        DATASETS.register(key, DatasetEntry(fn, default_model, augment), overwrite=True)
        return fn

    return decorator


def list_datasets() -> list[str]:
    """Return the names of all registered datasets, sorted."""
    return DATASETS.names()


def _parse_name(name: Any) -> tuple[str, str]:
    """Classify a dataset name: ``(kind, argument)``, kind in registered/folder/csv/plugin."""
    if not isinstance(name, str) or not name.strip():
        raise ArgumentError(
            f"`name` must be a non-empty string naming a dataset, got {name!r}.",
            cli_message=f"--dataset must name a dataset, got {name!r}.",
        )
    text = name.strip()
    key = text.lower()
    for prefix, kind in ((FOLDER_PREFIX, "folder"), (CSV_PREFIX, "csv")):
        if key.startswith(prefix):
            path = text[len(prefix) :].strip()
            if not path:
                raise ArgumentError(
                    f"dataset {text!r}: give a path after {prefix!r}, e.g. '{prefix}/data/x'.",
                    cli_message=f"--dataset {text}: give a path after {prefix!r}, "
                    f"e.g. --dataset {prefix}/data/x.",
                )
            return kind, path
    if ":" in text:  # registered names have no ':'
        return "plugin", text
    forms = (
        " For your own data use 'folder:PATH' (class subfolders of images), 'csv:PATH' "
        "(with {target}) or a plugin 'package.module:function'."
    )
    try:
        DATASETS.get(name)
    except ArgumentError as err:  # the registry's message, plus the forms of user data
        raise ArgumentError(
            str(err) + forms.format(target="target=COLUMN"),
            cli_message=err.cli_message + forms.format(target="--target COLUMN"),
        ) from None
    return "registered", DATASETS.key(name) or key


def default_model(name: str) -> str | None:
    """The backbone that suits a dataset, computed without loading any data.

    Registered datasets: their registered default (``mnist1d`` -> ``"mlp"``, ``digits`` ->
    ``"cnn"``, ``cifar10``/``cifar100``/``svhn``/``celeba`` -> ``"resnet18"``, the
    multi-task proxies as their base); ``folder:PATH`` -> ``"cnn"``; ``csv:PATH`` ->
    ``"mlp"``; plugins -> ``None`` (known only once loaded: :attr:`Dataset.default_model`).

    Parameters
    ----------
    name : str
        A dataset name as accepted by :func:`load_dataset`.

    Raises
    ------
    ArgumentError
        Unknown name (a ``ValueError``).

    Examples
    --------
    >>> from cogcal.data import default_model
    >>> default_model("MNIST1D"), default_model("cifar10"), default_model("csv:data.csv")
    ('mlp', 'resnet18', 'mlp')
    >>> default_model("my_pkg.data:load") is None
    True
    """
    kind, arg = _parse_name(name)
    if kind == "registered":
        return DATASETS.get(arg).default_model
    return {"folder": "cnn", "csv": "mlp"}.get(kind)


def default_augment(name: str) -> str:
    """The training augmentation a run on dataset ``name`` uses unless told otherwise.

    The paper's natural-image datasets keep their protocol (``cifar10``, ``cifar100``,
    ``svhn``: ``"crop_flip"``; ``celeba``: ``"flip"``); everything else gets ``"none"``:
    digits, mnist1d, tables and ``folder:`` images, for which a flip may change the class
    (digits, text, medical images): ask for ``"flip"`` or ``"crop_flip"`` explicitly.
    Plugins: ``"auto"``, the augmentation of the :class:`Dataset` the plugin returns.

    >>> default_augment("cifar10"), default_augment("digits"), default_augment("folder:x")
    ('crop_flip', 'none', 'none')
    """
    kind, arg = _parse_name(name)
    if kind == "registered":
        return DATASETS.get(arg).augment
    return "auto" if kind == "plugin" else "none"


def with_augment(ds: Dataset, augment: str) -> Dataset:
    """``ds`` with its training augmentation set to ``augment`` (``"auto"``: unchanged).

    Raises
    ------
    ArgumentError
        An image augmentation for data that are not images ``(C, H, W)``.
    """
    if augment == "auto":
        return ds
    if augment not in AUGMENT_CHOICES:
        raise ArgumentError(
            f"`augment` must be one of {', '.join(AUGMENT_CHOICES)}, got {augment!r}.",
            cli_message=f"--augment must be one of {', '.join(AUGMENT_CHOICES)}, got {augment!r}.",
        )
    if augment != "none" and len(ds.input_shape) != 3:
        raise ArgumentError(
            f"augment={augment!r} flips images; dataset {ds.name!r} has inputs of shape "
            f"{ds.input_shape}, not images (C, H, W): use augment='none'.",
            cli_message=f"--augment {augment} flips images; dataset {ds.name!r} has inputs of "
            f"shape {ds.input_shape}, not images: use --augment none.",
        )
    info = {**ds.info, "augmentation": AUGMENT_TEXT[augment]}
    return replace(ds, augment=None if augment == "none" else augment, info=info)


def _check_bool(value: Any, name: str, flag: str) -> bool:
    if Boolean().problem(bool(value) if isinstance(value, np.bool_) else value) is not None:
        raise ArgumentError(
            f"`{name}` must be True or False, got {value!r}.",
            cli_message=f"{flag} takes no value (got {value!r}).",
        )
    return bool(value)


def _check_normalization(normalization: Any) -> str:
    if normalization not in NORMALIZATIONS:
        raise ArgumentError(
            f"`normalization` must be one of {', '.join(map(repr, NORMALIZATIONS))}, "
            f"got {normalization!r}.",
            cli_message=f"--normalization must be one of {', '.join(NORMALIZATIONS)}, "
            f"got {normalization!r}.",
        )
    return str(normalization)


def apply_normalization(ds: Dataset, normalization: str) -> Dataset:
    """Return ``ds`` with its normalisation replaced as asked (``"auto"``: unchanged).

    ``"none"``: mean 0, std 1 for every channel (``uint8`` images are still scaled to
    [0, 1]); ``"imagenet"``: ImageNet's per-channel mean/std, for 3-channel images only
    (stored ``uint8``, or floats already on [0, 1]); ``"per-column"`` and ``"one-scale"``:
    for feature vectors only, each column's own mean/std on the training split (population
    std; a column constant there gets std 1), or one mean/std over all its cells.

    >>> import torch
    >>> from cogcal.data import dataset_from_splits
    >>> x = torch.tensor([[0.0, 10.0], [2.0, 30.0]])
    >>> ds = dataset_from_splits((x, torch.tensor([0, 1])), (x, torch.tensor([0, 1])),
    ...                          (x, torch.tensor([0, 1])), num_classes=2)
    >>> apply_normalization(ds, "per-column").mean, apply_normalization(ds, "one-scale").mean
    ((1.0, 20.0), (10.5, 10.5))
    """
    normalization = _check_normalization(normalization)
    if normalization == "auto":
        return ds
    if normalization in ("per-column", "one-scale"):
        return _feature_normalization(ds, normalization)
    k = len(ds.mean)
    if normalization == "none":
        mean, std = (0.0,) * k, (1.0,) * k
        text = "none (mean 0, std 1; uint8 images scaled to [0, 1])"
    else:
        if len(ds.input_shape) != 3 or ds.input_shape[0] != 3:
            why = "ImageNet's per-channel statistics are for RGB images"
            raise ArgumentError(
                f"normalization='imagenet' needs RGB images (3, H, W), as {why}; dataset "
                f"{ds.name!r} has inputs of shape {ds.input_shape}. Use normalization='auto' "
                "or 'none'.",
                cli_message=f"--normalization imagenet needs RGB images, as {why}; dataset "
                f"{ds.name!r} has inputs of shape {ds.input_shape}. Use --normalization auto "
                "or none.",
            )
        mean, std = IMAGENET_MEAN, IMAGENET_STD
        text = "imagenet (torchvision's ImageNet per-channel mean/std, on [0, 1] pixels)"
    info = dict(ds.info)
    info.update({"mean": list(mean), "std": list(std), "normalization": text})
    return replace(ds, mean=tuple(mean), std=tuple(std), info=info)


def _feature_normalization(ds: Dataset, normalization: str) -> Dataset:
    """:func:`apply_normalization`'s ``"per-column"`` and ``"one-scale"``."""
    x = ds.train.x
    if len(ds.input_shape) != 1 or not x.dtype.is_floating_point:
        flag = f"normalization={normalization!r}"
        raise ArgumentError(
            f"{flag} standardises the columns of feature vectors (1-D inputs: a csv: table, "
            f"mnist1d, a plugin's); dataset {ds.name!r} has inputs of shape {ds.input_shape}"
            f"{'' if x.dtype.is_floating_point else f' stored as {x.dtype}'}. Use "
            "normalization='auto' or 'none'.",
            cli_message=f"--normalization {normalization} standardises the columns of feature "
            f"vectors (a csv: table, mnist1d, a plugin's 1-D inputs); dataset {ds.name!r} has "
            f"inputs of shape {ds.input_shape}. Use --normalization auto or none.",
        )
    mean, std, text = feature_scaling(x.numpy().astype(np.float64), normalization)
    shared = (
        f", shared by its {ds.input_shape[0]} feature columns"
        if normalization == "one-scale"
        else ""
    )
    text = f"{text}{shared}, as asked (normalization={normalization!r})"
    info = dict(ds.info)
    info.update({"mean": list(mean), "std": list(std), "normalization": text})
    return replace(ds, mean=mean, std=std, info=info)


def feature_scaling(
    cells: np.ndarray, rule: str, *, column_std: np.ndarray | None = None
) -> tuple[tuple[float, ...], tuple[float, ...], str]:
    """The training split's standardisation of feature vectors ``cells`` (rows x columns)
    under ``rule``: ``"per-column"`` (each column's mean and population std; a column
    constant on it gets std 1) or ``"one-scale"`` (one mean/std over all the cells, for
    every column); returns the per-column means, stds and the rule in words.
    ``column_std``: the columns' stds when the caller has them (not computed again).

    >>> import numpy as np
    >>> feature_scaling(np.array([[0.0, 10.0], [2.0, 10.0]]), "per-column")[:2]
    ((1.0, 10.0), (1.0, 1.0))
    >>> cells = np.array([[0.0, 10.0], [2.0, 30.0]])
    >>> mean, std, _ = feature_scaling(cells, "one-scale")
    >>> mean, std == (cells.std(),) * 2
    ((10.5, 10.5), True)
    """
    columns = cells.shape[1]
    if rule == "one-scale":
        pooled = float(cells.std())
        return (
            (float(cells.mean()),) * columns, (pooled if pooled > 0 else 1.0,) * columns,
            "one mean/std over all the training split's cells",
        )  # fmt: skip
    std = cells.std(axis=0) if column_std is None else column_std
    return (
        tuple(float(v) for v in cells.mean(axis=0)),
        tuple(float(v) if v > 0 else 1.0 for v in std),
        "per-column standardisation with the training split's mean/std (population std; "
        "columns constant on it get std 1)",
    )


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
    check(fraction, FRACTION, "fraction")
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


def missing_files_error(
    dataset: str,
    root: Path,
    missing: Sequence[Path],
    layout: str,
    fix: str,
    *,
    download: str | None = None,
    cli_fix: str | None = None,
    function: str = "load_dataset",
) -> DatasetNotFoundError:
    """Build the one error raised when a dataset's files are missing.

    Parameters
    ----------
    dataset : str
        What is missing (e.g. ``"cifar10"``).
    root : Path
        The data root searched.
    missing : sequence of Path
        Every missing path.
    layout : str
        The expected layout under the data root.
    fix : str
        How to get the files by hand (Python form).
    download : str, optional
        If the files can be downloaded: what is downloaded (e.g. ``"cifar-10-python.tar.gz,
        163 MiB"``); the message then names ``download=True`` / ``--download``.
    cli_fix : str, optional
        ``fix`` for the command line (default: ``fix``).
    function : str, default "load_dataset"
        The Python function whose arguments the message names.
    """
    files = "\n".join(f"  - {p}" for p in missing)
    head = (
        f"dataset {dataset!r} not found under data root {str(root)!r}; missing file(s):\n"
        f"{files}\nExpected layout under the data root:\n{layout}\nHow to fix: "
    )
    if download:
        py_dl = f"pass download=True to {function} to download it ({download}, MD5-verified); or "
        cli_dl = f"add --download to download it ({download}, MD5-verified); or "
    else:
        py_dl = cli_dl = ""
    return DatasetNotFoundError(
        f"{head}{py_dl}{fix}; or point the data root elsewhere (root=... in {function}).",
        cli_message=f"{head}{cli_dl}{cli_fix if cli_fix is not None else fix}; or point the "
        "data root elsewhere (--data-root DIR).",
    )
