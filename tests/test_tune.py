"""Learning-rate search: extension at the grid's edges, divergence, reuse by configuration."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import cogcal.train.runner as runner
from cogcal.cli import main
from cogcal.runs import RunDir, RunRecord
from cogcal.train import TrainConfig
from cogcal.train.loop import NonFiniteLossError
from cogcal.train.tuning import (
    LR_FLOOR_BOUND,
    RATIO_BOUND,
    Grid,
    GridSearch,
    edge_warning,
    point_config,
)


def _drive(search: GridSearch, nll) -> list[dict]:
    trained = []
    while points := search.next_points():
        for p in points:
            trained.append(p)
            search.record(p, nll(p))
    return trained


def test_interior_choice_needs_no_extension():
    search = GridSearch(Grid(lrs=(1e-4, 1e-3, 1e-2)), max_extensions=2)
    trained = _drive(search, lambda p: abs(math.log10(p["lr"]) + 3))
    assert len(trained) == 3 and search.best == {"lr": 1e-3} and search.at_edge == []


@pytest.mark.parametrize("optimum", [1e-6, 1e0])
def test_an_edge_choice_extends_the_grid_outward_until_the_cap(optimum):
    search = GridSearch(Grid(lrs=(1e-4, 1e-3)), max_extensions=2)
    trained = _drive(search, lambda p: abs(math.log10(p["lr"] / optimum)))
    lrs = sorted(p["lr"] for p in trained)
    if optimum < 1e-4:  # the factor of the grid itself (10) is the step
        assert lrs == pytest.approx([1e-6, 1e-5, 1e-4, 1e-3])
        assert search.best == {"lr": 1e-6} and search.at_edge == ["lr low"]
    else:
        assert lrs == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])
        assert search.best == {"lr": 0.1} and search.at_edge == ["lr high"]
    summary = search.summary([])
    assert summary["at_edge"] and summary["cap_reached"] and summary["extensions"] == 2


def test_each_axis_of_a_cog_grid_extends_on_its_own():
    search = GridSearch(Grid(lrs=(1e-3, 1e-2), ratios=(0.01, 0.1)), max_extensions=3)
    # best λ_f 1e-2 (interior after one step up), best ratio 1e-3 (two steps down)
    trained = _drive(
        search,
        lambda p: abs(math.log10(p["lr"]) + 2) + abs(math.log10(p["ratio"]) + 3),
    )
    assert search.best == {"lr": 1e-2, "ratio": 1e-3}
    assert search.grid.lrs == pytest.approx((1e-3, 1e-2, 1e-1))
    assert search.grid.ratios == pytest.approx((1e-4, 1e-3, 0.01, 0.1))
    assert search.at_edge == []
    assert len(trained) == len(search.grid.points())  # every point of the grown grid
    assert point_config(search.best) == {"lr": 1e-2, "calibrator_lr": 1e-5}


def test_the_ratio_never_grows_to_one_and_names_its_bound():
    search = GridSearch(Grid(lrs=(1e-3,), ratios=(0.1, 0.3)), max_extensions=3)
    _drive(search, lambda p: -p["ratio"] + abs(math.log10(p["lr"]) + 3))
    assert max(search.grid.ratios) == 0.3 and search.best == {"lr": 1e-3, "ratio": 0.3}
    # the only edge left is the bound, named as such (reported, not hidden)
    assert search.at_edge == [] and search.bounds == [RATIO_BOUND] == ["ratio < 1 bound"]
    summary = search.summary([])
    assert not summary["at_edge"] and summary["edges"] == summary["bounds"] == [RATIO_BOUND]
    assert not summary["cap_reached"]


def test_the_ratio_axis_is_a_half_decade_ladder_that_extends_like_the_lr_axis():
    search = GridSearch(Grid(lrs=(1e-3, 3e-3, 1e-2), ratios=(0.03, 0.1, 0.3)), max_extensions=3)
    assert search.grid.factors == pytest.approx((math.sqrt(10), math.sqrt(10)))
    # optimum ratio 0.003: two half-decade steps below the grid
    trained = _drive(
        search, lambda p: abs(math.log10(p["lr"] / 3e-3)) + abs(math.log10(p["ratio"] / 3e-3))
    )
    assert search.grid.ratios == pytest.approx((1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3))
    assert search.grid.lrs == pytest.approx((1e-3, 3e-3, 1e-2))  # interior: not extended
    assert search.best == {"lr": 3e-3, "ratio": 3e-3} and search.at_edge == search.bounds == []
    assert len(trained) == 18 and search.extensions == 3
    # the lr axis steps the same way, both directions
    lr_search = GridSearch(Grid(lrs=(1e-3, 3e-3)), max_extensions=4)
    _drive(lr_search, lambda p: abs(math.log10(p["lr"] / 0.1)))
    assert lr_search.grid.lrs == pytest.approx((1e-3, 3e-3, 1e-2, 0.03, 0.1, 0.3))
    assert lr_search.best == {"lr": 0.1} and lr_search.at_edge == []


def test_a_low_ratio_choice_extends_down_and_a_high_one_stops_below_one():
    search = GridSearch(Grid(lrs=(1e-3, 3e-3, 1e-2), ratios=(0.01, 0.03)), max_extensions=5)
    _drive(search, lambda p: abs(math.log10(p["lr"] / 3e-3)) - p["ratio"])
    assert search.grid.ratios == pytest.approx((0.01, 0.03, 0.1, 0.3))  # 0.3 -> 1: stop
    assert search.extensions == 2 and search.bounds == [RATIO_BOUND]
    fast = Grid(lrs=(1e-3,), ratios=(0.1, 0.3), allow_fast_calibrator=True)
    assert fast.can_extend("ratio high") and fast.extended(["ratio high"]).ratios[-1] == 1.0


def test_an_extension_below_the_lr_floor_stops_and_is_recorded():
    search = GridSearch(Grid(lrs=(1e-8, 3e-8, 1e-7)), max_extensions=2)
    trained = _drive(search, lambda p: p["lr"])  # the smallest is always best
    assert min(p["lr"] for p in trained) == 1e-8 and len(trained) == 3
    assert search.at_edge == [] and search.bounds == [LR_FLOOR_BOUND]
    assert search.summary([])["edges"] == ["lr >= 1e-8 floor"]


def test_diverged_points_are_results_not_choices():
    search = GridSearch(Grid(lrs=(1e-3, 1e-2, 1e-1)), max_extensions=2)
    # 1e-1 diverges, 1e-2 is best: interior, because its diverged neighbour was evaluated
    _drive(search, lambda p: math.inf if p["lr"] > 0.05 else -math.log10(p["lr"]))
    assert search.best == {"lr": 1e-2} and search.at_edge == []
    assert search.statuses[(("lr", 0.1),)] == "diverged"


def test_grids_must_be_log_spaced_and_ratios_below_one():
    with pytest.raises(ValueError, match="log-spaced"):
        Grid(lrs=(1e-4, 1e-3, 3e-3))
    with pytest.raises(ValueError, match="half-decade"):
        Grid(lrs=(1e-3,), ratios=(0.01, 0.03, 0.3))  # a gap in the ladder
    assert Grid(lrs=(1e-3,), ratios=(0.03, 0.1, 0.3)).ratios == (0.03, 0.1, 0.3)
    with pytest.raises(ValueError, match="breaks COG's hierarchy"):
        Grid(lrs=(1e-3,), ratios=(0.1, 1.0))


# --------------------------------------------------------------------------- cogcal tune


def _fake_run(nll_of, diverge=lambda cfg: False):
    """A stand-in for `runner.run` writing a record through the run contract."""
    calls = []

    def fake(cfg: TrainConfig, *, resume=False, overwrite=False):
        calls.append(cfg)
        folder = RunDir(cfg.out)
        resolved = {**cfg.resolved(), "task": "multiclass", "data": {}}
        folder.prepare(cfg, resolved, resume=resume, overwrite=overwrite)
        folder.write_config(resolved)
        if diverge(cfg):
            folder.metrics_path.write_text(json.dumps({"status": "diverged", "config": resolved}))
            raise NonFiniteLossError("the training loss became nan")
        nll = nll_of(cfg)
        record = RunRecord(config=resolved, val={"nll": nll, "brier": nll / 2, "acc": 0.9}, test={})
        folder.write_record(record)
        return record.to_dict()

    return fake, calls


def test_tune_extends_records_and_reuses_points(tmp_path, monkeypatch):
    fake, calls = _fake_run(lambda cfg: abs(math.log10(cfg.lr) + 2))  # optimum 1e-2
    monkeypatch.setattr(runner, "run", fake)
    cfg = TrainConfig(method="ce", preset="paper", epochs=1)
    summary = runner.tune(cfg, Grid(lrs=(1e-4, 1e-3)), tmp_path / "t", max_extensions=3)
    assert summary["best"] == {"lr": 0.01} and not summary["at_edge"]
    assert [r["lr"] for r in summary["table"]] == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])
    assert json.loads((tmp_path / "t" / "tune.json").read_text())["selection"].startswith("lowest")
    n = len(calls)
    again = runner.tune(cfg, Grid(lrs=(1e-4, 1e-3)), tmp_path / "t", max_extensions=3)
    assert len(calls) == n and again["best"] == summary["best"]  # nothing retrained


def test_tune_refuses_a_point_made_with_another_configuration(tmp_path, monkeypatch, capsys):
    fake, calls = _fake_run(lambda cfg: 0.5)
    monkeypatch.setattr(runner, "run", fake)
    argv = ["tune", "--lrs", "1e-3", "--max-extensions", "0", "--out", str(tmp_path / "t")]
    argv += ["--preset", "paper"]
    assert main([*argv, "--method", "ce", "--epochs", "1", "--no-progress"]) == 0
    # the same folder, another method and epochs: an error naming the difference, not a reuse
    assert main([*argv, "--method", "ls", "--epochs", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "another configuration" in err and "epochs: 1 -> 3" in err and "method: 'ce'" in err
    assert len(calls) == 1
    assert main([*argv, "--method", "ls", "--epochs", "3", "--no-progress", "--overwrite"]) == 0
    assert len(calls) == 2 and calls[-1].method == "ls"


def test_a_diverging_point_is_recorded_and_the_others_compared(tmp_path, monkeypatch, capsys):
    fake, calls = _fake_run(lambda cfg: 1.0 / cfg.lr, diverge=lambda cfg: cfg.lr > 1)
    monkeypatch.setattr(runner, "run", fake)
    argv = ["tune", "--method", "ce", "--lrs", "1e-3,1e30", "--max-extensions", "0"]
    argv += ["--preset", "paper", "--epochs", "30"]
    assert main([*argv, "--out", str(tmp_path / "t")]) == 0
    table = json.loads((tmp_path / "t" / "tune.json").read_text())["table"]
    assert [r["status"] for r in table] == ["complete", "diverged"]
    assert "diverged" in capsys.readouterr().out
    n = len(calls)
    assert main([*argv, "--out", str(tmp_path / "t")]) == 0
    assert len(calls) == n  # the diverged point is a result: not trained again
    fake, _ = _fake_run(lambda cfg: 1.0, diverge=lambda cfg: True)
    monkeypatch.setattr(runner, "run", fake)
    assert main([*argv, "--out", str(tmp_path / "all")]) == 1
    err = capsys.readouterr().err
    assert "every tuning point" in err and "lr0.001" in err and "lr1e+30" in err
    assert (tmp_path / "all" / "tune.csv").is_file()


@pytest.mark.slow
def test_tune_end_to_end_on_mnist1d(tmp_path):
    root = tmp_path / "data"
    argv = ["tune", "--method", "cog-fc", "--model", "mlp", "--epochs", "1", "--lrs", "1e-3"]
    argv += ["--calibrator-ratios", "0.1", "--max-extensions", "0", "--data-root", str(root)]
    assert main([*argv, "--out", str(tmp_path / "t"), "--no-progress"]) == 0
    summary = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert summary["best_config"] == {"lr": 1e-3, "calibrator_lr": 1e-4}
    assert summary["at_edge"]  # a one-point grid is at its edge, and says so
    assert Path(tmp_path / "t" / "lr0.001_ratio0.1" / "metrics.json").is_file()


@pytest.mark.parametrize(
    ("lrs", "expect"),
    [
        ((1e-3,), (3e-5, 3e-2)),  # one value: half-decade steps
        ((1e-3, 3e-3), (3e-5, 0.1)),
        ((3e-3, 1e-2), (1e-4, 0.3)),
        ((2e-3, 4e-3), (2.5e-4, 3.2e-2)),  # a constant factor other than 10**0.5: kept
        ((1e-4, 1e-3), (1e-7, 1)),
    ],
)
def test_any_log_spaced_grid_extends_on_both_sides(lrs, expect):
    grid = Grid(lrs=lrs)
    for _ in range(3):
        grid = grid.extended(["lr low", "lr high"])
    assert len(grid.lrs) == len(lrs) + 6
    assert (grid.lrs[0], grid.lrs[-1]) == pytest.approx(expect)
    assert all(float(f"{v:.3g}") == v for v in grid.lrs)  # short, stable values
    assert Grid(lrs=grid.lrs).lrs == grid.lrs  # still a valid (log-spaced) axis
    steps = [math.log10(b / a) for a, b in zip(grid.lrs, grid.lrs[1:], strict=False)]
    assert max(steps) - min(steps) < 0.1  # ladder steps are log10(3) and log10(10/3)


def test_cap_reached_counts_only_edges_that_could_move():
    search = GridSearch(Grid(lrs=(1e-3,), ratios=(0.1, 0.3)), max_extensions=1)
    _drive(search, lambda p: -p["ratio"] + abs(math.log10(p["lr"]) + 3))
    assert search.bounds == [RATIO_BOUND] and search.extendable_edges == []
    assert not search.summary([])["cap_reached"]
    capped = GridSearch(Grid(lrs=(1e-3, 3e-3)), max_extensions=1)
    _drive(capped, lambda p: p["lr"])
    assert capped.at_edge == ["lr low"] and capped.summary([])["cap_reached"]


def test_tune_cli_names_the_ratio_bound(tmp_path, monkeypatch, capsys):
    # best λ_f 1e-3 (interior), best ratio the largest: 0.3, where the next step would be 1
    fake, _ = _fake_run(lambda cfg: abs(math.log10(cfg.lr) + 3) - cfg.calibrator_lr / cfg.lr)
    monkeypatch.setattr(runner, "run", fake)
    argv = ["tune", "--method", "cog-fc", "--preset", "paper", "--lrs", "1e-4,1e-3,1e-2"]
    argv += ["--calibrator-ratios"]
    assert main([*argv, "0.1,0.3", "--epochs", "1", "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "(at the ratio < 1 bound)" in out and "still at the grid edge" not in out
    summary = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert summary["best"] == {"lr": 1e-3, "ratio": 0.3} and summary["bounds"] == [RATIO_BOUND]
    assert not summary["at_edge"] and summary["extensions"] == 0


def _selection(edges, best, grid, max_runs=5):
    return {
        "at_edge": True, "edges": edges, "best_config": best, "grid": grid, "max_runs": max_runs,
    }  # fmt: skip


def test_a_choice_at_an_open_edge_warns_with_the_next_point_to_try():
    cog = {"lr": [1e-3, 3e-3, 1e-2], "ratio": [0.1, 0.3]}
    selection = _selection(["lr high", RATIO_BOUND], {"lr": 0.01, "calibrator_lr": 0.003}, cog)
    message = edge_warning(selection)
    assert "(lr 0.01, calibrator lr 0.003) sit at the lr high edge of the grid" in message
    assert "at most 5 runs" in message and "bound" not in message
    # one step beyond on the ladder, the chosen ratio kept
    assert "train with --lr 0.03 --calibrator-lr 0.009 and compare the validation NLL" in message
    assert "`cogcal tune`" in message
    python = edge_warning(selection, python=True)
    assert "`lr=0.03`, `calibrator_lr=0.009`" in python and "cogcal.train.tune" in python
    # two open edges: one point beyond each
    both = _selection(
        ["lr high", "ratio low"], {"lr": 0.01, "calibrator_lr": 0.0003},
        {"lr": [1e-3, 3e-3, 1e-2], "ratio": [0.03, 0.1, 0.3]},
    )  # fmt: skip
    assert "lr high and ratio low edges" in edge_warning(both)
    assert "--lr 0.03 --calibrator-lr 0.0009 or with --lr 0.01 --calibrator-lr 0.0001" in (
        edge_warning(both)
    )
    # the default path delivered cross-entropy + post hoc: the search was COG-FC's side's
    other = {**both, "choice": {"side": "posthoc", "chosen": "ms"}}
    assert edge_warning(other).startswith(
        "COG-FC's side of the default path (the model delivered is cross-entropy + ms, "
        "which beat it): its learning rates chosen by validation cross-entropy (lr 0.01"
    )
    kept = {**both, "choice": {"side": "cog", "chosen": "cog-fc"}}
    assert edge_warning(kept) == edge_warning(both)
    # a one-rate method at its low edge
    low = _selection(["lr low"], {"lr": 1e-4}, {"lr": [1e-4, 3e-4, 1e-3]}, max_runs=3)
    assert "(lr 0.0001) sit at the lr low edge" in edge_warning(low)
    assert "train with --lr 3e-05 and compare" in edge_warning(low)


def test_no_edge_warning_for_an_interior_choice_or_a_bound_alone():
    best = {"lr": 0.003, "calibrator_lr": 0.0009}
    grid = {"lr": [1e-3, 3e-3, 1e-2], "ratio": [0.1, 0.3]}
    assert edge_warning(None) is None
    assert edge_warning({**_selection([], best, grid), "at_edge": False}) is None
    # the ratio's bound is not a grid problem, even in a record that called it an edge
    assert edge_warning(_selection([RATIO_BOUND], best, grid)) is None
    assert edge_warning(_selection([LR_FLOOR_BOUND], {"lr": 1e-8}, {"lr": [1e-8]})) is None
