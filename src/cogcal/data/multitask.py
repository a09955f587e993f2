"""Multi-task (multi-label) datasets: CelebA's 40 attributes and CPU proxies.

``celeba`` reads the torchvision CelebA layout under the data root (official partitions,
images resized and centre-cropped to 32x32 as in the paper, 40 binary attributes) and
caches the decoded images once under ``root/celeba/cogcal-32x32.npz``.

``mnist1d-mtl`` and ``digits-mtl`` are *proxies* that run on a CPU in seconds: the
inputs and splits of ``mnist1d`` / ``digits`` with :data:`PROXY_TASKS`, eight binary
tasks derived from the digit label (one of them with fixed label noise). They exercise
the multi-task code paths; they are not a benchmark of the paper. See ``docs/multitask.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cogcal._io import save_npz
from cogcal.data.base import (
    AUGMENTATIONS,
    Dataset,
    DatasetCorruptError,
    Split,
    channel_stats_uint8,
    missing_files_error,
    register_dataset,
)
from cogcal.data.downloads import describe
from cogcal.data.images import pil_image, resize_center_crop
from cogcal.data.loading import load_dataset

__all__ = [
    "CELEBA_ATTRIBUTES",
    "CELEBA_CACHE_NAME",
    "CELEBA_IMAGE_SIZE",
    "PROXY_NOISE_SEED",
    "PROXY_TASKS",
    "ProxyTask",
    "celeba_preprocess",
    "proxy_task_labels",
]

# --------------------------------------------------------------------------- CelebA

#: The 40 attribute names of ``list_attr_celeba.txt``, in file order.
CELEBA_ATTRIBUTES: tuple[str, ...] = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald",
    "Bangs", "Big_Lips", "Big_Nose", "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair",
    "Bushy_Eyebrows", "Chubby", "Double_Chin", "Eyeglasses", "Goatee", "Gray_Hair",
    "Heavy_Makeup", "High_Cheekbones", "Male", "Mouth_Slightly_Open", "Mustache",
    "Narrow_Eyes", "No_Beard", "Oval_Face", "Pale_Skin", "Pointy_Nose",
    "Receding_Hairline", "Rosy_Cheeks", "Sideburns", "Smiling", "Straight_Hair",
    "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick",
    "Wearing_Necklace", "Wearing_Necktie", "Young",
)  # fmt: skip

#: Side of the stored square images.
CELEBA_IMAGE_SIZE = 32
#: Cache file written under ``root/celeba/``.
CELEBA_CACHE_NAME = "cogcal-32x32.npz"

CELEBA_DIR = "celeba"
CELEBA_IMG_DIR = "img_align_celeba"
CELEBA_ATTR_FILE = "list_attr_celeba.txt"
CELEBA_PARTITION_FILE = "list_eval_partition.txt"
CELEBA_PARTITIONS = ("train", "val", "test")  # codes 0, 1, 2 of list_eval_partition.txt

#: Description of the image preprocessing; part of the cache key.
CELEBA_PREPROCESSING = (
    "PIL: convert to RGB; resize the shorter side to 32 with bilinear filtering (PIL's "
    "resize, which antialiases when downscaling), the longer side to int(32 * long / short), "
    "as torchvision's Resize(32); centre crop 32x32 with offsets round((side - 32) / 2), as "
    "torchvision's CenterCrop(32); stored uint8 (N, 3, 32, 32)"
)

# Bump when the cache content or the preprocessing changes.
_CELEBA_CACHE_VERSION = 1
_DECODE_CHUNK = 512


def celeba_preprocess(image: Any, size: int = CELEBA_IMAGE_SIZE) -> np.ndarray:
    """Resize (shorter side) and centre-crop one PIL image, as the ``celeba`` dataset does.

    Equivalent to torchvision's ``Compose([Resize(size), CenterCrop(size)])`` on a PIL
    image with the default bilinear interpolation.

    Parameters
    ----------
    image : PIL.Image.Image
        Any mode; converted to RGB.
    size : int, default 32
        Side of the output.

    Returns
    -------
    numpy.ndarray
        ``uint8`` array of shape ``(3, size, size)``.
    """
    return resize_center_crop(image, size, mode="RGB")


def _decode_image(path: Path) -> np.ndarray:
    """Decode and preprocess one CelebA image (see :func:`celeba_preprocess`)."""
    try:
        with pil_image().open(path) as img:
            return celeba_preprocess(img, CELEBA_IMAGE_SIZE)
    except (OSError, ValueError, SyntaxError) as err:
        raise DatasetCorruptError(
            f"cannot decode CelebA image {path}: {type(err).__name__}: {err}. "
            "Extract img_align_celeba.zip again."
        ) from None


def _decode_all(paths: list[Path]) -> np.ndarray:
    """Decode ``paths`` into one ``(N, 3, 32, 32)`` array, in chunks, on a thread pool.

    PIL releases the GIL while decoding and resizing, so threads scale with the cores.
    """
    s = CELEBA_IMAGE_SIZE
    out = np.empty((len(paths), 3, s, s), dtype=np.uint8)

    def work(start: int) -> None:
        for i in range(start, min(start + _DECODE_CHUNK, len(paths))):
            out[i] = _decode_image(paths[i])

    workers = max(1, min(8, os.cpu_count() or 1))
    starts = range(0, len(paths), _DECODE_CHUNK)
    if workers == 1 or len(starts) <= 1:
        for st in starts:
            work(st)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(work, starts):
                pass
    return out


def _corrupt(path: Path, lineno: int, problem: str) -> DatasetCorruptError:
    return DatasetCorruptError(
        f"{path}, line {lineno}: {problem}. The file does not have the format of the "
        "official CelebA file; download it again."
    )


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetCorruptError(f"cannot read {path}: {type(err).__name__}: {err}.") from None


def _check_filename(path: Path, lineno: int, name: str) -> None:
    if Path(name).name != name or name in (".", "..") or "\\" in name:
        raise _corrupt(path, lineno, f"{name!r} is not a plain image file name")


def _parse_partition(path: Path) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """Parse ``list_eval_partition.txt``: ``filename 0|1|2`` per line, no header."""
    names: list[str] = []
    codes: list[int] = []
    where: dict[str, int] = {}
    for lineno, line in enumerate(_read_lines(path), start=1):
        tok = line.split()
        if not tok:
            continue
        if len(tok) != 2:
            raise _corrupt(path, lineno, f"expected 'filename partition', got {line.strip()!r}")
        name, code = tok
        _check_filename(path, lineno, name)
        if code not in ("0", "1", "2"):
            raise _corrupt(path, lineno, f"partition must be 0, 1 or 2, got {code!r}")
        if name in where:
            raise _corrupt(path, lineno, f"{name!r} already listed on line {where[name]}")
        where[name] = lineno
        names.append(name)
        codes.append(int(code))
    if not names:
        raise DatasetCorruptError(f"{path} lists no images.")
    return names, np.asarray(codes, dtype=np.int8), where


def _parse_attributes(path: Path) -> tuple[list[str], dict[str, tuple[int, list[str]]]]:
    """Parse ``list_attr_celeba.txt``: count, 40 names, then ``filename v1..v40`` (-1/1).

    Returns the attribute names and, per file name, its line number and raw values.
    """
    lines = _read_lines(path)
    if len(lines) < 2:
        raise _corrupt(path, len(lines) or 1, "expected a count line and an attribute-name line")
    try:
        count = int(lines[0].strip())
    except ValueError:
        raise _corrupt(
            path, 1, f"expected the number of images, got {lines[0].strip()!r}"
        ) from None
    names = lines[1].split()
    n_attr = len(CELEBA_ATTRIBUTES)
    if len(names) != n_attr:
        raise _corrupt(path, 2, f"expected {n_attr} attribute names, got {len(names)}")
    if len(set(names)) != n_attr:
        raise _corrupt(path, 2, "attribute names are not unique")
    rows: dict[str, tuple[int, list[str]]] = {}
    for lineno, line in enumerate(lines[2:], start=3):
        tok = line.split()
        if not tok:
            continue
        if len(tok) != n_attr + 1:
            raise _corrupt(
                path, lineno, f"expected a file name and {n_attr} values, got {len(tok)} fields"
            )
        name, values = tok[0], tok[1:]
        _check_filename(path, lineno, name)
        bad = next((v for v in values if v not in ("1", "-1")), None)
        if bad is not None:
            raise _corrupt(path, lineno, f"attribute values must be -1 or 1, got {bad!r}")
        if name in rows:
            raise _corrupt(path, lineno, f"{name!r} already listed on line {rows[name][0]}")
        rows[name] = (lineno, values)
    if len(rows) != count:
        raise _corrupt(path, 1, f"the header announces {count} images but {len(rows)} are listed")
    return names, rows


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as err:
        raise DatasetCorruptError(f"cannot read {path}: {type(err).__name__}: {err}.") from None
    return h.hexdigest()


def _celeba_key(attr_path: Path, part_path: Path) -> str:
    return json.dumps(
        {
            "version": _CELEBA_CACHE_VERSION,
            "size": CELEBA_IMAGE_SIZE,
            "preprocessing": CELEBA_PREPROCESSING,
            "attr_sha256": _sha256(attr_path),
            "partition_sha256": _sha256(part_path),
        },
        sort_keys=True,
    )


_CACHE_KEYS = ("key", "x", "y", "counts", "filenames", "attr_names", "mean", "std")


def _load_celeba_cache(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """Return the cache's arrays, or None (with a warning) when it must be rebuilt."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if "key" not in f.files or str(f["key"]) != key:
                warnings.warn(
                    f"the CelebA cache {path} was built from other list files or another "
                    "preprocessing; rebuilding it (decoding every image takes minutes).",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return None
            data = {k: f[k] for k in _CACHE_KEYS}
        n, s, t = data["x"].shape[0], CELEBA_IMAGE_SIZE, len(CELEBA_ATTRIBUTES)
        if (
            data["x"].shape != (n, 3, s, s)
            or data["x"].dtype != np.uint8
            or data["y"].shape != (n, t)
            or data["counts"].shape != (3,)
            or int(data["counts"].sum()) != n
            or data["filenames"].shape != (n,)
            or data["attr_names"].shape != (t,)
        ):
            raise DatasetCorruptError("unexpected array shapes")
        return data
    except Exception as err:  # unreadable, truncated or foreign file: rebuild
        warnings.warn(
            f"ignoring unreadable CelebA cache {path} ({err}); rebuilding it "
            "(decoding every image takes minutes).",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _build_celeba_cache(
    root: Path, base: Path, attr_path: Path, part_path: Path, key: str
) -> dict[str, np.ndarray]:
    """Parse and cross-check the list files, decode every image, compute the statistics."""
    names, codes, part_line = _parse_partition(part_path)
    attr_names, rows = _parse_attributes(attr_path)
    for name in names:
        if name not in rows:
            raise DatasetCorruptError(
                f"{attr_path}: no attribute line for {name!r}, which {part_path} lists on "
                f"line {part_line[name]}. The two files must list the same images."
            )
    if len(rows) != len(names):
        extra = next(n for n in rows if n not in part_line)
        raise DatasetCorruptError(
            f"{part_path}: no partition line for {extra!r}, which {attr_path} lists on line "
            f"{rows[extra][0]}. The two files must list the same images."
        )
    img_dir = base / CELEBA_IMG_DIR
    try:
        present = set(os.listdir(img_dir))
    except OSError as err:
        raise DatasetCorruptError(f"cannot list {img_dir}: {err}.") from None
    missing = [n for n in names if n not in present]
    if len(missing) == len(names):
        raise missing_files_error(
            "celeba",
            root,
            [img_dir / names[0]],
            _celeba_layout(root),
            f"{img_dir} holds none of the images listed in {part_path}; extract "
            f"img_align_celeba.zip into {base}",
        )
    if missing:
        raise DatasetCorruptError(
            f"{img_dir}: {len(missing)} image(s) listed in {part_path} are missing, the first "
            f"{missing[0]!r} (line {part_line[missing[0]]}). Extract img_align_celeba.zip again."
        )
    # Store the images grouped by partition (train, val, test), each in file order, so
    # that every split is a contiguous slice of the cache.
    order = np.argsort(codes, kind="stable")
    ordered = [names[i] for i in order]
    x = _decode_all([img_dir / n for n in ordered])
    flat = " ".join(" ".join(rows[n][1]) for n in ordered).split()
    y = np.asarray(flat, dtype=np.int8).reshape(len(ordered), len(attr_names))
    y = ((y + 1) // 2).astype(np.int8)  # -1/1 -> 0/1
    counts = np.bincount(codes, minlength=3).astype(np.int64)
    if counts[0] == 0:
        raise DatasetCorruptError(f"{part_path} assigns no image to the training partition (0).")
    mean, std = channel_stats_uint8(x[: counts[0]])
    return {
        "key": np.asarray(key),
        "x": x,
        "y": y,
        "counts": counts,
        "filenames": np.asarray(ordered),
        "attr_names": np.asarray(attr_names),
        "mean": np.asarray(mean, dtype=np.float64),
        "std": np.asarray(std, dtype=np.float64),
    }


def _celeba_layout(root: Path) -> str:
    return (
        f"  {root}/{CELEBA_DIR}/\n"
        f"      {CELEBA_IMG_DIR}/000001.jpg ... 202599.jpg\n"
        f"      {CELEBA_ATTR_FILE}\n"
        f"      {CELEBA_PARTITION_FILE}\n"
        f"  (torchvision's CelebA(root={str(root)!r}) layout)"
    )


def _flip_augmentation() -> str | None:
    # docs/method.md section 4: CelebA uses a random horizontal flip (no crop) in training. Used as
    # soon as Dataset knows the "flip" augmentation; no augmentation until then.
    return "flip" if "flip" in AUGMENTATIONS else None


@register_dataset("celeba", default_model="resnet18", augment="flip")
def _load_celeba(root: Path) -> Dataset:
    """CelebA, 40 binary attributes, official partitions, 32x32 images (cached)."""
    base = root / CELEBA_DIR
    attr_path, part_path = base / CELEBA_ATTR_FILE, base / CELEBA_PARTITION_FILE
    img_dir = base / CELEBA_IMG_DIR
    missing = [p for p in (attr_path, part_path) if not p.is_file()]
    if not img_dir.is_dir():
        missing.append(img_dir)
    if missing:
        raise missing_files_error(
            "celeba",
            root,
            missing,
            _celeba_layout(root),
            "download img_align_celeba.zip, list_attr_celeba.txt and list_eval_partition.txt "
            "from the CelebA page (https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html, "
            f"'Align&Cropped Images' and 'Anno'/'Eval') into {base} and extract the zip there",
            download=describe("celeba"),
        )
    key = _celeba_key(attr_path, part_path)
    cache = base / CELEBA_CACHE_NAME
    data = _load_celeba_cache(cache, key) if cache.exists() else None
    cache_hit = data is not None
    build_seconds = None
    if data is None:
        t0 = time.perf_counter()
        data = _build_celeba_cache(root, base, attr_path, part_path, key)
        build_seconds = time.perf_counter() - t0
        try:
            save_npz(cache, **data)
        except OSError as err:
            warnings.warn(
                f"could not write the CelebA cache {cache} ({err}); continuing without it "
                "(the next load decodes every image again).",
                RuntimeWarning,
                stacklevel=2,
            )
    x = data["x"]
    y = torch.from_numpy(data["y"].astype(np.int64))
    counts = [int(c) for c in data["counts"]]
    bounds = np.concatenate([[0], np.cumsum(counts)])
    splits = {
        name: Split(
            torch.from_numpy(np.ascontiguousarray(x[bounds[i] : bounds[i + 1]])),
            y[bounds[i] : bounds[i + 1]],
        )
        for i, name in enumerate(CELEBA_PARTITIONS)
    }
    mean = tuple(float(v) for v in data["mean"])
    std = tuple(float(v) for v in data["std"])
    attr_names = [str(n) for n in data["attr_names"]]
    augment = _flip_augmentation()
    info = {
        "dataset": "celeba",
        "splits": "official partitions of list_eval_partition.txt (0 train, 1 val, 2 test)",
        "sizes": dict(zip(CELEBA_PARTITIONS, counts, strict=True)),
        "tasks": attr_names,
        "labels": "attribute -1/1 mapped to 0/1",
        "mean": list(mean),
        "std": list(std),
        "normalization": "per-channel on [0, 1] pixels, computed on the training partition",
        "preprocessing": CELEBA_PREPROCESSING,
        "augmentation": "random horizontal flip (training only)"
        if augment == "flip"
        else "none (random horizontal flip pending Dataset support for augment='flip')",
        "positive_rate_train": [float(v) for v in splits["train"].y.float().mean(0).tolist()],
        "source_files": [str(attr_path), str(part_path), str(img_dir)],
        "cache": str(cache),
        "cache_hit": cache_hit,
        "build_seconds": build_seconds,
    }
    return Dataset(
        name="celeba",
        task="multilabel",
        num_classes=len(attr_names),
        input_shape=(3, CELEBA_IMAGE_SIZE, CELEBA_IMAGE_SIZE),
        class_names=attr_names,
        **splits,
        mean=mean,
        std=std,
        augment=augment,
        info=info,
    )


# --------------------------------------------------------------------------- CPU proxies


@dataclass(frozen=True)
class ProxyTask:
    """One binary task of the multi-task CPU proxies.

    Attributes
    ----------
    name : str
        Task name (``class_names`` entry).
    digits : tuple of int
        Digit classes whose label is 1.
    label_noise : float
        Probability that a sample's label is flipped (fixed draw, see
        :func:`proxy_task_labels`).
    """

    name: str
    digits: tuple[int, ...]
    label_noise: float = 0.0


#: The tasks of ``mnist1d-mtl`` and ``digits-mtl``, in column order. Different base
#: rates (10% to 50%) and difficulties; ``even_noisy`` is ``even`` with 20% of its labels
#: flipped, so its best achievable accuracy is 80% and a calibrated model must say so.
PROXY_TASKS: tuple[ProxyTask, ...] = (
    ProxyTask("even", (0, 2, 4, 6, 8)),
    ProxyTask("greater_than_4", (5, 6, 7, 8, 9)),
    ProxyTask("has_loop", (0, 6, 8, 9)),
    ProxyTask("prime", (2, 3, 5, 7)),
    ProxyTask("multiple_of_3", (0, 3, 6, 9)),
    ProxyTask("is_zero", (0,)),
    ProxyTask("is_one", (1,)),
    ProxyTask("even_noisy", (0, 2, 4, 6, 8), label_noise=0.2),
)

#: Seed of the label noise of the proxies (one stream per split).
PROXY_NOISE_SEED = 20240918


def proxy_task_labels(
    digits: np.ndarray | torch.Tensor,
    split: str,
    tasks: tuple[ProxyTask, ...] = PROXY_TASKS,
) -> np.ndarray:
    """Derive the binary proxy-task labels from digit labels.

    Parameters
    ----------
    digits : array-like of int
        Digit labels 0..9 of one split, shape ``(N,)``, in the split's order.
    split : str
        ``"train"``, ``"val"`` or ``"test"``: selects the fixed noise stream, drawn from
        ``numpy.random.default_rng([PROXY_NOISE_SEED, index of the split])``.
    tasks : tuple of ProxyTask
        Task definitions (:data:`PROXY_TASKS` by default).

    Returns
    -------
    numpy.ndarray
        ``int64`` 0/1 labels of shape ``(N, len(tasks))``.
    """
    d = np.asarray(digits).reshape(-1)
    if d.size and (d.min() < 0 or d.max() > 9):
        raise ValueError(f"digit labels must lie in 0..9, got [{d.min()}, {d.max()}].")
    if split not in CELEBA_PARTITIONS:
        raise ValueError(f"`split` must be 'train', 'val' or 'test', got {split!r}.")
    rng = np.random.default_rng([PROXY_NOISE_SEED, CELEBA_PARTITIONS.index(split)])
    out = np.empty((d.shape[0], len(tasks)), dtype=np.int64)
    for j, task in enumerate(tasks):
        col = np.isin(d, task.digits)
        # Draw for every task, noisy or not, so that each task's flips do not depend
        # on the noise levels of the tasks before it.
        flips = rng.random(d.shape[0]) < task.label_noise
        out[:, j] = col ^ flips
    return out


def _proxy(name: str, base_name: str, root: Path) -> Dataset:
    base = load_dataset(base_name, root=root)
    splits = {
        s: Split(base.split(s).x, torch.from_numpy(proxy_task_labels(base.split(s).y.numpy(), s)))
        for s in CELEBA_PARTITIONS
    }
    info = dict(base.info)
    info.update(
        {
            "dataset": name,
            "base_dataset": base_name,
            "proxy": (
                f"CPU proxy of a multi-task benchmark: {base_name}'s inputs and splits with "
                "binary tasks derived from the digit label; not a dataset of the paper"
            ),
            "tasks": [
                {"name": t.name, "digits": list(t.digits), "label_noise": t.label_noise}
                for t in PROXY_TASKS
            ],
            "noise_seed": PROXY_NOISE_SEED,
            "positive_rate": {
                s: [float(v) for v in sp.y.float().mean(0).tolist()] for s, sp in splits.items()
            },
        }
    )
    return Dataset(
        name=name,
        task="multilabel",
        num_classes=len(PROXY_TASKS),
        input_shape=base.input_shape,
        class_names=[t.name for t in PROXY_TASKS],
        **splits,
        mean=base.mean,
        std=base.std,
        augment=base.augment,
        info=info,
    )


@register_dataset("mnist1d-mtl", default_model="mlp")
def _load_mnist1d_mtl(root: Path) -> Dataset:
    """Multi-task CPU proxy: mnist1d inputs/splits, the binary tasks of PROXY_TASKS."""
    return _proxy("mnist1d-mtl", "mnist1d", root)


@register_dataset("digits-mtl", default_model="cnn")
def _load_digits_mtl(root: Path) -> Dataset:
    """Multi-task CPU proxy: digits inputs/splits, the binary tasks of PROXY_TASKS."""
    return _proxy("digits-mtl", "digits", root)
