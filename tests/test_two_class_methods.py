"""The two-class methods ``platt`` and ``beta``: they train (``cogcal train``,
:func:`cogcal.fit`, ``cogcal bench``) on two-class data, and any other number of classes is
refused before anything trains, in one line naming the method, K and the alternatives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import cogcal
import cogcal.train.runner as runner
from cogcal._errors import ArgumentError
from cogcal.bench import check_requirements
from cogcal.bench.suites import parse_suite
from cogcal.calibrators import BetaCalibration, Platt
from cogcal.cli import main
from cogcal.data import load_dataset
from cogcal.runs.methods import METHODS, get_method

CLASSES = {"platt": Platt, "beta": BetaCalibration}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


def _no_training(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a stage trained before the refusal")

    monkeypatch.setattr(runner, "fit_stage", refuse)


def test_the_two_class_methods_are_the_two_class_calibrator_kinds():
    assert [m for m, spec in METHODS.items() if spec.two_class] == ["platt", "beta"]
    for name in ("ce", "ts", "sms", "bbq", "cog-fc", "tst"):
        assert get_method(name).classes_problem(10, "digits") is None
    assert get_method("platt").classes_problem(2, "breast-cancer") is None
    assert get_method("beta").extra_parameters(2, 64) == 3
    assert get_method("platt").extra_parameters_formula() == "2"


@pytest.mark.parametrize("method", ["platt", "beta"])
def test_two_class_method_trains_on_breast_cancer_through_the_cli(
    method, data_root, tmp_path, capsys
):
    out = tmp_path / method
    argv = ["train", "--dataset", "breast-cancer", "--method", method, "--epochs", "2"]
    argv += ["--lr", "1e-2", "--data-root", str(data_root), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["config"]["method"] == method and saved["config"]["num_classes"] == 2
    assert set(saved["val_uncalibrated"]) >= {"nll", "ece_15"}
    loaded = cogcal.load_run(out)
    calibrator = loaded.model.calibrator
    assert type(calibrator) is CLASSES[method]
    # the run's calibrator is the one fitted on the network's validation logits
    val = load_dataset("breast-cancer", root=data_root).val
    with torch.no_grad():
        logits = loaded.model.network(loaded.model.preprocess(val.x))
    refit = CLASSES[method]().fit(logits, val.y.long())
    for mine, theirs in zip(calibrator.parameters(), refit.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    # predict uses it: the probabilities are those the calibrated model gives
    x = load_dataset("breast-cancer", root=data_root).test.x[:4]
    np.save(tmp_path / "x.npy", x.numpy())
    capsys.readouterr()
    assert main(["predict", str(out), "--input", str(tmp_path / "x.npy"), "--no-progress"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    with torch.no_grad():
        probs = torch.softmax(loaded.model(x), -1)
    got = torch.tensor([[float(v) for v in row.split(",")[1:]] for row in rows])
    torch.testing.assert_close(got, probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dataset", ["digits", "mnist1d"])
def test_two_class_method_on_ten_classes_is_refused_before_training(
    dataset, data_root, tmp_path, capsys, monkeypatch
):
    _no_training(monkeypatch)
    out = tmp_path / "run"
    argv = ["train", "--dataset", dataset, "--method", "platt", "--epochs", "1", "--lr", "1e-2"]
    assert main([*argv, "--data-root", str(data_root), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("cogcal: error: --method platt is for two classes only")
    assert f"{dataset!r} has K = 10" in err and "use ts, svs or sms" in err
    assert not out.exists()  # nothing written either


def test_tune_refuses_a_two_class_method_before_marking_its_folder(data_root, tmp_path, capsys):
    out = tmp_path / "tune"
    argv = ["tune", "--dataset", "digits", "--model", "cnn", "--method", "beta", "--epochs", "1"]
    argv += ["--batch-size", "64", "--schedule", "none", "--data-root", str(data_root)]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--method beta is for two classes only" in err
    assert not (out / "tune.json").exists()


def test_two_class_method_through_fit(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    x = rng.normal(size=(400, 8)).astype(np.float32) + y[:, None].astype(np.float32)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    result = cogcal.fit(net, (x, y), method="beta", epochs=2, lr=1e-2, progress=False)
    assert type(result.model.calibrator) is BetaCalibration
    _no_training(monkeypatch)
    three = nn.Sequential(nn.Linear(8, 3))
    with pytest.raises(ArgumentError, match=r"^`method` platt is for two classes only.*K = 3"):
        cogcal.fit(three, (x, np.arange(400) % 3), method="platt", epochs=1, lr=1e-2)


def _suite(methods: list[str], digits: list[str] | None = None) -> dict:
    return {
        "name": "two",
        "datasets": {
            "breast-cancer": {"model": "mlp"},
            "digits": {"model": "mlp", **({"methods": digits} if digits else {})},
        },
        "methods": methods,
        "seeds": 1,
        "protocols": ["fair"],
        "budget": {"fair": {"epochs": 1, "schedule": "none", "patience": None}},
        "tune": {"lrs": [1e-3], "ratios": [0.1], "baseline_lrs": [1e-3], "max_extensions": 0},
    }


def test_bench_refuses_a_two_class_method_on_ten_classes_up_front(data_root, tmp_path, capsys):
    with pytest.raises(ArgumentError, match=r"method beta is for two classes only.*'digits'"):
        check_requirements(parse_suite(_suite(["ce", "beta"])), data_root, check_train=False)
    info = check_requirements(
        parse_suite(_suite(["ce", "beta"], digits=["ce"])), data_root, check_train=False
    )
    assert info["breast-cancer"]["num_classes"] == 2
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(_suite(["ce", "platt"])))
    out = tmp_path / "bench"
    argv = ["bench", "--suite", str(path), "--out", str(out), "--data-root", str(data_root)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if "error" in line]) == 1
    assert "datasets.digits.methods" in err[-1]
    assert not out.exists()
