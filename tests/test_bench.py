"""Tests of ``cogcal bench``: suites, planning and tuning, the run contract, signals, tables.

Most tests use a fake runner (:func:`fake_run`, imported by the spawned workers as
``test_bench:fake_run``) that writes a run folder through the run-folder contract
(:class:`~cogcal.runs.RunDir`, :class:`~cogcal.runs.RunRecord`) in a few
milliseconds, with a validation NLL that is a function of (lr, ratio); one slow test runs
the real trainer for one epoch.

Environment knobs of the fake runner (inherited by the workers):

* ``FAKE_OPT``: ``"lr=1e-2,ratio=1e-3"``, the optimum of the validation NLL;
* ``FAKE_DIVERGE_LR``: points with ``lr >= value`` diverge (metrics.json "diverged");
* ``FAKE_FAIL``: comma-separated ``method/seedK`` that raise;
* ``FAKE_EXIT``: comma-separated ``method/seedK`` that write a complete record, then
  raise ``SystemExit(0)``;
* ``FAKE_SLEEP``: seconds every run sleeps; ``FAKE_SLOW``: ``method/seedK`` that sleep 60 s
  and write their pid to ``FAKE_PIDFILE`` first.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from cogcal.bench import BenchSummary, budgets, check_requirements, list_suites, load_suite
from cogcal.bench.budget import family_of, floor_epoch
from cogcal.bench.executor import copy_run, reuse_key
from cogcal.bench.plan import Plan, TuneGroup
from cogcal.bench.results import metrics_rows
from cogcal.bench.suites import parse_suite
from cogcal.commands.bench import run_bench as _run_bench
from cogcal.runs import RunDir, RunRecord
from cogcal.runs.columns import EFFECT_COLUMNS, RESULT_COLUMNS, RUN_COLUMNS, TUNING_COLUMNS
from cogcal.train.config import TrainConfig
from cogcal.train.tuning import GridSearch

RUNNER = "test_bench:fake_run"
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- fake runner


def _tag(cfg: TrainConfig) -> str:
    return f"{cfg.method}/seed{cfg.seed}"


def _env_list(name: str) -> list[str]:
    return [x for x in os.environ.get(name, "").split(",") if x]


def fake_nll(lr: float, ratio: float | None, seed: int = 0, method: str = "ce") -> float:
    """The fake validation NLL: lowest at FAKE_OPT, smooth in log(lr) and log(ratio)."""
    opt = dict(kv.split("=") for kv in _env_list("FAKE_OPT")) if "FAKE_OPT" in os.environ else {}
    nll = 0.3 + 0.1 * abs(math.log10(lr) - math.log10(float(opt.get("lr", 2e-3))))
    if ratio is not None:
        nll += 0.05 * abs(math.log10(ratio) - math.log10(float(opt.get("ratio", 0.05))))
    return nll + 0.001 * (zlib.crc32(f"{method}-{seed}".encode()) % 10)


def fake_run(config: dict, resume: bool = False) -> dict:
    """Write a run folder like cogcal.train.run does, with metrics from :func:`fake_nll`."""
    cfg = TrainConfig.from_dict(config)
    folder = RunDir(cfg.out)
    folder.path.mkdir(parents=True, exist_ok=True)
    resolved = {**cfg.resolved(), "task": "multiclass", "data": {"fingerprint": "fake"}}
    folder.write_config(resolved)
    tag = _tag(cfg)
    print(f"fake training {tag}")
    if tag in _env_list("FAKE_SLOW"):
        Path(os.environ["FAKE_PIDFILE"]).write_text(str(os.getpid()))
        time.sleep(60)
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    if tag in _env_list("FAKE_FAIL"):
        raise RuntimeError(f"planned failure of {tag}")
    lr, cal = cfg.learning_rates()
    if "FAKE_DIVERGE_LR" in os.environ and lr >= float(os.environ["FAKE_DIVERGE_LR"]):
        from cogcal import _io

        _io.write_json(
            folder.metrics_path, {"status": "diverged", "error": "nan loss", "config": resolved}
        )
        raise FloatingPointError("training loss became nan")
    nll = fake_nll(lr, None if cal is None else cal / lr, cfg.seed, cfg.method)
    val = {"acc": 1.0 - nll, "nll": nll, "brier": nll / 2, "ece_15": 0.05}
    for b in (5, 10, 15, 20, 50, 100):
        val.update({f"ece_{b}": 0.02 + 0.001 * b, f"rmsce_{b}": 0.03, f"mce_{b}": 0.1})
    uncal = None
    if cfg.method in ("ts", "vs", "ms"):  # calibrated val NLL: better, and flat in lr
        uncal, val = dict(val), {**val, "nll": 0.1}
    rng = np.random.default_rng(cfg.seed)
    labels = rng.integers(0, 10, 50)
    logits = (rng.normal(size=(50, 10)) + 3 * np.eye(10)[labels]).astype(np.float32)
    np.savez(folder.path / "test_logits.npz", logits=logits, labels=labels)
    record = RunRecord(
        config=resolved,
        val=val,
        test={k: v + 0.01 for k, v in val.items()},
        val_uncalibrated=uncal,
        timing={"stage1": {"seconds": 0.01}, "total_seconds": 0.02},
    )
    folder.write_record(record)
    if tag in _env_list("FAKE_EXIT"):
        raise SystemExit(0)
    return record.to_dict()


TINY = {
    "name": "tiny",
    "datasets": {"digits": {"model": "cnn"}},
    "methods": ["ce", "ts", "cog-fc", "cog-ts"],
    "seeds": 2,
    "protocols": ["paper", "fair"],
    "train": {"batch_size": 64},
    "budget": {
        "paper": {
            "baselines": {"lr": 1e-4, "epochs": 1, "schedule": "none", "patience": None},
            "cog": {"epochs": 1, "schedule": "step", "step_size": 1, "patience": None},
        },
        "fair": {"epochs": 1, "schedule": "step", "step_size": 1, "patience": None},
    },
    "tune": {
        "lrs": [1e-3, 2e-3],
        "ratios": [0.01, 0.1],
        "baseline_lrs": [1e-3, 2e-3],
        "max_extensions": 2,
    },
}


def _suite(**changes) -> dict:
    suite = json.loads(json.dumps(TINY))
    suite.update(changes)
    return suite


def _write_suite(tmp_path: Path, suite: dict = TINY, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(suite))
    return path


def run_bench(*args, **kwargs) -> BenchSummary:
    kwargs.setdefault("runner", RUNNER)
    kwargs.setdefault("progress", False)
    kwargs.setdefault("report", False)
    return _run_bench(*args, **kwargs)


def _bench(tmp_path: Path, out: Path, suite: dict = TINY, **kwargs) -> BenchSummary:
    return run_bench(
        _write_suite(tmp_path, suite),
        out=out,
        jobs=kwargs.pop("jobs", 1),
        data_root=tmp_path / "data",
        **kwargs,
    )


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _metrics(out: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(out.glob("runs/*/*/*/*/metrics.json"))}


def _record(path: Path) -> dict:
    return json.loads((path / "metrics.json").read_text())


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in (
        "FAKE_OPT",
        "FAKE_DIVERGE_LR",
        "FAKE_FAIL",
        "FAKE_EXIT",
        "FAKE_SLEEP",
        "FAKE_SLOW",
        "FAKE_PIDFILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(HERE))


# --------------------------------------------------------------------------- suites


def test_shipped_suites_load_and_state_budgets():
    names = list_suites()
    for expected in (
        "quick",
        "cpu",
        "digits",
        "mtl-quick",
        "paper-cifar10",
        "paper-cifar100",
        "paper-svhn",
        "paper-wrn",
        "paper-vit",
        "paper-celeba",
    ):
        assert expected in names
    docs = (Path(__file__).resolve().parents[1] / "docs" / "bench.md").read_text()
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name in names:
        suite = load_suite(name)
        assert suite.name == name and suite.description
        measured = re.search(r"(\d+ min \d+ s)", suite.description)
        if name in ("quick", "claims") and measured:  # the measured time README and docs state
            assert measured[1] in docs and measured[1] in readme
        elif name in ("quick", "claims"):  # or none yet: said so, never an estimate as a time
            assert "time not measured for this version" in suite.description
        else:
            assert "min" not in suite.description  # no unmeasured time claims
        for protocol in suite.protocols:  # every family the suite has states its budget
            for fam in {family_of(m) for m in suite.methods}:
                b = suite.budgets[protocol][fam]
                assert b.epochs >= 1 and b.schedule in ("step", "none")
        fair = suite.budgets.get("fair")
        if fair:  # one schedule for every method
            assert fair["baselines"].schedule == fair["cog"].schedule == "step"
            assert fair["baselines"].step_size == fair["cog"].step_size
            assert fair["baselines"].epochs == fair["cog"].epochs
    assert all(load_suite(n).requires_gpu for n in names if n.startswith("paper-"))


def test_quick_is_the_paper_regime_sized_for_a_cpu():
    quick = load_suite("quick")
    assert [(e.name, e.model) for e in quick.datasets] == [("mnist1d", "mlp"), ("blobs-100", "mlp")]
    assert quick.protocols == ("fair",) and len(quick.seeds) >= 5 and not quick.requires_gpu
    assert {"ce", "ts", "tst", "cog-fc", "cog-ts"} <= set(quick.methods)
    fair = quick.budgets["fair"]["baselines"]
    # runs stop once the validation Brier stops improving, well inside the epoch cap
    assert fair.patience is not None and fair.patience < fair.epochs
    assert fair.stage2_epochs is not None and floor_epoch(1e-2, "step", fair.step_size, 40) is None
    # half-decade grids; ratios below 1, the top one next to the ratio < 1 bound
    assert quick.tune.ratios == (0.1, 0.3) and quick.tune.lrs == (3e-3, 1e-2, 3e-2)
    assert quick.tune.search("cog").grid.bound("ratio high") == "ratio < 1 bound"
    cpu = load_suite("cpu")  # carries what quick cannot
    assert set(quick.methods) < set(cpu.methods) and cpu.protocols == ("paper", "fair")
    assert {e.name for e in cpu.datasets} == {"mnist1d", "digits"} and cpu.effect
    assert len(cpu.seeds) >= 5


def test_paper_vit_cog_floor_not_before_baseline_budget():
    b = budgets(load_suite("paper-vit"))["paper"]
    assert b["cog"]["lr"] == 1e-4 and b["cog"]["calibrator_lr"] == 1e-5
    assert b["cog"]["schedule"] == "step" and b["cog"]["floor_epoch"] is None
    assert b["baselines"]["epochs"] == b["cog"]["epochs"] == 400
    assert b["baselines"]["patience"] == b["cog"]["patience"] == 50
    # the paper suites with the step-10 COG schedule state their floor epoch
    c10 = budgets(load_suite("paper-cifar10"))["paper"]["cog"]
    assert c10["floor_epoch"] == floor_epoch(c10["floor_epoch_lr"], "step", 10, 300) == 50


def test_floor_epoch_matches_the_loop_rule():
    import torch

    for lr, step, epochs in ((1e-3, 10, 300), (1e-4, 100, 400), (3e-3, 4, 30), (1e-2, 1, 8)):
        opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step, gamma=0.1)
        stop = None
        for epoch in range(epochs):  # the loop checks the floor at each epoch's start
            if opt.param_groups[0]["lr"] < 1e-8:
                stop = epoch
                break
            opt.step()
            sched.step()
        assert floor_epoch(lr, "step", step, epochs) == stop, (lr, step)


def test_budget_and_bench_fields_are_trainconfig_fields():
    import dataclasses

    from cogcal.bench.budget import BUDGET_FIELDS, Budget
    from cogcal.bench.suites import BENCH_FIELDS

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(BUDGET_FIELDS) <= names and set(BENCH_FIELDS) <= names
    full = Budget(5, "step", 2, 3, 4, 1e-3, 1e-4).config_fields()
    assert set(full) == set(BUDGET_FIELDS)


def test_list_and_protocol_override(capsys, tmp_path):
    from cogcal.cli import main

    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "quick" in listed and "paper-vit" in listed
    timed = [line for line in listed.splitlines() if " min" in line]
    # only the suites measured for this version (README) may state a time
    assert all(line.startswith(("quick ", "claims ")) for line in timed)
    only_paper = parse_suite(_suite(protocols=["paper"], budget={"paper": TINY["budget"]["paper"]}))
    with pytest.raises(ValueError, match="no budget for the fair protocol"):
        only_paper.replace(protocols=("fair",))
    assert parse_suite(_suite(effect=False)).effect is False


def test_unknown_suite_name_suggests():
    with pytest.raises(ValueError, match="Did you mean 'quick'.*Shipped suites"):
        load_suite("quik")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"epochz": 3}, r"unknown key 'epochz'.*Allowed keys: name, description"),
        ({"train": {"batch_sise": 3}}, r"unknown key 'batch_sise'.*Did you mean 'batch_size'"),
        ({"train": {"epochs": 3}}, r"'epochs' is part of the training budget"),
        ({"train": {"method": "ce"}}, r"set by cogcal bench"),
        ({"train": {"batch_size": 0}}, r"batch_size"),
        ({"datasets": {"mnist": {}}}, "'mnist' is unknown.*mnist1d"),
        ({"datasets": {"digits": {"model": "resnet"}}}, "unknown"),
        ({"methods": ["cog-f"]}, "unknown method 'cog-f'"),
        ({"seeds": 0}, "from 1 to"),
        ({"protocols": ["paper", "fast"]}, "unknown protocol 'fast'"),
        ({"requires": {"gpus": True}}, "unknown key 'gpus'"),
        ({"paper_baseline_lr": 1e-4}, "budget.paper.baselines.lr"),
        ({"tune": {"cog": [{"lr": 1e-3}]}}, r"tune.lrs x tune.ratios"),
        ({"tune": {**TINY["tune"], "ratios": [0.1, 1.0]}}, "hierarchy"),
        ({"tune": {**TINY["tune"], "lrs": [1e-3, 2e-3, 1e-2]}}, "log-spaced"),
        ({"tune": {**TINY["tune"], "max_extensions": -1}}, "max_extensions"),
        ({"tune": {"lrs": [1e-3]}}, "given together"),
        ({"budget": {"paper": TINY["budget"]["paper"]}}, "no budget for the fair protocol"),
        (
            {
                "budget": {
                    **TINY["budget"],
                    "fair": {"epochs": 1, "schedule": "step", "step_size": 1},
                }
            },
            "patience",
        ),
        (
            {"budget": {**TINY["budget"], "fair": {**TINY["budget"]["fair"], "lr": 1e-3}}},
            "fair protocol tunes",
        ),
        ({"budget": {**TINY["budget"], "fair": {"cog": {}, "baselines": {}}}}, "one budget"),
        (
            {"budget": {**TINY["budget"], "paper": {"cog": TINY["budget"]["paper"]["cog"]}}},
            "no budget for the baselines family",
        ),
        (
            {
                "budget": {
                    **TINY["budget"],
                    "fair": {"epochs": 1, "schedule": "step", "patience": None},
                }
            },
            "step_size",
        ),
        ({"methods": ["ce", "tst"]}, "stage2_epochs"),
    ],
)
def test_suite_validation_errors(change, match):
    with pytest.raises(ValueError, match=match):
        parse_suite(_suite(**change), source="test")


def test_suite_builds_every_trainconfig():
    # a calibrator_lr above lr is refused by TrainConfig itself
    bad = _suite()
    bad["budget"]["paper"]["cog"].update(lr=1e-4, calibrator_lr=1e-3)
    with pytest.raises(ValueError, match=r"paper/digits/cog-fc.*calibrator_lr"):
        parse_suite(bad, source="test")


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
        run_bench("paper-cifar10", out=tmp_path / "o", data_root=tmp_path)
    assert not (tmp_path / "o").exists()  # nothing started


def test_missing_data_is_one_clear_error(tmp_path):
    suite = parse_suite(_suite(datasets={"cifar10": {"model": "resnet18"}}))
    with pytest.raises(ValueError, match="needs the dataset 'cifar10'"):
        check_requirements(suite, tmp_path / "nowhere")


def test_multilabel_dataset_refuses_methods_without_a_multitask_form(tmp_path):
    suite = parse_suite(
        _suite(
            datasets={"digits-mtl": {"model": "cnn"}},
            methods=["ce", "tst"],
            budget={
                **TINY["budget"],
                "paper": {
                    **TINY["budget"]["paper"],
                    "baselines": {**TINY["budget"]["paper"]["baselines"], "stage2_epochs": 1},
                },
                "fair": {**TINY["budget"]["fair"], "stage2_epochs": 1},
            },
        )
    )
    with pytest.raises(ValueError, match="multi-task form; tst"):
        check_requirements(suite, tmp_path)


# --------------------------------------------------------------------------- planning


def _plan(suite_dict: dict, out: Path = Path("/o")) -> tuple[Plan, list]:
    queued: list = []
    plan = Plan(parse_suite(suite_dict), out, Path("data"), queued.extend)
    queued.extend(plan.initial_jobs())
    return plan, queued


def test_plan_protocols_schedules_and_groups():
    plan, queued = _plan(
        _suite(
            methods=["ce", "ls", "ts", "tst", "cog-fc", "cog-ts"],
            budget={
                **TINY["budget"],
                "paper": {
                    **TINY["budget"]["paper"],
                    "baselines": {**TINY["budget"]["paper"]["baselines"], "stage2_epochs": 2},
                },
                "fair": {**TINY["budget"]["fair"], "stage2_epochs": 2},
            },
        )
    )
    by_label = {j.label: j for j in queued}
    # paper: the baselines at the fixed lr without a schedule, never tuned
    ce = by_label["paper/digits/ce/seed1"].config.resolved()
    assert ce["lr"] == 1e-4 and ce["schedule"] == "none" and ce["calibrator_lr"] is None
    assert by_label["paper/digits/tst/seed0"].config.stage2_epochs == 2
    groups = {g.label: g for g in plan.groups}
    assert "paper/digits/ce" not in groups
    # COG tuned in both protocols with the step schedule; fair baselines tuned too
    assert {
        "paper/digits/cog-fc",
        "fair/digits/cog-ts",
        "fair/digits/ce",
        "fair/digits/ls",
        "fair/digits/tst",
        "effect/digits/ce",
    } <= set(groups)
    assert groups["fair/digits/ce"].used_by == ["ce", "ts"]  # ts calibrates a ce network
    # the fair protocol gives every method the same schedule, step size and epochs
    for job in queued:
        r = job.config.resolved()
        if job.protocol == "fair":
            assert (r["schedule"], r["step_size"], r["epochs"]) == ("step", 1, 1), job.label
        if job.protocol == "paper" and job.method.startswith("cog"):
            assert r["schedule"] == "step"
    eff = groups["effect/digits/ce"]
    assert eff.schedule == "none" and eff.folder.name == "ce-no-schedule"
    # grid points: COG lrs x ratios (4), baselines baseline_lrs (2)
    assert len(groups["paper/digits/cog-fc"].jobs) == 4 and len(groups["fair/digits/ls"].jobs) == 2
    point = next(iter(groups["paper/digits/cog-fc"].jobs.values()))
    assert point.config.seed == 0 and point.config.progress is False


def test_reuse_key_is_the_contract():
    a = TrainConfig(method="ce", dataset="digits", preset="paper", lr=1e-4, out="x", data_root="y")
    paper = TrainConfig(method="ce", dataset="digits", preset="paper", out="z")  # its lr: 1e-4
    assert reuse_key(a) == reuse_key(paper)
    assert reuse_key(a) != reuse_key(a.replace(batch_size=32))
    assert reuse_key(a) != reuse_key(a.replace(schedule="step"))


# --------------------------------------------------------------------------- tuning


def _tune(out: Path, group: str) -> dict:
    return json.loads((out / "tune" / group / "tune.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("opt", "diverge", "expect"),
    [
        # optimum above the lr grid: extended upward twice, still at the edge (cap)
        ("lr=1,ratio=0.05", None, {"ext": 2, "cap": True, "edges": ["lr high"], "lr": 0.008}),
        # optimum below the ratio grid: ratio extended downward, then interior
        ("lr=2e-3,ratio=1e-3", None, {"ext": 2, "cap": False, "edges": [], "ratio": 0.001}),
        # interior after one lr extension (2.5e-3 is nearer 2e-3 than 4e-3)
        ("lr=2.5e-3,ratio=0.05", None, {"ext": 1, "cap": False, "edges": ["ratio < 1 bound"]}),
        # points at lr >= 3e-3 diverge: results, excluded from the choice
        ("lr=1,ratio=0.05", 3e-3, {"ext": 1, "cap": False, "edges": [], "lr": 0.002}),
    ],
)
def test_grid_extension(tmp_path, monkeypatch, opt, diverge, expect):
    monkeypatch.setenv("FAKE_OPT", opt)
    if diverge:
        monkeypatch.setenv("FAKE_DIVERGE_LR", str(diverge))
    out = tmp_path / "out"
    suite = _suite(methods=["cog-fc"], protocols=["paper"], seeds=1)
    summary = _bench(tmp_path, out, suite)
    assert summary.failed == 0
    tune = _tune(out, "paper/digits/cog-fc")
    assert tune["extensions"] == expect["ext"] and tune["cap_reached"] is expect["cap"]
    bound = "ratio < 1 bound"  # 0.1 -> 1 would reach the bound: recorded, never crossed
    assert [e for e in tune["edges"] if e != bound] == [e for e in expect["edges"] if e != bound]
    assert (bound in tune["edges"]) is (bound in tune["bounds"]) is (tune["best"]["ratio"] == 0.1)
    assert tune["at_edge"] is bool(set(tune["edges"]) - {bound})
    if bound in expect["edges"]:  # the bound alone is not "at an edge" (tuning.csv too)
        assert tune["edges"] == [bound] and not tune["at_edge"]
    if "lr" in expect:
        assert tune["best"]["lr"] == pytest.approx(expect["lr"])
    if "ratio" in expect:
        assert tune["best"]["ratio"] == pytest.approx(expect["ratio"])
    # every trained point is in tune.csv / tuning.csv, the chosen one marked
    rows = _read_csv(out / "tuning.csv")
    assert list(rows[0]) == list(TUNING_COLUMNS)
    assert (
        len(rows) == len(tune["table"]) == len(list((out / "tune/paper/digits/cog-fc").glob("lr*")))
    )
    assert sum(r["chosen"] == "True" for r in rows) == 1
    statuses = {r["status"] for r in rows}
    assert statuses == ({"complete", "diverged"} if diverge else {"complete"})
    # the seed run uses the chosen point (and is the seed-0 tuning run, copied)
    run = _record(out / "runs/paper/digits/cog-fc/seed0")
    assert run["config"]["lr"] == pytest.approx(tune["best"]["lr"])
    assert run["config"]["calibrator_lr"] == pytest.approx(tune["best_config"]["calibrator_lr"])
    assert run["copied_from"]
    assert summary.counts["diverged"] == sum(r["status"] == "diverged" for r in rows)


@pytest.mark.slow
def test_group_without_finite_point_blocks_its_seed_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_DIVERGE_LR", "1e-9")  # every point diverges
    out = tmp_path / "out"
    summary = _bench(tmp_path, out, _suite(methods=["ce", "cog-fc"], protocols=["paper"]))
    assert summary.counts["blocked"] == 2 and summary.failed == 2
    failed = (out / "failed.txt").read_text()
    assert "paper/digits/cog-fc/seed1\tblocked\tno finite point" in failed
    # ce (fixed lr 1e-4) diverges too: a result, not a failure
    assert {(r["method"], r["status"]) for r in _read_csv(out / "runs.csv")} == {
        ("ce", "diverged"),
        ("cog-fc", "failed"),
    }
    assert _tune(out, "paper/digits/cog-fc")["best"] is None


def test_selection_uses_the_nll_before_calibration(tmp_path):
    """A post-hoc record's calibrated validation NLL is not what chooses its lr."""
    search = GridSearch(parse_suite(TINY).tune.grid("baselines"), max_extensions=0)
    group = TuneGroup("fair", "digits", "ts", {}, search, tmp_path, 0)
    for lr, uncal, cal in ((1e-3, 0.5, 0.1), (2e-3, 0.4, 0.2)):
        folder = RunDir(tmp_path / f"lr{lr:g}")
        folder.path.mkdir()
        folder.write_record(
            RunRecord(
                config={"method": "ts", "lr": lr},
                val={"nll": cal},
                test={},
                val_uncalibrated={"nll": uncal},
            )
        )

        class Done:
            status, point, out = "complete", {"lr": lr}, folder.path

        group.record(Done)
    assert search.best == {"lr": 2e-3}
    assert group.rows["lr0.002"]["val_nll"] == 0.4


