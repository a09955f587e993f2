"""Image folders (``folder:PATH``): torchvision's ``ImageFolder`` layout, decoded with PIL.

:func:`load_image_folder` reads one subfolder per class, optionally split into ``train/``,
``val/``, ``test/``; images are resized and centre-cropped to square ``uint8`` images stored
like CIFAR. Splits the folders do not fix follow :data:`~cogcal.data.custom.USER_SPLIT_RULE`.
"""

from __future__ import annotations

import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cogcal._constraints import Integer, violation
from cogcal.data.base import (
    SPLIT_SEED,
    Dataset,
    DatasetCorruptError,
    DatasetNotFoundError,
    Split,
    apply_normalization,
    channel_stats_uint8,
)
from cogcal.data.custom import (
    USER_SPLIT_RULE,
    _check_every_class_in_every_split,
    _check_split_sizes,
    _class_counts,
    _err,
    _not_found,
    split_indices,
)
from cogcal.data.images import GRAYSCALE_MODES, IMAGE_EXTENSIONS, pil_image, resize_center_crop

__all__ = ["DEFAULT_IMAGE_SIZE", "image_files", "load_image_folder"]

#: Side of the square images of ``folder:`` datasets unless ``image_size`` says otherwise.
DEFAULT_IMAGE_SIZE = 32

_DECODE_CHUNK = 256


def _visible(p: Path) -> bool:
    return not p.name.startswith(".")


def _subdirs(folder: Path) -> list[Path]:
    try:
        return sorted((p for p in folder.iterdir() if p.is_dir() and _visible(p)), key=str)
    except OSError as err:
        raise DatasetCorruptError(f"cannot list {folder}: {err}.") from None


def _is_image(p: Path) -> bool:
    return p.suffix.lower() in IMAGE_EXTENSIONS and _visible(p)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _images_under(folder: Path, what: str, root: str, seen: dict[str, Path]) -> list[Path]:
    """Image files under ``folder`` (recursively), in sorted order.

    Symbolic links are followed only where they stay inside the dataset folder ``root``
    (a real path) and do not lead back to a folder they sit in (a loop); a link leaving
    the dataset folder, a loop, or an image reached twice (``seen``: real path -> first
    path) is an error naming the link, so no image is read twice or from elsewhere
    without a word. ``what`` starts each message (``"dataset 'folder:PATH'"``).
    """
    out: list[Path] = []
    if not _inside(os.path.realpath(folder), root):  # a class or split folder that is a link
        raise _err(
            f"{what}: {folder} is a link to {os.path.realpath(folder)}, outside "
            "the dataset folder; cogcal reads only files inside it: copy the files in, or link "
            "the whole dataset folder instead."
        )
    stack = [(folder, (os.path.realpath(folder),))]
    while stack:
        current, ancestors = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name, reverse=True)
        except OSError as err:
            raise DatasetCorruptError(f"cannot list {current}: {err}.") from None
        files, dirs = [], []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            real = os.path.realpath(path)
            if entry.is_symlink():
                if not _inside(real, root):
                    raise _err(
                        f"{what}: {path} is a link to {real}, outside the "
                        "dataset folder; cogcal reads only files inside it: copy the files in, "
                        "or link the whole dataset folder instead."
                    )
                if real in ancestors:
                    raise _err(
                        f"{what}: {path} is a link to {real}, a folder it sits "
                        "in (a loop that would read the same images again); remove the link."
                    )
            if entry.is_dir():
                dirs.append((path, (*ancestors, real)))
            elif entry.is_file() and _is_image(path):
                if real in seen:
                    raise _err(
                        f"{what}: {path} and {seen[real]} are the same image "
                        "file (through a link); each image may be in the dataset once: remove "
                        "the link."
                    )
                seen[real] = path
                files.append(path)
        out.extend(reversed(files))
        stack.extend(dirs)  # reverse-sorted: popped in sorted order
    return out


