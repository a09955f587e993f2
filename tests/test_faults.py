"""Fault injection: hard kills, corrupt checkpoints, diverging losses, bad input.

Nothing already written may be lost or trusted when half-written, and every mistake gets
one clear line on the command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cogcal.cli import main
from cogcal.train import TrainConfig, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


def _argv(data_root: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--method", "cog-ts", "--epochs", "8", "--step-size", "3",
        "--data-root", str(data_root), "--out", str(out), "--no-progress", *extra,
    ]  # fmt: skip


def test_sigkill_mid_epoch_then_resume_matches_uninterrupted_run(data_root, tmp_path):
    reference = tmp_path / "reference"
    assert main(_argv(data_root, reference)) == 0
    expected = json.loads((reference / "metrics.json").read_text())["test"]

    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cogcal.cli", *_argv(data_root, killed)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    done = killed / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 120
    while not done.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)  # epoch 0 is saved, epoch 1 is running
    proc.wait()
    assert not (killed / "metrics.json").exists(), "the run finished before it could be killed"

    # without --resume the unfinished run is protected
    assert main(_argv(data_root, killed)) == 2
    assert main(_argv(data_root, killed, "--resume")) == 0
    resumed = json.loads((killed / "metrics.json").read_text())
    assert resumed["test"] == expected
    assert "resumed_from" in resumed["timing"]["stage1"]


def test_resume_with_other_settings_is_refused(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = TrainConfig(
        method="cog-ts",
        epochs=4,
        step_size=2,
        data_root=str(data_root),
        out=str(out),
        progress=False,
    )
    with pytest.raises(RuntimeError, match="simulated crash"):  # after the first checkpoint
        _run_and_interrupt(cfg)
    assert main(_argv(data_root, out, "--resume", "--lr", "0.01")) == 2
    assert "started with other settings" in capsys.readouterr().err


def _run_and_interrupt(cfg: TrainConfig) -> None:
    from cogcal.train.module import CalibrationModule

    original = CalibrationModule.on_train_epoch_start

    def crash(self):
        if self.current_epoch == 1:  # epoch 0 is checkpointed
            raise RuntimeError("simulated crash")
        original(self)

    CalibrationModule.on_train_epoch_start = crash
    try:
        run(cfg)
    finally:
        CalibrationModule.on_train_epoch_start = original


def test_corrupt_checkpoint_is_reported_not_trusted(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_argv(data_root, out)) == 0
    (out / "metrics.json").unlink()  # pretend the run was interrupted ...
    (out / "checkpoints" / "done.json").unlink()
    (out / "checkpoints" / "last.ckpt").write_bytes(b"\x00garbage" * 100)  # ... mid-write
    assert main(_argv(data_root, out, "--resume")) == 2
    err = capsys.readouterr().err
    assert "last.ckpt is corrupt" in err and err.count("\n") == 1


def test_nan_loss_stops_and_keeps_last_good_checkpoint(data_root, tmp_path, monkeypatch, capsys):
    import cogcal.train.runner as runner

    real = runner.loss_function
    calls = {"n": 0}

    def poisoned(method, task="multiclass"):
        fn = real(method, task)

        def loss(z, y):
            calls["n"] += 1
            value = fn(z, y)
            return value * float("nan") if calls["n"] > 45 else value  # epoch 2 (30 steps/epoch)

        return loss

    monkeypatch.setattr(runner, "loss_function", poisoned)
    out = tmp_path / "run"
    assert main(_argv(data_root, out)) == 1
    err = capsys.readouterr().err
    assert "training loss became nan in epoch 1" in err and "Traceback" not in err
    last = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["epoch"] == 0
    assert all(
        torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point()
    )
    assert not (out / "metrics.json").exists()


def test_no_half_written_files_after_a_failed_write(tmp_path, monkeypatch):
    from cogcal import _io

    target = tmp_path / "metrics.json"
    _io.write_json(target, {"ok": 1})

    class Boom(Exception):
        pass

    def explode(*args, **kwargs):
        raise Boom

    monkeypatch.setattr(json, "dumps", explode)
    with pytest.raises(Boom):
        _io.write_json(target, {"ok": 2})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"ok": 1}
    with pytest.raises(Boom), _io.atomic_write(target, "w") as f:
        f.write('{"ok": ')  # a crash mid-write
        raise Boom
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # no temporary left behind
