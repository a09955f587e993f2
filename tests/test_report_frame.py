"""Tests of cogcal.report.frame: results.csv read once, checked, normalised; one filter."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from cogcal.report.frame import (
    AGGREGATE,
    INDIVIDUAL,
    SeedPlan,
    load_bench_csv,
    load_results,
    rows,
)
from cogcal.report.tables import comparison_table
from cogcal.runs.columns import EFFECT_COLUMNS, RESULT_COLUMNS, RUN_COLUMNS, TUNING_COLUMNS
from test_report_render import result_row, write_csv


def _write(tmp_path, rows_):
    write_csv(tmp_path / "results.csv", RESULT_COLUMNS, rows_)
    return tmp_path


def _cells(seeds=(0, 1, 2), methods=("ce", "cog-fc")):
    out = []
    for m in methods:
        for s in seeds:
            for metric, v in (("acc", 0.8 + 0.01 * s), ("nll", 0.5), ("brier", 0.2)):
                out.append(result_row("d", m, "paper", s, "test", metric, v))
    return out


def test_normalises_blanks_seeds_and_severity(tmp_path):
    r = _cells()
    r.append(result_row("d", "ce", "paper", "2.0", "shift", "acc", 0.5, condition="blur",
                        severity="3.0"))  # fmt: skip
    r.append(result_row("d", "ce", "paper", 1, "test", "acc", 0.7, task="t0"))
    r.append(result_row("d", "ce", "paper", 1, "test", "acc", "nan", task="mean"))
    df = load_results(_write(tmp_path, r))
    assert list(df.columns) == list(RESULT_COLUMNS)
    assert df["seed"].dtype.kind == "i" and df["value"].dtype.kind == "f"
    assert set(df["task"]) == {"", "t0", "mean"} and set(df["condition"]) == {"", "blur"}
    shift = rows(df, split="shift")
    assert shift["severity"].tolist() == ["3"] and shift["seed"].tolist() == [2]
    assert len(rows(df, split="test", task=AGGREGATE)) == 19  # 18 plain + the mean row
    assert rows(df, task=INDIVIDUAL)["value"].tolist() == [0.7]
    assert np.isnan(rows(df, task="mean")["value"].iloc[0])  # nan stays, never dropped
    assert len(rows(df, method=["ce"], metric="acc", condition="")) == 5


@pytest.mark.parametrize(
    ("bad", "column", "shown"),
    [
        ({"value": "abc"}, "value", "'abc'"),
        ({"value": ""}, "value", "''"),
        ({"seed": "one"}, "seed", "'one'"),
        ({"seed": "-1"}, "seed", "'-1'"),
        ({"split": "train"}, "split", "'train'"),
        ({"protocol": "mine"}, "protocol", "'mine'"),
        ({"condition": "blur"}, "condition", "'blur'"),
    ],
)
def test_bad_cell_names_line_and_value(tmp_path, bad, column, shown):
    r = _cells()
    r[4] = {**r[4], **bad}
    with pytest.raises(ValueError) as err:
        load_results(_write(tmp_path, r))
    msg = str(err.value)
    assert f"column {column!r}" in msg and "line 6" in msg and shown in msg, msg


def test_structural_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_results(tmp_path / "nowhere")
    (tmp_path / "results.csv").write_text("dataset,method\nd,ce\n")
    with pytest.raises(ValueError, match="lacks the column"):
        load_results(tmp_path)
    r = _cells()
    r.append(dict(r[0]))
    with pytest.raises(ValueError, match="lines 2, 20 hold the same result"):
        load_results(_write(tmp_path, r))
    r = _cells() + [result_row("d", "ce", "paper", 0, "ood", "auroc", 0.9)]
    with pytest.raises(ValueError, match="OOD set's name"):
        load_results(_write(tmp_path, r))


def test_fewer_seeds_than_planned_are_flagged(tmp_path):
    r = [x for x in _cells() if not (x["method"] == "cog-fc" and x["seed"] == 2)]
    r = [x for x in r if not (x["method"] == "ce" and x["seed"] == 1 and x["metric"] == "nll")]
    df = load_results(_write(tmp_path, r))
    t = comparison_table(df, "d", "paper")  # no plan: the largest count (3) is expected
    cells = {row[0].text: [c.text for c in row] for row in t.rows}
    assert cells["cog-fc"][1] == "0.805 ± 0.007 (2 of 3 seeds)"
    assert cells["ce"][1] == "0.810 ± 0.010" and cells["ce"][2] == "0.500 ± 0.000 (2 of 3 seeds)"
    assert any("fewer seeds than planned" in str(n) for n in t.notes)
    plan = SeedPlan({("d", "paper", "ce"): 5}, default=3)
    t = comparison_table(df, "d", "paper", plan=plan)
    cells = {row[0].text: [c.text for c in row] for row in t.rows}
    assert cells["ce"][1] == "0.810 ± 0.010 (3 of 5 seeds)"
    full = comparison_table(load_results(_write(tmp_path, _cells())), "d", "paper")
    assert not any("(" in c.text for row in full.rows for c in row[1:-1])


def test_seed_plan_from_runs_and_bench_json(tmp_path):
    runs = [
        {"dataset": "d", "method": "ce", "protocol": "paper", "seed": s, "status": st}
        for s, st in ((0, "complete"), (1, "failed"), (2, "diverged"))
    ]
    write_csv(tmp_path / "runs.csv", RUN_COLUMNS, runs)
    r = load_bench_csv(tmp_path, "runs.csv")
    assert r["run_dir"].tolist() == ["", "", ""] and r["seed"].dtype.kind == "i"
    plan = SeedPlan.from_bench(r, {"suite": {"seeds": [0, 1, 2, 3]}})
    assert plan.planned("d", "paper", "ce") == 3 and plan.planned("d", "paper", "ts") == 4
    assert SeedPlan.from_bench(None, None).planned("d", "paper", "ce") is None


def test_tuning_and_effect_files_read_as_the_bench_writes_them(tmp_path):
    write_csv(
        tmp_path / "tuning.csv",
        TUNING_COLUMNS,
        [
            {"protocol": "fair", "dataset": "d", "group": "ce", "lr": 1e-3, "status": "complete",
             "chosen": True, "at_edge": True, "edges": "lr high; ratio low", "extensions": 2,
             "cap_reached": False, "val_nll": 0.5},
            {"protocol": "fair", "dataset": "d", "group": "ce", "lr": 1e-2, "status": "diverged",
             "chosen": False, "at_edge": True, "edges": "lr high; ratio low", "extensions": 2,
             "cap_reached": False, "val_nll": ""},
        ],
    )  # fmt: skip
    t = load_bench_csv(tmp_path, "tuning.csv")
    assert t["chosen"].tolist() == [True, False] and t["at_edge"].all()
    assert not t["cap_reached"].any() and np.isnan(t["val_nll"].iloc[1])
    assert t["edges"].iloc[0] == "lr high; ratio low" and t["schedule"].tolist() == ["", ""]
    write_csv(tmp_path / "tuning.csv", TUNING_COLUMNS, [])  # a bench stopped before any group
    assert load_bench_csv(tmp_path, "tuning.csv").empty
    row = {"dataset": "d", "variant": "cog-fc (ratio 0.1)", "seed": 0, "split": "test",
           "metric": "nll", "value": 0.3}  # fmt: skip
    write_csv(tmp_path / "effect.csv", EFFECT_COLUMNS, [row])
    assert load_bench_csv(tmp_path, "effect.csv")["value"].tolist() == [0.3]
    assert load_bench_csv(tmp_path / "none", "tuning.csv") is None


@pytest.mark.slow
def test_report_imports_no_bench_lightning_or_plots():
    code = (
        "import sys, cogcal.report.run_report, cogcal.report.render;"
        "assert 'pandas' not in sys.modules, 'pandas imported by the run report';"
        "import cogcal.report.build;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('lightning', 'matplotlib')"
        " or m.startswith('cogcal.bench')]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