def test_fair_post_hoc_methods_use_ce_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_OPT", "lr=4e-3,ratio=0.05")
    out = tmp_path / "out"
    assert (
        _bench(tmp_path, out, _suite(methods=["ce", "ts"], protocols=["fair"], effect=False)).failed
        == 0
    )
    tune = _tune(out, "fair/digits/ce")
    assert tune["used_by"] == ["ce", "ts"] and tune["best"]["lr"] == pytest.approx(4e-3)
    ts = _record(out / "runs/fair/digits/ts/seed1")
    assert ts["config"]["method"] == "ts" and ts["config"]["lr"] == pytest.approx(4e-3)
    assert ts["config"]["schedule"] == "step"
    assert not (out / "tune/fair/digits/ts").exists()


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_bench_end_to_end_tables_effect_and_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "ts/seed1")
    monkeypatch.setenv("FAKE_OPT", "lr=2e-3,ratio=0.05")
    out = tmp_path / "out"
    summary = _bench(tmp_path, out, jobs=2, report=True)
    assert isinstance(summary, BenchSummary) and os.fspath(summary) == str(out)
    assert summary.counts["failed"] == 2 and summary.failed == 2  # ts/seed1 in both protocols
    results = _read_csv(out / "results.csv")
    assert list(results[0]) == list(RESULT_COLUMNS)
    assert {r["protocol"] for r in results} == {"paper", "fair"}
    assert {r["method"] for r in results} == {"ce", "ts", "cog-fc", "cog-ts"}  # never decorated
    assert {r["split"] for r in results} == {"val", "test"}
    runs_done = {(r["protocol"], r["method"], r["seed"]) for r in results}
    assert len(runs_done) == 2 * 4 * 2 - 2 and ("paper", "ts", "1") not in runs_done
    failed = (out / "failed.txt").read_text()
    assert "paper/digits/ts/seed1\tfailed\tRuntimeError: planned failure" in failed
    log = out / "runs/paper/digits/ts/seed1/run.log"
    assert "RuntimeError: planned failure" in log.read_text()
    runs = _read_csv(out / "runs.csv")
    assert list(runs[0]) == list(RUN_COLUMNS) and len(runs) == 16
    by = {(r["protocol"], r["method"], r["seed"]): r for r in runs}
    assert by[("paper", "ts", "1")]["status"] == "failed"
    assert (
        by[("paper", "ce", "0")]["schedule"] == "none"
        and by[("fair", "ce", "0")]["schedule"] == "step"
    )
    # the effect comparison: its own folders and table, never in results.csv
    effect = _read_csv(out / "effect.csv")
    assert list(effect[0]) == list(EFFECT_COLUMNS)
    variants = {r["variant"] for r in effect}
    assert {
        "ce (no schedule)",
        "ce (step schedule)",
        "cog-fc (ratio 0.01)",
        "cog-fc (ratio 0.1)",
    } <= variants
    assert {r["schedule"] for r in effect if r["variant"] == "ce (no schedule)"} == {"none"}
    step = _record(out / "runs/effect/digits/ce-step-schedule/seed1")
    assert (
        step["copied_from"]
        and step["config"]["lr"] == _record(out / "runs/fair/digits/ce/seed1")["config"]["lr"]
    )
    chosen = _tune(out, "fair/digits/cog-fc")["best"]["ratio"]
    at_chosen = _record(out / f"runs/effect/digits/cog-fc-ratio{chosen:g}/seed1")
    assert at_chosen["copied_from"]  # = the fair cog-fc run
    assert (out / "tune/effect/digits/ce-no-schedule/tune.json").is_file()
    tuning = _read_csv(out / "tuning.csv")
    assert {r["protocol"] for r in tuning} == {"paper", "fair", "effect"}
    # bench.json: budgets per protocol and family, counts as a mapping
    meta = json.loads((out / "bench.json").read_text())
    assert meta["budgets"]["fair"]["baselines"]["schedule"] == "step"
    assert meta["budgets"]["paper"]["baselines"]["lr"] == 1e-4
    assert set(meta["budgets"]["paper"]) == {"baselines", "cog"}
    session = meta["sessions"][-1]
    assert session["counts"]["failed"] == 2 and session["interrupted"] is None
    assert (out / "report.html").is_file() and (out / "report.md").is_file()

    # re-run: finished runs skipped through the contract, the failed ones retried
    monkeypatch.delenv("FAKE_FAIL")
    before = _metrics(out)
    summary = _bench(tmp_path, out)
    after = _metrics(out)
    assert all(after[k] == v for k, v in before.items())
    assert summary.failed == 0 and summary.counts["trained"] == 2
    assert not (out / "failed.txt").exists()
    # a half-written run (no metrics.json) is cleared and redone; foreign files survive
    victim = out / "runs/fair/digits/cog-fc/seed1"
    (victim / "metrics.json").unlink()
    (victim / "notes.txt").write_text("mine")
    (victim / ".metrics.json.x.cogcal-tmp").write_text("x")  # cogcal's half-written file
    (victim / ".draft.tmp").write_text("mine")  # the user's, though it looks temporary
    before = _metrics(out)
    summary = _bench(tmp_path, out)
    # redone: copied from its identical twin (the effect's cog-fc run at the chosen ratio)
    assert summary.failed == 0 and summary.counts["trained"] + summary.counts["copied"] == 1
    assert (victim / "notes.txt").read_text() == "mine"  # never deleted
    assert not (victim / ".metrics.json.x.cogcal-tmp").exists()
    assert (victim / ".draft.tmp").read_text() == "mine"
    assert RunDir(victim).is_complete()
    after = _metrics(out)
    assert [k for k in after if before.get(k) != after[k]] == [str(victim / "metrics.json")]


