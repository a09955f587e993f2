"""`cogcal bench --executor ray` on a local Ray instance gives the local pool's results."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from cogcal.bench import run_bench

pytestmark = pytest.mark.slow

SUITE = {
    "name": "ray-smoke",
    "datasets": {"digits": {"model": "cnn"}},
    "methods": ["ts", "cog-fc"],
    "seeds": 1,
    "protocols": ["paper"],
    "budget": {
        "paper": {
            "baselines": {"lr": 1e-4, "epochs": 1, "schedule": "none", "patience": None},
            "cog": {"epochs": 1, "schedule": "step", "step_size": 1, "patience": None},
        }
    },
    "tune": {"lrs": [1e-3], "ratios": [0.1], "max_extensions": 0},
}


def _results(out: Path) -> dict[tuple, float]:
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    key = (
        "dataset",
        "method",
        "protocol",
        "seed",
        "split",
        "metric",
        "task",
        "condition",
        "severity",
    )
    return {tuple(r[k] for k in key): float(r["value"]) for r in rows}


def test_ray_executor_matches_local_pool(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    common = dict(jobs=1, data_root=tmp_path / "data", progress=False, report=False)
    assert run_bench(suite, out=tmp_path / "local", **common).failed == 0
    # a local Ray instance with this machine's CPUs; the workers inherit PYTHONPATH
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    try:
        assert run_bench(suite, out=tmp_path / "ray", executor="ray", **common).failed == 0
    finally:
        if ray.is_initialized():
            ray.shutdown()
    local, remote = _results(tmp_path / "local"), _results(tmp_path / "ray")
    assert local.keys() == remote.keys() and len(local) > 50
    for key, value in local.items():  # same seeds, same CPU kernels: the same numbers
        assert remote[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_address_needs_ray_executor(tmp_path):
    with pytest.raises(ValueError, match="`address` applies to executor 'ray' only"):
        run_bench("quick", out=tmp_path, address="auto")
    with pytest.raises(ValueError, match="`executor` must be one of"):
        run_bench("quick", out=tmp_path, executor="slurm")
