"""Never lose what the user has, never report a wrong result silently, and exit by cause.

Each test is the repro of one failure a hostile user found (kept small: tiny data, one or
two epochs, the CLI called in-process where possible).
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

import cogcal.train.runner as runner
from cogcal.cli import main
from cogcal.train.rundir import RunDir

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _train(out: Path, *extra: str, epochs: int = 1) -> list[str]:
    return [
        "train", "--dataset", "digits", "--model", "mlp", "--method", "ce",
        "--epochs", str(epochs), "--out", str(out), "--no-progress", *extra,
    ]  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before {path} appeared"


# --------------------------------------------------------------------------- item 1


def test_a_second_train_on_a_folder_in_use_touches_nothing(tmp_path, capsys):
    """Item 1: the second `cogcal train` is refused before it reads or clears anything."""
    out = tmp_path / "lk"
    argv = _train(out, "--checkpoint-seconds", "1000", epochs=400)
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cogcal.cli", *argv], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(out / "logs" / "stage1.csv", proc)  # config.json written, epochs running
        before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
        config = (out / "config.json").read_text()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"in use by process {proc.pid}" in err and err.count("\n") == 1
        assert (out / "config.json").read_text() == config
        assert {"config.json", "logs/stage1.csv"} <= set(before)
        assert all((out / p).exists() for p in before)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert RunDir(out).is_marked()  # the run can still be resumed