@pytest.mark.slow
def test_interrupted_resume_continues_from_checkpoints(tmp_path):
    """An unfinished run of the planned configuration with checkpoints is resumed."""
    out = tmp_path / "out"
    suite = _suite(methods=["ce"], protocols=["paper"], seeds=1)
    _bench(tmp_path, out, suite)
    run = RunDir(out / "runs/paper/digits/ce/seed0")
    run.metrics_path.unlink()
    (run.checkpoints).mkdir(exist_ok=True)
    (run.checkpoints / "last.ckpt").write_bytes(b"state")
    summary = _bench(tmp_path, out, suite)
    assert summary.counts["trained"] == 1
    assert "cogcal bench: resuming" in (run.path / "run.log").read_text()


@pytest.mark.slow
def test_seeds_and_protocols_override(tmp_path):
    out = tmp_path / "o"
    _bench(tmp_path, out, seeds=1, protocols=("fair",))
    rows = _read_csv(out / "results.csv")
    assert {r["protocol"] for r in rows} == {"fair"} and {r["seed"] for r in rows} == {"0"}


@pytest.mark.slow
def test_concurrent_bench_refused(tmp_path, lock_holder):
    out = tmp_path / "o"
    holder = lock_holder(out)
    with pytest.raises(ValueError, match=f"in use by process {holder.pid}"):
        _bench(tmp_path, out)
    holder.kill()  # SIGKILL: the lock file stays behind
    holder.wait()
    assert [p.name for p in out.iterdir()] == [".cogcal.lock"]
    _bench(tmp_path, out, seeds=1, protocols=("paper",))  # stale lock: taken over
    assert (out / "results.csv").is_file() and not (out / ".cogcal.lock").exists()


