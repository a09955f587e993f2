"""The defaults: budgets from the training-set size, the paper's preset, learning rates
chosen by validation cross-entropy when none is given, and the health check of each run."""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch
from torch import nn

import cogcal
from cogcal.cli import main
from cogcal.health import CalibrationWarning
from cogcal.train import robustness, runner
from cogcal.train.config import (
    AUTO_MIN_STEPS,
    ConfigError,
    TrainConfig,
    auto_budget,
)
from cogcal.train.select import MAX_RUNS, selection_folder


@pytest.mark.parametrize(
    ("n", "batch", "epochs"),
    [
        (114, 16, 188),  # wine: 8 steps an epoch -> ceil(1500 / 8) epochs
        (1149, 32, 42),  # digits: 1149 // 20 = 57 -> 32; 36 steps -> ceil(1500 / 36)
        (7680, 256, 50),  # mnist1d: 30 steps an epoch
        (40_000, 256, 30),  # CIFAR-sized: 157 steps an epoch, at least 30 epochs
    ],
)
def test_auto_budget_gives_enough_steps_whatever_the_size(n, batch, epochs):
    budget = auto_budget(n)
    assert (budget["batch_size"], budget["epochs"]) == (batch, epochs)
    assert budget["steps_per_epoch"] == math.ceil(n / batch)
    assert budget["steps"] >= AUTO_MIN_STEPS


def test_with_budget_keeps_given_fields_and_scales_the_schedule():
    cfg = TrainConfig(method="cog-fc", batch_size=64).with_budget(1149)
    assert (cfg.batch_size, cfg.epochs, cfg.schedule, cfg.step_size) == (64, 84, "step", 28)
    given = TrainConfig(method="ce", epochs=4, batch_size=256, schedule="none", lr=1e-4)
    assert given.with_budget(1149).resolved() == {**given.resolved(), "schedule": "none"}
    paper = TrainConfig(method="ce", preset="paper").with_budget(1149, task="multilabel")
    assert (paper.batch_size, paper.epochs, paper.schedule_name) == (256, 100, "none")
    assert paper.learning_rates() == (1e-4, None)
    two = TrainConfig(devices=2, lr=1e-3).with_budget(114)
    assert two.batch_size % 2 == 0


def test_no_lr_means_chosen_and_a_lone_calibrator_lr_is_refused():
    assert TrainConfig().selects_learning_rates
    assert not TrainConfig(lr=1e-3).selects_learning_rates
    assert not TrainConfig(preset="paper").selects_learning_rates
    with pytest.raises(ConfigError, match="`calibrator_lr` is given without `lr`"):
        TrainConfig(calibrator_lr=1e-4)
    with pytest.raises(ConfigError, match="`preset` must be one of auto, paper"):
        TrainConfig(preset="fast")


