"""Suite validation: plugins only with --allow-plugins, a sane seed maximum, csv: datasets,
case-insensitive method names, budgets and grids only for the families a suite has."""

from __future__ import annotations

import csv
import json
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml

from cogcal.bench import budgets, check_requirements, load_suite
from cogcal.bench.suites import MAX_SEEDS, parse_suite
from cogcal.cli import main
from cogcal.commands.bench import run_bench
from cogcal.train.config import TrainConfig
from test_bench import TINY

HERE = Path(__file__).resolve().parent

BASELINES_ONLY = {  # test_bench's tiny suite without its COG methods, budget and grid
    **{k: v for k, v in TINY.items() if k not in ("methods", "budget", "tune")},
    "methods": ["ce", "ts"],
    "budget": {
        "paper": {"baselines": TINY["budget"]["paper"]["baselines"]},
        "fair": TINY["budget"]["fair"],
    },
    "tune": {"baseline_lrs": [1e-3, 3e-3, 1e-2], "max_extensions": 1},
    "effect": False,
}


def _suite(**changes) -> dict:
    suite = json.loads(json.dumps(BASELINES_ONLY))
    suite.update(changes)
    return suite


def _write(tmp_path: Path, suite: dict) -> Path:
    path = tmp_path / f"suite-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


# --------------------------------------------------------------------------- plugins