@pytest.mark.parametrize("kind", ["user", "train run"])
def test_bench_out_refuses_a_folder_it_did_not_write(tmp_path, kind):
    """Item 2: a folder without the bench's mark is never written into (report.md,
    results.csv, figures/ of the user, or a train run's files, stay as they were)."""
    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    files = {"report.md": "my report", "results.csv": "a,b\n1,2\n", "figures/f.png": "png"}
    if kind == "train run":
        cfg = TrainConfig(method="ce", out=str(out))
        RunDir(out).write_config(cfg.resolved())
        files["config.json"] = (out / "config.json").read_text()
    for name, text in files.items():
        (out / name).write_text(text)
    with pytest.raises(ValueError, match="not written by cogcal bench"):
        _bench(tmp_path, out, seeds=1, protocols=("paper",))
    assert {n: (out / n).read_text() for n in files} == files
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == sorted(
        [*files, "figures"]
    )


@pytest.mark.slow
def test_bench_reruns_into_its_own_folder_and_an_empty_one(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    _bench(tmp_path, out, seeds=1, protocols=("paper",))  # empty: fine
    assert json.loads((out / "bench.json").read_text())["cogcal_bench"] == 1
    summary = _bench(tmp_path, out, seeds=1, protocols=("paper",))  # its own mark: fine
    assert summary.counts["trained"] == 0 and summary.counts["skipped"] > 0


@pytest.mark.slow
def test_system_exit_in_a_run_is_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "ce/seed0")
    out = tmp_path / "o"
    summary = _bench(tmp_path, out, _suite(methods=["ce"], protocols=["paper"]))
    assert summary.counts["failed"] == 1 and summary.failed == 1
    assert "SystemExit" in (out / "failed.txt").read_text()
    assert {r["seed"] for r in _read_csv(out / "results.csv")} == {"1"}


