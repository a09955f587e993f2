"""Multi-process training (DDP on CPU, 2 processes) gives the single-process metrics, with
the learning rates given or chosen by the default path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def _table(path: Path) -> None:
    """A small 3-class table (150 rows): a few optimizer steps an epoch."""
    g = np.random.default_rng(0)
    x = g.normal(size=(150, 4))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(f"{v:.4f}" for v in row) + f",{label}" for row, label in zip(x, y, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")


def test_two_processes_choose_the_learning_rates_by_successive_halving(tmp_path):
    """Without --lr, `--devices 2 --strategy ddp` runs the default path: the processes are
    launched once and every point is a two-process run; the rung NLLs are those of one
    process up to the reduction order."""
    table = tmp_path / "d.csv"
    _table(table)
    common = ["--dataset", f"csv:{table}", "--target", "label", "--epochs", "3", "--no-progress"]
    common += ["--data-root", str(tmp_path / "data")]
    assert main(["train", *common, "--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cmd = [sys.executable, "-m", "cogcal.cli", "train", *common, "--out", str(tmp_path / "two")]
    cmd += ["--devices", "2", "--strategy", "ddp", "--accelerator", "cpu"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "runs in one process" not in proc.stderr
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())["selection"]
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["config"]["devices"] == 2 and two["status"] == "complete"
    selection = two["selection"]
    assert selection["mode"] == "halving" and [r["epoch"] for r in selection["rungs"]] == [1, 2]
    rows = {r["run"]: r for r in selection["table"]}
    assert [r["status"] for r in rows.values()].count("complete") == 1
    assert selection["epochs_trained"] == sum(r["epochs"] for r in rows.values())
    for run, row in rows.items():  # each point's log written once (by process 0)
        log = tmp_path / "two.select" / run / "logs" / "stage1.csv"
        assert len(log.read_text().splitlines()) == 1 + row["epochs"], run
    ones = {r["run"]: r for r in one["table"]}
    for run in set(rows) & set(ones):
        assert rows[run]["rung1_val_nll"] == pytest.approx(ones[run]["rung1_val_nll"], abs=5e-3)
