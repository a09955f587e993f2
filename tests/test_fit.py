"""`cogcal.fit` on your own model and data, and `cogcal.load_run` on a finished run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import cogcal
from cogcal import CalibratedModel
from cogcal.cli import main
from cogcal.health import CalibrationWarning
from cogcal.metrics import evaluate
from cogcal.train import METHODS, get_method


def _problem(n: int = 600, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, y


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


@pytest.mark.slow
@pytest.mark.parametrize(  # three classes: platt and beta (two only) in test_two_class_methods
    "method", [m for m, s in METHODS.items() if m not in ("focal", "cog-focal") and not s.two_class]
)
def test_every_method_through_fit(method, tmp_path):
    x, y = _problem()
    result = cogcal.fit(
        _net(), (x, y), method=method, preset="paper", epochs=2, stage2_epochs=1, batch_size=64, progress=False,
        out=tmp_path / "run",
    )  # fmt: skip
    assert isinstance(result.model, CalibratedModel) and not result.model.training
    assert {"acc", "nll", "brier", "ece_15"} <= set(result.metrics)
    stages = 2 if get_method(method).stage2 else 1
    assert len(result.history) == 2 + (stages - 1)
    # the returned model predicts exactly what the run evaluated on validation
    with np.load(tmp_path / "run" / "val_logits.npz") as f:
        saved, labels = torch.from_numpy(f["logits"]), torch.from_numpy(f["labels"])
    torch.manual_seed(0)  # V-TST draws Monte Carlo samples
    with torch.no_grad():
        val_x = x[_val_index(y)]
        mine = result.model(val_x)
    if method != "vtst":
        torch.testing.assert_close(mine, saved, rtol=1e-5, atol=1e-5)
    assert evaluate(saved, labels)["nll"] == pytest.approx(result.metrics["nll"])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["dataset"] == "python:data" and config["model"] == "python:Sequential"
    assert config["data"]["validation"].startswith("stratified 20% of train_data")


def _val_index(y: torch.Tensor) -> np.ndarray:
    from cogcal.data import SPLIT_SEED, stratified_split

    return stratified_split(y.numpy(), 0.2, seed=SPLIT_SEED)[1]


class _Pairs(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["numpy", "tensordataset", "dataset", "dataloader"])
def test_every_input_kind(kind):
    x, y = _problem()
    xv, yv = _problem(200, seed=1)
    if kind == "numpy":
        train, val = (x.numpy(), y.numpy()), (xv.numpy(), list(yv.numpy()))
    elif kind == "tensordataset":
        train, val = TensorDataset(x, y), TensorDataset(xv, yv)
    elif kind == "dataset":
        train, val = _Pairs(x, y), _Pairs(xv, yv)
    else:
        train = DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True)
        val = DataLoader(TensorDataset(xv, yv), batch_size=100)
    result = cogcal.fit(
        _net(), train, val, method="cog-ts", epochs=10, batch_size=32, lr=1e-2, progress=False
    )
    assert result.validation == "val_data as given"
    assert result.metrics["acc"] > 0.5  # learned something on a separable problem
    with torch.no_grad():
        acc = (result.model(xv).argmax(1) == yv).float().mean().item()
    assert acc == pytest.approx(result.metrics["acc"])


@pytest.mark.slow
def test_fit_with_a_dataset_and_no_validation_splits_it(tmp_path):
    x, y = _problem()
    result = cogcal.fit(_net(), _Pairs(x, y), method="ce", preset="paper", epochs=1, progress=False)
    assert result.validation.startswith("stratified 20% of train_data (120 samples")


def test_fit_errors_are_specific():
    x, y = _problem(100)
    with pytest.raises(ValueError, match="`model` must be a torch nn.Module"):
        cogcal.fit("net", (x, y))
    with pytest.raises(ValueError, match="100 inputs but 99 labels"):
        cogcal.fit(_net(), (x, y[:99]))
    with pytest.raises(ValueError, match=r"labels outside 0..2 \(found 5\)"):
        cogcal.fit(_net(), (x, y + 3), progress=False)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    with pytest.raises(ValueError, match="`val_data` is needed when `train_data` is a DataLoader"):
        cogcal.fit(_net(), loader)
    with pytest.raises(ValueError, match="`method` 'cog-fcc' is unknown"):
        cogcal.fit(_net(), (x, y), method="cog-fcc")
    with pytest.raises(ValueError, match="unknown training config key"):
        cogcal.fit(_net(), (x, y), epoch=3)
    with pytest.raises(ValueError, match="class indices"):
        cogcal.fit(_net(), (x, y.float() + 0.5))


@pytest.mark.slow
def test_fit_writes_a_run_folder_with_the_train_contract(tmp_path):
    x, y = _problem()
    out = tmp_path / "run"
    cogcal.fit(_net(), (x, y), preset="paper", epochs=1, out=out, progress=False)
    with pytest.raises(ValueError, match="already holds a finished run"):
        cogcal.fit(_net(), (x, y), preset="paper", epochs=1, out=out, progress=False)
    again = cogcal.fit(
        _net(), (x, y), preset="paper", epochs=1, out=out, progress=False, overwrite=True
    )
    assert again.out == out
    with pytest.raises(ValueError, match="model given in Python"):
        cogcal.load_run(out)


@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for method in ("ce", "ts", "vs", "ms", "cog-fc", "cog-ms", "tst", "vtst"):
        argv = [
            "train",
            "--dataset",
            "digits",
            "--method",
            method,
            "--preset",
            "paper",
            "--epochs",
            "2",
        ]
        argv += ["--stage2-epochs", "1", "--data-root", str(root / "data"), "--no-progress"]
        assert main([*argv, "--out", str(root / method)]) == 0
    return root


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ce", "ts", "vs", "ms", "cog-fc", "cog-ms", "tst", "vtst"])
def test_load_run_predicts_the_saved_test_logits(method, digits_runs):
    from cogcal.data import load_dataset

    loaded = cogcal.load_run(digits_runs / method)
    assert isinstance(loaded.model, CalibratedModel) and loaded.config.method == method
    data = load_dataset("digits", root=digits_runs / "data")
    torch.manual_seed(loaded.config.seed)  # V-TST's Monte Carlo samples, as the run drew them
    with torch.no_grad():
        logits = loaded.model(data.test.x)  # raw inputs: the run's standardisation inside
    with np.load(digits_runs / method / "test_logits.npz") as f:
        torch.testing.assert_close(logits, torch.from_numpy(f["logits"]), rtol=1e-5, atol=1e-5)
    last = cogcal.load_run(digits_runs / method, which="last")
    assert last.which == "last"


def test_load_run_refuses_foreign_folders(tmp_path):
    with pytest.raises(ValueError, match="holds no finished cogcal run"):
        cogcal.load_run(tmp_path)
    with pytest.raises(ValueError, match="`which` must be 'best' or 'last'"):
        cogcal.load_run(tmp_path, which="final")


@pytest.mark.slow
def test_fit_warnings_name_python_arguments_not_flags():
    """A cogcal.fit user gets fixes in the terms of the call (`epochs`), not CLI flags."""
    x, y = _problem()
    with pytest.warns(CalibrationWarning) as caught:
        result = cogcal.fit(_net(), (x, y), epochs=3, batch_size=64, lr=1e-3, progress=False)
    messages = [str(w.message) for w in caught if w.category is CalibrationWarning]
    assert [f.kind for f in result.health.findings][0] == "under-trained"
    assert "leave `epochs` and `batch_size` unset" in messages[0], messages
    assert all("--" not in m for m in messages), messages