# --------------------------------------------------------------------------- run contract


def _cli_bench(tmp_path: Path, suite: dict, out: Path, monkeypatch) -> int:
    import cogcal.bench.session
    from cogcal.cli import main

    monkeypatch.setattr(cogcal.bench.session, "DEFAULT_RUNNER", RUNNER)
    path = _write_suite(tmp_path, suite, name=f"s{zlib.crc32(json.dumps(suite).encode())}.yaml")
    return main(
        [
            "bench",
            "--suite",
            str(path),
            "--out",
            str(out),
            "--jobs",
            "1",
            "--data-root",
            str(tmp_path / "data"),
            "--quiet",
        ]
    )


def _session(out: Path) -> dict:
    return json.loads((out / "bench.json").read_text())["sessions"][-1]["counts"]


def _contract_suite(**train) -> dict:
    suite = _suite(
        methods=["ce", "cog-fc"],
        protocols=["paper"],
        seeds=1,
        tune={"lrs": [1e-3, 1e-2], "ratios": [0.1], "max_extensions": 0},
    )
    suite["budget"]["paper"]["baselines"]["epochs"] = 2
    suite["train"] = train
    return suite


@pytest.mark.slow
def test_a_field_dropped_back_to_its_default_retrains(tmp_path, monkeypatch):
    with_bs = _contract_suite(batch_size=32)
    x, y = tmp_path / "x", tmp_path / "y"
    assert _cli_bench(tmp_path, with_bs, x, monkeypatch) == 0
    first = _session(x)
    assert first["trained"] == 3 and first["copied"] == 1  # 2 points, ce; cog-fc copied
    assert _cli_bench(tmp_path, with_bs, x, monkeypatch) == 0  # the same suite: all skipped
    assert _session(x)["skipped"] == 4 and _session(x)["trained"] == 0
    shutil.copytree(x, y)
    assert _cli_bench(tmp_path, _contract_suite(), y, monkeypatch) == 0  # batch_size dropped
    assert _session(y)["trained"] == 3 and _session(y)["skipped"] == 0
    assert _record(y / "runs/paper/digits/ce/seed0")["config"]["batch_size"] == 256


