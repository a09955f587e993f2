"""`cogcal calibrate` and `cogcal.calibrate`: post-hoc calibration of a model trained
elsewhere, chosen by cross-validated validation NLL, written to a folder, loaded back."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss

import cogcal
from cogcal.calibrators import KINDS, auto_candidates
from cogcal.cli import main
from cogcal.posthoc import POSTHOC_METHODS, cross_validated_nll


def _scores(n: int, k: int = 4, seed: int = 0, scale: float = 3.0):
    """Over-confident logits whose classes are mixed by a fixed matrix (so a full map helps)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = 2.0 * np.eye(k)[y] + rng.normal(size=(n, k))
    mix = np.eye(k) + 0.6 * np.roll(np.eye(k), 1, axis=1)
    return scale * z @ mix, y


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _write_csv(path, p, y, names):
    lines = [",".join([*names, "label"])]
    lines += [
        ",".join(f"{v:.10f}" for v in row) + f",{names[c]}" for row, c in zip(p, y, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- Python


def test_cross_validated_nll_is_the_pooled_held_out_nll_of_fold_fits():
    """Against a hand-written loop: the same stratified folds (fixed seed), a temperature
    fitted by scipy on each complement with the same Gaussian prior on log T, scored by
    scikit-learn's log_loss on the held-out fold."""
    from scipy.optimize import minimize_scalar

    from cogcal.calibrators import DEFAULT_TEMPERATURE_L2
    from cogcal.calibrators._folds import _stratified_folds

    z, y = _scores(300, k=3)
    folds = _stratified_folds(torch.as_tensor(y), 5, 0).numpy()
    total = 0.0
    for f in range(5):
        tr, te = folds != f, folds == f

        def objective(log_t, z=z[tr], y=y[tr]):
            p = _softmax(z / np.exp(log_t))
            nll = -np.log(p[np.arange(len(y)), y]).sum()
            return (nll + DEFAULT_TEMPERATURE_L2 / 2 * log_t**2) / len(y)

        log_t = minimize_scalar(
            objective, bounds=(-5, 5), method="bounded", options={"xatol": 1e-10}
        ).x
        total += log_loss(y[te], _softmax(z[te] / np.exp(log_t)), labels=range(3)) * te.sum()
    ours = cross_validated_nll(torch.as_tensor(z), torch.as_tensor(y), "ts", cv=5)
    assert ours == pytest.approx(total / len(y), rel=1e-5)


@pytest.mark.slow
def test_auto_chooses_the_lowest_cross_validated_nll_and_refits_on_all_of_it():
    z, y = _scores(800, k=3)
    cal = cogcal.calibrate(z, y, candidates=("ts", "ms"))
    assert set(cal.cv_nll) == {"ts", "ms"} and cal.folds == 5
    assert cal.method == min(cal.cv_nll, key=cal.cv_nll.get) == "ms"  # the classes are mixed
    alone = cogcal.calibrate(z, y, method="ms")
    np.testing.assert_allclose(cal.predict_proba(z[:50]), alone.predict_proba(z[:50]), atol=1e-12)
    assert alone.cv_nll == {} and alone.folds is None
    assert alone.nll_after < alone.nll_before
    assert alone.nll_before == pytest.approx(log_loss(y, _softmax(z)), rel=1e-9)


@pytest.mark.parametrize(
    "method",
    [
        pytest.param(m, marks=pytest.mark.slow) if m in ("vs", "ms", "dirichlet") else m
        for m in POSTHOC_METHODS
    ],
)
def test_every_method_fits_and_lowers_the_nll_of_over_confident_logits(method):
    k = 2 if KINDS.get(method).two_class else 3  # Platt and Beta: two classes only
    z, y = _scores(600, k=k, seed=1)
    zt, yt = _scores(600, k=k, seed=2)
    cal = cogcal.calibrate(z, y, method=method)
    p = cal.predict_proba(zt)
    assert p.shape == zt.shape and np.allclose(p.sum(1), 1.0)
    assert log_loss(yt, p) < log_loss(yt, _softmax(zt))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "gamma"}, "`method` must be one of auto"),
        ({"candidates": ("ts", "gamma")}, "`candidates`"),
        ({"candidates": "ts"}, "`candidates`"),
        ({"cv": 1}, "`cv` must be an integer >= 2"),
    ],
)
def test_bad_arguments_are_value_errors(kwargs, match):
    z, y = _scores(200)
    with pytest.raises(ValueError, match=match):
        cogcal.calibrate(z, y, **kwargs)


