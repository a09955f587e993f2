"""Tests of cogcal.data: datasets, splits, normalisation, augmentation, batch loader."""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import cogcal.data.tabular as tabular
from cogcal.data import (
    SPLIT_SEED,
    BatchLoader,
    DatasetCorruptError,
    DatasetNotFoundError,
    augment_crop_flip,
    list_datasets,
    load_dataset,
    make_mnist1d,
    stratified_split,
)
from cogcal.data.vision import CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD

# ----------------------------------------------------------------------------- fixtures


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def _dump(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


class _Py2Pickler(pickle._Pickler):  # type: ignore[name-defined]
    """Writes ``bytes`` as Python 2 ``str`` (BINSTRING), like the official CIFAR files."""

    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_bytes(self, obj: bytes) -> None:
        self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes


def _dump_py2(path: Path, obj: dict) -> None:
    """A Python-2-style pickle: bytes keys, numpy.core module names (as in the real files)."""
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump({k.encode(): v for k, v in obj.items()})
    raw = buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
    assert b"cnumpy.core.multiarray\n" in raw
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)


def write_cifar10(root: Path, per_batch: int = 20, n_test: int = 30) -> None:
    rng = np.random.default_rng(0)
    base = root / "cifar-10-batches-py"
    for i in range(1, 6):
        labels = [int(v) for v in np.arange(per_batch) % 10]
        _dump(base / f"data_batch_{i}", {"data": _images(rng, per_batch), "labels": labels})
    test = {"data": _images(rng, n_test), "labels": [int(v) for v in np.arange(n_test) % 10]}
    _dump_py2(base / "test_batch", test)
    names = ["airplane", "automobile", "bird", "cat", "deer"]
    names += ["dog", "frog", "horse", "ship", "truck"]
    _dump(base / "batches.meta", {"label_names": names, "num_vis": 3072})