@pytest.mark.slow
def test_a_changed_field_retrains(tmp_path, monkeypatch):
    x = tmp_path / "x"
    assert _cli_bench(tmp_path, _contract_suite(), x, monkeypatch) == 0
    changed = _contract_suite()
    changed["budget"]["paper"]["baselines"]["epochs"] = 3
    assert _cli_bench(tmp_path, changed, x, monkeypatch) == 0
    counts = _session(x)
    assert counts["trained"] == 1 and counts["skipped"] >= 2  # only ce changed
    assert _record(x / "runs/paper/digits/ce/seed0")["config"]["epochs"] == 3


@pytest.mark.slow
def test_a_run_folder_copied_from_another_configuration_retrains(tmp_path, monkeypatch):
    x = tmp_path / "x"
    suite = _contract_suite()
    suite["methods"] = ["ce", "ts", "cog-fc"]
    assert _cli_bench(tmp_path, suite, x, monkeypatch) == 0
    ts = x / "runs/paper/digits/ts/seed0"
    shutil.rmtree(ts)
    shutil.copytree(x / "runs/paper/digits/ce/seed0", ts)
    assert _cli_bench(tmp_path, suite, x, monkeypatch) == 0
    assert _session(x)["trained"] == 1
    assert _record(ts)["config"]["method"] == "ts"


