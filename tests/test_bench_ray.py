"""`cogcal bench --executor ray` on a local Ray instance gives the local pool's results."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from cogcal.commands.bench import run_bench

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


def test_unreachable_ray_address_fails_fast_with_one_line(tmp_path, capsys):
    import time

    from cogcal.cli import main

    started = time.monotonic()
    out = tmp_path / "o"
    argv = ["bench", "--executor", "ray", "--address", "127.0.0.1:1", "--out", str(out)]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "could not connect to the Ray cluster at --address 127.0.0.1:1" in err
    assert err.count("\n") == 1 and not out.exists()
    assert time.monotonic() - started < 60  # not minutes


def test_sigterm_under_ray_exits_143_with_tables_and_report(tmp_path):
    """Ray's driver installs its own SIGTERM handler; the bench's must stay in charge."""
    pytest.importorskip("ray")
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    here = Path(__file__).resolve().parent
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({**SUITE, "methods": ["ce", "ts"], "seeds": 2}))
    out = tmp_path / "out"
    script = (
        "import sys\n"
        "import cogcal.bench.session\n"
        "cogcal.bench.session.DEFAULT_RUNNER = 'test_bench:fake_run'\n"
        "from cogcal.cli import main\n"
        f"sys.exit(main(['bench', '--suite', {str(suite)!r}, '--out', {str(out)!r}, "
        f"'--jobs', '1', '--data-root', {str(tmp_path / 'd')!r}, '--quiet', "
        "'--executor', 'ray']))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(here.parent / "src"), str(here)]),
        "FAKE_SLOW": "ts/seed0",
        "FAKE_PIDFILE": str(tmp_path / "pid"),
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=env, start_new_session=True,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "pid").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the slow job never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert (
        err.strip().splitlines()[-1]
        == "cogcal: interrupted (SIGTERM); run the same command again to resume"
    )
    with open(out / "runs.csv", newline="") as f:
        runs = {(r["method"], r["seed"]): r["status"] for r in csv.DictReader(f)}
    assert runs[("ts", "0")] == "interrupted"
    assert (out / "results.csv").is_file() and (out / "report.md").is_file()
    assert json.loads((out / "bench.json").read_text())["sessions"][-1]["interrupted"] == "SIGTERM"
