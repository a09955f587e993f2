"""Tests of the multi-task datasets: CelebA from fixture files, and the CPU proxies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cogcal.data import (
    DatasetCorruptError,
    DatasetNotFoundError,
    list_datasets,
    load_dataset,
)
from cogcal.data import multitask as mt
from cogcal.data.base import AUGMENTATIONS

# ----------------------------------------------------------------------------- CelebA fixture

W, H = 40, 50  # non-square, portrait like CelebA's 178x218
# Official partition code per fixture image (000001.jpg ... 000006.jpg), not contiguous.
PARTITIONS = [0, 0, 1, 2, 0, 1]
BLUE, RED = (0, 0, 255), (255, 0, 0)


def _colour(i: int) -> tuple[int, int, int]:
    return (30 * i, 250 - 30 * i, 60 + 20 * i)


def _attr_value(i: int, j: int) -> int:
    return 1 if (3 * i + j) % 4 == 0 else -1


def _image(i: int) -> Image.Image:
    if i == 1:  # red, with blue bands of 5 rows at the top and bottom
        arr = np.zeros((H, W, 3), np.uint8)
        arr[:] = RED
        arr[:5] = BLUE
        arr[-5:] = BLUE
        return Image.fromarray(arr)
    return Image.new("RGB", (W, H), _colour(i))


def _write_celeba(root: Path, n: int = len(PARTITIONS), newline: str = "\n") -> Path:
    """Write a tiny CelebA in torchvision's layout and the official text formats."""
    base = root / "celeba"
    (base / "img_align_celeba").mkdir(parents=True)
    names = [f"{i:06d}.jpg" for i in range(1, n + 1)]
    for i, name in enumerate(names, start=1):
        _image(i).save(base / "img_align_celeba" / name, quality=95, subsampling=0)
    # list_attr_celeba.txt: count, names (with a trailing space), then "%2d" values.
    lines = [str(n), " ".join(mt.CELEBA_ATTRIBUTES) + " "]
    for i, name in enumerate(names, start=1):
        values = " ".join(f"{_attr_value(i, j):2d}" for j in range(40))
        lines.append(f"{name} {values}")
    (base / "list_attr_celeba.txt").write_bytes((newline.join(lines) + newline).encode())
    part = [f"{name} {p}" for name, p in zip(names, PARTITIONS, strict=True)]
    (base / "list_eval_partition.txt").write_bytes((newline.join(part) + newline).encode())
    return base


