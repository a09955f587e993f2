"""Tests of ``cogcal bench``: suites, planning, the process pool, resuming, results.csv.

Most tests use a fake runner (:func:`fake_run`, imported by the spawned workers as
``test_bench:fake_run``) that writes a run directory like ``cogcal.train.run`` does in a
few milliseconds; one test runs the real trainer for one epoch.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from cogcal.bench import check_requirements, list_suites, load_suite, run_bench
from cogcal.bench.executor import clear_run_dir, config_key, copy_run, is_finished
from cogcal.bench.plan import build_plan
from cogcal.bench.results import COLUMNS, metrics_rows
from cogcal.bench.suites import parse_suite

RUNNER = "test_bench:fake_run"
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- fake runner


def _atomic_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def fake_run(config: dict) -> dict:
    """Write a run directory like cogcal.train.run, with metrics that depend on the config.

    ``FAKE_FAIL`` (comma-separated ``method/seedK``) makes those runs raise;
    ``FAKE_SLEEP`` (seconds) slows every run down.
    """
    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    method, seed = config["method"], int(config["seed"])
    print(f"fake training {method} seed {seed}")
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    if f"{method}/seed{seed}" in os.environ.get("FAKE_FAIL", "").split(","):
        raise RuntimeError(f"planned failure of {method}/seed{seed}")
    lr = float(config.get("lr") or 1e-3)
    h = zlib.crc32(f"{method}-{seed}".encode()) % 1000 / 1000.0
    # A smooth, deterministic dependence on lr: best near 1e-3.
    nll = 0.3 + 0.1 * abs(np.log10(lr) + 3.0) + 0.02 * h
    metrics = {"acc": 0.9 - 0.05 * abs(np.log10(lr) + 3.0) + 0.01 * h, "nll": nll, "brier": nll / 2}
    for b in (5, 10, 15, 20, 50, 100):
        metrics[f"ece_{b}"] = (
            0.02 + 0.001 * b * (1 + h) + (0.0 if method.startswith("cog") else 0.01)
        )
        metrics[f"rmsce_{b}"] = metrics[f"ece_{b}"] * 1.2
        metrics[f"mce_{b}"] = metrics[f"ece_{b}"] * 3
    (out / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, 200)
    logits = rng.normal(size=(200, 10)) + 3 * np.eye(10)[labels]
    np.savez(out / "test_logits.npz", logits=logits.astype(np.float32), labels=labels)
    result = {
        "config": {**config, "calibrator_lr": config.get("calibrator_lr")},
        "val": {k: float(v) for k, v in metrics.items()},
        "test": {k: float(v) + 0.01 for k, v in metrics.items()},
        "timing": {"stage1": {"seconds": 0.01}, "total_seconds": 0.02},
        "status": "complete",
    }
    _atomic_json(out / "metrics.json", result)
    return result


TINY = {
    "name": "tiny",
    "datasets": {"digits": {"model": "cnn"}},
    "methods": ["ce", "ts", "cog-fc", "cog-ts"],
    "seeds": 2,
    "protocols": ["paper", "fair"],
    "train": {"epochs": 1, "stage2_epochs": 1},
    "tune": {
        "cog": [{"lr": 1e-3, "calibrator_lr": 1e-4}, {"lr": 1e-2, "calibrator_lr": 1e-3}],
        "baseline": [{"lr": 1e-4}, {"lr": 1e-3}],
    },
}


def _write_suite(tmp_path: Path, suite: dict = TINY) -> Path:
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def _bench(tmp_path: Path, out: Path, **kwargs) -> Path:
    return run_bench(
        _write_suite(tmp_path),
        out=out,
        jobs=kwargs.pop("jobs", 1),
        data_root=tmp_path / "data",
        progress=False,
        runner=RUNNER,
        report=kwargs.pop("report", False),
        **kwargs,
    )


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _mtimes(out: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(out.glob("runs/*/*/*/*/metrics.json"))}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("FAKE_FAIL", raising=False)
    monkeypatch.delenv("FAKE_SLEEP", raising=False)
    monkeypatch.syspath_prepend(str(HERE))


# --------------------------------------------------------------------------- suites


def test_shipped_suites_load():
    names = list_suites()
    for expected in (
        "quick",
        "digits",
        "paper-cifar10",
        "paper-cifar100",
        "paper-svhn",
        "paper-wrn",
        "paper-vit",
    ):
        assert expected in names
    for name in names:
        suite = load_suite(name)
        assert suite.name == name and suite.description
    quick = load_suite("quick")
    assert quick.protocols == ("paper", "fair") and len(quick.seeds) == 3
    assert set(quick.methods) == {
        "ce",
        "ls",
        "ts",
        "ms",
        "tst",
        "vtst",
        "cog-fc",
        "cog-ts",
        "cog-ms",
        "cog-ls",
    }
    vit = load_suite("paper-vit")
    assert vit.train["patience"] == 50 and vit.cog_grid == ()
    assert vit.method_train["cog-fc"] == {"lr": 1e-4, "calibrator_lr": 1e-5}
    assert all(load_suite(n).requires_gpu for n in names if n.startswith("paper-"))


def test_unknown_suite_name_suggests():
    with pytest.raises(ValueError, match="Did you mean 'quick'.*Shipped suites"):
        load_suite("quik")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"epochz": 3}, r"unknown key 'epochz'.*Allowed keys: name, description"),
        ({"train": {"epoch": 3}}, r"unknown key 'epoch' in .*train.*Did you mean 'epochs'"),
        ({"tune": {"cog": [{"lr": 1e-3, "clr": 1e-4}]}}, r"unknown key 'clr'.*lr, calibrator_lr"),
        ({"tune": {"cog": [{"lr": 1e-3, "calibrator_lr": 1e-2}]}}, "slower"),
        ({"datasets": {"mnist": {}}}, "unknown dataset 'mnist'.*mnist1d"),
        ({"datasets": {"digits": {"model": "resnet"}}}, "unknown"),
        ({"methods": ["cog-f"]}, "unknown method 'cog-f'"),
        ({"seeds": 0}, "at least 1"),
        ({"protocols": ["paper", "fast"]}, "unknown protocol 'fast'"),
        ({"requires": {"gpus": True}}, "unknown key 'gpus'"),
        ({"method_train": {"ms": {"lr": 1e-3}}}, "not in methods"),
    ],
)
def test_suite_validation_errors(change, match):
    raw = {**TINY, **change}
    with pytest.raises(ValueError, match=match):
        parse_suite(raw, source="test")


def test_user_yaml_path(tmp_path):
    suite = load_suite(_write_suite(tmp_path))
    assert suite.name == "tiny" and suite.seeds == (0, 1)
    (tmp_path / "bad.yaml").write_text("methods: [ce\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_suite(tmp_path / "bad.yaml")
    with pytest.raises(ValueError, match="does not exist"):
        load_suite(tmp_path / "missing.yaml")


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="this machine has a GPU: nothing to refuse"
)
def test_gpu_suite_refuses_without_gpu(tmp_path):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        run_bench("paper-cifar10", out=tmp_path / "o", data_root=tmp_path, progress=False)
    assert not (tmp_path / "o").exists()  # nothing started


def test_missing_data_is_one_clear_error(tmp_path):
    suite = parse_suite({**TINY, "datasets": {"cifar10": {"model": "resnet18"}}})
    with pytest.raises(ValueError, match="needs the dataset 'cifar10'"):
        check_requirements(suite, tmp_path / "nowhere", check_train=False)


def test_plan_protocols():
    suite = load_suite("quick")
    queued = []
    plan = build_plan(suite, Path("/o"), Path("data"), queued.extend, lambda g, j: None)
    by_label = {j.label: j for j in plan.initial}
    # paper: baselines at lr 1e-4, without tuning
    assert by_label["paper/mnist1d/ce/seed2"].config["lr"] == 1e-4
    assert "calibrator_lr" not in by_label["paper/mnist1d/tst/seed0"].config
    groups = {g.label: g for g in plan.groups}
    # COG tuned in both protocols; fair baselines tuned, post-hoc methods use ce's choice
    assert "paper/mnist1d/cog-fc" in groups and "fair/mnist1d/cog-ms" in groups
    assert "paper/mnist1d/ce" not in groups
    assert groups["fair/mnist1d/ce"].dependents == ["ce", "ts", "ms"]
    assert all(p.config["method"] == "ce" for p in groups["fair/mnist1d/ce"].points)
    assert plan.expected_total == 2 * 10 * 3 + 8 * 2 + 4 * 3
    assert all(j.config["progress"] is False for j in plan.initial)


# --------------------------------------------------------------------------- run dirs


def test_is_finished_and_copy(tmp_path):
    run = tmp_path / "r"
    cfg = {"dataset": "digits", "method": "ce", "seed": 0, "lr": 1e-3, "out": str(run)}
    assert not is_finished(run, cfg)
    fake_run(cfg)
    assert is_finished(run, cfg)
    assert not is_finished(run, {**cfg, "lr": 1e-4})  # another configuration: redo
    assert is_finished(run, {**cfg, "out": "elsewhere", "data_root": "x"})
    assert is_finished(run, {**cfg, "steps_per_call": 3})  # never changes results (tested)
    assert config_key(cfg) == config_key({**cfg, "out": "y", "progress": False})
    copy_run(run, tmp_path / "c")
    copied = json.loads((tmp_path / "c" / "metrics.json").read_text())
    assert copied["copied_from"] and is_finished(tmp_path / "c", cfg)
    (tmp_path / "c" / "junk").mkdir()
    clear_run_dir(tmp_path / "c")
    assert list((tmp_path / "c").iterdir()) == []


def test_metrics_rows_shapes():
    m = {
        "val": {"acc": 0.5, "nll": None},
        "test": {"acc": 0.7, "acc/Smiling": 0.8},
        "shift": {"gaussian_noise": {"1": {"acc": 0.6}, "2": {"acc": 0.5}}, "rot45": {"acc": 0.4}},
        "ood": {"svhn": {"auroc": 0.9, "fpr95": 0.3}},
    }
    rows = metrics_rows(m, "d", "ce", "paper", 3)
    assert all(set(r) == set(COLUMNS) for r in rows)
    key = {
        (r["split"], r["metric"], r["task"], r["condition"], r["severity"]): r["value"]
        for r in rows
    }
    assert key[("val", "acc", "", "", "")] == 0.5
    assert np.isnan(key[("val", "nll", "", "", "")])
    assert key[("test", "acc", "mean", "", "")] == 0.7
    assert key[("test", "acc", "Smiling", "", "")] == 0.8
    assert key[("shift", "acc", "", "gaussian_noise", "2")] == 0.5
    assert key[("shift", "acc", "", "rot45", "")] == 0.4
    assert key[("ood", "auroc", "", "svhn", "")] == 0.9
    recs = {"shift": [{"condition": "fog", "severity": 3, "acc": 0.2}]}
    assert metrics_rows(recs, "d", "ce", "fair", 0)[0]["severity"] == "3"


# --------------------------------------------------------------------------- end to end


def test_bench_end_to_end_resume_and_failures(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("FAKE_FAIL", "ts/seed1")
    _bench(tmp_path, out, report=True, jobs=2)
    results = _read_csv(out / "results.csv")
    assert list(results[0]) == list(COLUMNS)
    assert {r["protocol"] for r in results} == {"paper", "fair"}
    assert {r["split"] for r in results} == {"val", "test"}
    assert all(float(r["value"]) == float(r["value"]) for r in results)
    methods = {(r["protocol"], r["method"], r["seed"]) for r in results}
    assert ("paper", "ts", "1") not in methods and ("fair", "ts", "1") not in methods
    assert ("paper", "ts", "0") in methods and ("fair", "cog-ts", "1") in methods
    assert len(methods) == 2 * 4 * 2 - 2
    # the failed run is reported with its log, which holds the traceback
    failed = (out / "failed.txt").read_text()
    assert "paper/digits/ts/seed1" in failed and "planned failure" in failed
    log = out / "runs" / "paper" / "digits" / "ts" / "seed1" / "run.log"
    assert "RuntimeError: planned failure" in log.read_text()
    # tuning chose the lowest validation NLL (the fake's optimum is lr 1e-3)
    tune = json.loads((out / "tune" / "fair" / "digits" / "ce" / "tune.json").read_text())
    assert tune["best"] == {"lr": 1e-3} and tune["used_by"] == ["ce", "ts"]
    fair_ts = json.loads((out / "runs/fair/digits/ts/seed0/metrics.json").read_text())
    assert fair_ts["config"]["lr"] == 1e-3
    paper_ts = json.loads((out / "runs/paper/digits/ts/seed0/metrics.json").read_text())
    assert paper_ts["config"]["lr"] == 1e-4
    # identical configurations are trained once: seed 0 reuses the chosen tuning run
    cog0 = json.loads((out / "runs/paper/digits/cog-fc/seed0/metrics.json").read_text())
    assert "copied_from" in cog0
    runs = _read_csv(out / "runs.csv")
    assert {r["status"] for r in runs} == {"complete", "failed"}
    meta = json.loads((out / "bench.json").read_text())
    assert meta["sessions"][-1]["counts"]["failed"] == 2
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    assert "Failed runs" in (out / "report.md").read_text()

    # re-run: the finished runs are skipped, the failed ones retried (and now succeed)
    monkeypatch.delenv("FAKE_FAIL")
    before = _mtimes(out)
    _bench(tmp_path, out)
    after = _mtimes(out)
    assert all(after[k] == v for k, v in before.items())
    assert len(after) == len(before) + 2
    counts = json.loads((out / "bench.json").read_text())["sessions"][-1]["counts"]
    assert counts["failed"] == 0 and counts["trained"] + counts["copied"] == 2
    assert not (out / "failed.txt").exists()
    assert (
        len({(r["protocol"], r["method"], r["seed"]) for r in _read_csv(out / "results.csv")}) == 16
    )

    # a half-written run (no metrics.json, debris) is cleared and redone; the rest kept
    victim = out / "runs" / "fair" / "digits" / "cog-fc" / "seed1"
    (victim / "metrics.json").unlink()
    (victim / "debris.tmp").write_text("x")
    before = _mtimes(out)
    _bench(tmp_path, out)
    after = _mtimes(out)
    assert not (victim / "debris.tmp").exists() and is_finished(victim)
    changed = [k for k in after if before.get(k) != after[k]]
    assert changed == [str(victim / "metrics.json")]


def test_seeds_and_protocols_override(tmp_path):
    out = tmp_path / "o"
    _bench(tmp_path, out, seeds=1, protocols=("fair",), jobs=1)
    rows = _read_csv(out / "results.csv")
    assert {r["protocol"] for r in rows} == {"fair"} and {r["seed"] for r in rows} == {"0"}


def test_concurrent_bench_refused(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (out / ".bench.lock").write_text(str(sleeper.pid))
        with pytest.raises(ValueError, match="another cogcal bench"):
            _bench(tmp_path, out)
    finally:
        sleeper.kill()
        sleeper.wait()
    _bench(tmp_path, out, seeds=1, protocols=("paper",))  # stale lock: proceeds
    assert (out / "results.csv").is_file() and not (out / ".bench.lock").exists()


def test_killed_bench_resumes_without_redoing(tmp_path):
    """SIGKILL the bench mid-way; workers exit with it; the re-run completes the rest."""
    suite = _write_suite(tmp_path)
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from pathlib import Path
        from cogcal.bench import run_bench
        run_bench({str(suite)!r}, out=Path({str(out)!r}), jobs=2,
                  data_root=Path({str(tmp_path / "data")!r}), progress=False,
                  runner={RUNNER!r}, report=False)
        """
    )
    env = {**os.environ, "FAKE_SLEEP": "0.4"}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and len(_mtimes(out)) < 4:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = _mtimes(out)
    assert 4 <= len(done_before) < 16
    assert not (out / "results.csv").exists()
    # the orphaned workers notice that their parent is gone and exit
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ps = subprocess.run(
            ["ps", "-o", "pid=", "-g", str(proc.pid)], capture_output=True, text=True
        )
        if not ps.stdout.split():
            break
        time.sleep(0.2)
    assert ps.stdout.split() == []
    _bench(tmp_path, out)
    after = _mtimes(out)
    assert len(after) == 16
    assert all(after[k] == v for k, v in done_before.items())


@pytest.mark.slow
def test_real_trainer_smoke(tmp_path):
    """One epoch of the real trainer through the real worker path (cogcal.train.run)."""
    suite = {
        "name": "smoke",
        "datasets": {"digits": {"model": "cnn"}},
        "methods": ["ts", "cog-fc"],
        "seeds": 1,
        "protocols": ["paper"],
        "train": {"epochs": 1},
        "tune": {"cog": [{"lr": 1e-3, "calibrator_lr": 1e-4}]},
    }
    out = tmp_path / "out"
    run_bench(
        _write_suite(tmp_path, suite),
        out=out,
        jobs=1,
        data_root=tmp_path / "data",
        progress=False,
        report=False,
    )
    rows = _read_csv(out / "results.csv")
    assert {r["method"] for r in rows} == {"ts", "cog-fc"}
    assert {r["metric"] for r in rows} >= {"acc", "nll", "brier", "ece_15", "mce_100"}
    assert (out / "runs/paper/digits/ts/seed0/test_logits.npz").is_file()
    assert "copied_from" in json.loads(
        (out / "runs/paper/digits/cog-fc/seed0/metrics.json").read_text()
    )
