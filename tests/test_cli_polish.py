"""The command line as a user meets it: `--no-progress`, help texts, `--augment`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cogcal.cli import build_parser, main
from cogcal.data import dataset_from_splits, default_augment, with_augment
from cogcal.runs.methods import get_method
from cogcal.train import TrainConfig, list_methods, same_config


def _help(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command].format_help()


@pytest.mark.slow
def test_no_progress_keeps_the_summary_and_the_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--dataset", "digits", "--method", "ce", "--epochs", "1", "--lr", "1e-3"]
    argv += ["--data-root", str(tmp_path / "data"), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}/metrics.json" in captured.out
    assert "ce on digits (cnn, seed 0)" in captured.out
    assert [line.split()[0] for line in captured.out.splitlines()[2:4]] == ["val", "test"]
    assert "%|" not in captured.err  # no progress bar
    assert json.loads((out / "config.json").read_text())["augment"] == "none"


def test_train_help_has_no_misleading_defaults_and_one_line_per_method():
    text = _help("train")
    assert "method's" not in text
    assert "--target COLUMN       class column of a csv: dataset (required there)" in text
    assert "--image-size PIXELS" in text and "(default: 32)" in text
    for name in list_methods():
        line = next(li for li in text.splitlines() if li.split()[:1] == [name])
        assert get_method(name).description in line
    assert "--augment" in text and "crop_flip" in text


def test_predict_help():
    text = _help("predict")
    assert "--input PATH" in text and "--which {best,last}" in text


def test_augment_defaults_per_kind_of_data_and_the_run_contract():
    assert default_augment("cifar10") == "crop_flip" and default_augment("svhn") == "crop_flip"
    assert default_augment("celeba") == "flip"
    for name in ("digits", "mnist1d", "folder:photos", "csv:t.csv"):
        assert default_augment(name) == "none"
    assert TrainConfig(dataset="folder:x").resolved()["augment"] == "none"
    assert TrainConfig(dataset="cifar10").resolved()["augment"] == "crop_flip"
    flip = TrainConfig(dataset="folder:x", augment="flip")
    assert not same_config(flip, TrainConfig(dataset="folder:x"))
    assert same_config(
        TrainConfig(dataset="folder:x", augment="none"), TrainConfig(dataset="folder:x")
    )
    with pytest.raises(ValueError, match="`augment` flip flips images; a csv: table takes none"):
        TrainConfig(dataset="csv:t.csv", target="y", augment="flip")
    with pytest.raises(ValueError, match="`augment` must be one of none, flip, crop_flip"):
        TrainConfig(augment="mirror")


@pytest.mark.slow
def test_with_augment_applies_to_images_only(tmp_path):
    rng = np.random.default_rng(0)

    def split(shape):
        return rng.integers(0, 255, (20, *shape)).astype(np.uint8), rng.integers(0, 2, 20)

    images = dataset_from_splits(split((1, 6, 6)), split((1, 6, 6)), split((1, 6, 6)))
    flipped = with_augment(images, "flip")
    assert flipped.augment == "flip" and flipped.info["augmentation"].startswith("random")
    x = images.train.x[:8]
    g = torch.Generator().manual_seed(0)
    out = flipped.transform(x, train=True, generator=g)
    plain = images.transform(x, train=True)
    same = [torch.equal(o, p) for o, p in zip(out, plain, strict=True)]
    mirrored = [torch.equal(o, p.flip(-1)) for o, p in zip(out, plain, strict=True)]
    assert all(a or b for a, b in zip(same, mirrored, strict=True)) and not all(same)
    assert with_augment(flipped, "none").augment is None
    table = dataset_from_splits(split((5,)), split((5,)), split((5,)))
    with pytest.raises(ValueError, match=r"augment='flip' flips images.*shape \(5,\)"):
        with_augment(table, "flip")
    argv = ["train", "--dataset", "mnist1d", "--augment", "flip", "--epochs", "1"]
    argv += ["--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert not (tmp_path / "run").exists()