@pytest.mark.slow
def test_symlinked_run_folder_fails_that_job_and_is_untouched(tmp_path, monkeypatch):
    x = tmp_path / "x"
    suite = _contract_suite()
    assert _cli_bench(tmp_path, suite, x, monkeypatch) == 0
    run = x / "runs/paper/digits/ce/seed0"
    target = tmp_path / "elsewhere"
    shutil.copytree(run, target)
    (target / "metrics.json").unlink()  # unfinished: a bench would clear it
    (target / "mine.txt").write_text("keep")
    shutil.rmtree(run)
    run.symlink_to(target, target_is_directory=True)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in target.rglob("*"))
    assert _cli_bench(tmp_path, suite, x, monkeypatch) == 1
    assert sorted((p.name, p.stat().st_mtime_ns) for p in target.rglob("*")) == before
    assert run.is_symlink()
    line = next(ln for ln in (x / "failed.txt").read_text().splitlines() if "ce/seed0" in ln)
    assert "symbolic link" in line and "\n" not in line


def test_copy_run_copies_only_cogcal_files(tmp_path):
    cfg = TrainConfig(method="ce", dataset="digits", lr=1e-4, out=str(tmp_path / "a"))
    fake_run(cfg.to_dict())
    (tmp_path / "a" / "checkpoints").mkdir()
    (tmp_path / "a" / "checkpoints" / "best.ckpt").write_bytes(b"w")
    (tmp_path / "a" / "checkpoints" / "notes.txt").write_text("foreign")
    (tmp_path / "a" / "mine.txt").write_text("foreign")
    dst = RunDir(tmp_path / "b")
    copy_run(RunDir(tmp_path / "a"), dst)
    assert dst.finished_with(cfg.replace(out=str(dst.path)))
    assert (dst.path / "checkpoints" / "best.ckpt").read_bytes() == b"w"
    assert not (dst.path / "mine.txt").exists()
    assert not (dst.path / "checkpoints" / "notes.txt").exists()
    assert json.loads(dst.metrics_path.read_text())["copied_from"] == "../a"


def test_metrics_rows_shapes():
    m = {
        "val": {"acc": 0.5, "nll": None},
        "test": {"acc": 0.7, "acc/Smiling": 0.8},
        "shift": {"gaussian_noise": {"1": {"acc": 0.6}, "2": {"acc": 0.5}}, "rot45": {"acc": 0.4}},
        "ood": {"svhn": {"auroc": 0.9, "fpr95": 0.3}},
    }
    rows = metrics_rows(m, "d", "ce", "paper", 3)
    assert all(set(r) == set(RESULT_COLUMNS) for r in rows)
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