def _mean_colour(x: torch.Tensor) -> np.ndarray:
    return x.float().mean(dim=(-1, -2)).numpy()


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_celeba_from_fixture(tmp_path: Path, newline: str) -> None:
    _write_celeba(tmp_path, newline=newline)
    ds = load_dataset("celeba", root=tmp_path)
    assert "celeba" in list_datasets()
    assert ds.task == "multilabel" and ds.num_classes == 40
    assert ds.class_names == list(mt.CELEBA_ATTRIBUTES)
    assert ds.input_shape == (3, 32, 32)
    # official partitions, file order within each
    expected = {"train": [1, 2, 5], "val": [3, 6], "test": [4]}
    for split, ids in expected.items():
        s = ds.split(split)
        assert s.x.dtype == torch.uint8 and tuple(s.x.shape) == (len(ids), 3, 32, 32)
        assert s.y.dtype == torch.int64 and tuple(s.y.shape) == (len(ids), 40)
        want = torch.tensor([[(_attr_value(i, j) + 1) // 2 for j in range(40)] for i in ids])
        assert torch.equal(s.y, want)
        for row, i in zip(s.x, ids, strict=True):
            if i != 1:  # solid-colour images keep their colour (JPEG q95, no subsampling)
                np.testing.assert_allclose(_mean_colour(row), _colour(i), atol=3)
    # normalisation: per-channel statistics of the training partition, recorded in info
    train = ds.train.x.numpy().astype(np.float64) / 255.0
    np.testing.assert_allclose(ds.mean, train.mean(axis=(0, 2, 3)), atol=1e-9)
    np.testing.assert_allclose(ds.std, train.std(axis=(0, 2, 3)), atol=1e-9)
    assert ds.info["mean"] == list(ds.mean) and ds.info["sizes"] == {
        "train": 3,
        "val": 2,
        "test": 1,
    }
    json.dumps(ds.info)  # JSON-serialisable
    batch = ds.transform(ds.train.x)
    assert batch.dtype == torch.float32 and tuple(batch.shape) == (3, 3, 32, 32)


def test_celeba_centre_crop(tmp_path: Path) -> None:
    from torchvision import transforms

    base = _write_celeba(tmp_path)
    img = load_dataset("celeba", root=tmp_path).train.x[0].numpy()  # 000001.jpg
    r, g, b = (img[c].astype(int) for c in range(3))
    # The blue bands (top and bottom 10% of the height) are cropped away: the shorter side
    # (width) is resized to 32, the height to 40, and the centre 32 rows kept. Squashing
    # the image instead would leave blue rows at the top and bottom.
    assert (r[1:-1] > 200).all() and (b[1:-1] < 60).all()
    assert r[16, 16] > 240 and b[16, 16] < 20
    # Identical to torchvision's Resize(32) + CenterCrop(32) on the decoded JPEG.
    tv = transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32)])
    with Image.open(base / "img_align_celeba" / "000001.jpg") as im:
        ref = np.asarray(tv(im.convert("RGB"))).transpose(2, 0, 1)
    np.testing.assert_array_equal(img, ref)


@pytest.mark.parametrize("size", [(40, 50), (50, 40), (178, 218), (20, 30), (32, 32)])
def test_celeba_preprocess_matches_torchvision(size: tuple[int, int]) -> None:
    from torchvision import transforms

    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    ours = mt.celeba_preprocess(im)
    tv = transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32)])
    ref = np.asarray(tv(im)).transpose(2, 0, 1)
    assert ours.dtype == np.uint8 and ours.shape == (3, 32, 32)
    np.testing.assert_array_equal(ours, ref)


def test_celeba_cache_written_once_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _write_celeba(tmp_path)
    first = load_dataset("celeba", root=tmp_path)
    cache = base / mt.CELEBA_CACHE_NAME
    assert cache.is_file() and not first.info["cache_hit"]
    assert not list(base.glob("*.tmp")) and not list(base.glob(".*.tmp"))
    mtime = cache.stat().st_mtime_ns

    def boom(path: Path) -> np.ndarray:
        raise RuntimeError("decoder called although the cache is valid")

    monkeypatch.setattr(mt, "_decode_image", boom)
    again = load_dataset("celeba", root=tmp_path)
    assert again.info["cache_hit"] and cache.stat().st_mtime_ns == mtime
    for split in ("train", "val", "test"):
        assert torch.equal(first.split(split).x, again.split(split).x)
        assert torch.equal(first.split(split).y, again.split(split).y)
    assert first.mean == again.mean and first.std == again.std
    # The cache is keyed by the list files: editing one forces a rebuild.
    part = base / "list_eval_partition.txt"
    part.write_text(part.read_text().replace("000004.jpg 2", "000004.jpg 1"))
    with (
        pytest.warns(RuntimeWarning, match="other list files"),
        pytest.raises(RuntimeError, match="decoder called"),
    ):
        load_dataset("celeba", root=tmp_path)


def test_celeba_unreadable_cache_is_rebuilt(tmp_path: Path) -> None:
    base = _write_celeba(tmp_path)
    first = load_dataset("celeba", root=tmp_path)
    (base / mt.CELEBA_CACHE_NAME).write_bytes(b"not an npz")
    with pytest.warns(RuntimeWarning, match="unreadable CelebA cache"):
        again = load_dataset("celeba", root=tmp_path)
    assert torch.equal(first.train.x, again.train.x)
    assert load_dataset("celeba", root=tmp_path).info["cache_hit"]


