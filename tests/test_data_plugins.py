"""Tests of user data: folder:PATH, csv:PATH, plugins, dataset_from_splits, default models."""

from __future__ import annotations

import csv
import os
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cogcal._errors import ArgumentError, cli_message
from cogcal.data import (
    SPLIT_SEED,
    Dataset,
    DatasetCorruptError,
    DatasetNotFoundError,
    DatasetPluginError,
    Split,
    dataset_from_splits,
    default_model,
    list_datasets,
    load_dataset,
)
from cogcal.data.custom import USER_SPLIT_RULE, split_indices
from cogcal.data.images import resize_center_crop
from cogcal.models import check_compatible, create_model

# ----------------------------------------------------------------------------- helpers


def _colour(rng: np.random.Generator, base: int) -> tuple[int, int, int]:
    return tuple(int(v) for v in np.clip(base + rng.integers(-40, 40, 3), 0, 255))


def write_images(
    folder: Path,
    counts: dict[str, int],
    *,
    size: tuple[int, int] = (20, 20),
    mode: str = "RGB",
    seed: int = 0,
    brightness: int = 0,
) -> None:
    """``counts[class]`` PNG images per class folder, noisy, class-dependent colours."""
    rng = np.random.default_rng(seed)
    for k, (cls, n) in enumerate(sorted(counts.items())):
        (folder / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            w, h = size
            base = 60 + 50 * k + brightness
            if mode == "L":
                arr = np.clip(base + rng.integers(-30, 30, (h, w)), 0, 255).astype(np.uint8)
            else:
                arr = np.clip(
                    np.array(_colour(rng, base)) + rng.integers(-30, 30, (h, w, 3)), 0, 255
                ).astype(np.uint8)
            Image.fromarray(arr, mode).save(folder / cls / f"img{i:03d}.png")


def channel_stats(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    xf = x.double() / 255
    c = xf.shape[1]
    flat = xf.transpose(0, 1).reshape(c, -1)
    return flat.mean(1).numpy(), flat.std(1, unbiased=False).numpy()


def write_csv(
    path: Path, header: list[str], rows: list[list[object]], delimiter: str = ","
) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def table(n: int = 60, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    x = rng.normal(size=(n, 4)) * [1.0, 10.0, 0.1, 5.0] + [0.0, 100.0, -3.0, 7.0] + y[:, None]
    return x, y


# ----------------------------------------------------------------------------- folder


def test_folder_without_split_folders(tmp_path: Path) -> None:
    write_images(tmp_path / "imgs", {"cat": 12, "dog": 10, "bird": 8}, size=(24, 20))
    ds = load_dataset(f"folder:{tmp_path / 'imgs'}")
    assert ds.name == f"folder:{tmp_path / 'imgs'}"
    assert ds.class_names == ["bird", "cat", "dog"] and ds.num_classes == 3
    assert ds.input_shape == (3, 32, 32) and ds.train.x.dtype == torch.uint8
    assert ds.train.x.shape[1:] == (3, 32, 32) and ds.train.y.dtype == torch.int64
    assert ds.default_model == "cnn" and ds.augment is None and ds.task == "multiclass"
    # the split rule: the digits rule on the labels in file order (classes sorted)
    y_all = np.repeat([0, 1, 2], [8, 12, 10])
    tr, va, te = split_indices(y_all)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (len(tr), len(va), len(te)) == (19, 5, 6)
    assert ds.train.y.tolist() == y_all[tr].tolist()
    assert ds.test.y.tolist() == y_all[te].tolist()
    assert ds.info["sizes"] == {"train": 19, "val": 5, "test": 6}
    assert ds.info["split_rule"].endswith(USER_SPLIT_RULE) and ds.info["split_seed"] == SPLIT_SEED
    assert ds.info["class_counts"]["test"] == [2, 2, 2]
    assert len(ds.info["fingerprint"]["sha256"]) == 64 and ds.info["fingerprint"]["files"] == 30
    # normalisation: the training split's statistics only
    mean, std = channel_stats(ds.train.x)
    np.testing.assert_allclose(ds.mean, mean, rtol=1e-9)
    np.testing.assert_allclose(ds.std, std, rtol=1e-9)
    all_mean, _ = channel_stats(torch.cat([ds.train.x, ds.val.x, ds.test.x]))
    assert not np.allclose(ds.mean, all_mean, rtol=1e-6)
    # stored images are the resized, centre-cropped files
    first_bird = Image.open(tmp_path / "imgs" / "bird" / "img000.png")
    assert torch.equal(ds.train.x[0], torch.from_numpy(resize_center_crop(first_bird, 32)))
    z = ds.transform(ds.train.x[:5], train=True, generator=torch.Generator().manual_seed(0))
    assert z.shape == (5, 3, 32, 32) and z.dtype == torch.float32


def test_folder_with_split_folders_and_train_only_statistics(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_images(root / "train", {"a": 6, "b": 5}, seed=1)
    write_images(root / "val", {"a": 2, "b": 2}, seed=2)
    write_images(root / "test", {"a": 3, "b": 1}, seed=3)
    ds = load_dataset(f"folder:{root}", image_size=16)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (11, 4, 4)
    assert ds.input_shape == (3, 16, 16) and ds.info["split_rule"] == "given by the split folders"
    assert ds.test.y.tolist() == [0, 0, 0, 1]
    # brighter validation/test images change the fingerprint but not the statistics
    write_images(root / "val", {"a": 2, "b": 2}, seed=5, brightness=80)
    write_images(root / "test", {"a": 3, "b": 1}, seed=6, brightness=80)
    again = load_dataset(f"folder:{root}", image_size=16)
    assert again.mean == ds.mean and again.std == ds.std
    assert not torch.equal(again.test.x, ds.test.x)
    assert again.info["fingerprint"]["sha256"] != ds.info["fingerprint"]["sha256"]
    # a touched file (new mtime, same bytes) keeps the fingerprint
    f = root / "train" / "a" / "img000.png"
    os.utime(f, (1_000_000, 1_000_000))
    assert (
        load_dataset(f"folder:{root}", image_size=16).info["fingerprint"]
        == again.info["fingerprint"]
    )


def test_folder_train_and_test_only_draws_validation(tmp_path: Path) -> None:
    write_images(tmp_path / "train", {"x": 10, "y": 10})
    write_images(tmp_path / "test", {"x": 2, "y": 3})
    ds = load_dataset(f"folder:{tmp_path}")
    assert (len(ds.train), len(ds.val), len(ds.test)) == (16, 4, 5)
    assert ds.info["split_rule"].startswith("val drawn from train/")
    assert ds.info["class_counts"]["val"] == [2, 2]


def test_folder_grey_and_mixed_images(tmp_path: Path) -> None:
    write_images(tmp_path / "grey", {"a": 5, "b": 5}, mode="L", size=(28, 28))
    ds = load_dataset(f"folder:{tmp_path / 'grey'}", image_size=28)
    assert ds.input_shape == (1, 28, 28) and len(ds.mean) == 1
    model = create_model(ds.default_model, num_classes=2, input_shape=ds.input_shape)
    assert model(ds.transform(ds.train.x[:2])).shape == (2, 2)
    with pytest.raises(ArgumentError, match="needs RGB images"):
        load_dataset(f"folder:{tmp_path / 'grey'}", normalization="imagenet")
    write_images(tmp_path / "grey", {"c": 5}, mode="RGB")  # one colour class: all RGB
    mixed = load_dataset(f"folder:{tmp_path / 'grey'}")
    assert mixed.input_shape == (3, 32, 32)
    grey = mixed.train.x[mixed.train.y == 0]
    assert torch.equal(grey[:, 0], grey[:, 1]) and torch.equal(grey[:, 0], grey[:, 2])


def test_folder_normalization_options(tmp_path: Path) -> None:
    write_images(tmp_path, {"a": 5, "b": 5})
    none = load_dataset(f"folder:{tmp_path}", normalization="none")
    assert none.mean == (0.0, 0.0, 0.0) and none.std == (1.0, 1.0, 1.0)
    torch.testing.assert_close(none.transform(none.test.x), none.test.x.float() / 255)
    imnet = load_dataset(f"folder:{tmp_path}", normalization="imagenet")
    assert imnet.mean == (0.485, 0.456, 0.406) and imnet.info["normalization"].startswith(
        "imagenet"
    )
    with pytest.raises(ArgumentError, match="normalization") as err:
        load_dataset(f"folder:{tmp_path}", normalization="zscore")
    assert "--normalization" in err.value.cli_message


@pytest.mark.parametrize("shape", [(3, 64, 64), (1, 28, 28), (3, 32, 32)])
def test_cnn_takes_folder_image_sizes(shape: tuple[int, int, int]) -> None:
    check_compatible("cnn", shape)
    model = create_model("cnn", num_classes=4, input_shape=shape)
    assert model(torch.randn(2, *shape)).shape == (2, 4)


def test_bad_folders(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_dataset(f"folder:{tmp_path / 'nope'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="no class subfolders"):
        load_dataset(f"folder:{tmp_path / 'empty'}")
    write_images(tmp_path / "one", {"only": 4})
    with pytest.raises(ArgumentError, match="at least 2 classes"):
        load_dataset(f"folder:{tmp_path / 'one'}")
    write_images(tmp_path / "hole", {"a": 4, "b": 4})
    (tmp_path / "hole" / "c").mkdir()
    (tmp_path / "hole" / "c" / "notes.txt").write_text("no images here")
    with pytest.raises(DatasetNotFoundError, match=r"class folder .*c holds no image files"):
        load_dataset(f"folder:{tmp_path / 'hole'}")
    write_images(tmp_path / "broken", {"a": 4, "b": 4})
    bad = tmp_path / "broken" / "b" / "img002.png"
    bad.write_bytes(b"\x89PNG not really")
    with pytest.raises(DatasetCorruptError, match="img002.png"):
        load_dataset(f"folder:{tmp_path / 'broken'}")
    write_images(tmp_path / "loose", {"a": 4, "b": 4})
    Image.new("RGB", (8, 8)).save(tmp_path / "loose" / "stray.png")
    with pytest.raises(ArgumentError, match="one subfolder per class"):
        load_dataset(f"folder:{tmp_path / 'loose'}")
    write_images(tmp_path / "mixed" / "train", {"a": 4, "b": 4})
    write_images(tmp_path / "mixed" / "test", {"a": 2, "b": 2})
    write_images(tmp_path / "mixed", {"zebra": 2})
    with pytest.raises(ArgumentError, match="mixes split folders"):
        load_dataset(f"folder:{tmp_path / 'mixed'}")
    write_images(tmp_path / "extra" / "train", {"a": 4, "b": 4})
    write_images(tmp_path / "extra" / "test", {"a": 2, "c": 2})
    with pytest.raises(ArgumentError, match="train/ lacks"):
        load_dataset(f"folder:{tmp_path / 'extra'}")
    write_images(tmp_path / "few", {"a": 1, "b": 1})
    with pytest.raises(ArgumentError, match="too few"):
        load_dataset(f"folder:{tmp_path / 'few'}")
    with pytest.raises(ArgumentError, match="image_size") as err:
        load_dataset(f"folder:{tmp_path / 'hole'}", image_size=1)
    assert "--image-size" in err.value.cli_message


# ----------------------------------------------------------------------------- csv


def test_csv_string_target_and_train_only_standardisation(tmp_path: Path) -> None:
    x, y = table()
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    rows = [[*map(float, r), n] for r, n in zip(x, names, strict=True)]
    path = write_csv(tmp_path / "iris.csv", ["f0", "f1", "f2", "f3", "species"], rows)
    ds = load_dataset(f"csv:{path}", target="species")
    assert ds.class_names == ["setosa", "versicolor", "virginica"]
    assert ds.input_shape == (4,) and ds.default_model == "mlp" and ds.augment is None
    tr, va, te = split_indices(y)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (len(tr), len(va), len(te)) == (38, 10, 12)
    assert ds.train.x.dtype == torch.float32 and ds.test.y.tolist() == y[te].tolist()
    np.testing.assert_allclose(ds.test.x.numpy(), x[te].astype(np.float32))
    # per-column statistics of the training split only
    np.testing.assert_allclose(ds.mean, x[tr].mean(0), rtol=1e-6)
    np.testing.assert_allclose(ds.std, x[tr].std(0), rtol=1e-6)
    z = ds.transform(ds.train.x).double()
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(z.std(0, unbiased=False), 1, atol=1e-5)
    assert ds.info["split_rule"] == USER_SPLIT_RULE and ds.info["target"] == "species"
    # wildly different validation/test rows change nothing in the statistics
    x2 = x.copy()
    x2[np.concatenate([va, te])] *= 1000.0
    rows2 = [[*map(float, r), n] for r, n in zip(x2, names, strict=True)]
    write_csv(path, ["f0", "f1", "f2", "f3", "species"], rows2)
    again = load_dataset(f"csv:{path}", target="species")
    assert again.mean == ds.mean and again.std == ds.std
    assert again.info["fingerprint"]["sha256"] != ds.info["fingerprint"]["sha256"]
    none = load_dataset(f"csv:{path}", target="species", normalization="none")
    assert none.mean == (0.0,) * 4 and torch.equal(none.transform(none.test.x), none.test.x)


def test_csv_integer_target_tsv_quotes_and_constant_column(tmp_path: Path) -> None:
    labels = [7, 1, 3] * 8
    rows = [[i, 2.5, f"{i % 5}", lab] for i, lab in enumerate(labels)]
    path = write_csv(tmp_path / "t.tsv", ["a b", "const", "q", "label"], rows, delimiter="\t")
    ds = load_dataset(f"csv:{path}", target="label")
    assert ds.class_names == ["1", "3", "7"] and ds.num_classes == 3
    mapping = {1: 0, 3: 1, 7: 2}
    everything = torch.cat([ds.train.y, ds.val.y, ds.test.y]).tolist()
    assert sorted(everything) == sorted(mapping[v] for v in labels)
    assert ds.info["constant_columns"] == ["const"] and ds.std[1] == 1.0
    assert ds.info["features"] == ["a b", "const", "q"]
    # BOM, quoted fields with the delimiter inside, blank lines
    text = '\ufeffx,"y, quoted",cls\n1,2,"a"\n\n3,4,b\n5,6,"a"\n7,8,b\n9,10,a\n11,12,b\n13,14,a\n15,16,b\n'
    (tmp_path / "q.csv").write_text(text, encoding="utf-8")
    small = load_dataset(f"csv:{tmp_path / 'q.csv'}", target="cls")
    assert small.info["features"] == ["x", "y, quoted"] and small.class_names == ["a", "b"]


@pytest.mark.parametrize("scaled", [False, True])
def test_csv_pixels_share_one_scale(tmp_path: Path, scaled: bool) -> None:
    """8 x 8 pixel images as a table: one mean/std over every training cell, so that a
    pixel dark on all training images but one does not put a test image that lights it
    many stds away (it would per column); 63 columns, or a value out of the pixel range,
    keep the per-column standardisation."""
    rng = np.random.default_rng(0)
    n, k = 200, 64
    labels = np.arange(n) % 4
    pixels = rng.integers(0, 256, size=(n, k)).astype(float)
    tr, _, te = split_indices(labels)
    pixels[:, 0] = 0.0
    pixels[[tr[0], te[0]], 0] = 255.0  # lit in one training image and one test image
    if scaled:
        pixels /= 255.0
    header = [f"pixel{i}" for i in range(k)] + ["label"]

    def load(name: str, x: np.ndarray, names: list[str]) -> Dataset:
        rows = [[*r, c] for r, c in zip(x, labels, strict=True)]
        return load_dataset(f"csv:{write_csv(tmp_path / name, names, rows)}", target="label")

    ds = load("px.csv", pixels, header)
    x_tr = pixels[tr]
    np.testing.assert_allclose(ds.mean, [x_tr.mean()] * k, rtol=1e-6)
    np.testing.assert_allclose(ds.std, [x_tr.std()] * k, rtol=1e-6)
    assert "one mean/std over all the training split's cells" in ds.info["normalization"]
    assert ds.transform(ds.test.x[:1]).abs().max() < 3.0
    assert (pixels[te[0], 0] - x_tr[:, 0].mean()) / x_tr[:, 0].std() > 10.0  # per column
    # fewer columns, or a value no pixel takes: per column, as before
    ds = load("narrow.csv", pixels[:, 1:], header[1:])
    np.testing.assert_allclose(ds.std, x_tr[:, 1:].std(0), rtol=1e-6)
    assert ds.info["normalization"].startswith("per-column")
    pixels[tr[1], 5] = 1.5 if scaled else 256.0
    ds = load("px.csv", pixels, header)
    np.testing.assert_allclose(ds.std, pixels[tr].std(0), rtol=1e-6)


def test_csv_normalization_overrides_the_auto_rule(tmp_path: Path) -> None:
    """`per-column` and `one-scale` pick either rule whatever `auto` would choose: 64
    columns of small counts (integers in [0, 255], so `auto` takes them for pixels) per
    column, a narrow table on one scale; images refuse both (one line for the CLI)."""
    rng = np.random.default_rng(1)
    n, k = 120, 64
    labels = np.arange(n) % 3
    counts = rng.integers(0, 4, size=(n, k)) * np.arange(1, k + 1)  # column j: 0..3(j+1)
    tr, _, _ = split_indices(labels)
    header = [f"c{i}" for i in range(k)] + ["label"]
    rows = [[*map(int, r), c] for r, c in zip(counts, labels, strict=True)]
    path = f"csv:{write_csv(tmp_path / 'counts.csv', header, rows)}"
    assert load_dataset(path, target="label").info["normalization"].startswith("one mean/std")
    per = load_dataset(path, target="label", normalization="per-column")
    np.testing.assert_allclose(per.mean, counts[tr].mean(0), rtol=1e-6)
    np.testing.assert_allclose(per.std, counts[tr].std(0), rtol=1e-6)
    assert "normalization='per-column'" in per.info["normalization"]
    assert per.info["mean"] == list(per.mean)
    z = per.transform(per.train.x).numpy()
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(z.std(0), 1.0, rtol=1e-4)
    narrow = [[*map(int, r[:3]), c] for r, c in zip(counts, labels, strict=True)]
    path = f"csv:{write_csv(tmp_path / 'narrow.csv', header[:3] + ['label'], narrow)}"
    one = load_dataset(path, target="label", normalization="one-scale")
    np.testing.assert_allclose(one.mean, [counts[tr][:, :3].mean()] * 3, rtol=1e-6)
    np.testing.assert_allclose(one.std, [counts[tr][:, :3].std()] * 3, rtol=1e-6)
    write_images(tmp_path / "img", {"a": 5, "b": 5})
    for choice in ("per-column", "one-scale"):
        with pytest.raises(ArgumentError, match=f"normalization='{choice}' standardises") as e:
            load_dataset(f"folder:{tmp_path / 'img'}", normalization=choice)
        assert f"--normalization {choice}" in e.value.cli_message
        assert "\n" not in e.value.cli_message and "(3, 32, 32)" in e.value.cli_message


def test_csv_errors(tmp_path: Path) -> None:
    x, y = table(30)
    rows = [[*map(float, r), int(c)] for r, c in zip(x, y, strict=True)]
    path = write_csv(tmp_path / "d.csv", ["a", "b", "c", "d", "label"], rows)
    with pytest.raises(ArgumentError, match=r"no column target='lable'.*Did you mean 'label'") as e:
        load_dataset(f"csv:{path}", target="lable")
    assert "--target lable" in e.value.cli_message
    with pytest.raises(ArgumentError, match="needs `target`") as e:
        load_dataset(f"csv:{path}")
    assert "--target COLUMN" in e.value.cli_message and "a, b, c, d, label" in str(e.value)
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_dataset(f"csv:{tmp_path / 'missing.csv'}", target="label")
    # non-numeric feature columns: all named, with a line number
    bad = [[*r[:2], "red", "x1", r[4]] for r in rows]
    write_csv(tmp_path / "n.csv", ["a", "b", "colour", "city", "label"], bad)
    with pytest.raises(ArgumentError, match=r"non-numeric.*'colour' \(line 2: 'red'\).*'city'"):
        load_dataset(f"csv:{tmp_path / 'n.csv'}", target="label")
    # missing values
    holes = [list(r) for r in rows]
    holes[4][1] = ""
    holes[9][1] = "NA"
    write_csv(tmp_path / "m.csv", ["a", "b", "c", "d", "label"], holes)
    with pytest.raises(
        ArgumentError, match=r"missing values in column\(s\) 'b' \(2 value\(s\), first on line 6"
    ):
        load_dataset(f"csv:{tmp_path / 'm.csv'}", target="label")
    # one class; non-integer numeric target; ragged row; empty file
    write_csv(tmp_path / "one.csv", ["a", "label"], [[i, "same"] for i in range(10)])
    with pytest.raises(ArgumentError, match="at least 2"):
        load_dataset(f"csv:{tmp_path / 'one.csv'}", target="label")
    write_csv(tmp_path / "reg.csv", ["a", "y"], [[i, i / 3] for i in range(10)])
    with pytest.raises(ArgumentError, match="non-integer numbers"):
        load_dataset(f"csv:{tmp_path / 'reg.csv'}", target="y")
    (tmp_path / "rag.csv").write_text("a,b,y\n1,2,0\n3,1\n")
    with pytest.raises(ArgumentError, match="line 3 has 2 fields"):
        load_dataset(f"csv:{tmp_path / 'rag.csv'}", target="y")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ArgumentError, match="empty"):
        load_dataset(f"csv:{tmp_path / 'empty.csv'}", target="y")
    with pytest.raises(ArgumentError, match="for RGB images"):
        load_dataset(f"csv:{path}", target="label", normalization="imagenet")


def _plain_variants() -> dict[str, tuple[str, str]]:
    """Valid tables (file name, text) that both readers accept."""
    x, y = table(60)
    x[:, 1] *= 1e5  # exponents when printed with repr
    x[3, 2] = -0.0
    names = np.array(["setosa", "versi color", "virginica"])[y]
    text = [[repr(float(v)) for v in r] for r in x]  # (all digits, exponents)
    body = [",".join([*r, str(c)]) for r, c in zip(text, y, strict=True)]
    first = [",".join([n, *map(str, r)]) for r, n in zip(x, names, strict=True)]
    spaced = [" , ".join([*(f" {v:.6g} " for v in r), f" {c} "]) for r, c in zip(x, y, strict=True)]
    tabbed = ["\t".join([*r, str(c)]) for r, c in zip(text, y, strict=True)]
    return {
        "plain": ("p.csv", "a,b,c,d,label\n" + "\n".join(body) + "\n"),
        "crlf, BOM, blank lines": (
            "w.csv",
            "\ufeff\r\n\r\na,b,c,d,label\r\n"
            + "\r\n".join(body[:30])
            + "\r\n  \r\n\r\n"
            + "\r\n".join(body[30:]),
        ),
        "label first, names with spaces": ("f.csv", "label,a,b,c,d\n" + "\n".join(first) + "\n"),
        "padded cells": ("s.csv", " a , b , c , d , label \n" + "\n".join(spaced) + "\n"),
        "tsv": ("t.tsv", "a\tb\tc\td\tlabel\n" + "\n".join(tabbed) + "\n"),
    }


@pytest.mark.parametrize("variant", list(_plain_variants()))
def test_csv_plain_tables_read_by_pandas_c_parser_equal_the_careful_reader(
    tmp_path: Path, variant: str, monkeypatch
) -> None:
    """A plain numeric table is read by pandas' C parser (load_csv's fast path), to the
    same dataset, bit for bit, as the careful cell-by-cell reader gives."""
    from cogcal.data import tables

    file, text = _plain_variants()[variant]
    (tmp_path / file).write_text(text, encoding="utf-8", newline="")
    assert tables._read_plain_numeric("x", tmp_path / file, "label") is not None
    fast = load_dataset(f"csv:{tmp_path / file}", target="label")
    monkeypatch.setattr(tables, "_read_plain_numeric", lambda *args: None)
    careful = load_dataset(f"csv:{tmp_path / file}", target="label")
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(fast, split).x, getattr(careful, split).x)
        assert torch.equal(getattr(fast, split).y, getattr(careful, split).y)
    assert fast.info == careful.info and fast.class_names == careful.class_names


@pytest.mark.parametrize(
    "text",
    [
        "a,b,label\n1,2,0,9\n3,4,1\n",  # a first row one field longer (pandas' index)
        "a,b,label\n1,2,0\n3,4,1,9\n",  # a later row longer
        "a,b,label\n1,2,0\n3,4\n",  # a short row
        'a,b,label\n1,"2",0\n3,4,1\n',  # quotes
        "a,b,label\n1,2,\n3,4,1\n",  # a missing label
        "a,b,label\n1,2,NA\n3,4,1\n",  # a label that reads as missing
        "a,b,label\n1,nan,0\n3,4,1\n",  # a missing feature
        "a,b,label\n1,inf,0\n3,4,1\n",  # not finite
        "a,b,label\n1,1e39,0\n3,4,1\n",  # beyond float32
        "a,b,label\n1,1_000,0\n3,4,1\n",  # a number only Python's float() reads
        "a,a,label\n1,2,0\n3,4,1\n",  # a repeated name
        "a,b,label,\n1,2,0,\n3,4,1,\n",  # an unnamed column
        "a,b,label\n1,2,0.5\n3,4,1\n",  # a label _class_labels refuses
        "a,b,label\n",  # no rows
    ],
)
def test_csv_irregular_tables_go_to_the_careful_reader(tmp_path: Path, text: str) -> None:
    """Whatever the careful reader might read differently or refuse is left to it (which
    names the line and column)."""
    from cogcal.data import tables

    (tmp_path / "i.csv").write_text(text, encoding="utf-8")
    assert tables._read_plain_numeric("x", tmp_path / "i.csv", "label") is None


def test_arguments_that_do_not_apply(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="`target` applies only") as err:
        load_dataset("digits", target="label")
    assert "--target applies only" in cli_message(err.value)
    with pytest.raises(ArgumentError, match="`image_size` applies only"):
        load_dataset("digits", image_size=16)
    with pytest.raises(ArgumentError, match="give a path after"):
        load_dataset("folder:")
    with pytest.raises(ArgumentError, match=r"unknown dataset.*folder:PATH") as err:
        load_dataset("imagenet")
    assert "--target COLUMN" in err.value.cli_message


# ----------------------------------------------------------------------------- defaults


def test_default_models() -> None:
    expected = {
        "mnist1d": "mlp",
        "digits": "cnn",
        "cifar10": "resnet18",
        "cifar100": "resnet18",
        "svhn": "resnet18",
        "celeba": "resnet18",
        "mnist1d-mtl": "mlp",
        "digits-mtl": "cnn",
    }
    assert set(expected) <= set(list_datasets())
    for name, model in expected.items():
        assert default_model(name) == model
        assert default_model(name.upper()) == model
    assert default_model("folder:/x") == "cnn" and default_model("FOLDER:/x") == "cnn"
    assert default_model("csv:t.csv") == "mlp" and default_model("pkg.mod:load") is None
    with pytest.raises(ArgumentError, match="Did you mean 'digits'"):
        default_model("digit")
    assert load_dataset("Digits-MTL").default_model == "cnn"


def test_registered_normalization_options() -> None:
    plain = load_dataset("digits", normalization="none")
    assert plain.mean == (0.0,) and plain.std == (1.0,)
    assert torch.equal(plain.transform(plain.test.x), plain.test.x)
    assert plain.info["normalization"].startswith("none")
    with pytest.raises(ArgumentError, match="needs RGB images"):
        load_dataset("digits", normalization="imagenet")


# ----------------------------------------------------------------------------- dataset_from_splits


def test_dataset_from_splits_kinds() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    rng = np.random.default_rng(0)

    def pair(n: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.integers(0, 256, (n, 3, 8, 8)).astype(np.uint8), rng.integers(0, 4, n)

    class MapStyle(torch.utils.data.Dataset):
        def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
            self.x, self.y = x, y

        def __len__(self) -> int:
            return len(self.y)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return torch.from_numpy(self.x[i]), int(self.y[i])

    xa, ya = pair(20)
    xb, yb = pair(6)
    xc, yc = pair(5)
    ds = dataset_from_splits(
        TensorDataset(torch.from_numpy(xa), torch.from_numpy(ya)),
        DataLoader(MapStyle(xb, yb), batch_size=4, shuffle=True),
        (xc, yc.astype(np.float64)[:, None]),  # whole-number floats in a column: accepted
        num_classes=4,
        class_names=["a", "b", "c", "d"],
        info={"source": "test"},
    )
    assert ds.input_shape == (3, 8, 8) and ds.default_model == "cnn"
    assert ds.train.x.dtype == torch.float32 and ds.val.y.dtype == torch.int64
    torch.testing.assert_close(ds.train.x, torch.from_numpy(xa).float())  # values unchanged
    assert ds.val.y.tolist() == yb.tolist() and ds.test.y.tolist() == yc.tolist()
    assert ds.mean == (0.0,) and ds.std == (1.0,) and ds.info["source"] == "test"
    assert ds.info["sizes"] == {"train": 20, "val": 6, "test": 5}
    assert ds.info["split_rule"].startswith("given")
    assert len(ds.info["fingerprint"]["sha256"]) == 64
    multi = dataset_from_splits(
        (np.zeros((4, 3)), np.eye(4, 2, dtype=bool)),
        (np.zeros((2, 3)), np.ones((2, 2))),
        (torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int32)),
        task="multilabel",
    )
    assert multi.num_classes == 2 and multi.task == "multilabel" and multi.default_model == "mlp"


def test_dataset_from_splits_errors() -> None:
    x, y = np.zeros((5, 3)), np.arange(5) % 2
    good = (x, y)
    cases = [
        (((x, y + 0.5), good, good), "not all whole"),
        (((x, y - 1), good, good), ">= 0"),
        ((good, (np.zeros((5, 4)), y), good), "per-sample shape"),
        ((good, good, (np.full((5, 3), np.nan), y)), "NaN"),
        ((good, (x[:0], y[:0]), good), "empty"),
        ((good, good, (x, y[:4])), "5 inputs but 4 labels"),
        ((good, good, 42), "is a int; expected an \\(X, y\\) pair"),
        ((good, good, [1, 2, 3]), "item 0 must be an \\(input, label\\) pair"),
        ((good, good, (np.zeros(5), y)), "feature axis"),
        ((good, good, (np.array([["a"]] * 5), y)), "must be numbers"),
    ]
    for splits, match in cases:
        with pytest.raises(ArgumentError, match=match):
            dataset_from_splits(*splits)
    with pytest.raises(ArgumentError, match="labels go up to 1"):
        dataset_from_splits(good, good, good, num_classes=1)
    with pytest.raises(ArgumentError, match="`class_names` has 3 entries"):
        dataset_from_splits(good, good, good, class_names=["a", "b", "c"])

    class Pil(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> tuple[object, int]:
            return Image.new("RGB", (4, 4)), i

    with pytest.raises(ArgumentError, match="PIL image.*ToTensor"):
        dataset_from_splits(Pil(), good, good)

    class Triples(Pil):
        def __getitem__(self, i: int) -> tuple[object, int, int]:
            return torch.zeros(3), i, i

    with pytest.raises(ArgumentError, match="item 0 must be an \\(input, label\\) pair"):
        dataset_from_splits(Triples(), good, good)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):  # noqa: ANN204
            yield torch.zeros(3), 0

    with pytest.raises(ArgumentError, match="iterable-style"):
        dataset_from_splits(Stream(), good, good)


# ----------------------------------------------------------------------------- plugins


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def make_plugin(folder: Path, body: str) -> str:
    name = f"cogcal_test_plugin_{uuid.uuid4().hex[:10]}"
    (folder / f"{name}.py").write_text(body)
    return name


PLUGIN = """
import numpy as np
import torch
from torch.utils.data import TensorDataset

SEEN = {}

def _pair(n, seed, shift=0.0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)) * 3.0 + 10.0 + shift, rng.integers(0, 3, n)

def tabular(root):
    SEEN["root"] = root
    x, y = _pair(30, 0)
    return {"train": (x, y), "val": _pair(10, 1, shift=100.0), "test": _pair(10, 2, shift=-50.0),
            "num_classes": 3, "class_names": ["r", "g", "b"]}

def images():
    x = torch.rand(12, 3, 16, 16)
    y = torch.arange(12) % 2
    return {"train": TensorDataset(x, y), "val": (x[:4], y[:4]), "test": (x[:4], y[:4]),
            "num_classes": 2}

def sequences():
    out = tabular(None)
    out["default_model"] = "cnn1d"
    return out

def whole():
    from cogcal.data import dataset_from_splits
    x, y = _pair(9, 3)
    return dataset_from_splits((x, y), (x, y), (x, y), name="mine")

def raises():
    raise RuntimeError("database offline")

def wrong_type():
    return [1, 2, 3]

def missing_keys():
    return {"train": _pair(5, 0), "val": _pair(5, 0)}

def unknown_keys():
    out = tabular(None)
    out["n_classes"] = 3
    return out

def bad_labels():
    out = tabular(None)
    out["num_classes"] = 2
    return out

NOT_CALLABLE = 42
"""


def test_plugin_mapping_and_train_only_statistics(plugin_dir: Path) -> None:
    mod = make_plugin(plugin_dir, PLUGIN)
    ds = load_dataset(f"{mod}:tabular", root=plugin_dir / "root")
    assert ds.name == f"{mod}:tabular" and ds.input_shape == (6,) and ds.default_model == "mlp"
    assert (len(ds.train), len(ds.val), len(ds.test)) == (30, 10, 10)
    assert ds.class_names == ["r", "g", "b"]
    assert sys.modules[mod].SEEN["root"] == plugin_dir / "root"  # root= passed when accepted
    x_tr = ds.train.x.double()
    np.testing.assert_allclose(ds.mean, [float(x_tr.mean())], rtol=1e-9)
    np.testing.assert_allclose(ds.std, [float(x_tr.std(unbiased=False))], rtol=1e-9)
    assert abs(ds.mean[0] - 10.0) < 1.0  # the shifted val/test sets did not enter
    assert ds.info["plugin"] == f"{mod}:tabular"
    assert ds.info["plugin_file"].endswith(f"{mod}.py") and len(ds.info["plugin_file_sha256"]) == 64
    assert ds.info["fingerprint"]["sha256"]
    imgs = load_dataset(f"{mod}:images")
    assert imgs.input_shape == (3, 16, 16) and imgs.default_model == "cnn"
    assert load_dataset(f"{mod}:sequences").default_model == "cnn1d"
    whole = load_dataset(f"{mod}:whole")
    assert isinstance(whole, Dataset) and whole.name == "mine" and whole.mean == (0.0,)
    assert whole.info["plugin"] == f"{mod}:whole"


def test_plugin_errors(plugin_dir: Path) -> None:
    mod = make_plugin(plugin_dir, PLUGIN)
    cases = {
        "no_such_pkg_zz.mod:fn": r"cannot import the module 'no_such_pkg_zz.mod'.*PYTHONPATH",
        f"{mod}:tabulr": rf"'{mod}' has no attribute 'tabulr'. Did you mean 'tabular'",
        f"{mod}:NOT_CALLABLE": "is a int, not a function",
        f"{mod}:raises": "the plugin raised RuntimeError: database offline",
        f"{mod}:wrong_type": "returned a list; expected a cogcal.data.Dataset, or a mapping",
        f"{mod}:missing_keys": "lacks the key\\(s\\) 'test', 'num_classes'",
        f"{mod}:unknown_keys": "unknown key\\(s\\) 'n_classes'",
        f"{mod}:bad_labels": "unusable splits.*labels go up to 2",
        "a.b:": "expected 'package.module:function'",
        "a-b:c": "expected 'package.module:function'",
    }
    for spec, match in cases.items():
        with pytest.raises(DatasetPluginError, match=match) as err:
            load_dataset(spec)
        assert isinstance(err.value, ValueError)
        assert spec in str(err.value)
    with pytest.raises(DatasetPluginError) as err:
        load_dataset(f"{mod}:raises")
    assert isinstance(err.value.__cause__, RuntimeError)
    dep = make_plugin(plugin_dir, "import no_such_dependency_zz\ndef f():\n    return {}\n")
    with pytest.raises(DatasetPluginError, match="imports 'no_such_dependency_zz'"):
        load_dataset(f"{dep}:f")
    boom = make_plugin(plugin_dir, "raise SyntaxError('bad plugin')\n")
    with pytest.raises(DatasetPluginError, match="raised SyntaxError: bad plugin"):
        load_dataset(f"{boom}:f")


def test_split_rule_is_the_digits_rule() -> None:
    from cogcal.data.tabular import _read_digits

    x, y, _ = _read_digits()
    tr, va, te = split_indices(y)
    ds = load_dataset("digits")
    assert torch.equal(ds.train.x, torch.from_numpy(x[tr]))
    assert torch.equal(ds.val.x, torch.from_numpy(x[va]))
    assert torch.equal(ds.test.x, torch.from_numpy(x[te]))


def test_split_records_into_dataset() -> None:
    s = Split(torch.zeros(3, 2), torch.zeros(3, dtype=torch.int64))
    ds = dataset_from_splits(s, s, s, num_classes=2)
    assert len(ds.train) == 3 and ds.num_classes == 2


def test_read_table_names_lines_across_quoted_newlines_and_open_quotes(tmp_path: Path) -> None:
    from cogcal.data.tables import read_table

    path = tmp_path / "t.csv"
    path.write_text('\n a , b ,y\n"1\n2",2,0\n\n 3 ,4,1\n5,6,1,9\n')
    with pytest.raises(ArgumentError, match="line 7 has 4 fields, the header 3"):
        read_table(path, what="t", error=DatasetCorruptError)
    path.write_text('a,b,y\n"1\n2",2,0\n\n 3 ,4,1\n')
    table = read_table(path, what="t", error=DatasetCorruptError)
    assert table.header == ["a", "b", "y"] and table.header_line == 1
    assert table.rows == [["1\n2", "2", "0"], ["3", "4", "1"]] and table.lines == [3, 5]
    path.write_text('a,y\n1,"0\n2,1\n')
    with pytest.raises(DatasetCorruptError, match="is a quote left open"):
        read_table(path, what="t", error=DatasetCorruptError)