# --------------------------------------------------------------------------- signals


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


@pytest.mark.slow
def test_worker_sigterm_interrupts_that_job_only(tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    monkeypatch.setenv("FAKE_SLOW", "ce/seed1")
    monkeypatch.setenv("FAKE_PIDFILE", str(pidfile))
    killed = []

    def killer() -> None:
        _wait_for(pidfile.exists)
        pid = int(pidfile.read_text())
        killed.append(pid)
        os.kill(pid, signal.SIGTERM)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out = tmp_path / "o"
    summary = _bench(tmp_path, out, _suite(methods=["ce", "ts"], protocols=["paper"], seeds=3))
    thread.join(5)
    assert killed and summary.counts["interrupted"] == 1 and summary.failed == 1
    assert summary.counts["trained"] == 5  # the bench went on
    runs = {(r["method"], r["seed"]): r["status"] for r in _read_csv(out / "runs.csv")}
    assert runs[("ce", "1")] == "interrupted"
    assert sum(s == "complete" for s in runs.values()) == 5
    assert "ce/seed1\tinterrupted\tinterrupted (SIGTERM)" in (out / "failed.txt").read_text()


def _bench_script(suite: Path, out: Path, data: Path) -> str:
    return textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import cogcal.bench.session
        cogcal.bench.session.DEFAULT_RUNNER = {RUNNER!r}
        from cogcal.cli import main
        sys.exit(main(["bench", "--suite", {str(suite)!r}, "--out", {str(out)!r},
                       "--jobs", "1", "--data-root", {str(data)!r}, "--quiet"]))
        """
    )


@pytest.mark.slow
def test_sigterm_to_the_bench_exits_143_with_tables(tmp_path):
    suite = _write_suite(tmp_path, _suite(methods=["ce", "ts"], protocols=["paper"], seeds=3))
    out = tmp_path / "out"
    env = {**os.environ, "FAKE_SLOW": "ts/seed0", "FAKE_PIDFILE": str(tmp_path / "pid")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _bench_script(suite, out, tmp_path / "d")],
        env=env,
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: (tmp_path / "pid").exists(), timeout=120)
        worker = int((tmp_path / "pid").read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert "interrupted (SIGTERM)" in err
    _wait_for(lambda: not Path(f"/proc/{worker}").exists(), timeout=30)  # the worker stopped
    rows = _read_csv(out / "results.csv")
    assert {(r["method"], r["seed"]) for r in rows} == {("ce", "0"), ("ce", "1"), ("ce", "2")}
    runs = {(r["method"], r["seed"]): r["status"] for r in _read_csv(out / "runs.csv")}
    assert runs[("ts", "0")] == "interrupted"
    assert "ts/seed0\tinterrupted" in (out / "failed.txt").read_text()
    assert (out / "report.md").is_file(), err
    assert json.loads((out / "bench.json").read_text())["sessions"][-1]["interrupted"] == "SIGTERM"
    assert not (out / ".cogcal.lock").exists()


@pytest.mark.slow
def test_killed_bench_resumes_without_redoing(tmp_path):
    """SIGKILL the bench mid-way; workers exit with it; the re-run completes the rest."""
    suite = _write_suite(tmp_path, _suite(protocols=["paper"], seeds=3))
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from pathlib import Path
        from cogcal.commands.bench import run_bench
        run_bench({str(suite)!r}, out=Path({str(out)!r}), jobs=2,
                  data_root=Path({str(tmp_path / "data")!r}), progress=False,
                  runner={RUNNER!r}, report=False)
        """
    )
    env = {**os.environ, "FAKE_SLEEP": "0.3"}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    _wait_for(lambda: len(_metrics(out)) >= 3, timeout=120)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = _metrics(out)
    assert not (out / "results.csv").exists()

    # the orphaned workers notice that their parent is gone and exit
    def gone() -> bool:
        ps = subprocess.run(
            ["ps", "-o", "pid=", "-g", str(proc.pid)], capture_output=True, text=True
        )
        return not ps.stdout.split()

    _wait_for(gone, timeout=30)
    summary = _bench(tmp_path, out, _suite(protocols=["paper"], seeds=3))
    after = _metrics(out)
    assert summary.failed == 0 and summary.counts["skipped"] >= len(done_before)
    assert all(after[k] == v for k, v in done_before.items())
    assert len(after) == 4 * 3


@pytest.mark.slow
def test_real_trainer_smoke(tmp_path):
    """One epoch of the real trainer through the real worker path (cogcal.train.run)."""
    suite = _suite(
        methods=["ts", "cog-fc"],
        protocols=["paper"],
        seeds=1,
        tune={"lrs": [1e-3], "ratios": [0.1], "max_extensions": 0},
    )
    out = tmp_path / "out"
    summary = _run_bench(
        _write_suite(tmp_path, suite),
        out=out,
        jobs=1,
        data_root=tmp_path / "data",
        progress=False,
        report=False,
    )
    assert summary.failed == 0
    rows = _read_csv(out / "results.csv")
    assert {r["method"] for r in rows} == {"ts", "cog-fc"}
    assert {r["metric"] for r in rows} >= {"acc", "nll", "brier", "ece_15", "mce_100"}
    assert (out / "runs/paper/digits/ts/seed0/test_logits.npz").is_file()
    assert "copied_from" in _record(out / "runs/paper/digits/cog-fc/seed0")
    tune = _tune(out, "paper/digits/cog-fc")
    assert tune["best"] == {"lr": 1e-3, "ratio": 0.1}