def test_celeba_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("celeba", root=tmp_path)
    msg = str(err.value)
    for name in ("list_attr_celeba.txt", "list_eval_partition.txt", "img_align_celeba"):
        assert name in msg
    assert "Expected layout" in msg
    base = _write_celeba(tmp_path / "one")
    (base / "list_attr_celeba.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match="list_attr_celeba.txt") as err:
        load_dataset("celeba", root=tmp_path / "one")
    assert "list_eval_partition.txt" not in str(err.value).split("Expected layout")[0]
    # images not extracted: the directory is there but empty
    base = _write_celeba(tmp_path / "two")
    for p in (base / "img_align_celeba").iterdir():
        p.unlink()
    with pytest.raises(DatasetNotFoundError, match="img_align_celeba.zip"):
        load_dataset("celeba", root=tmp_path / "two")


def _edit_line(path: Path, lineno: int, new: str) -> None:
    lines = path.read_text().splitlines()
    lines[lineno - 1] = new
    path.write_text("\n".join(lines) + "\n")


def _attr_line(i: int, values: list[str] | None = None) -> str:
    vals = values or [f"{_attr_value(i, j):2d}" for j in range(40)]
    return f"{i:06d}.jpg " + " ".join(vals)


@pytest.mark.parametrize(
    ("file", "lineno", "new", "match"),
    [
        ("list_attr_celeba.txt", 2, " ".join(mt.CELEBA_ATTRIBUTES[:39]), "line 2: expected 40"),
        ("list_attr_celeba.txt", 1, "7", "line 1: the header announces 7"),
        ("list_attr_celeba.txt", 1, "six", "line 1: expected the number"),
        ("list_attr_celeba.txt", 3, _attr_line(1, ["0"] * 40), "line 3: attribute values"),
        ("list_attr_celeba.txt", 4, _attr_line(2, ["1"] * 39), "line 4: expected a file name"),
        ("list_eval_partition.txt", 6, "", "no partition line for '000006.jpg'"),
        ("list_eval_partition.txt", 3, "000003.jpg 3", "line 3: partition must be"),
        ("list_eval_partition.txt", 2, "000001.jpg 0", "line 2: '000001.jpg' already listed"),
        ("list_eval_partition.txt", 6, "000099.jpg 0", "no attribute line for '000099.jpg'"),
        ("list_eval_partition.txt", 1, "../x.jpg 0", "line 1: '../x.jpg' is not a plain"),
    ],
)
def test_celeba_corrupt_lists(tmp_path: Path, file: str, lineno: int, new: str, match: str) -> None:
    base = _write_celeba(tmp_path)
    path = base / file
    if lineno > len(path.read_text().splitlines()):
        path.write_text(path.read_text() + new + "\n")
    else:
        _edit_line(path, lineno, new)
    with pytest.raises(DatasetCorruptError, match=match) as err:
        load_dataset("celeba", root=tmp_path)
    assert file in str(err.value)


def test_celeba_missing_or_broken_image(tmp_path: Path) -> None:
    base = _write_celeba(tmp_path)
    (base / "img_align_celeba" / "000004.jpg").unlink()
    with pytest.raises(DatasetCorruptError, match=r"'000004.jpg' \(line 4\)"):
        load_dataset("celeba", root=tmp_path)
    (base / "img_align_celeba" / "000004.jpg").write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(DatasetCorruptError, match="cannot decode CelebA image .*000004.jpg"):
        load_dataset("celeba", root=tmp_path)
    assert not (base / mt.CELEBA_CACHE_NAME).exists()


def test_celeba_flip_augmentation(tmp_path: Path) -> None:
    _write_celeba(tmp_path)
    ds = load_dataset("celeba", root=tmp_path)
    x = ds.train.x
    if "flip" not in AUGMENTATIONS:  # Dataset does not know "flip" yet: no augmentation
        assert ds.augment is None
        assert torch.equal(ds.transform(x, train=True), ds.transform(x))
        return
    assert ds.augment == "flip"
    plain = ds.transform(x)
    for seed in range(4):
        out = ds.transform(x, train=True, generator=torch.Generator().manual_seed(seed))
        for o, p in zip(out, plain, strict=True):
            assert torch.equal(o, p) or torch.equal(o, p.flip(-1))


# ----------------------------------------------------------------------------- CPU proxies


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One shared data root: mnist1d is generated once (a few seconds) for the module."""
    return tmp_path_factory.mktemp("data")


@pytest.mark.parametrize(
    ("name", "base_name"),
    [pytest.param("mnist1d-mtl", "mnist1d", marks=pytest.mark.slow), ("digits-mtl", "digits")],
)
def test_proxy_tasks(data_root: Path, name: str, base_name: str) -> None:
    base = load_dataset(base_name, root=data_root)
    ds = load_dataset(name, root=data_root)
    assert name in list_datasets()
    assert ds.task == "multilabel" and ds.num_classes == len(mt.PROXY_TASKS)
    assert 6 <= ds.num_classes <= 10
    assert ds.class_names == [t.name for t in mt.PROXY_TASKS]
    assert ds.input_shape == base.input_shape
    assert ds.mean == base.mean and ds.std == base.std
    assert "proxy" in ds.info["proxy"].lower()
    json.dumps(ds.info)
    for split in ("train", "val", "test"):
        s, b = ds.split(split), base.split(split)
        assert torch.equal(s.x, b.x)
        assert s.y.dtype == torch.int64 and tuple(s.y.shape) == (len(b), ds.num_classes)
        digits = b.y.numpy()
        y = s.y.numpy()
        for j, task in enumerate(mt.PROXY_TASKS):
            clean = np.isin(digits, task.digits)
            if task.label_noise == 0:
                np.testing.assert_array_equal(y[:, j], clean)
            else:
                rate = (y[:, j] != clean).mean()
                assert abs(rate - task.label_noise) < 0.06, (split, task.name, rate)
            # both classes present in every split
            assert 0 < y[:, j].sum() < len(y), (split, task.name)
        np.testing.assert_allclose(ds.info["positive_rate"][split], y.mean(0))


def test_proxy_task_definitions() -> None:
    by_name = {t.name: set(t.digits) for t in mt.PROXY_TASKS}
    assert by_name["even"] == {0, 2, 4, 6, 8}
    assert by_name["greater_than_4"] == {5, 6, 7, 8, 9}
    assert by_name["has_loop"] == {0, 6, 8, 9}
    assert by_name["prime"] == {2, 3, 5, 7}
    assert by_name["multiple_of_3"] == {0, 3, 6, 9}
    assert by_name["is_zero"] == {0} and by_name["is_one"] == {1}
    assert by_name["even_noisy"] == by_name["even"]


@pytest.mark.slow
def test_proxy_deterministic(data_root: Path) -> None:
    a = load_dataset("mnist1d-mtl", root=data_root)
    b = load_dataset("mnist1d-mtl", root=data_root)
    for split in ("train", "val", "test"):
        assert torch.equal(a.split(split).y, b.split(split).y)
    digits = np.arange(1000) % 10
    np.testing.assert_array_equal(
        mt.proxy_task_labels(digits, "train"), mt.proxy_task_labels(digits, "train")
    )
    # each split has its own fixed noise stream
    assert not np.array_equal(
        mt.proxy_task_labels(digits, "train"), mt.proxy_task_labels(digits, "test")
    )


def test_proxy_task_labels_bad_input() -> None:
    with pytest.raises(ValueError, match="0..9"):
        mt.proxy_task_labels(np.array([3, 10]), "train")
    with pytest.raises(ValueError, match="'train', 'val' or 'test'"):
        mt.proxy_task_labels(np.array([3]), "validation")