def _problem(n: int = 600, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _count_runs(monkeypatch) -> list[TrainConfig]:
    calls: list[TrainConfig] = []
    real = runner._train

    def spy(config, *args):
        calls.append(config)
        return real(config, *args)

    monkeypatch.setattr(runner, "_train", spy)  # once per configuration trained
    return calls


@pytest.mark.slow
def test_fit_without_lr_chooses_by_validation_nll_and_reuses_the_chosen_run(tmp_path, monkeypatch):
    calls = _count_runs(monkeypatch)
    out = tmp_path / "run"
    x, y = _problem()
    net = _net()
    with pytest.warns(CalibrationWarning, match="under-trained"):
        result = cogcal.fit(net, (x, y), method="cog-fc", epochs=1, out=out, progress=False)
    selection = result.selection
    assert selection is not None and 3 <= selection["runs"] <= MAX_RUNS == 7
    assert len(calls) == selection["runs"]  # the chosen run is not trained again
    table = selection["table"]
    best = min(table, key=lambda r: r["val_nll"])
    assert selection["best_config"]["lr"] == best["lr"]
    assert result.config.lr is None  # the configuration as given
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["config"]["lr"] == best["lr"] and saved["config"]["out"] == str(out)
    assert saved["config"]["calibrator_lr"] == pytest.approx(best["lr"] * best["ratio"], rel=1e-2)
    assert saved["val"]["nll"] == pytest.approx(best["val_nll"])
    assert saved["health"]["findings"][0]["kind"] == "under-trained"
    assert (selection_folder(out) / "tune.json").is_file()
    # the caller's network holds the chosen weights
    with torch.no_grad():
        torch.testing.assert_close(result.model.network(x[:5]), net(x[:5]))
    # the same call again: refused without overwrite; with it, every point is reused
    with pytest.raises(ValueError, match="already holds a finished run"):
        cogcal.fit(_net(), (x, y), method="cog-fc", epochs=1, out=out, progress=False)
    n = len(calls)
    with pytest.warns(CalibrationWarning):
        again = cogcal.fit(
            _net(), (x, y), method="cog-fc", epochs=1, out=out, progress=False, overwrite=True
        )
    assert again.selection["best"] == selection["best"] and len(calls) == n
    assert again.metrics == result.metrics


@pytest.mark.slow
def test_an_explicit_lr_trains_exactly_one_configuration(tmp_path, monkeypatch):
    calls = _count_runs(monkeypatch)
    x, y = _problem()
    with pytest.warns(CalibrationWarning):
        result = cogcal.fit(_net(), (x, y), epochs=1, lr=1e-3, out=tmp_path / "r", progress=False)
    assert len(calls) == 1 and result.selection is None
    assert not selection_folder(tmp_path / "r").exists()
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (saved["batch_size"], saved["epochs"], saved["preset"]) == (16, 1, "auto")


@pytest.mark.slow
def test_baselines_choose_one_rate_on_a_grid(tmp_path):
    x, y = _problem()
    with pytest.warns(CalibrationWarning):
        result = cogcal.fit(_net(), (x, y), method="ce", epochs=1, progress=False)
    assert result.selection["runs"] <= 4 and "ratio" not in result.selection["grid"]


@pytest.mark.slow
def test_a_one_epoch_digits_run_warns_under_trained(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--dataset", "digits", "--method", "cog-fc", "--epochs", "1", "--lr", "1e-3"]
    assert main([*argv, "--data-root", str(tmp_path / "data"), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "batch 32 (36 steps/epoch), 1 epochs = 36 optimizer steps" in captured.err
    assert "cogcal: warning: under-trained: it made only 36 optimizer steps" in captured.err
    health = json.loads((out / "metrics.json").read_text())["health"]
    assert not health["ok"] and health["steps"] == 36
    assert main(["report", str(out)]) == 0  # the one-run report shows the warning
    report = (out / "report.md").read_text()
    assert "Health check" in report and "under-trained: it made only 36" in report


@pytest.mark.slow
def test_no_false_alarm_on_a_calibrated_run(tmp_path, capsys):
    # cross-entropy then temperature scaling on digits: nothing miscalibrated to report
    out = tmp_path / "run"
    argv = ["train", "--dataset", "digits", "--method", "ts", "--epochs", "15", "--lr", "3e-3"]
    assert main([*argv, "--data-root", str(tmp_path / "data"), "--out", str(out)]) == 0
    health = json.loads((out / "metrics.json").read_text())["health"]
    kinds = {f["kind"] for f in health["findings"]}
    assert not kinds & {"over-confident", "under-confident"}, health
    assert "confident" not in capsys.readouterr().err


@pytest.mark.slow
def test_selection_evaluates_ood_and_shift_for_the_chosen_run_only(tmp_path):
    """The points of a learning-rate selection skip the OOD and shift sets; the chosen run
    gets them afterwards, the same numbers as a run trained with its learning rate."""
    out, data = tmp_path / "run", ["--data-root", str(tmp_path / "data")]
    argv = ["train", "--dataset", "digits", "--method", "ce", "--epochs", "1", "--no-progress"]
    assert main([*argv, *data, "--out", str(out)]) == 0
    chosen = json.loads((out / "metrics.json").read_text())
    assert chosen["ood"] and chosen["shift"], chosen["unavailable"]
    assert "extra" in chosen["config"] and "defer_robustness" not in chosen["config"]["extra"]
    points = sorted(selection_folder(out).glob("*/metrics.json"))
    assert len(points) == chosen["selection"]["runs"]
    for path in points:
        point = json.loads(path.read_text())
        assert point["ood"] == {}, path
        assert "chosen run" in point["unavailable"]["ood"]["all"]
    lr = f"{chosen['config']['lr']:g}"
    assert main([*argv, *data, "--lr", lr, "--out", str(tmp_path / "direct")]) == 0
    direct = json.loads((tmp_path / "direct" / "metrics.json").read_text())
    assert direct["test"] == pytest.approx(chosen["test"])
    for key in ("ood", "shift"):
        assert json.dumps(direct[key], sort_keys=True) == json.dumps(chosen[key], sort_keys=True)


@pytest.mark.slow
def test_a_selection_killed_during_the_chosen_runs_ood_evaluation_is_not_complete(
    tmp_path, monkeypatch
):
    """metrics.json is written after the chosen run's OOD and shift sets: a failure there
    leaves no finished run behind, and --resume finishes it without training again."""
    out, data = tmp_path / "run", ["--data-root", str(tmp_path / "data")]
    argv = ["train", "--dataset", "digits", "--method", "ce", "--epochs", "1", "--no-progress"]
    real = robustness.evaluate_robustness

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(robustness, "evaluate_robustness", killed)
    assert main([*argv, *data, "--out", str(out)]) == 130  # interrupted
    assert not (out / "metrics.json").exists()
    monkeypatch.setattr(robustness, "evaluate_robustness", real)
    calls = _count_runs(monkeypatch)
    assert main([*argv, *data, "--out", str(out), "--resume"]) == 0
    assert calls == []  # every point was finished: reused, none trained again
    assert json.loads((out / "metrics.json").read_text())["ood"]


def _at_the_edge(record: dict) -> dict:
    """``record`` as if its learning rates had been chosen at the high edge of the grid."""
    lr, cal_lr = record["config"]["lr"], record["config"]["calibrator_lr"]
    return {
        **record,
        "selection": {
            "at_edge": True, "edges": ["lr high", "ratio < 1 bound"], "max_runs": MAX_RUNS,
            "best_config": {"lr": lr, "calibrator_lr": cal_lr},
            "grid": {"lr": [lr / 10, lr * 0.3, lr], "ratio": [0.1, 0.3]},
        },
    }  # fmt: skip


@pytest.mark.slow
def test_a_choice_at_the_edge_of_the_grid_is_said_whatever_the_progress(
    tmp_path, monkeypatch, capsys
):
    """`cogcal train --no-progress` and `cogcal.fit` both say when the chosen rates sit at
    an edge the run cap kept the search from moving past (the selection itself is faked)."""
    real = runner.execute

    def chosen_at_edge(config, **kwargs):
        record, model = real(config, **kwargs)
        return _at_the_edge(record), model

    monkeypatch.setattr(runner, "execute", chosen_at_edge)  # behind `cogcal train`
    monkeypatch.setattr(importlib.import_module("cogcal.train.fit"), "execute", chosen_at_edge)
    x, y = _problem()
    with pytest.warns(UserWarning, match=r"sit at the lr high edge of the grid tried") as seen:
        cogcal.fit(_net(), (x, y), epochs=1, lr=1e-3, progress=False)
    message = next(str(w.message) for w in seen if "lr high edge" in str(w.message))
    assert "train with `lr=0.003`, `calibrator_lr=0.0003`" in message  # the next rate out
    assert "cogcal.train.tune" in message
    argv = ["train", "--dataset", "digits", "--preset", "paper", "--epochs", "1"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err.splitlines()
    edge = [line for line in err if "edge of the grid" in line]
    assert len(edge) == 1 and edge[0].startswith("cogcal: warning: the learning rates chosen")
    assert "--lr 0.003 --calibrator-lr 0.0003" in edge[0] and "`cogcal tune`" in edge[0]