def image_files(folder: str | os.PathLike[str], *, what: str) -> list[Path]:
    """The image files under ``folder`` (recursively, sorted), read as ``folder:``
    datasets read them: hidden files and folders skipped, links followed only inside
    ``folder`` and never into a loop, no image reached twice (``cogcal predict`` reads a
    folder of images with it).

    ``what`` starts the message of the error raised for a link out, a loop or an image
    reached twice (an :class:`~cogcal._errors.ArgumentError`, a ``ValueError``).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "a").mkdir(); (root / "a" / "x.png").touch(); (root / ".hidden.png").touch()
    >>> [p.relative_to(root).as_posix() for p in image_files(root, what="inputs")]
    ['a/x.png']
    """
    folder = Path(folder)
    return _images_under(folder, what, os.path.realpath(folder), {})


def _scan_classes(
    folder: Path, spec: str, root: str, seen: dict[str, Path]
) -> dict[str, list[Path]]:
    """Class name -> image files of one class-folder root."""
    classes = _subdirs(folder)
    exts = ", ".join(IMAGE_EXTENSIONS)
    loose = [p for p in folder.iterdir() if p.is_file() and _is_image(p)]
    if loose:
        msg = (
            f"dataset 'folder:{spec}': {folder} holds image files directly (e.g. "
            f"{loose[0].name}); images must sit in one subfolder per class "
            f"({folder}/<class>/<image>)"
        )
        raise _err(msg + ".")
    if not classes:
        msg = (
            f"dataset 'folder:{spec}': {folder} has no class subfolders; expected "
            f"{folder}/<class>/<image> with images ({exts}), one subfolder per class "
            "(optionally under train/, val/, test/)"
        )
        raise _err(msg + ".", cls=DatasetNotFoundError)
    out = {}
    for c in classes:
        files = _images_under(c, f"dataset 'folder:{spec}'", root, seen)
        if not files:
            raise _err(
                f"dataset 'folder:{spec}': the class folder {c} holds no image files "
                f"({exts}); remove it or add images.",
                cls=DatasetNotFoundError,
            )
        out[c.name] = files
    return out


def _decode(paths: list[Path], size: int) -> tuple[list[np.ndarray], list[str]]:
    """Decode ``paths`` (resized, centre-cropped); also return each file's sha256."""
    arrays: list[np.ndarray] = [np.empty(0, np.uint8)] * len(paths)
    digests = [""] * len(paths)
    image = pil_image()

    def one(i: int) -> None:
        path = paths[i]
        try:
            data = path.read_bytes()
        except OSError as err:
            raise DatasetCorruptError(f"cannot read image {path}: {err}.") from None
        digests[i] = hashlib.sha256(data).hexdigest()
        try:
            with image.open(io.BytesIO(data)) as img:
                mode = "L" if img.mode in GRAYSCALE_MODES else "RGB"
                arrays[i] = resize_center_crop(img, size, mode=mode)
        except Exception as err:  # PIL raises many types for broken files
            raise DatasetCorruptError(
                f"cannot decode image {path}: {type(err).__name__}: {err}. Replace or remove "
                "the file."
            ) from None

    def chunk(start: int) -> None:
        for i in range(start, min(start + _DECODE_CHUNK, len(paths))):
            one(i)

    starts = range(0, len(paths), _DECODE_CHUNK)
    workers = max(1, min(8, os.cpu_count() or 1))
    if workers == 1 or len(starts) <= 1:
        for s in starts:
            chunk(s)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(chunk, starts))
    return arrays, digests


#: The side, in pixels, of the square images a folder: dataset is resized to.
IMAGE_SIZE = Integer(2, 4096, note="(side of the square images)")


def _check_image_size(image_size: Any) -> int:
    if image_size is None:
        return DEFAULT_IMAGE_SIZE
    error = violation(image_size, IMAGE_SIZE, "image_size", flag="--image-size")
    if error is not None:
        raise _err(str(error), error.cli_message)
    return int(image_size)


