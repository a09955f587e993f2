"""The training runner: every method end to end, data hygiene, determinism, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tqdm import tqdm

from cogcal.calibrators import MatrixScaling, Temperature, VectorScaling
from cogcal.cli import main
from cogcal.data import load_dataset
from cogcal.metrics import evaluate
from cogcal.train import METHODS, TrainConfig, get_method, run, tune
from cogcal.train.module import CalibrationModule

SPEC_KEYS = {"acc", "nll", "brier"} | {
    f"{m}_{b}" for m in ("ece", "rmsce", "mce") for b in (5, 10, 15, 20, 50, 100)
}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


def _config(data_root, out, **kw) -> TrainConfig:
    base = dict(epochs=1, stage2_epochs=1, data_root=str(data_root), out=str(out), progress=False)
    return TrainConfig(**{**base, **kw})


def _check_run_dir(out: Path, result: dict) -> None:
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["status"] == "complete"
    assert set(saved) >= {"config", "val", "test", "timing", "ood", "shift"}
    for split in ("val", "test"):
        assert set(saved[split]) >= SPEC_KEYS, split
        assert all(isinstance(v, float) for v in saved[split].values())
    for name in ("config.json", "val_logits.npz", "test_logits.npz"):
        assert (out / name).is_file(), name
    assert (out / "checkpoints" / "best.ckpt").is_file()
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert list((out / "logs").rglob("metrics.csv"))
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
    assert set(saved["shift"]["shear"]["3"]) >= SPEC_KEYS


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_runs_on_mnist1d(method, data_root, tmp_path):
    out = tmp_path / method
    result = run(_config(data_root, out, method=method))
    _check_run_dir(out, result)
    m = get_method(method)
    if m.stage2:
        assert (out / "checkpoints" / "stage1" / "best.ckpt").is_file()
    if m.posthoc:
        assert (out / "calibrator.pt").is_file()
    lr, cal_lr = result["config"]["lr"], result["config"]["calibrator_lr"]
    assert lr == (1e-3 if m.cog else 1e-4)
    assert cal_lr == (pytest.approx(lr / 10) if m.cog else None)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ce", "ms", "vtst", "cog-fc", "cog-tst", "cog-focal"])
def test_methods_run_on_digits_through_the_cli(method, data_root, tmp_path, capsys):
    out = tmp_path / method
    argv = ["train", "--dataset", "digits", "--method", method, "--epochs", "1"]
    argv += ["--stage2-epochs", "1", "--data-root", str(data_root), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "test" in printed and "brier" in printed  # the end-of-run summary
    assert (out / "reliability.png").stat().st_size > 1000
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["config"]["dataset"] == "digits" and saved["config"]["model"] == "cnn"


MULTILABEL_METHODS = ["ce", "ls", "ts", "ms", "cog-fc", "cog-ts", "cog-ms", "cog-ls"]


@pytest.mark.slow
@pytest.mark.parametrize("method", MULTILABEL_METHODS)
def test_multitask_methods_run_through_the_cli(method, data_root, tmp_path):
    from cogcal.data import load_dataset as load

    out = tmp_path / method
    argv = ["train", "--dataset", "mnist1d-mtl", "--method", method, "--epochs", "1"]
    assert main([*argv, "--data-root", str(data_root), "--out", str(out), "--no-progress"]) == 0
    saved = json.loads((out / "metrics.json").read_text())
    names = load("mnist1d-mtl", root=data_root).class_names
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


def test_multitask_rejects_methods_without_a_multitask_form(data_root, tmp_path, capsys):
    argv = ["train", "--dataset", "mnist1d-mtl", "--method", "tst", "--out", str(tmp_path)]
    assert main([*argv, "--data-root", str(data_root)]) == 2
    assert "no multi-task form" in capsys.readouterr().err


def _row_keys(x: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.float()}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cog-fc", "cog-ms", "cog-tst"])
def test_cog_never_gives_validation_data_to_the_optimizer(method, data_root, tmp_path, monkeypatch):
    data = load_dataset("mnist1d", root=data_root)
    train_rows = _row_keys(data.transform(data.train.x))
    held_out = _row_keys(data.transform(data.val.x)) | _row_keys(data.transform(data.test.x))
    seen: list[torch.Tensor] = []
    original = CalibrationModule.training_step

    def spy(self, batches, batch_idx):
        seen.extend(x.detach().clone() for x, _ in batches)
        return original(self, batches, batch_idx)

    monkeypatch.setattr(CalibrationModule, "training_step", spy)
    run(_config(data_root, tmp_path / "run", method=method))
    rows = _row_keys(torch.cat(seen))
    assert rows <= train_rows
    assert not rows & held_out
    assert sum(len(b) for b in seen) == len(data.train)  # one epoch, every training sample


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "cls"), [("ts", Temperature), ("vs", VectorScaling), ("ms", MatrixScaling)]
)
def test_posthoc_calibrators_fit_on_validation_only(method, cls, data_root, tmp_path, monkeypatch):
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = cls.fit

    def spy(self, logits, labels):
        calls.append((logits.clone(), labels.clone()))
        return original(self, logits, labels)

    monkeypatch.setattr(cls, "fit", spy)
    run(_config(data_root, tmp_path / "run", method=method))
    data = load_dataset("mnist1d", root=data_root)
    assert len(calls) == 1
    logits, labels = calls[0]
    assert torch.equal(labels, data.val.y.long())
    assert logits.shape == (len(data.val), data.num_classes)


@pytest.mark.slow
def test_same_seed_same_result_on_cpu(data_root, tmp_path):
    a = run(_config(data_root, tmp_path / "a", method="cog-ts", epochs=2))
    b = run(_config(data_root, tmp_path / "b", method="cog-ts", epochs=2))
    c = run(_config(data_root, tmp_path / "c", method="cog-ts", epochs=2, seed=1))
    assert a["test"] == b["test"]
    assert a["test"] != c["test"]
    # deterministic kernels were on during training only: the caller's flags are restored
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cog-ms", "vtst"])
def test_steps_per_call_never_changes_the_result(method, data_root, tmp_path, capsys):
    # 30 minibatches an epoch: groups of 1, of 7 (a short last group) and of 8 (default)
    results, bars = [], []
    for k in (1, 7, 8):
        config = _config(
            data_root, tmp_path / f"k{k}", method=method, epochs=2, steps_per_call=k, progress=True
        )
        results.append(run(config))
        bars.append(capsys.readouterr().out)  # Lightning's bars write to stdout
    for other in results[1:]:
        assert other["val"] == results[0]["val"]
        assert other["test"] == results[0]["test"]
    stage = "stage2" if method == "vtst" else "stage1"
    for k, bar in zip((1, 7, 8), bars, strict=True):
        # the bar counts minibatches whatever the grouping, and its last redraw shows the
        # last epoch's validation values
        assert "30/30" in bar and "/4 " not in bar and "/5 " not in bar
        log = (tmp_path / f"k{k}" / "logs" / stage / "metrics.csv").read_text().splitlines()
        header = log[0].split(",")
        last = [r.split(",") for r in log[1:]][-1][header.index("val_brier")]
        assert f"val_brier={tqdm.format_num(float(last))}" in bar.split("30/30")[-1]


@pytest.mark.slow
def test_cog_learning_rates_follow_the_step_schedule(data_root, tmp_path):
    out = tmp_path / "run"
    run(
        _config(data_root, out, method="cog-ms", epochs=3, step_size=1, lr=1e-2, calibrator_lr=1e-3)
    )
    log = (out / "logs" / "stage1" / "metrics.csv").read_text().splitlines()
    header = log[0].split(",")
    net, cal = header.index("lr_network"), header.index("lr_calibrator")
    rows = [r.split(",") for r in log[1:] if r.split(",")[net]]
    assert [float(r[net]) for r in rows] == pytest.approx([1e-2, 1e-3, 1e-4])
    assert [float(r[cal]) for r in rows] == pytest.approx([1e-3, 1e-4, 1e-5])


@pytest.mark.slow
def test_early_stopping_on_validation_brier(data_root, tmp_path, monkeypatch):
    from cogcal.metrics import StreamingMetrics

    real = StreamingMetrics.compute

    def flat(self):  # a validation Brier that never improves after the first epoch
        return {**real(self), "brier": 0.5}

    monkeypatch.setattr("cogcal.train.module.StreamingMetrics.compute", flat)
    cfg = _config(data_root, tmp_path / "run", method="ce", epochs=10, patience=2)
    result = run(cfg)
    assert result["timing"]["stage1"]["epochs_run"] == 3  # epoch 0, then 2 without progress
    assert result["timing"]["stage1"]["best_epoch"] == 0


@pytest.mark.slow
def test_tune_chooses_by_validation_nll_and_resumes(data_root, tmp_path, monkeypatch):
    grid = [{"lr": 1e-3, "calibrator_lr": 1e-4}, {"lr": 1e-2, "calibrator_lr": 1e-3}]
    summary = tune(_config(data_root, tmp_path / "x", method="cog-fc"), grid, tmp_path / "tune")
    table = summary["table"]
    best = min(table, key=lambda r: r["val_nll"])
    assert summary["best"] == {"lr": best["lr"], "calibrator_lr": best["calibrator_lr"]}
    assert (tmp_path / "tune" / "tune.csv").read_text().count("\n") == 3
    # a second call reuses the finished runs instead of training again
    monkeypatch.setattr("cogcal.train.runner.run", lambda cfg: pytest.fail("retrained"))
    again = tune(_config(data_root, tmp_path / "x", method="cog-fc"), grid, tmp_path / "tune")
    assert again["best"] == summary["best"]


def test_config_validation_names_the_flag(data_root):
    cases = [
        (dict(method="cog-fcc"), "--method 'cog-fcc' is unknown.*Did you mean 'cog-fc'"),
        (dict(dataset="cifar11"), "--dataset 'cifar11' is unknown.*'cifar10'"),
        (dict(model="resnet19"), "--model 'resnet19'"),
        (dict(epochs=0), "--epochs must be an integer >= 1"),
        (dict(batch_size=0), "--batch-size"),
        (dict(steps_per_call=0), "--steps-per-call must be an integer >= 1"),
        (dict(lr=-1.0), "--lr must be a positive"),
        (dict(lr=1e-12), "--lr 1e-12 is below 1e-08"),
        (dict(lr=1e-3, calibrator_lr=1e-3), "--calibrator-lr .* must be smaller"),
        (dict(method="ce", calibrator_lr=1e-5), "COG methods only"),
        (dict(accelerator="tpu"), "--accelerator"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            TrainConfig(**kwargs)
    with pytest.raises(
        ValueError, match=r"unknown training config key\(s\) 'epoch' \(did you mean 'epochs'"
    ):
        TrainConfig.from_dict({"epoch": 3})
    TrainConfig(lr=1e-3, calibrator_lr=1e-3, allow_fast_calibrator=True)  # allowed explicitly


def test_cli_user_errors_are_one_line_without_traceback(capsys, tmp_path):
    assert main(["train", "--method", "cog-fcc", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "Did you mean 'cog-fc'" in err
    with pytest.raises(SystemExit) as exc:
        main(["train", "--lr", "abc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--lr" in err
    assert (
        main(
            [
                "train",
                "--dataset",
                "cifar10",
                "--data-root",
                str(tmp_path),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "cifar-10-batches-py" in err and err.count("\n") == 1


def test_cli_refuses_to_overwrite_a_finished_run(tmp_path, capsys):
    (tmp_path / "metrics.json").write_text(json.dumps({"status": "complete"}))
    assert main(["train", "--out", str(tmp_path)]) == 2
    assert "already holds a finished run" in capsys.readouterr().err


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("cogcal ")
    assert main([]) == 0
    assert "train" in capsys.readouterr().out