PLUGIN = """
from pathlib import Path
import numpy as np

Path({marker!r}).write_text("imported")

def load():
    Path({marker!r}).write_text("called")
    rng = np.random.default_rng(0)
    def pair(n):
        return rng.normal(size=(n, 4)), np.arange(n) % 3
    return {{"train": pair(30), "val": pair(12), "test": pair(12), "num_classes": 3}}
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A plugin module that leaves a marker file when it is imported or called."""
    name = f"cogcal_suite_plugin_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "marker.txt"
    (tmp_path / f"{name}.py").write_text(PLUGIN.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, marker


def _plugin_suite(module: str) -> dict:
    return _suite(datasets={f"{module}:load": {"model": "mlp"}})


def test_a_plugin_suite_is_refused_without_the_flag_and_nothing_is_imported(tmp_path, plugin):
    module, marker = plugin
    path = _write(tmp_path, _plugin_suite(module))
    with pytest.raises(ValueError, match=rf"import the Python module '{module}'.*--allow-plugins"):
        load_suite(path)
    with pytest.raises(ValueError, match="call its function 'load'"):
        run_bench(path, out=tmp_path / "out", data_root=tmp_path / "data", progress=False)
    assert not marker.exists() and module not in sys.modules
    assert not (tmp_path / "out").exists()
    # "os:abort" (issue repro): refused while checking, the process lives on
    with pytest.raises(ValueError, match="module 'os'.*function 'abort'"):
        parse_suite(_suite(datasets={"os:abort": {"model": "mlp"}}), source="test")


def test_cli_names_the_flag_and_exits_2(tmp_path, plugin, capsys):
    module, marker = plugin
    path = _write(tmp_path, _plugin_suite(module))
    out = tmp_path / "out"
    assert main(["bench", "--suite", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--allow-plugins" in err and f"{module}" in err
    assert not marker.exists() and not out.exists()


def test_with_the_flag_checking_imports_nothing_and_the_bench_loads_the_plugin(tmp_path, plugin):
    module, marker = plugin
    suite = load_suite(_write(tmp_path, _plugin_suite(module)), allow_plugins=True)
    assert not marker.exists() and module not in sys.modules  # checking ran no code
    info = check_requirements(suite, tmp_path / "data")  # the bench's data check loads it
    assert marker.read_text() == "called" and info[f"{module}:load"]["num_classes"] == 3


def test_registered_folder_and_csv_names_are_not_plugins():
    from cogcal.bench.suites import _is_plugin

    assert _is_plugin("my_pkg.data:load") and _is_plugin("os:abort")
    for name in ("mnist1d", "MNIST1D", "csv:x.csv", "CSV:x.csv", "folder:/a/b", "digits-mtl"):
        assert not _is_plugin(name)


# --------------------------------------------------------------------------- seeds


@pytest.mark.parametrize("seeds", [99999999999999999999, 30000000, MAX_SEEDS + 1])
def test_huge_seed_counts_are_one_clear_error(seeds, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_suite()).replace("seeds: 2", f"seeds: {seeds}"))
    with pytest.raises(ValueError, match=rf"seeds must be a count from 1 to {MAX_SEEDS}"):
        load_suite(path)


def test_seed_values_and_lists_have_limits(tmp_path, capsys):
    assert parse_suite(_suite(seeds=MAX_SEEDS)).seeds[-1] == MAX_SEEDS - 1
    with pytest.raises(ValueError, match="integers from 0 to 4294967295"):
        parse_suite(_suite(seeds=[0, 2**32]))
    with pytest.raises(ValueError, match=f"the most a suite runs is {MAX_SEEDS}"):
        parse_suite(_suite(seeds=list(range(MAX_SEEDS + 1))))
    with pytest.raises(ValueError, match="tune.seed must be an integer from 0 to"):
        parse_suite(_suite(tune={**BASELINES_ONLY["tune"], "seed": 2**40}))
    with pytest.raises(ValueError, match="from 1 to"):
        parse_suite(_suite(seeds=0))
    # the same limit for --seeds, one line, exit 2
    path = _write(tmp_path, _suite())
    argv = ["bench", "--suite", str(path), "--seeds", "30000000", "--out", str(tmp_path / "o")]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"from 1 to {MAX_SEEDS}" in err


# --------------------------------------------------------------------------- csv: datasets


def _table(path: Path, n: int = 90) -> Path:
    rng = np.random.default_rng(0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "label"])
        for i in range(n):
            y = ["red", "green", "blue"][i % 3]
            w.writerow([*(rng.normal(size=3) + i % 3).round(4), y])
    return path


@pytest.mark.slow
def test_a_csv_dataset_with_its_target_runs_in_a_suite(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    table = _table(tmp_path / "table.csv")
    name = f"csv:{table}"
    suite_dict = _suite(datasets={name: {"target": "label"}}, protocols=["fair"], seeds=1)
    suite = load_suite(_write(tmp_path, suite_dict))
    assert suite.datasets[0].train == {"target": "label"}
    info = check_requirements(suite, tmp_path / "data")
    assert info[name]["num_classes"] == 3 and info[name]["model"] == "mlp"
    summary = run_bench(
        suite, out=tmp_path / "out", data_root=tmp_path / "data", progress=False,
        report=False, runner="test_bench:fake_run", jobs=1,
    )  # fmt: skip
    assert summary.failed == 0
    configs = list((tmp_path / "out" / "runs").glob("fair/*/ce/seed0/config.json"))
    assert configs and json.loads(configs[0].read_text())["target"] == "label"


def test_a_csv_dataset_without_a_target_says_where_to_put_it():
    with pytest.raises(ValueError, match=r"needs .*target.*give it on the entry"):
        parse_suite(_suite(datasets={"csv:t.csv": {"model": "mlp"}}), source="test")
    with pytest.raises(ValueError, match="target must be a column name"):
        parse_suite(_suite(datasets={"csv:t.csv": {"target": 3}}), source="test")
    with pytest.raises(ValueError, match="target` applies to csv: datasets only"):
        parse_suite(_suite(datasets={"digits": {"target": "label"}}), source="test")


def test_a_csv_datasets_train_section_takes_its_target(tmp_path):
    """``datasets: {csv:PATH: {train: {target: label}}}`` is the csv: table's own section:
    its target is accepted there (it was refused as "applies to csv: datasets only") and
    every planned run gets it; other datasets still refuse it, wherever it is given."""
    from cogcal.bench.plan import Plan

    name = f"csv:{_table(tmp_path / 'table.csv')}"
    datasets = {name: {"train": {"target": "label", "augment": "none"}}}
    suite = load_suite(_write(tmp_path, _suite(datasets=datasets, seeds=1)))
    assert suite.datasets[0].train == {"target": "label", "augment": "none"}
    jobs = Plan(suite, tmp_path / "out", tmp_path / "data", lambda jobs: None).initial_jobs()
    assert {job.kind for job in jobs} == {"point", "seed"}  # tuning points and fixed runs
    assert {(job.config.dataset, job.config.target) for job in jobs} == {(name, "label")}
    both = {name: {"target": "label", "train": {"target": "label"}}}  # the same, twice: fine
    assert parse_suite(_suite(datasets=both)).datasets[0].train == {"target": "label"}
    with pytest.raises(ValueError, match=r"train: `augment` flip flips images; a csv: table"):
        parse_suite(_suite(datasets={name: {"train": {"target": "label", "augment": "flip"}}}))
    with pytest.raises(ValueError, match=r"\.train\.target must be a column name, got 3"):
        parse_suite(_suite(datasets={name: {"train": {"target": 3}}}))
    with pytest.raises(ValueError, match=r"`target` must be a column name, got 3"):
        TrainConfig(dataset=name, target=3)  # the TrainConfig rule, for Python callers too
    with pytest.raises(ValueError, match=r"target is given twice \('a' and train.target\)"):
        parse_suite(_suite(datasets={name: {"target": "a", "train": {"target": "b"}}}))
    with pytest.raises(ValueError, match=r"datasets\.digits: `target` applies to csv: datasets"):
        parse_suite(_suite(datasets={"digits": {"train": {"target": "label"}}}))
    with pytest.raises(ValueError, match=r"train: 'target' names the class column of one csv"):
        parse_suite(_suite(datasets={name: {"target": "label"}}, train={"target": "label"}))


# --------------------------------------------------------------------------- methods


def test_method_names_are_case_insensitive_like_the_cli():
    suite = parse_suite(_suite(methods=["CE", " Ts "]))
    assert suite.methods == ("ce", "ts")
    with pytest.raises(ValueError, match="listed twice"):
        parse_suite(_suite(methods=["ce", "CE"]))
    with pytest.raises(ValueError, match="unknown method 'Cog-F'.*Did you mean 'cog-fc'"):
        parse_suite(_suite(methods=["Cog-F"]))


# --------------------------------------------------------------------------- families


def test_a_baselines_only_suite_needs_no_cog_budget_or_grid():
    suite = parse_suite(_suite(), source="test")
    assert set(suite.budgets["paper"]) == {"baselines"} and not suite.tune.lrs
    recorded = budgets(suite)
    assert set(recorded["paper"]) == set(recorded["fair"]) == {"baselines"}
    assert recorded["fair"]["baselines"]["methods"] == ["ce", "ts"]


def test_a_cog_only_suite_needs_no_baseline_budget_or_grid():
    suite = parse_suite(
        _suite(
            methods=["cog-fc"],
            budget={
                "paper": {"cog": {"epochs": 1, "schedule": "step", "step_size": 1, "patience": 1}}
            },
            protocols=["paper"],
            tune={"lrs": [1e-3, 3e-3], "ratios": [0.1, 0.3]},
        ),
        source="test",
    )
    assert suite.tune.baseline_lrs == () and set(budgets(suite)["paper"]) == {"cog"}


def test_a_family_the_suite_has_still_needs_its_budget_and_grid():
    with pytest.raises(ValueError, match=r"budget.paper has no budget for the cog family \(cog-fc"):
        parse_suite(_suite(methods=["ce", "cog-fc"]), source="test")
    fams = {"baselines": BASELINES_ONLY["budget"]["paper"]["baselines"]}
    fams["cog"] = {"epochs": 1, "schedule": "none", "patience": None}
    with pytest.raises(ValueError, match="tune.lrs and tune.ratios are needed"):
        parse_suite(
            _suite(methods=["ce", "cog-fc"], budget={**BASELINES_ONLY["budget"], "paper": fams}),
            source="test",
        )


# --------------------------------------------------------------------------- suite files

#: A "billion laughs": name: expands to 9**6 strings through five nested aliases.
LAUGHS = "\n".join(
    ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 6)]
    + ["name: *l5"]
)


