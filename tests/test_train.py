"""The training runner: every method end to end, data hygiene, determinism, the CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import cogcal.train.runner as runner
from cogcal.calibrators import MatrixScaling, Temperature, VectorScaling
from cogcal.cli import main
from cogcal.data import load_dataset
from cogcal.metrics import evaluate
from cogcal.train import METHODS, TrainConfig, get_method, run

METRIC_KEYS = {"acc", "nll", "brier"} | {
    f"{m}_{b}" for m in ("ece", "rmsce", "mce") for b in (5, 10, 15, 20, 50, 100)
}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


def _config(data_root, out, **kw) -> TrainConfig:
    base = dict(
        preset="paper",
        epochs=1,
        stage2_epochs=1,
        data_root=str(data_root),
        out=str(out),
        progress=False,
    )
    return TrainConfig(**{**base, **kw})


def _log(out: Path, stage: str = "stage1") -> list[dict[str, str]]:
    with (out / "logs" / f"{stage}.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _check_run_dir(out: Path, result: dict) -> None:
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["status"] == "complete"
    assert set(saved) >= {"config", "val", "test", "timing", "ood", "shift"}
    for split in ("val", "test"):
        assert set(saved[split]) >= METRIC_KEYS, split
        assert all(isinstance(v, float) for v in saved[split].values())
    config = json.loads((out / "config.json").read_text())
    assert config["cogcal_run"] == 2 and config["schedule"] in ("step", "none")
    for name in ("val_logits.npz", "test_logits.npz"):
        assert (out / name).is_file(), name
    assert (out / "checkpoints" / "best.ckpt").is_file()
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert _log(out)
    # metrics.json is what the saved logits give: nothing is computed on other data
    with np.load(out / "test_logits.npz", allow_pickle=False) as f:
        recomputed = evaluate(torch.from_numpy(f["logits"]), torch.from_numpy(f["labels"]))
    assert recomputed["brier"] == pytest.approx(saved["test"]["brier"], rel=1e-6)
    assert result["test"]["acc"] == saved["test"]["acc"]
    # robustness sections (mnist1d: structure-destroyed OOD sets, generator-graded shift)
    assert set(saved["ood"]) >= {"mnist1d-shuffled", "noise", "pooled"}
    assert all(0 <= v["auroc"] <= 1 and 0 <= v["fpr95"] <= 1 for v in saved["ood"].values())
    assert set(saved["shift"]) >= {"iid_noise", "shear", "mean"}
    assert set(saved["shift"]["mean"]) == {"1", "2", "3", "4", "5"}
    assert set(saved["shift"]["shear"]["3"]) >= METRIC_KEYS


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m, spec in METHODS.items() if not spec.two_class])
def test_every_method_runs_on_mnist1d(method, data_root, tmp_path):
    out = tmp_path / method
    result = run(_config(data_root, out, method=method))
    _check_run_dir(out, result)
    m = get_method(method)
    if m.stage2:
        assert (out / "checkpoints" / "stage1" / "best.ckpt").is_file()
        assert _log(out, "stage2")
    if m.posthoc:
        assert (out / "calibrator.pt").is_file()
        assert set(result["val_uncalibrated"]) >= METRIC_KEYS
    lr, cal_lr = result["config"]["lr"], result["config"]["calibrator_lr"]
    assert lr == (1e-3 if m.cog else 1e-4)
    assert cal_lr == (pytest.approx(lr / 10) if m.cog else None)
    assert result["config"]["schedule"] == ("step" if m.cog else "none")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ce", "ms", "vtst", "cog-fc", "cog-tst", "cog-focal"])
def test_methods_run_on_digits_through_the_cli(method, data_root, tmp_path, capsys):
    out = tmp_path / method
    argv = [
        "train",
        "--dataset",
        "digits",
        "--method",
        method.upper(),
        "--preset",
        "paper",
        "--epochs",
        "1",
    ]
    argv += ["--stage2-epochs", "1", "--data-root", str(data_root), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "test" in printed and "brier" in printed  # the end-of-run summary
    assert main(["report", str(out)]) == 0  # the one-run report and its reliability diagram
    assert (out / "reliability.png").stat().st_size > 1000
    assert (out / "report.html").is_file()
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["config"]["dataset"] == "digits" and saved["config"]["model"] == "cnn"
    assert saved["config"]["method"] == method  # names are case-insensitive


MULTILABEL_METHODS = ["ce", "ls", "ts", "ms", "cog-fc", "cog-ts", "cog-ms", "cog-ls"]


@pytest.mark.slow
@pytest.mark.parametrize("method", MULTILABEL_METHODS)
def test_multitask_methods_run_through_the_cli(method, data_root, tmp_path):
    out = tmp_path / method
    argv = [
        "train",
        "--dataset",
        "mnist1d-mtl",
        "--method",
        method,
        "--preset",
        "paper",
        "--epochs",
        "1",
    ]
    assert main([*argv, "--data-root", str(data_root), "--out", str(out), "--no-progress"]) == 0
    saved = json.loads((out / "metrics.json").read_text())
    names = load_dataset("mnist1d-mtl", root=data_root).class_names
    assert saved["config"]["task"] == "multilabel"
    with np.load(out / "test_logits.npz", allow_pickle=False) as f:
        logits, labels = torch.from_numpy(f["logits"]), torch.from_numpy(f["labels"])
    assert logits.shape == (len(labels), len(names))
    for j, name in enumerate(names):  # per-task values are the binary metrics of that task
        alone = evaluate(logits[:, j], labels[:, j], task="binary")
        for key in ("acc", "nll", "brier", "ece_15"):
            assert saved["test"][f"{key}/{name}"] == pytest.approx(alone[key], rel=1e-6)
    for key in ("acc", "brier"):  # the plain keys are unweighted means over tasks
        mean = np.mean([saved["test"][f"{key}/{n}"] for n in names])
        assert saved["test"][key] == pytest.approx(mean, rel=1e-9)
    if method in ("ts", "ms"):
        state = torch.load(out / "calibrator.pt", weights_only=True)
        assert all(v.shape == (len(names),) for v in state.values())  # one map per task


@pytest.mark.slow
def test_multitask_rejects_methods_without_a_multitask_form(data_root, tmp_path, capsys):
    argv = ["train", "--dataset", "mnist1d-mtl", "--method", "tst", "--out", str(tmp_path / "o")]
    assert main([*argv, "--data-root", str(data_root)]) == 2
    err = capsys.readouterr().err
    assert "no multi-task form" in err and "--method" in err


def _row_keys(x: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.float()}


def _spy_training_batches(monkeypatch) -> list[torch.Tensor]:
    """Record every input batch the training loops draw (what reaches the optimizer)."""
    seen: list[torch.Tensor] = []
    original = runner.fit_stage

    class Recording:
        def __init__(self, loader):
            self.loader = loader

        def __len__(self):
            return len(self.loader)

        def set_epoch(self, epoch):
            self.loader.set_epoch(epoch)

        def __iter__(self):
            for x, y in self.loader:
                seen.append(x.detach().clone())
                yield x, y

    def spy(fabric, stage, train_loader, *args, **kwargs):
        return original(fabric, stage, Recording(train_loader), *args, **kwargs)

    monkeypatch.setattr(runner, "fit_stage", spy)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cog-fc", "cog-ms", "cog-tst", "vtst"])
def test_training_never_sees_validation_or_test_data(method, data_root, tmp_path, monkeypatch):
    data = load_dataset("mnist1d", root=data_root)
    train_rows = _row_keys(data.transform(data.train.x))
    held_out = _row_keys(data.transform(data.val.x)) | _row_keys(data.transform(data.test.x))
    seen = _spy_training_batches(monkeypatch)
    run(_config(data_root, tmp_path / "run", method=method))
    rows = _row_keys(torch.cat(seen))
    assert rows <= train_rows
    assert not rows & held_out
    stages = 2 if get_method(method).stage2 else 1
    assert sum(len(b) for b in seen) == stages * len(data.train)  # one epoch per stage


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "cls"), [("ts", Temperature), ("vs", VectorScaling), ("ms", MatrixScaling)]
)
def test_posthoc_calibrators_fit_on_validation_only(method, cls, data_root, tmp_path, monkeypatch):
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = cls.fit

    def spy(self, logits, labels, *args, **kwargs):
        calls.append((torch.as_tensor(logits).clone(), torch.as_tensor(labels).clone()))
        return original(self, logits, labels, *args, **kwargs)

    monkeypatch.setattr(cls, "fit", spy)
    result = run(_config(data_root, tmp_path / "run", method=method))
    data = load_dataset("mnist1d", root=data_root)
    assert len(calls) == 1
    logits, labels = calls[0]
    assert torch.equal(labels, data.val.y.long())
    assert logits.shape == (len(data.val), data.num_classes)
    # the uncalibrated validation metrics are those of the logits the calibrator saw
    assert result["val_uncalibrated"]["nll"] == pytest.approx(evaluate(logits, labels)["nll"])


@pytest.mark.slow
def test_same_seed_same_result_on_cpu(data_root, tmp_path):
    for model in ("mlp", "cnn1d"):
        kw = dict(method="cog-ts", epochs=2, model=model)
        a = run(_config(data_root, tmp_path / f"a{model}", **kw))
        b = run(_config(data_root, tmp_path / f"b{model}", **kw))
        c = run(_config(data_root, tmp_path / f"c{model}", **kw, seed=1))
        assert a["test"] == b["test"]
        assert a["test"] != c["test"]


@pytest.mark.slow
def test_progress_bar_counts_minibatches_and_shows_the_last_epoch(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    run(_config(data_root, out, method="cog-ms", epochs=2, progress=True))
    bar = capsys.readouterr().err  # the bar is on stderr
    assert "60/60" in bar  # 30 minibatches an epoch, 2 epochs
    last = float(_log(out)[-1]["val_brier"])
    assert f"val_brier={last:.4f}" in bar.split("60/60")[-1]


@pytest.mark.slow
def test_cog_learning_rates_follow_the_step_schedule(data_root, tmp_path):
    out = tmp_path / "run"
    run(
        _config(data_root, out, method="cog-ms", epochs=3, step_size=1, lr=1e-2, calibrator_lr=1e-3)
    )
    rows = _log(out)
    assert [float(r["lr_network"]) for r in rows] == pytest.approx([1e-2, 1e-3, 1e-4])
    assert [float(r["lr_calibrator"]) for r in rows] == pytest.approx([1e-3, 1e-4, 1e-5])


@pytest.mark.slow
def test_any_method_can_take_the_step_schedule(data_root, tmp_path):
    out = tmp_path / "run"
    result = run(_config(data_root, out, method="ce", epochs=2, step_size=1, schedule="step"))
    assert result["config"]["schedule"] == "step"
    assert [float(r["lr_network"]) for r in _log(out)] == pytest.approx([1e-4, 1e-5])


@pytest.mark.slow
def test_training_stops_at_the_learning_rate_floor(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = _config(data_root, out, method="cog-fc", epochs=9, step_size=1, lr=1e-5, progress=True)
    result = run(cfg)
    stage = result["timing"]["stage1"]
    # λ_c = 1e-6 reaches the 1e-8 floor after 3 divisions; λ_f = 1e-5 after 4 (epoch 4)
    assert stage["stopped"] == "lr_floor" and stage["epochs_run"] == 4
    assert "every learning rate is below 1e-08" in capsys.readouterr().err


@pytest.mark.slow
def test_early_stopping_on_validation_brier(data_root, tmp_path, monkeypatch):
    from cogcal.metrics import StreamingMetrics

    real = StreamingMetrics.compute

    def flat(self):  # a validation Brier that never improves after the first epoch
        return {**real(self), "brier": 0.5}

    monkeypatch.setattr(StreamingMetrics, "compute", flat)
    cfg = _config(data_root, tmp_path / "run", method="ce", epochs=10, patience=2)
    result = run(cfg)
    assert result["timing"]["stage1"]["epochs_run"] == 3  # epoch 0, then 2 without progress
    assert result["timing"]["stage1"]["best_epoch"] == 0
    assert result["timing"]["stage1"]["stopped"] == "patience"


def test_config_validation_names_the_field_in_python_and_the_flag_on_the_cli():
    cases = [
        (dict(method="cog-fcc"), "method", "'cog-fcc' is unknown.*Did you mean 'cog-fc'"),
        (dict(dataset="cifar11"), "dataset", "'cifar11' is unknown.*'cifar10'"),
        (dict(model="resnet19"), "model", "'resnet19'"),
        (dict(epochs=0), "epochs", "must be an integer >= 1"),
        (dict(batch_size=0), "batch_size", "must be an integer >= 1"),
        (dict(seed=1099511627776), "seed", "must be an integer from 0 to 4294967295"),
        (dict(lr=-1.0), "lr", "must be a positive"),
        (dict(lr=1e-12), "lr", "1e-12 is below 1e-08"),
        (dict(lr=1e-3, calibrator_lr=1e-3), "calibrator_lr", "must be smaller"),
        (dict(method="ce", calibrator_lr=1e-5), "calibrator_lr", "COG methods only"),
        (dict(accelerator="tpu"), "accelerator", "must be one of"),
        (dict(precision="16-mixed"), "precision", "needs a GPU"),
        (dict(schedule="cosine"), "schedule", "must be one of step, none"),
        (dict(out=""), "out", "must be a non-empty path"),
        (dict(data_root=""), "data_root", "must be a non-empty path"),
    ]
    for kwargs, field, message in cases:
        with pytest.raises(ValueError, match=message) as exc:
            TrainConfig(**kwargs)
        assert f"`{field}`" in str(exc.value)
        assert "--" + field.replace("_", "-") in exc.value.cli_message
    with pytest.raises(
        ValueError, match=r"unknown training config key\(s\) 'epoch' \(did you mean 'epochs'"
    ):
        TrainConfig.from_dict({"epoch": 3})
    TrainConfig(lr=1e-3, calibrator_lr=1e-3, allow_fast_calibrator=True)  # allowed explicitly
    with pytest.raises(ValueError, match="unknown training config key"):
        TrainConfig.from_dict({"steps_per_call": 8})  # a field that never shipped


def test_cli_flags_come_from_the_config_fields(capsys):
    import dataclasses

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        if f.metadata["cli"]:
            expected = ("--no-" if f.default is True else "--") + f.name.replace("_", "-")
            assert expected in text, expected
    assert "ddp_find_unused_parameters_true" in text  # choices come from the field
    for name in ("cog-fc", "mnist1d", "resnet18"):  # the registries' names are listed
        assert name in text


def test_cli_user_errors_are_one_line_without_traceback(capsys, tmp_path):
    assert main(["train", "--method", "cog-fcc", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "Did you mean 'cog-fc'" in err
    assert err.startswith("cogcal: error: --method")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--lr", "abc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--lr" in err and err.startswith("cogcal: error:")
    out = tmp_path / "o"
    argv = ["train", "--dataset", "cifar10", "--data-root", str(tmp_path), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cifar-10-batches-py" in err and err.count("\n") == 1
    assert main(["train", "--seed", "1099511627776", "--out", str(out)]) == 2
    assert "--seed must be an integer from 0 to" in capsys.readouterr().err
    assert not out.exists()  # nothing was created for a run that could not start
    for argv, message in (
        (["train", "--out", ""], "--out must be a non-empty path"),
        (["train", "--data-root", "", "--out", str(out)], "--data-root must be a non-empty"),
        (["train", "--precision", "16-mixed", "--out", str(out)], "16-mixed needs a GPU"),
    ):
        assert main(argv) == 2
        assert message in capsys.readouterr().err


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("cogcal ")
    assert main([]) == 0
    text = capsys.readouterr().out
    assert "train" in text and "cog-fc" in text and "mnist1d" in text


@pytest.mark.slow
def test_lightning_fabric_runs_the_same_loop_when_a_run_needs_it(data_root, tmp_path):
    from cogcal.train.devices import SingleProcess, launch, needs_fabric

    plain = _config(data_root, tmp_path / "a", method="cog-ms", epochs=2)
    assert not needs_fabric(plain) and isinstance(launch(plain), SingleProcess)
    # mixed precision on the CPU goes through Fabric (bf16 autocast in the forward pass)
    mixed = _config(data_root, tmp_path / "b", method="cog-ms", epochs=2, precision="bf16-mixed")
    assert needs_fabric(mixed)
    a, b = run(plain), run(mixed)
    assert b["config"]["precision"] == "bf16-mixed"
    assert b["test"]["acc"] == pytest.approx(a["test"]["acc"], abs=0.05)