def write_cifar100(root: Path, n_train: int = 400, n_test: int = 100) -> None:
    rng = np.random.default_rng(1)
    base = root / "cifar-100-python"
    for name, n in (("train", n_train), ("test", n_test)):
        fine = [int(v) for v in np.arange(n) % 100]
        coarse = [v // 5 for v in fine]
        _dump(base / name, {"data": _images(rng, n), "fine_labels": fine, "coarse_labels": coarse})
    _dump(
        base / "meta",
        {
            "fine_label_names": [f"c{i}" for i in range(100)],
            "coarse_label_names": [f"s{i}" for i in range(20)],
        },
    )


def write_svhn(root: Path, n_train: int = 50, n_test: int = 20) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import savemat

    rng = np.random.default_rng(2)
    base = root / "svhn"
    base.mkdir(parents=True, exist_ok=True)
    out = []
    for name, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
        y = (np.arange(n) % 10 + 1).astype(np.uint8)[:, None]  # 1..10, 10 means digit 0
        savemat(base / f"{name}_32x32.mat", {"X": x, "y": y})
        out.append(x)
    return out[0], out[1]


@pytest.fixture(scope="module")
def mnist1d_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One shared data root: mnist1d is generated once (a few seconds) for the module."""
    root = tmp_path_factory.mktemp("data")
    load_dataset("mnist1d", root=root)
    return root


# ----------------------------------------------------------------------------- registry


def test_registry_lists_core_datasets() -> None:
    assert {"mnist1d", "digits", "cifar10", "cifar100", "svhn"} <= set(list_datasets())


def test_unknown_dataset_suggests_closest() -> None:
    with pytest.raises(ValueError, match=r"known datasets.*Did you mean 'cifar100'"):
        load_dataset("cifar-100")


# ----------------------------------------------------------------------------- splits


def test_stratified_split_sizes_and_proportions() -> None:
    y = np.repeat(np.arange(4), [40, 30, 20, 10])
    keep, held = stratified_split(y, 0.2, seed=3)
    assert len(held) == 20 and len(keep) == 80
    assert np.intersect1d(keep, held).size == 0
    np.testing.assert_array_equal(np.bincount(y[held]), [8, 6, 4, 2])
    keep2, held2 = stratified_split(y, 0.2, seed=3)
    np.testing.assert_array_equal(held, held2)
    with pytest.raises(ValueError, match="fraction"):
        stratified_split(y, 1.5)


# ----------------------------------------------------------------------------- mnist1d


@pytest.mark.slow
def test_mnist1d_sizes_and_info(mnist1d_root: Path) -> None:
    ds = load_dataset("mnist1d", root=mnist1d_root)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (7680, 1920, 2400)
    assert ds.input_shape == (40,) and ds.num_classes == 10 and ds.task == "multiclass"
    assert ds.train.x.dtype == torch.float32 and ds.train.x.shape == (7680, 40)
    assert ds.train.y.dtype == torch.int64
    assert ds.info["split_seed"] == SPLIT_SEED
    assert ds.info["generator_args"]["num_samples"] == 12000
    assert ds.info["generator_args"]["seed"] == 42
    assert ds.info["sizes"] == {"train": 7680, "val": 1920, "test": 2400}
    z = ds.transform(ds.train.x)
    assert abs(float(z.mean())) < 1e-4 and abs(float(z.std()) - 1) < 1e-3
    # validation is stratified: every class 192 +- 1
    counts = torch.bincount(ds.val.y, minlength=10)
    assert int(counts.min()) >= 185 and int(counts.max()) <= 200


@pytest.mark.slow
def test_mnist1d_cache_reused_and_deterministic(
    mnist1d_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = list((mnist1d_root / "mnist1d").glob("*.npz"))
    assert len(files) == 1
    assert not list((mnist1d_root / "mnist1d").glob("*.tmp"))  # atomic write left nothing
    a = load_dataset("mnist1d", root=mnist1d_root)

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("regenerated despite the cache")

    monkeypatch.setattr(tabular, "_generate_raw", boom)
    b = load_dataset("mnist1d", root=mnist1d_root)
    assert b.info["cache_hit"]
    for s in ("train", "val", "test"):
        assert torch.equal(a.split(s).x, b.split(s).x)
        assert torch.equal(a.split(s).y, b.split(s).y)


def test_mnist1d_generator_matches_package_and_restores_rng() -> None:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = 100, 5
    ref = make_dataset(args)
    np.random.seed(123)  # noqa: NPY002
    before = np.random.get_state()[1].copy()  # noqa: NPY002
    ours = make_mnist1d(num_samples=100, seed=5)
    np.testing.assert_array_equal(np.random.get_state()[1], before)  # noqa: NPY002
    np.testing.assert_allclose(ours["x"], np.concatenate([ref["x"], ref["x_test"]]), atol=1e-6)
    np.testing.assert_array_equal(ours["y"], np.concatenate([ref["y"], ref["y_test"]]))


def test_make_mnist1d_shift_and_bad_override() -> None:
    clean = make_mnist1d(num_samples=100, seed=1, standardize=False)
    noisy = make_mnist1d({"iid_noise_scale": 0.5}, num_samples=100, seed=1, standardize=False)
    assert noisy["x"].shape == (100, 40)
    assert noisy["args"]["iid_noise_scale"] == 0.5
    assert not np.allclose(clean["x"], noisy["x"])
    fixed = make_mnist1d(
        {"iid_noise_scale": 0.5}, 100, 1, standardize=(clean["raw_mean"], clean["raw_std"])
    )
    np.testing.assert_allclose(
        fixed["x"], (noisy["x"] - clean["raw_mean"]) / clean["raw_std"], rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ValueError, match="unknown mnist1d generator argument 'noise'"):
        make_mnist1d({"noise": 1.0}, num_samples=100)


def test_mnist1d_corrupt_cache_is_regenerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tabular, "MNIST1D_NUM_SAMPLES", 200)
    monkeypatch.setitem(tabular.MNIST1D_DEFAULT_ARGS, "num_samples", 200)
    first = load_dataset("mnist1d", root=tmp_path)
    assert (len(first.train), len(first.val), len(first.test)) == (128, 32, 40)
    (cache,) = (tmp_path / "mnist1d").glob("*.npz")
    cache.write_bytes(cache.read_bytes()[:100])  # truncate
    with pytest.warns(RuntimeWarning, match="unreadable mnist1d cache"):
        again = load_dataset("mnist1d", root=tmp_path)
    assert torch.equal(first.test.x, again.test.x)
    assert not again.info["cache_hit"]


# ----------------------------------------------------------------------------- digits


def test_digits_splits() -> None:
    ds = load_dataset("digits")
    n = (len(ds.train), len(ds.val), len(ds.test))
    assert sum(n) == 1797 and n == (1149, 288, 360)
    assert ds.input_shape == (1, 8, 8) and ds.train.x.shape[1:] == (1, 8, 8)
    from sklearn.datasets import load_digits

    full = torch.as_tensor(load_digits().images, dtype=torch.float32)[:, None]
    # stratification: class proportions of the test split match the whole set
    all_counts = np.bincount(load_digits().target, minlength=10) / 1797
    test_counts = torch.bincount(ds.test.y, minlength=10).numpy() / len(ds.test)
    assert np.abs(all_counts - test_counts).max() < 0.01
    # no overlap, nothing lost: the multiset union of the splits is the full data set
    joined = torch.cat([ds.train.x, ds.val.x, ds.test.x]).reshape(1797, -1)
    assert sorted(map(tuple, joined.tolist())) == sorted(
        map(tuple, full.reshape(1797, -1).tolist())
    )
    labels = torch.cat([ds.train.y, ds.val.y, ds.test.y])
    assert torch.bincount(labels).tolist() == np.bincount(load_digits().target).tolist()
    z = ds.transform(ds.train.x)
    assert abs(float(z.mean())) < 1e-4 and abs(float(z.std()) - 1) < 1e-3


# ----------------------------------------------------------------------------- CIFAR / SVHN


def test_cifar10_from_fixture(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    ds = load_dataset("cifar10", root=tmp_path)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (80, 20, 30)
    assert ds.train.x.dtype == torch.uint8 and ds.train.x.shape == (80, 3, 32, 32)
    assert ds.class_names[0] == "airplane" and ds.num_classes == 10
    assert ds.mean == CIFAR10_MEAN and ds.std == CIFAR10_STD
    assert ds.augment == "crop_flip" and ds.input_shape == (3, 32, 32)
    assert torch.bincount(ds.val.y, minlength=10).tolist() == [2] * 10
    # stored layout: sample i of the test batch, channel-first like torchvision
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb") as f:
        raw = pickle.load(f, encoding="latin1")  # Python 2 str -> str
    assert raw["data"].shape == (30, 3072)
    assert torch.equal(ds.test.x[3], torch.from_numpy(raw["data"][3].reshape(3, 32, 32)))
    z = ds.transform(ds.test.x[:2])
    expect = (ds.test.x[:2].float() / 255 - torch.tensor(CIFAR10_MEAN)[:, None, None]) / (
        torch.tensor(CIFAR10_STD)[:, None, None]
    )
    assert z.dtype == torch.float32
    torch.testing.assert_close(z, expect)
    assert ds.info["val_fraction"] == 0.2 and ds.info["split_seed"] == SPLIT_SEED


def test_cifar100_from_fixture(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    ds = load_dataset("cifar100", root=tmp_path)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (380, 20, 100)
    assert ds.num_classes == 100 and ds.class_names[99] == "c99"
    assert ds.mean == CIFAR100_MEAN and ds.std == CIFAR100_STD


def test_svhn_from_fixture(tmp_path: Path) -> None:
    x_train, x_test = write_svhn(tmp_path)
    ds = load_dataset("svhn", root=tmp_path)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (40, 10, 20)
    assert ds.train.x.shape == (40, 3, 32, 32) and ds.train.x.dtype == torch.uint8
    assert set(ds.test.y.tolist()) == set(range(10))  # 10 -> 0
    assert int(ds.test.y[9]) == 0  # stored label 10
    # image layout: (H, W, C, N) -> (N, C, H, W)
    assert torch.equal(ds.test.x[5], torch.from_numpy(x_test[:, :, :, 5].transpose(2, 0, 1).copy()))
    # normalisation computed on the training split
    xf = ds.train.x.double() / 255
    mean = xf.mean(dim=(0, 2, 3))
    std = xf.permute(1, 0, 2, 3).reshape(3, -1).std(dim=1, unbiased=False)
    np.testing.assert_allclose(ds.mean, mean.numpy(), rtol=1e-9)
    np.testing.assert_allclose(ds.std, std.numpy(), rtol=1e-9)
    assert ds.info["mean"] == list(ds.mean)


def test_svhn_torchvision_layout(tmp_path: Path) -> None:
    write_svhn(tmp_path)
    for name in ("train_32x32.mat", "test_32x32.mat"):
        (tmp_path / "svhn" / name).rename(tmp_path / name)
    ds = load_dataset("svhn", root=tmp_path)
    assert len(ds.test) == 20


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("cifar10", "cifar-10-batches-py/data_batch_1"),
        ("cifar100", "cifar-100-python/train"),
        ("svhn", "svhn/train_32x32.mat"),
    ],
)
def test_missing_files_error(tmp_path: Path, name: str, missing: str) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(name, root=tmp_path)
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert name in msg and str(tmp_path / missing) in msg
    assert "Expected layout" in msg and "How to fix" in msg


def test_one_missing_cifar_file_named(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(DatasetNotFoundError, match="data_batch_4") as err:
        load_dataset("cifar10", root=tmp_path)
    assert "data_batch_3" not in str(err.value)


def test_corrupt_files(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    batch.write_bytes(batch.read_bytes()[:500])  # truncated
    with pytest.raises(DatasetCorruptError, match="data_batch_2"):
        load_dataset("cifar10", root=tmp_path)
    _dump(batch, {"data": np.zeros((4, 100), np.uint8), "labels": [0, 1, 2, 3]})  # wrong shape
    with pytest.raises(DatasetCorruptError, match=r"data_batch_2.*\(n, 3072\)"):
        load_dataset("cifar10", root=tmp_path)
    _dump(batch, {"data": np.zeros((4, 3072), np.uint8), "labels": [0, 1, 2]})
    with pytest.raises(DatasetCorruptError, match="4 integer labels"):
        load_dataset("cifar10", root=tmp_path)

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("pwned",))

    _dump(batch, {"data": Evil(), "labels": []})
    with pytest.raises(DatasetCorruptError, match="refusing to load"):
        load_dataset("cifar10", root=tmp_path)

    write_svhn(tmp_path)
    mat = tmp_path / "svhn" / "test_32x32.mat"
    mat.write_bytes(mat.read_bytes()[:300])
    with pytest.raises(DatasetCorruptError, match="test_32x32.mat"):
        load_dataset("svhn", root=tmp_path)


# ----------------------------------------------------------------------------- augmentation


def test_augmentation_matches_per_sample_reference() -> None:
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    out = augment_crop_flip(x, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    offsets = torch.randint(0, 9, (2, 16), generator=g)
    flips = torch.rand(16, generator=g) < 0.5
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(16):
        oy, ox = int(offsets[0, i]), int(offsets[1, i])
        ref = padded[i, :, oy : oy + 32, ox : ox + 32]
        if flips[i]:
            ref = ref.flip(-1)
        assert torch.equal(out[i], ref)


def test_augmentation_deterministic_and_effective(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    ds = load_dataset("cifar10", root=tmp_path)
    x = ds.train.x[:64]
    a = ds.transform(x, train=True, generator=torch.Generator().manual_seed(0))
    b = ds.transform(x, train=True, generator=torch.Generator().manual_seed(0))
    c = ds.transform(x, train=True, generator=torch.Generator().manual_seed(1))
    plain = ds.transform(x, train=False)
    assert a.shape == x.shape and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    changed = (a != plain).flatten(1).any(1)
    assert int(changed.sum()) >= 50  # P(no crop shift and no flip) = 1/162 per image
    # val/test: no augmentation whatever the generator
    g = torch.Generator().manual_seed(0)
    assert torch.equal(ds.transform(x, train=False, generator=g), plain)
    # non-augmented datasets ignore train=True
    digits = load_dataset("digits")
    xd = digits.train.x[:8]
    assert torch.equal(digits.transform(xd, train=True), digits.transform(xd, train=False))


def test_flip_only_and_crop_only() -> None:
    x = torch.arange(32.0).expand(2, 1, 32, 32).contiguous()  # non-symmetric ramp
    # padding 0: only flips possible
    out = augment_crop_flip(x, padding=0, generator=torch.Generator().manual_seed(0))
    for i in range(2):
        assert torch.equal(out[i], x[i]) or torch.equal(out[i], x[i].flip(-1))
    outs = torch.cat(
        [
            augment_crop_flip(x, padding=0, generator=torch.Generator().manual_seed(s))
            for s in range(8)
        ]
    )
    assert (outs[:, 0, 0, 0] == 31).any() and (outs[:, 0, 0, 0] == 0).any()
    # no flip: rows are shifted copies of the ramp, zero padding shows up
    crops = augment_crop_flip(
        x.repeat(16, 1, 1, 1), flip=False, generator=torch.Generator().manual_seed(0)
    )
    assert not torch.equal(crops, x.repeat(16, 1, 1, 1))
    assert (crops == 0).any()


# ----------------------------------------------------------------------------- loader


def _collect(loader: BatchLoader) -> torch.Tensor:
    return torch.cat([yb for _, yb in loader])


def test_batchloader_epochs() -> None:
    n = 103
    x, y = torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n)
    loader = BatchLoader(x, y, batch_size=10, shuffle=True, seed=1)
    assert len(loader) == 11
    e0 = _collect(loader)  # epoch 0, then auto-advances
    e1 = _collect(loader)
    assert sorted(e0.tolist()) == list(range(n)) and sorted(e1.tolist()) == list(range(n))
    assert not torch.equal(e0, e1)
    loader.set_epoch(0)
    assert torch.equal(_collect(loader), e0)
    again = BatchLoader(x, y, batch_size=10, shuffle=True, seed=1)
    again.set_epoch(1)
    assert torch.equal(_collect(again), e1)
    other = BatchLoader(x, y, batch_size=10, shuffle=True, seed=2)
    assert not torch.equal(_collect(other), e0)
    for xb, yb in BatchLoader(x, y, batch_size=10, shuffle=True):
        assert torch.equal(xb[:, 0].long(), yb)  # x and y stay paired
    dropped = BatchLoader(x, y, batch_size=10, shuffle=True, drop_last=True)
    assert len(dropped) == 10 and len(_collect(dropped)) == 100
    ordered = BatchLoader(x, y, batch_size=10, shuffle=False)
    assert torch.equal(_collect(ordered), y)


@pytest.mark.slow
def test_batchloader_transform_and_seeded_augmentation(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    ds = load_dataset("cifar10", root=tmp_path)
    la = ds.loader("train", batch_size=16, seed=3)
    lb = ds.loader("train", batch_size=16, seed=3)
    for (xa, ya), (xb, yb) in zip(la, lb, strict=True):
        assert xa.dtype == torch.float32 and xa.shape[1:] == (3, 32, 32)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    val = list(ds.loader("val", batch_size=8))
    assert torch.equal(torch.cat([v for v, _ in val]), ds.transform(ds.val.x))


@pytest.mark.parametrize("n", [100, 103])
@pytest.mark.parametrize("shuffle", [True, False])
def test_batchloader_shards(n: int, shuffle: bool) -> None:
    x, y = torch.zeros(n, 1), torch.arange(n)
    # evaluation: no padding, disjoint and covering exactly once
    parts = [
        _collect(
            BatchLoader(x, y, batch_size=8, shuffle=shuffle, num_replicas=4, rank=r, pad=False)
        )
        for r in range(4)
    ]
    joined = torch.cat(parts)
    assert len(joined) == n and sorted(joined.tolist()) == list(range(n))
    if not shuffle:
        assert torch.equal(torch.stack([p[:25] for p in parts], 1).reshape(-1), y[:100])
    # training: padded to equal shard sizes, every sample seen
    loaders = [
        BatchLoader(x, y, batch_size=8, shuffle=shuffle, num_replicas=4, rank=r, pad=True)
        for r in range(4)
    ]
    assert len({len(ld) for ld in loaders}) == 1
    parts = [_collect(ld) for ld in loaders]
    assert {len(p) for p in parts} == {26 if n == 103 else 25}
    assert set(torch.cat(parts).tolist()) == set(range(n))
    if n == 100:  # divisible: disjoint
        assert len(torch.cat(parts).unique()) == n
    # each step's union over replicas is the one-process batch of 4 x 8 samples
    single = _collect(BatchLoader(x, y, batch_size=32, shuffle=shuffle, pad=True))
    per_step = torch.stack([p[:24] for p in parts], 1).reshape(-1)
    assert torch.equal(per_step, single[:96])


@pytest.mark.slow
def test_batchloader_device_and_dataset_loader(mnist1d_root: Path) -> None:
    ds = load_dataset("mnist1d", root=mnist1d_root)
    loader = ds.loader("val", batch_size=500, device="cpu")
    assert len(loader) == 4 and not loader.shuffle and not loader.pad
    xs, ys = zip(*loader, strict=True)
    assert torch.equal(torch.cat(ys), ds.val.y)
    torch.testing.assert_close(torch.cat(xs), ds.transform(ds.val.x))
    train = ds.loader("train", batch_size=256, seed=0)
    assert train.shuffle and train.train and len(train) == 30
    with pytest.raises(ValueError, match="split must be"):
        ds.split("validation")


def test_batchloader_bad_arguments() -> None:
    x, y = torch.zeros(5, 1), torch.arange(5)
    with pytest.raises(ValueError, match="batch_size"):
        BatchLoader(x, y, batch_size=0, shuffle=False)
    with pytest.raises(ValueError, match="rank"):
        BatchLoader(x, y, batch_size=2, shuffle=False, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="samples"):
        BatchLoader(x, y[:4], batch_size=2, shuffle=False)
    with pytest.raises(ValueError, match="torch.Tensor"):
        BatchLoader(x.numpy(), y, batch_size=2, shuffle=False)  # type: ignore[arg-type]


@pytest.mark.slow
def test_data_layer_imports_no_heavy_deps() -> None:
    import subprocess
    import sys

    code = (
        "import sys, cogcal.data as d; d.load_dataset('digits'); "
        "bad = [m for m in ('lightning', 'matplotlib', 'pandas') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_batchloader_reads_the_epoch_when_iteration_starts() -> None:
    # Lightning makes iterators ahead of time (e.g. when resuming); they must follow the
    # set_epoch() that precedes their first batch, not the epoch when they were made.
    x, y = torch.zeros(50, 1), torch.arange(50)
    loader = BatchLoader(x, y, batch_size=50, shuffle=True, seed=3)
    early = iter(loader)
    iter(loader)  # made and dropped: changes nothing
    loader.set_epoch(7)
    (_, first), *_ = early
    reference = BatchLoader(x, y, batch_size=50, shuffle=True, seed=3)
    reference.set_epoch(7)
    assert torch.equal(first, next(iter(reference))[1])