def test_a_suite_whose_aliases_expand_past_the_bound_is_refused_before_writing(tmp_path, capsys):
    body = yaml.safe_dump({k: v for k, v in _suite().items() if k != "name"})
    path = tmp_path / "laughs.yaml"
    path.write_text(f"{LAUGHS}\n{body}")
    assert len(path.read_bytes()) < 2000
    with pytest.raises(ValueError, match="expands to more than 10000 YAML values"):
        load_suite(path)
    out = tmp_path / "out"
    assert main(["bench", "--suite", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expands to more than" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "name", [["a", "b"], {"k": 1}, 7, "x" * 65, "a b", "../up", "", "-dash", "na\nme"]
)
def test_a_suite_name_that_is_not_a_short_name_is_refused(name):
    with pytest.raises(ValueError, match="name must be a short name"):
        parse_suite(_suite(name=name))


def test_a_short_suite_name_is_kept():
    assert parse_suite(_suite(name="my-suite_2.v1")).name == "my-suite_2.v1"


def test_a_repeated_grid_value_names_the_key_the_user_wrote():
    tune = {**BASELINES_ONLY["tune"], "baseline_lrs": [1e-3, 1e-3]}
    with pytest.raises(ValueError, match=r"tune\.baseline_lrs lists 0\.001 twice"):
        parse_suite(_suite(tune=tune))
    with pytest.raises(ValueError, match=r"tune\.max_extensions must be an integer >= 0"):
        parse_suite(_suite(tune={**BASELINES_ONLY["tune"], "max_extensions": True}))