def load_image_folder(
    path: str | os.PathLike[str],
    *,
    image_size: int | None = None,
    normalization: str = "auto",
) -> Dataset:
    """Load images in class subfolders (torchvision ``ImageFolder`` layout).

    Layouts (``PATH`` relative to the working directory):

    - ``PATH/<class>/<image>``: one subfolder per class (images may sit deeper); the
      splits are drawn with :data:`USER_SPLIT_RULE`;
    - ``PATH/train/<class>/...`` with ``PATH/val/`` and/or ``PATH/test/``: those splits
      are used; a missing ``val/`` or ``test/`` is drawn from ``train/`` with the same rule.

    Classes are the sorted subfolder names (of ``train/``). Image files are those with the
    extensions of :data:`~cogcal.data.images.IMAGE_EXTENSIONS`; hidden files are skipped.
    Every image is decoded with PIL, converted to RGB (or kept grey, one channel, when all
    images are grey), its shorter side resized to ``image_size`` (bilinear, antialiased)
    and centre-cropped, as torchvision's ``Resize`` + ``CenterCrop``; stored ``uint8``
    ``(N, C, image_size, image_size)``.

    Parameters
    ----------
    path : str or Path
        The folder.
    image_size : int, optional
        Side of the square images (default :data:`DEFAULT_IMAGE_SIZE` = 32).
    normalization : {"auto", "none", "imagenet"}
        ``"auto"``: per-channel mean/std of the training split (on [0, 1] pixels).

    Returns
    -------
    Dataset
        ``name="folder:PATH"``, no augmentation (a flip can change the class of digits,
        text or medical images: a run asks for ``augment="flip"`` or ``"crop_flip"``,
        :func:`~cogcal.data.with_augment`), ``default_model="cnn"``;
        ``info`` records the layout, split rule, sizes, class counts, statistics and a
        content fingerprint (sha256 over the sorted relative paths and the sha256 of each
        file's bytes).
    """
    spec = os.fspath(path)
    folder = Path(spec).expanduser()
    size = _check_image_size(image_size)
    if not folder.is_dir():
        raise _not_found(f"folder:{spec}", folder, "a folder")
    given, layout = _layout(folder, spec)
    root, seen = os.path.realpath(folder), {}
    scanned = {s: _scan_classes(d, spec, root, seen) for s, d in given.items()}
    base = "train" if "train" in scanned else "all"
    classes = _check_classes(spec, scanned, given, base)
    files, digests, x_all, y_all, where = _read_images(scanned, classes, size)
    idx = _split(spec, y_all, where, base, given, classes)
    splits = {
        s: Split(torch.from_numpy(np.ascontiguousarray(x_all[i])), torch.from_numpy(y_all[i]))
        for s, i in idx.items()
    }
    c = x_all.shape[1]
    mean, std = channel_stats_uint8(splits["train"].x.numpy())
    std = tuple(s if s > 0 else 1.0 for s in std)
    info = {
        "dataset": f"folder:{spec}",
        "kind": "folder",
        "path": str(folder.resolve()),
        "layout": layout,
        "split_rule": _split_rule(given, base),
        "split_seed": SPLIT_SEED,
        "sizes": {s: int(len(i)) for s, i in idx.items()},
        "class_names": classes,
        "class_counts": {s: _class_counts(sp.y, len(classes)) for s, sp in splits.items()},
        "image_size": size,
        "channels": c,
        "preprocessing": (
            f"PIL decode; {'grey (all images are grey)' if c == 1 else 'RGB'}; shorter side "
            f"resized to {size} (bilinear, antialiased), centre crop {size}x{size}; uint8"
        ),
        "mean": list(mean),
        "std": list(std),
        "normalization": "per-channel mean/std of the training split, on [0, 1] pixels",
        "augmentation": "none (a run asks for one with augment='flip' or 'crop_flip')",
        "fingerprint": _fingerprint(folder, files, digests),
    }
    ds = Dataset(
        name=f"folder:{spec}",
        task="multiclass",
        num_classes=len(classes),
        input_shape=(c, size, size),
        class_names=classes,
        **splits,
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in std),
        augment=None,
        info=info,
        default_model="cnn",
    )
    return apply_normalization(ds, normalization)


def _split_rule(given: dict[str, Path], base: str) -> str:
    """How the splits were made: given by the split folders, or which were drawn, how."""
    drawn = [s for s in ("val", "test") if s not in given]
    if not drawn:
        return "given by the split folders"
    return (
        f"{', '.join(drawn)} drawn from {'train/' if base == 'train' else 'all images'}: "
        + USER_SPLIT_RULE
    )


