"""Tests of the robustness data: OOD sets, covariate-shift sets, corruptions, rotations."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import cogcal.data.tabular as tabular
from cogcal.data import (
    CORRUPTIONS,
    Dataset,
    DatasetCorruptError,
    Split,
    corrupt,
    load_dataset,
    make_mnist1d,
    ood_sets,
    rotate_images,
    shift_sets,
)
from cogcal.data.corruptions import CIFAR_C_CORRUPTIONS, NOT_COVERED
from cogcal.data.robustness import (
    DIGITS_SHIFTS,
    MNIST1D_SHIFTS,
    ROTATION_DEGREES,
    SHIFT_SEED,
    shift_conditions,
)

# ----------------------------------------------------------------------------- fixtures
# (file writers in the official layouts, as in tests/test_data.py)


def _dump(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_cifar10(root: Path, per_batch: int = 20, n_test: int = 30) -> None:
    rng = np.random.default_rng(0)
    base = root / "cifar-10-batches-py"
    for i in range(1, 6):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        _dump(base / f"data_batch_{i}", {"data": data, "labels": list(range(10)) * 2})
    test = rng.integers(0, 256, size=(n_test, 3072), dtype=np.uint8)
    _dump(base / "test_batch", {"data": test, "labels": [i % 10 for i in range(n_test)]})
    _dump(base / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})


def write_cifar100_test(root: Path, n: int = 12) -> None:
    data = np.random.default_rng(1).integers(0, 256, size=(n, 3072), dtype=np.uint8)
    _dump(root / "cifar-100-python" / "test", {"data": data, "fine_labels": list(range(n))})


def write_svhn_test(root: Path, n: int = 7) -> None:
    from scipy.io import savemat

    x = np.random.default_rng(2).integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
    (root / "svhn").mkdir(parents=True, exist_ok=True)
    savemat(root / "svhn" / "test_32x32.mat", {"X": x, "y": (np.arange(n) % 10 + 1)[:, None]})


def write_cifar_c(root: Path, name: str, n: int = 4, dirname: str = "CIFAR-10-C") -> None:
    """Official layout: severity s in rows [n*(s-1), n*s); pixel = 40 s + 10 c + i."""
    base = root / dirname
    base.mkdir(parents=True, exist_ok=True)
    x = np.zeros((5 * n, 32, 32, 3), dtype=np.uint8)
    for s in range(1, 6):
        for i in range(n):
            for c in range(3):
                x[(s - 1) * n + i, :, :, c] = 40 * s + 10 * c + i
    np.save(base / f"{name}.npy", x)
    np.save(base / "labels.npy", np.tile((np.arange(n) * 3) % 10, 5).astype(np.uint8))


@pytest.fixture(scope="module")
def cifar10(tmp_path_factory: pytest.TempPathFactory) -> tuple[Dataset, Path]:
    root = tmp_path_factory.mktemp("cifar")
    write_cifar10(root)
    return load_dataset("cifar10", root=root), root


def smooth_images(n: int = 6, channels: int = 3, size: int = 32) -> np.ndarray:
    """Natural-ish uint8 images: smooth random fields plus a bright square (an edge)."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(0)
    z = gaussian_filter(rng.standard_normal((n, channels, size, size)), (0, 0, 1.5, 1.5))
    lo, hi = z.min((1, 2, 3), keepdims=True), z.max((1, 2, 3), keepdims=True)
    x = np.rint(40 + (z - lo) / (hi - lo) * 180).astype(np.uint8)
    x[:, :, size // 3 : size // 2, size // 3 : size // 2] = 230
    return x


def _dist(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).mean())


# ----------------------------------------------------------------------------- corruptions

