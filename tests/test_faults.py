"""Fault injection: kills, signals, corrupt checkpoints, diverging losses, bad folders.

Nothing already written may be lost or trusted when half-written, nothing cogcal did not
write is ever deleted, the exit status tells the truth, and every mistake gets one line.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import cogcal.train.checkpoints as ckpts
import cogcal.train.runner as runner
from cogcal.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def reference(data_root, tmp_path_factory) -> dict:
    """An uninterrupted run that the interrupted ones must reproduce exactly."""
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main(_argv(data_root, out)) == 0
    return json.loads((out / "metrics.json").read_text())


#: A one-epoch run with the paper's settings (one configuration, no learning-rate choice).
ONE_EPOCH = ["train", "--preset", "paper", "--epochs", "1", "--no-progress"]


def _argv(data_root: Path, out: Path, *extra: str, epochs: int = 8) -> list[str]:
    # a checkpoint after every epoch, so that a kill can land between two of them
    return [
        "train", "--method", "cog-ts", "--preset", "paper", "--epochs", str(epochs),
        "--step-size", "3", "--data-root", str(data_root), "--out", str(out), "--no-progress",
        "--checkpoint-seconds", "0", *extra,
    ]  # fmt: skip


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and a
    # child inherits that (Python then installs no KeyboardInterrupt handler): tests run
    # as `pytest &` would see the SIGINT below ignored. The run gets SIGINT's default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(data_root: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "cogcal.cli", *_argv(data_root, out)]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_sigint,
    )  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, f"the run ended before {path} appeared: {proc.stderr.read()}"


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_matches_uninterrupted_run(data_root, reference, tmp_path):
    killed = tmp_path / "killed"
    proc = _start(data_root, killed)
    _wait_for(killed / "checkpoints" / "last.ckpt", proc)
    proc.send_signal(signal.SIGKILL)  # epoch 0 is saved, epoch 1 is running
    proc.wait()
    assert not (killed / "metrics.json").exists()
    assert main(_argv(data_root, killed)) == 2  # without --resume the unfinished run is kept
    assert main(_argv(data_root, killed, "--resume")) == 0  # the dead process's lock is stale
    resumed = json.loads((killed / "metrics.json").read_text())
    assert resumed["test"] == reference["test"]
    assert resumed["timing"]["stage1"]["resumed_from_epoch"] >= 1
    # the log lists every epoch once, the ones before the kill restored from the checkpoint
    with (killed / "logs" / "stage1.csv").open() as f:
        epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
    assert epochs == list(range(8))


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_exits_with_its_status_and_the_run_resumes(
    sig, status, data_root, reference, tmp_path
):
    out = tmp_path / "run"
    proc = _start(data_root, out)
    _wait_for(out / "checkpoints" / "last.ckpt", proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status
    name = signal.Signals(sig).name
    assert err.strip().endswith(f"cogcal: interrupted ({name}); resume with --resume")
    assert "Traceback" not in err
    assert not (out / "metrics.json").exists()
    assert not (out / ".cogcal.lock").exists()
    assert main(_argv(data_root, out, "--resume")) == 0
    assert json.loads((out / "metrics.json").read_text())["test"] == reference["test"]


def _interrupted_copy(data_root: Path, tmp_path: Path) -> Path:
    """A finished run turned into an interrupted one (metrics and stage summary removed)."""
    out = tmp_path / "run"
    assert main(_argv(data_root, out, epochs=2)) == 0
    (out / "metrics.json").unlink()
    (out / "checkpoints" / "done.json").unlink()
    return out


@pytest.mark.slow
def test_resume_with_other_settings_is_refused(data_root, tmp_path, capsys):
    out = _interrupted_copy(data_root, tmp_path)
    capsys.readouterr()  # the finished run's summary and health warnings
    argv = _argv(data_root, out, epochs=2)
    assert main([*argv, "--resume", "--lr", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "started with other settings" in err and "lr: 0.001 -> 0.01" in err
    assert err.count("\n") == 1


@pytest.mark.slow
def test_resuming_a_copied_run_without_its_config_is_refused(data_root, tmp_path, capsys):
    out = _interrupted_copy(data_root, tmp_path)
    capsys.readouterr()  # the finished run's summary and health warnings
    (out / "config.json").unlink()
    argv = _argv(data_root, out, epochs=2)
    assert main([*argv, "--resume", "--method", "cog-ms", "--model", "cnn1d"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "--out" in err
    assert "no config.json written by cogcal" in err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "last.ckpt is empty (0 bytes): the run was interrupted while saving"),
        (b"\x00garbage" * 100, "last.ckpt is truncated or corrupt"),
    ],
)
def test_bad_checkpoints_are_reported_not_trusted(content, message, data_root, tmp_path, capsys):
    out = _interrupted_copy(data_root, tmp_path)
    capsys.readouterr()  # the finished run's summary and health warnings
    (out / "checkpoints" / "last.ckpt").write_bytes(content)
    argv = _argv(data_root, out, epochs=2)
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_last_good_checkpoint(data_root, tmp_path, monkeypatch, capsys):
    real = runner.loss_function
    calls = {"n": 0}

    def poisoned(method, task="multiclass"):
        fn = real(method, task)

        def loss(z, y):
            calls["n"] += 1
            value = fn(z, y)
            return value * float("nan") if calls["n"] > 45 else value  # epoch 1 (30 steps/epoch)

        return loss

    monkeypatch.setattr(runner, "loss_function", poisoned)
    out = tmp_path / "run"
    assert main(_argv(data_root, out)) == 1
    err = capsys.readouterr().err
    assert "training loss became nan in epoch 1" in err and "Traceback" not in err
    last = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["loop"]["epoch"] == 1  # epoch 0 only
    assert all(torch.isfinite(v).all() for v in last["model"].values() if v.is_floating_point())
    assert json.loads((out / "metrics.json").read_text())["status"] == "diverged"


@pytest.mark.slow
def test_overwrite_never_deletes_what_cogcal_did_not_write(data_root, tmp_path, capsys):
    d = tmp_path / "d"
    (d / "logs").mkdir(parents=True)
    (d / "checkpoints").mkdir()
    (d / "logs" / "important.txt").write_text("keep me")
    argv = [*ONE_EPOCH, "--data-root", str(data_root)]
    assert main([*argv, "--overwrite", "--out", str(d)]) == 2
    err = capsys.readouterr().err
    assert "is not a cogcal run folder" in err and err.count("\n") == 1
    assert (d / "logs" / "important.txt").read_text() == "keep me"
    # a real run folder with a foreign file: --overwrite replaces the run, keeps the file
    run = tmp_path / "run"
    assert main([*argv, "--out", str(run)]) == 0
    (run / "logs" / "notes.txt").write_text("mine")
    assert main([*argv, "--overwrite", "--out", str(run)]) == 0
    assert (run / "logs" / "notes.txt").read_text() == "mine"
    # checkpoints/ as a link: refused, the link's target untouched
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "last.ckpt").write_text("not yours")
    for name in ("checkpoints", "logs"):
        (run / name / "notes.txt").unlink(missing_ok=True)
    import shutil

    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(precious)
    assert main([*argv, "--overwrite", "--out", str(run)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert (precious / "last.ckpt").read_text() == "not yours"


@pytest.mark.slow
def test_a_folder_in_use_is_refused(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    proc = _start(data_root, out)
    try:
        _wait_for(out / ".cogcal.lock", proc)
        assert main(_argv(data_root, out, "--overwrite")) == 2
        err = capsys.readouterr().err
        assert f"in use by process {proc.pid}" in err and err.count("\n") == 1
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_folder_and_disk_failures_are_one_line(data_root, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    argv = [*ONE_EPOCH, "--data-root", str(data_root)]
    for out, message in (
        (tmp_path / "file", "is an existing file"),
        (tmp_path / "file" / "run", "which is a file"),
        (tmp_path / "missing", "holds no run to resume"),
    ):
        extra = ["--resume"] if out.name == "missing" else []
        assert main([*argv, "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    assert not (tmp_path / "missing").exists()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpts._io, "save_torch", full)  # the checkpoint writer's disk is full
    out = tmp_path / "full"
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "free some disk space" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    monkeypatch.undo()

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "ro"))

    monkeypatch.setattr("tempfile.mkstemp", denied)
    assert main([*argv, "--out", str(tmp_path / "ro")]) == 1
    err = capsys.readouterr().err
    assert "Permission denied" in err and "ro" in err and err.count("\n") == 1


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