def test_bad_data_is_a_value_error_naming_it():
    z, y = _scores(200)
    with pytest.raises(ValueError, match="one class only"):
        cogcal.calibrate(z, np.zeros(200, dtype=int), method="ts")
    with pytest.raises(ValueError, match="class indices in"):
        cogcal.calibrate(z, y + 4, method="ts")
    with pytest.raises(ValueError, match="at least 50 samples"):
        cogcal.calibrate(z[:40], y[:40])
    bad = z.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        cogcal.calibrate(bad, y, method="ts")


# --------------------------------------------------------------------------- command line


@pytest.fixture
def splits(tmp_path):
    for name, seed, n in (("val", 0, 300), ("test", 1, 300)):
        z, y = _scores(n, k=3, seed=seed)
        np.savez(tmp_path / f"{name}.npz", logits=z, labels=y)
    return tmp_path


@pytest.mark.slow
def test_calibrate_writes_a_folder_that_loads_in_one_call(splits, capsys):
    out = splits / "cal"
    assert main(["calibrate", "--val", str(splits / "val.npz"), "--test", str(splits / "test.npz"),
                 "--method", "auto", "--out", str(out)]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "chose" in err and "5-fold cross-validated validation NLL" in err
    for name in ("calibration.json", "calibrator.pt", "metrics.json", "reliability.png",
                 "report.md", "report.html", "test_logits.npz"):  # fmt: skip
        assert (out / name).is_file(), name
    meta = json.loads((out / "calibration.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    assert meta["status"] == "complete" and set(meta["cv_nll"]) == set(auto_candidates(3))
    cal = cogcal.load_calibrator(out)
    assert cal.method == meta["method"] and cal.num_classes == 3
    with np.load(splits / "test.npz") as t:
        zt, yt = t["logits"], t["labels"]
    # before: the test logits as given; after: the loaded calibrator's probabilities
    assert metrics["test_before"]["nll"] == pytest.approx(log_loss(yt, _softmax(zt)), rel=1e-6)
    assert metrics["test"]["nll"] == pytest.approx(log_loss(yt, cal.predict_proba(zt)), rel=1e-6)
    assert metrics["test"]["nll"] < metrics["test_before"]["nll"]
    # the lowest cross-validated NLL was chosen, and refitted on the validation split alone
    finite = {m: x for m, x in meta["cv_nll"].items() if x is not None}
    assert cal.method == min(finite, key=finite.get)
    assert cal.cv_nll == pytest.approx(
        {m: math.inf if x is None else x for m, x in meta["cv_nll"].items()}
    )
    with np.load(splits / "val.npz") as v:
        direct = cogcal.calibrate(v["logits"], v["labels"], method=cal.method)
    np.testing.assert_allclose(direct.predict_proba(zt), cal.predict_proba(zt), atol=1e-10)
    assert "Choice" in (out / "report.md").read_text()
    assert main(["report", str(out)]) == 0  # the report is rebuilt from the folder


@pytest.mark.slow
def test_probabilities_in_a_csv_are_calibrated_as_their_log(tmp_path, capsys):
    z, y = _scores(600)
    p = _softmax(z)
    names = ["ant", "bee", "cat", "dog"]
    _write_csv(tmp_path / "val.csv", p, y, names)
    assert main(["calibrate", "--val", str(tmp_path / "val.csv"), "--scores", "probs",
                 "--method", "ts", "--out", str(tmp_path / "cal")]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("calibrated as logits log(p)") == 1
    loaded = cogcal.load_calibrator(tmp_path / "cal")
    direct = cogcal.calibrate(np.log(np.round(p, 10).clip(1e-12)), y, method="ts")
    assert loaded.calibrator.temperature == pytest.approx(direct.calibrator.temperature, rel=1e-6)
    assert json.loads((tmp_path / "cal" / "calibration.json").read_text())["class_names"] == names


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("val", "match"),
    [
        ({"logits": np.zeros((50, 3)), "y": np.zeros(50)}, "expected `labels` and exactly one"),
        ({"logits": np.zeros(50), "labels": np.zeros(50, int)}, "a 2-D float array"),
        ({"logits": np.full((60, 3), np.nan), "labels": np.arange(60) % 3}, "not a finite number"),
        (
            {"logits": np.zeros((60, 3)), "labels": np.arange(60) % 4},
            r"label 3 is outside \[0, 2\]",
        ),
        ({"logits": np.zeros((60, 3)), "labels": np.zeros(60, int)}, "at least two classes"),
        ({"logits": np.zeros((60, 3)), "labels": np.zeros(59, int)}, "59 labels for 60 rows"),
        ({"probs": np.full((60, 3), 0.5), "labels": np.arange(60) % 3}, "are not a distribution"),
        (
            {"logits": np.full((60, 3), 1 / 3), "labels": np.arange(60) % 3},
            "look like probabilities",
        ),
        ({"logits": np.zeros((30, 3)), "labels": np.arange(30) % 3}, "needs at least 50"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, val, match):
    np.savez(tmp_path / "val.npz", **val)
    out = tmp_path / "cal"
    assert main(["calibrate", "--val", str(tmp_path / "val.npz"), "--out", str(out)]) == 2
    line = _err_line(capsys)
    assert line.startswith("cogcal: error: ") and "val.npz" in line
    assert pytest.importorskip("re").search(match, line), line
    assert not out.exists()  # refused before anything was written


def test_test_split_of_another_model_and_folders_not_ours_are_refused(splits, capsys):
    np.savez(splits / "other.npz", logits=np.zeros((60, 5)), labels=np.arange(60) % 5)
    args = ["calibrate", "--val", str(splits / "val.npz"), "--method", "ts"]
    assert main([*args, "--test", str(splits / "other.npz"), "--out", str(splits / "a")]) == 2
    assert "same model" in _err_line(capsys)
    mine = splits / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main([*args, "--out", str(mine)]) == 2
    assert "not written by cogcal calibrate" in _err_line(capsys)
    assert (mine / "notes.txt").read_text() == "keep me"
    assert main([*args, "--out", str(splits / "b")]) == 0
    capsys.readouterr()
    assert main([*args, "--out", str(splits / "b")]) == 2
    assert "--overwrite" in _err_line(capsys)
    assert main([*args, "--out", str(splits / "b"), "--overwrite"]) == 0
    assert main([*args, "--val", str(splits / "missing.npz"), "--out", str(splits / "c")]) == 2


@pytest.mark.slow
def test_a_damaged_calibrator_is_named(splits, capsys):
    out = splits / "cal"
    assert main(["calibrate", "--val", str(splits / "val.npz"), "--method", "ms", "--out", str(out)]) == 0  # fmt: skip
    (out / "calibrator.pt").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"calibrator.pt: cannot be loaded: it is damaged"):
        cogcal.load_calibrator(out)
    with pytest.raises(ValueError, match="not a folder written by cogcal calibrate"):
        cogcal.load_calibrator(splits)


def test_a_failed_fold_scores_inf_and_is_never_chosen(monkeypatch):
    import cogcal.posthoc as posthoc

    real = posthoc.make_calibrator

    def flaky(kind, *a, **k):
        cal = real(kind, *a, **k)
        if kind == "ms":

            def fail(*_a, **_k):
                raise RuntimeError("diverged")

            cal.fit = fail
        return cal

    monkeypatch.setattr(posthoc, "make_calibrator", flaky)
    z, y = _scores(600)
    cal = cogcal.calibrate(z, y, candidates=("ts", "ms"))
    assert math.isinf(cal.cv_nll["ms"]) and cal.method == "ts"