def _layout(folder: Path, spec: str) -> tuple[dict[str, Path], str]:
    """The folders to scan (``{"train": ..., "val": ...}`` or ``{"all": folder}``), the layout."""
    names = {p.name for p in _subdirs(folder)}
    split_names = ("train", "val", "test")
    if "train" in names and names <= set(split_names):
        given = {s: folder / s for s in split_names if s in names}
        return given, f"split folders: {', '.join(s + '/' for s in given)}"
    if "train" in names and names & {"val", "test"}:
        others = sorted(names - set(split_names))
        raise _err(
            f"dataset 'folder:{spec}': {folder} mixes split folders (train/, val/, test/) "
            f"with other folders ({', '.join(others)}); put every class folder under "
            "train/ (and val/, test/), or use one subfolder per class without splits."
        )
    return {"all": folder}, "class folders (no split folders)"


def _check_classes(
    spec: str, scanned: dict[str, dict[str, list[Path]]], given: dict[str, Path], base: str
) -> list[str]:
    """The sorted classes of the ``base`` folder: at least 2, and every other split's within."""
    classes = sorted(scanned[base])
    if len(classes) < 2:
        raise _err(
            f"dataset 'folder:{spec}': found {len(classes)} class folder "
            f"({', '.join(classes)}) under {given[base]}; a classifier needs at least 2 classes."
        )
    for s, found in scanned.items():
        extra = sorted(set(found) - set(classes))
        if extra:
            raise _err(
                f"dataset 'folder:{spec}': {given[s]} has class folder(s) {', '.join(extra)} "
                f"that train/ lacks; every class of val/ and test/ must have training images."
            )
    return classes


def _read_images(
    scanned: dict[str, dict[str, list[Path]]], classes: list[str], size: int
) -> tuple[list[Path], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """``(files, digests, x, y, where)``: every image decoded, its label and its split folder.

    Grey images stay one channel when all are grey, else every image is RGB.
    """
    index = {c: i for i, c in enumerate(classes)}
    files: list[Path] = []
    labels: list[int] = []
    origin: list[str] = []
    for s, found in scanned.items():
        for c in sorted(found):
            files.extend(found[c])
            labels.extend([index[c]] * len(found[c]))
            origin.extend([s] * len(found[c]))
    arrays, digests = _decode(files, size)
    grey = all(a.shape[0] == 1 for a in arrays)
    if not grey:  # PIL's L -> RGB conversion copies the grey channel: same as converting first
        arrays = [np.repeat(a, 3, axis=0) if a.shape[0] == 1 else a for a in arrays]
    return files, digests, np.stack(arrays), np.asarray(labels, dtype=np.int64), np.asarray(origin)


def _split(
    spec: str,
    y_all: np.ndarray,
    where: np.ndarray,
    base: str,
    given: dict[str, Path],
    classes: list[str],
) -> dict[str, np.ndarray]:
    """Indices of the train/val/test splits: the split folders, the rest drawn from ``base``."""
    idx: dict[str, np.ndarray] = {}
    pool = np.flatnonzero(where == base)
    tr, va, te = split_indices(y_all[pool], test="test" not in given, val="val" not in given)
    idx["train"] = pool[tr]
    idx["val"] = pool[va] if va is not None else np.flatnonzero(where == "val")
    idx["test"] = pool[te] if te is not None else np.flatnonzero(where == "test")
    sizes = {s: int(len(i)) for s, i in idx.items()}
    _check_split_sizes(f"dataset 'folder:{spec}'", sizes, len(y_all), "add images")
    drawn_from = {s: i for s, i in idx.items() if s == "train" or s not in given}
    if len(drawn_from) > 1:  # as csv: a class the drawn splits leave out is refused
        _check_every_class_in_every_split(
            f"dataset 'folder:{spec}'", y_all, drawn_from, classes, "images"
        )
    return idx


def _fingerprint(folder: Path, files: list[Path], digests: list[str]) -> dict[str, Any]:
    """sha256 over the sorted relative paths and each image file's sha256."""
    fp = hashlib.sha256()
    for rel, digest in sorted(
        (f.relative_to(folder).as_posix(), d) for f, d in zip(files, digests, strict=True)
    ):
        fp.update(f"{rel}\0{digest}\n".encode())
    return {
        "sha256": fp.hexdigest(),
        "method": "sha256 over the sorted relative paths and the sha256 of each image file",
        "files": len(files),
    }