RANDOM = {"gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "glass_blur", "fog"}
# Official CIFAR-10-C parameters that are not ordered by pixel distance: saturate goes
# 0.3x, 0.1x (desaturate) then 1.5x, 2x, 2.5x; glass_blur trades blur for swap passes.
NON_MONOTONE = {"saturate", "glass_blur"}


def test_corruption_lists() -> None:
    assert len(CIFAR_C_CORRUPTIONS) == 19 and len(set(CIFAR_C_CORRUPTIONS)) == 19
    assert set(CORRUPTIONS) | set(NOT_COVERED) == set(CIFAR_C_CORRUPTIONS)
    assert not set(CORRUPTIONS) & set(NOT_COVERED)
    assert len(CORRUPTIONS) >= 12


@pytest.mark.parametrize(
    "name",
    [pytest.param(c, marks=pytest.mark.slow) if c == "zoom_blur" else c for c in CORRUPTIONS],
)
def test_corruption_properties(name: str) -> None:
    x = smooth_images()
    outs = [corrupt(x, name, s, seed=3) for s in range(1, 6)]
    for y in outs:
        assert isinstance(y, np.ndarray) and y.dtype == np.uint8 and y.shape == x.shape
    np.testing.assert_array_equal(corrupt(x, name, 2, seed=3), outs[1])  # deterministic
    if name in RANDOM:
        assert not np.array_equal(corrupt(x, name, 2, seed=4), outs[1])
    dist = [_dist(y, x) for y in outs]
    assert dist[0] > 0
    if name not in NON_MONOTONE:
        assert all(b >= a - 1e-9 for a, b in zip(dist, dist[1:], strict=False)), dist
    else:
        assert dist[4] > dist[0], dist
    # torch in -> torch out, identical values
    t = corrupt(torch.from_numpy(x), name, 2, seed=3)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8
    np.testing.assert_array_equal(t.numpy(), outs[1])


def test_corruptions_on_grayscale() -> None:
    x = smooth_images(n=2, channels=1)
    for name in CORRUPTIONS:
        if name == "saturate":
            with pytest.raises(ValueError, match="RGB"):
                corrupt(x, name, 1, seed=0)
            continue
        y = corrupt(x, name, 5, seed=0)
        assert y.shape == x.shape and y.dtype == np.uint8


def test_corrupt_bad_arguments() -> None:
    x = smooth_images(n=1)
    with pytest.raises(ValueError, match="Did you mean 'gaussian_noise'"):
        corrupt(x, "gausian_noise", 1, seed=0)
    with pytest.raises(ValueError, match="not generated on the fly"):
        corrupt(x, "frost", 1, seed=0)
    for bad in (0, 6, 2.0, True):
        with pytest.raises(ValueError, match="severity"):
            corrupt(x, "contrast", bad, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="uint8"):
        corrupt(x.astype(np.float32), "contrast", 1, seed=0)
    with pytest.raises(ValueError, match="uint8"):
        corrupt(x.transpose(0, 2, 3, 1), "contrast", 1, seed=0)  # NHWC


# ----------------------------------------------------------------------------- rotation


def test_rotation_basics() -> None:
    x = torch.from_numpy(smooth_images(n=3))
    assert torch.equal(rotate_images(x, 0), x)
    assert torch.equal(rotate_images(rotate_images(x, 180), 180), x)
    assert torch.equal(rotate_images(x, 90), torch.rot90(x, 1, dims=(2, 3)))  # counter-clockwise
    assert torch.equal(rotate_images(x, 37), rotate_images(x, 37))
    f = x.float() / 255
    rf = rotate_images(f, 37)
    assert rf.dtype == torch.float32
    assert (rotate_images(x, 37).float() - rf * 255).abs().max() <= 0.5 + 1e-4


def _svhn_like(x: torch.Tensor) -> Dataset:
    y = torch.arange(len(x)) % 10
    s = Split(x, y)
    return Dataset(
        name="svhn",
        task="multiclass",
        num_classes=10,
        input_shape=(3, 32, 32),
        class_names=[str(i) for i in range(10)],
        train=s,
        val=s,
        test=s,
        mean=(0.5, 0.5, 0.5),
        std=(0.25, 0.25, 0.25),
    )


def test_rotated_svhn(tmp_path: Path) -> None:
    # Horizontal ramps: the further the rotation, the more every pixel changes.
    ramp = torch.linspace(30, 220, 32).round().to(torch.uint8)
    x = ramp.view(1, 1, 1, 32).expand(4, 3, 32, 32).contiguous()
    ds = _svhn_like(x)
    sets, missing = shift_sets(ds, root=tmp_path)
    assert missing == {} and list(sets) == ["rotation"]
    assert sorted(sets["rotation"]) == [1, 2, 3, 4, 5]
    dist = []
    for s, deg in enumerate(ROTATION_DEGREES, start=1):
        split = sets["rotation"][s]
        assert split.x.dtype == torch.uint8 and split.x.shape == x.shape
        assert torch.equal(split.y, ds.test.y)
        assert torch.equal(split.x, rotate_images(x, deg))
        dist.append(_dist(split.x, x))
    assert all(b > a for a, b in zip(dist, dist[1:], strict=False)), dist
    again, _ = shift_sets(ds, root=tmp_path, max_per_severity=2)
    assert len(again["rotation"][3]) == 2


# ----------------------------------------------------------------------------- CIFAR-C


def test_cifar_c_reader(cifar10: tuple[Dataset, Path]) -> None:
    ds, root = cifar10
    write_cifar_c(root, "gaussian_noise", n=4)
    sets, missing = shift_sets(ds, root=root, conditions=["gaussian_noise", "contrast"])
    assert list(sets) == ["gaussian_noise"] and list(missing) == ["contrast"]
    assert "contrast.npy" in missing["contrast"] and "generate_missing=True" in missing["contrast"]
    assert "labels.npy" not in missing["contrast"].split("missing file(s):")[1].split("\n")[1]
    for s in range(1, 6):
        split = sets["gaussian_noise"][s]
        assert split.x.dtype == torch.uint8 and tuple(split.x.shape) == (4, 3, 32, 32)
        assert split.x.is_contiguous()
        for i in range(4):
            for c in range(3):
                assert (split.x[i, c] == 40 * s + 10 * c + i).all()
        assert split.y.dtype == torch.int64
        assert split.y.tolist() == [(i * 3) % 10 for i in range(4)]
    sub, _ = shift_sets(ds, root=root, conditions=["gaussian_noise"], max_per_severity=2)
    rows = [(sub["gaussian_noise"][s].x[:, 0, 0, 0] - 40 * s).tolist() for s in range(1, 6)]
    assert len(rows[0]) == 2 and all(r == rows[0] for r in rows)  # same images per severity
    assert sub["gaussian_noise"][1].y.tolist() == [(i * 3) % 10 for i in rows[0]]


def test_cifar_c_missing_and_generated(tmp_path: Path, cifar10: tuple[Dataset, Path]) -> None:
    ds, _ = cifar10
    sets, missing = shift_sets(ds, root=tmp_path)
    assert sets == {} and set(missing) == set(CIFAR_C_CORRUPTIONS)
    msg = missing["zoom_blur"]
    assert "zoom_blur.npy" in msg and "labels.npy" in msg and "CIFAR-10-C" in msg
    assert "severity" in msg and "generate_missing=True" in msg
    assert "cannot be generated on the fly" in missing["frost"]
    sets, missing = shift_sets(
        ds, root=tmp_path, conditions=["contrast", "frost"], generate_missing=True
    )
    assert list(sets) == ["contrast"] and list(missing) == ["frost"]
    for s in range(1, 6):
        split = sets["contrast"][s]
        assert torch.equal(split.y, ds.test.y)
        assert torch.equal(split.x, corrupt(ds.test.x, "contrast", s, seed=SHIFT_SEED))
    with pytest.raises(ValueError, match="Did you mean 'contrast'"):
        shift_sets(ds, root=tmp_path, conditions=["contrst"])
    with pytest.raises(ValueError, match="max_per_severity"):
        shift_sets(ds, root=tmp_path, max_per_severity=0)


def test_cifar_c_malformed_file(tmp_path: Path, cifar10: tuple[Dataset, Path]) -> None:
    ds, _ = cifar10
    base = tmp_path / "CIFAR-10-C"
    base.mkdir()
    np.save(base / "fog.npy", np.zeros((7, 32, 32, 3), np.uint8))
    np.save(base / "labels.npy", np.zeros(7, np.int64))
    with pytest.raises(DatasetCorruptError, match="severity-major"):
        shift_sets(ds, root=tmp_path, conditions=["fog"])
    (base / "fog.npy").write_bytes(b"not an npy file")
    with pytest.raises(DatasetCorruptError, match="fog.npy"):
        shift_sets(ds, root=tmp_path, conditions=["fog"])


# ----------------------------------------------------------------------------- OOD


def test_cifar_ood_sets(tmp_path: Path, cifar10: tuple[Dataset, Path]) -> None:
    ds, _ = cifar10
    sets, missing = ood_sets(ds, root=tmp_path)
    assert sets == {} and set(missing) == {"svhn", "cifar100"}
    assert "test_32x32.mat" in missing["svhn"]
    assert "cifar-100-python" in missing["cifar100"]
    write_svhn_test(tmp_path, n=7)
    write_cifar100_test(tmp_path, n=12)
    sets, missing = ood_sets(ds, root=tmp_path)
    assert missing == {}
    assert tuple(sets["svhn"].shape) == (7, 3, 32, 32)
    assert tuple(sets["cifar100"].shape) == (12, 3, 32, 32)
    for x in sets.values():
        assert x.dtype == ds.test.x.dtype
        assert ds.transform(x[:2]).shape == (2, 3, 32, 32)


def test_cpu_ood_sets(tmp_path: Path, small_mnist1d: Dataset) -> None:
    ds = small_mnist1d
    sets, missing = ood_sets(ds, root=tmp_path)
    assert missing == {} and set(sets) == {"mnist1d-shuffled", "noise"}
    for x in sets.values():
        assert x.dtype == torch.float32 and x.shape == ds.test.x.shape
    np.testing.assert_array_equal(
        np.sort(sets["mnist1d-shuffled"].numpy(), 1), np.sort(ds.test.x.numpy(), 1)
    )
    again, _ = ood_sets(ds, root=tmp_path)
    assert all(torch.equal(again[k], sets[k]) for k in sets)

    digits = load_dataset("digits")
    sets, missing = ood_sets(digits, root=tmp_path)
    assert missing == {} and set(sets) == {"mnist1d-rendered", "digits-shuffled"}
    for x in sets.values():
        assert x.dtype == torch.float32 and x.shape == digits.test.x.shape
        assert x.min() >= 0 and x.max() <= 16
    assert sets["mnist1d-rendered"].max() > 15


# ----------------------------------------------------------------------------- CPU shift


@pytest.fixture(scope="module")
def small_mnist1d(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tabular, "MNIST1D_NUM_SAMPLES", 200)
        mp.setitem(tabular.MNIST1D_DEFAULT_ARGS, "num_samples", 200)
        return load_dataset("mnist1d", root=tmp_path_factory.mktemp("m1d"))


def test_mnist1d_shift(
    tmp_path: Path, small_mnist1d: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = small_mnist1d
    n = 60
    sets, missing = shift_sets(ds, root=tmp_path, max_per_severity=n)
    assert missing == {} and set(sets) == set(MNIST1D_SHIFTS)
    stats = (ds.info["raw_mean"], ds.info["raw_std"])
    clean = make_mnist1d(num_samples=n, seed=SHIFT_SEED, standardize=stats)
    for cond, by_sev in sets.items():
        assert sorted(by_sev) == [1, 2, 3, 4, 5]
        for split in by_sev.values():
            assert split.x.dtype == torch.float32 and tuple(split.x.shape) == (n, 40)
            assert split.y.dtype == torch.int64 and split.y.min() >= 0 and split.y.max() <= 9
        if cond != "translation":  # same draws as the clean set: paired comparison
            dist = [_dist(by_sev[s].x, clean["x"]) for s in range(1, 6)]
            assert all(b > a for a, b in zip(dist, dist[1:], strict=False)), (cond, dist)
            assert torch.equal(by_sev[3].y, torch.from_numpy(clean["y"]))
    files = list((tmp_path / "mnist1d").glob("shift-*.npz"))
    assert len(files) == 5 * len(MNIST1D_SHIFTS)
    assert not list((tmp_path / "mnist1d").glob("*.tmp"))

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("regenerated despite the cache")

    monkeypatch.setattr(tabular, "_generate_raw", boom)
    again, _ = shift_sets(ds, root=tmp_path, max_per_severity=n, conditions=["shear"])
    assert list(again) == ["shear"]
    for s in range(1, 6):
        assert torch.equal(again["shear"][s].x, sets["shear"][s].x)
        assert torch.equal(again["shear"][s].y, sets["shear"][s].y)


def test_digits_shift(tmp_path: Path) -> None:
    ds = load_dataset("digits")
    sets, missing = shift_sets(ds, root=tmp_path)
    assert missing == {} and set(sets) == set(DIGITS_SHIFTS) == set(shift_conditions("digits"))
    for cond, by_sev in sets.items():
        dist = []
        for s in range(1, 6):
            split = by_sev[s]
            assert split.x.dtype == torch.float32 and split.x.shape == ds.test.x.shape
            assert torch.equal(split.y, ds.test.y)
            assert split.x.min() >= 0 and split.x.max() <= 16
            dist.append(_dist(split.x, ds.test.x))
        assert dist[0] > 0
        if cond != "rotation":  # 0, 1, 8 are near-symmetric: pixel distance peaks at 90 deg
            assert all(b > a for a, b in zip(dist, dist[1:], strict=False)), (cond, dist)
    again, _ = shift_sets(ds, root=tmp_path, conditions=["gaussian_noise"])
    assert torch.equal(again["gaussian_noise"][2].x, sets["gaussian_noise"][2].x)


def test_unsupported_dataset(tmp_path: Path) -> None:
    ds = load_dataset("digits")
    ds.name = "celeba"
    with pytest.raises(ValueError, match="supported"):
        ood_sets(ds, root=tmp_path)
    with pytest.raises(ValueError, match="supported"):
        shift_sets(ds, root=tmp_path)


@pytest.mark.parametrize("sigma", [0.5, 1.5, 3.0, 15.0])  # 15: the kernel is wider than a row
def test_gaussian_smooth_equals_scipy_gaussian_filter1d(sigma):
    from scipy.ndimage import gaussian_filter1d

    from cogcal.data.robustness import gaussian_smooth

    x = np.random.default_rng(0).standard_normal((30, 40))
    ours = gaussian_smooth(x, sigma)
    assert ours.shape == x.shape and ours.dtype == np.float64
    np.testing.assert_allclose(ours, gaussian_filter1d(x, sigma, axis=1), rtol=0, atol=1e-13)
