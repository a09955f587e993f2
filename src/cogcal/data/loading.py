"""`load_dataset`: one entry point for registered datasets, ``folder:``, ``csv:`` and plugins."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cogcal._errors import ArgumentError
from cogcal.data import custom, downloads, folders, tables
from cogcal.data.base import (
    DATASETS,
    Dataset,
    _check_bool,
    _check_normalization,
    _parse_name,
    apply_normalization,
)

__all__ = ["load_dataset"]


def load_dataset(
    name: str,
    *,
    root: str | Path = "data",
    download: bool = False,
    mirror: str | None = None,
    target: str | None = None,
    image_size: int | None = None,
    normalization: str = "auto",
    progress: bool = True,
) -> Dataset:
    """Load a dataset with its fixed train/validation/test splits.

    Parameters
    ----------
    name : str
        What to load:

        - a registered name (:func:`list_datasets`, case-insensitive): ``mnist1d``,
          ``digits``, ``cifar10``, ``cifar100``, ``svhn``, ``celeba``, ``mnist1d-mtl``,
          ``digits-mtl``;
        - ``"folder:PATH"``: images in class subfolders (torchvision ``ImageFolder``
          layout), optionally under ``train/``, ``val/``, ``test/``;
        - ``"csv:PATH"``: a table with a header row; numeric feature columns and the class
          column named by ``target``;
        - ``"package.module:function"``: a plugin function returning a :class:`Dataset` or
          a mapping of splits (see ``docs/data.md``).

        Paths are relative to the working directory, not to ``root``.
    root : str or Path, default "data"
        Data root: registered image datasets are read from their standard torchvision
        layouts under it (and downloaded into it with ``download=True``); ``mnist1d``
        caches its generated samples in ``root/mnist1d/``.
    download : bool, default False
        Download a registered image dataset (``cifar10``, ``cifar100``, ``svhn``,
        ``celeba``) into ``root`` if its files are missing: resumable, every file checked
        against a pinned MD5 (see :func:`cogcal.data.download`). No effect on other data.
    mirror : str, optional
        Base URL (or local directory) of an internal mirror serving the official file
        names; default: the ``COGCAL_DATA_MIRROR`` environment variable, else the
        official URLs.
    target : str, optional
        ``csv:`` only (and required there): the name of the class column.
    image_size : int, optional
        ``folder:`` only: side of the square images after resizing the shorter side and
        centre-cropping (default 32).
    normalization : {"auto", "none", "imagenet", "per-column", "one-scale"}, default "auto"
        ``"auto"``: each dataset's documented normalisation (user data: statistics of the
        training split only); ``"none"``: none (``uint8`` images still scaled to [0, 1]);
        ``"imagenet"``: ImageNet's channel statistics (RGB images only); ``"per-column"``,
        ``"one-scale"``: feature vectors only, each column's own training-split mean/std,
        or one over all the training split's cells (docs/data.md).
    progress : bool, default True
        Show download progress bars on stderr.

    Returns
    -------
    Dataset

    Raises
    ------
    ArgumentError
        A ``ValueError``: unknown name (the message lists the known ones and suggests the
        closest), arguments that do not apply to the kind of data, bad user data.
    DatasetNotFoundError
        Missing files (the message names them, the expected layout and ``download=True``).
    DatasetCorruptError
        Unreadable files or unexpected content (the message names the file).

    Examples
    --------
    >>> from cogcal.data import load_dataset
    >>> ds = load_dataset("digits")
    >>> ds.input_shape, len(ds.train), len(ds.val), len(ds.test), ds.default_model
    ((1, 8, 8), 1149, 288, 360, 'cnn')
    >>> batch = ds.transform(ds.train.x[:4], train=True)
    >>> batch.dtype, tuple(batch.shape)
    (torch.float32, (4, 1, 8, 8))
    """
    kind, arg = _parse_name(name)
    normalization = _check_normalization(normalization)
    download = _check_bool(download, "download", "--download")
    progress = _check_bool(progress, "progress", "--progress")
    _check_applies(name, kind, target=target, image_size=image_size)
    if kind == "registered":
        root_path = Path(root).expanduser()
        if download and arg in downloads.RESOURCES:
            downloads.download(arg, root_path, mirror=mirror, progress=progress)
        entry = DATASETS.get(arg)
        ds = entry.builder(root_path)
        if ds.default_model is None:
            ds = replace(ds, default_model=entry.default_model)
        return apply_normalization(ds, normalization)

    if kind == "folder":
        return folders.load_image_folder(arg, image_size=image_size, normalization=normalization)
    if kind == "csv":
        return tables.load_csv(arg, target=target, normalization=normalization)
    return custom.load_plugin(arg, root=Path(root).expanduser(), normalization=normalization)


def _check_applies(name: str, kind: str, **options: object) -> None:
    """Refuse ``target``/``image_size`` given for a kind of data they do not apply to."""
    needs = {"target": "csv", "image_size": "folder"}
    for option, value in options.items():
        if value is not None and kind != needs[option]:
            flag = "--" + option.replace("_", "-")
            raise ArgumentError(
                f"`{option}` applies only to '{needs[option]}:PATH' datasets, got "
                f"{option}={value!r} with dataset {name!r}.",
                cli_message=f"{flag} applies only to --dataset {needs[option]}:PATH, got {flag} "
                f"{value} with --dataset {name}.",
            )
