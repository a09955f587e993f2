"""Shape and label guards of the post-hoc calibrators (issue 40, items 1 and 4): a fitted
temperature refuses logits of another width, and every fit refuses held-out labels that
miss a class."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cogcal
from cogcal.calibrators import KINDS, Temperature, make_calibrator
from cogcal.cli import main


def _logits(n: int = 300, k: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    return 3.0 * (rng.normal(size=(n, k)) + 2.0 * np.eye(k)[y]), y


def test_fitted_temperature_refuses_another_width() -> None:
    z, y = _logits()
    ts = Temperature().fit(z, y)
    for bad in (z[:, :3], torch.tensor(z[:, :3])):
        with pytest.raises(ValueError, match="has 3 columns but Temperature was fitted on 4"):
            ts.predict_proba(bad)
        with pytest.raises(ValueError, match="has 3 columns"):
            ts(bad)
    # the same error type as a width-bound calibrator's
    vs = make_calibrator("vs").fit(z, y)
    with pytest.raises(ValueError, match="has 3 columns"):
        vs.predict_proba(z[:, :3])
    # an unfitted temperature (e.g. trained with COG) takes any width; a refit takes the new one
    assert Temperature()(torch.zeros(2, 7)).shape == (2, 7)
    z3, y3 = _logits(k=3)
    assert ts.fit(z3, y3).predict_proba(z3).shape == (300, 3)


@pytest.mark.parametrize("kind", KINDS.names())
def test_fit_refuses_a_class_missing_from_the_labels(kind: str) -> None:
    if KINDS.get(kind).two_class:
        pytest.skip("with two classes a missing class is labels of one class (fitted as before)")
    z, y = _logits()
    y = np.where(y == 2, 0, y)  # class 2 never occurs
    with pytest.raises(ValueError, match=r"no sample of class 2 \(of 4 classes\)"):
        make_calibrator(kind).fit(z, y)


@pytest.mark.parametrize("method", ["auto", "ts", "ms", "histogram"])
def test_calibrate_refuses_missing_classes_in_one_line(method: str) -> None:
    z, y = _logits(k=5)
    y = np.where((y == 1) | (y == 3), 0, y)
    with pytest.raises(ValueError, match="no sample of classes 1, 3 ") as info:
        cogcal.calibrate(z, y, method=method)
    message = str(info.value)
    assert "\n" not in message and "stratified" in message


def test_binary_needs_both_classes_and_multilabel_both_outcomes() -> None:
    z, _ = _logits(k=2)
    with pytest.raises(ValueError, match="one class only"):
        cogcal.calibrate(z, np.ones(300, int), method="ts")
    y = np.ones(300, int)
    y[:5] = 2
    with pytest.raises(ValueError, match="no sample of class 0"):
        make_calibrator("ts").fit(np.c_[z, z[:, :1]], y)
    rng = np.random.default_rng(0)
    zm, ym = rng.normal(size=(200, 3)), (rng.random((200, 3)) < 0.5).astype(int)
    ym[:, 1] = 1
    for kind in ("ts", "vs"):
        with pytest.raises(ValueError, match="only 0s or only 1s in task 1 "):
            make_calibrator(kind, "multilabel").fit(zm, ym)


def test_auto_tolerates_a_class_with_one_sample() -> None:
    # stratified folds leave the single sample out of one fold's training part; that fold
    # fit is scored on held-out data, not refused
    z, y = _logits(n=400, k=4)
    y[y == 3] = 0
    y[0] = 3
    cal = cogcal.calibrate(z, y, candidates=("ts", "vs"))
    assert set(cal.cv_nll) == {"ts", "vs"}


@pytest.mark.parametrize("method", ["auto", "ms"])
def test_cli_refuses_a_class_missing_from_validation(tmp_path, capsys, method: str) -> None:
    # issue 40: present in the test split, absent from the validation split
    z, y = _logits(n=400, k=4)
    np.savez(tmp_path / "val.npz", logits=z, labels=np.where(y == 2, 0, y))
    np.savez(tmp_path / "test.npz", logits=z, labels=y)
    out = tmp_path / "cal"
    args = ["calibrate", "--val", str(tmp_path / "val.npz"), "--test", str(tmp_path / "test.npz")]
    assert main([*args, "--out", str(out), "--method", method]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no sample of class 2 (of 4 classes)" in err[0], err
    assert "val.npz" in err[0] and not out.exists()
