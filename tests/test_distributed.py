"""Multi-process training (DDP on CPU, 2 processes) gives the single-process metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cogcal.cli import main

pytestmark = pytest.mark.slow


def test_two_process_ddp_matches_one_process(tmp_path):
    data_root = tmp_path / "data"
    common = [
        "--method",
        "cog-ms",
        "--preset",
        "paper",
        "--epochs",
        "2",
        "--data-root",
        str(data_root),
        "--no-progress",
    ]
    assert main(["train", *common, "--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cmd = [sys.executable, "-m", "cogcal.cli", "train", *common, "--out", str(tmp_path / "two")]
    cmd += ["--devices", "2", "--strategy", "ddp", "--accelerator", "cpu"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["config"]["devices"] == 2
    # the same global batches (strided shards) and averaged gradients: the same run up to
    # floating-point reduction order
    for key in ("acc", "nll", "brier"):
        assert two["test"][key] == pytest.approx(one["test"][key], abs=5e-3), key
        assert two["val"][key] == pytest.approx(one["val"][key], abs=5e-3), key
    # validation metrics were merged across processes, every sample counted once
    rows = (tmp_path / "two" / "logs" / "stage1.csv").read_text().splitlines()
    assert len(rows) == 3  # header + 2 epochs, written once (by process 0)
