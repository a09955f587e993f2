"""The default path weighs COG-FC against cross-entropy + post-hoc calibration (issue 41,
docs/method.md §1): the choice by validation NLL (cross-validated for the post-hoc side),
the cross-entropy side's rate (judged by its validation NLL after the best temperature),
its record, the report and predict lines, the chosen run as a valid run of its method, and
a resumed default path that continues the same choice."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cogcal
from cogcal.cli import main
from cogcal.commands.predict import predict
from cogcal.data import load_dataset
from cogcal.posthoc import Calibration
from cogcal.report.run_report import choice_line, health_section
from cogcal.runs import RunDir, RunRecord
from cogcal.runs.checkpoints import CHECKPOINT_FORMAT
from cogcal.train import choice as choice_module
from cogcal.train import loop, robustness
from cogcal.train.choice import (
    COG_SIDE,
    METHOD_GIVEN,
    RATE_RULE,
    choose,
    first_step_lr,
    paired_gain,
    posthoc_rates,
    sides_folder,
    weighs,
)
from cogcal.train.config import TrainConfig, add_arguments, config_from_args
from cogcal.train.select import BASE_RATIO


def _records(cog_nll: float, ce_nll: float = 0.9) -> tuple[dict, dict]:
    cog = {
        "config": {"lr": 1e-2, "calibrator_lr": 1e-3},
        "val": {"nll": cog_nll, "ece_15": 0.05, "acc": 0.9},
    }
    ce = {"config": {"lr": 1e-3}, "val": {"nll": ce_nll, "acc": 0.91}}
    return cog, ce


def _cal(cv: dict[str, float], in_sample: float = 0.01) -> Calibration:
    best = min(cv, key=cv.__getitem__)
    return Calibration(best, nn.Identity(), 3, cv_nll=cv, folds=5, nll_after=in_sample)


# --------------------------------------------------------------------------- the rule


def test_post_hoc_replaces_cog_only_when_clearly_lower():
    cog, ce = _records(0.30)
    low = choose(
        cog, ce, _cal({"ts": 0.25, "vs": 0.27}), {"nll": 0.2, "ece_15": 0.01}, (0.05, 0.01)
    )
    assert (low["chosen"], low["side"]) == ("ts", "posthoc")
    assert low["posthoc"]["val_nll_cv"] == 0.25 and low["cog"]["val_nll"] == 0.30
    assert low["posthoc"]["lr"] == 1e-3 and low["cog"]["calibrator_lr"] == 1e-3
    assert (low["gain"], low["gain_se"]) == (0.05, 0.01)
    # lower, but within two standard errors of the paired difference: COG-FC kept
    noisy = choose(cog, ce, _cal({"ts": 0.25}), {}, (0.05, 0.03))
    assert (noisy["chosen"], noisy["side"]) == (COG_SIDE, "cog")
    assert "not more than 2 standard errors" in noisy["reason"]
    higher = choose(cog, ce, _cal({"ts": 0.35}), {}, (-0.05, 0.001))
    assert higher["side"] == "cog"
    assert choose(cog, ce, _cal({"ts": 0.30}), {}, (0.0, 0.0))["side"] == "cog"  # a tie
    assert "test split is not used" in low["rule"] and "cross-validated" in low["reason"]


def test_the_paired_gain_is_the_cross_validated_nll_difference():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(300) % 3
    z = 4.0 * nn.functional.one_hot(y, 3).double() + torch.randn(
        300, 3, generator=g, dtype=torch.float64
    )
    cal = cogcal.calibrate(z, y, "auto")
    mean, se = paired_gain(z, cal.held_out_nll, y)  # COG-FC's logits: the same, uncalibrated
    nll = float(nn.functional.cross_entropy(z, y))
    assert mean == pytest.approx(nll - cal.cv_nll[cal.method], rel=1e-9) and se > 0
    assert cogcal.calibrate(z, y, "ts").held_out_nll is None  # a method given: no folds


@pytest.mark.parametrize("method", ["ms", "dirichlet", "ts", "isotonic"])
def test_the_held_out_nll_per_sample_are_the_terms_of_the_cross_validated_nll(method):
    """``Calibration.held_out_nll``: each sample's NLL from the fold fit that held it out,
    for a penalised calibrator at the strength its own cross-validation chose (its
    ``cv_sample_nll_``), for the others from ``cross_validated_nll``'s fold fits: the mean
    is the reported ``cv_nll`` exactly."""
    g = torch.Generator().manual_seed(1)
    y = torch.arange(400) % 4
    z = 3.0 * nn.functional.one_hot(y, 4).double() + 1.5 * torch.randn(
        400, 4, generator=g, dtype=torch.float64
    )
    scored = cogcal.calibrate(z, y, "auto", candidates=(method,))
    terms = scored.held_out_nll
    assert terms.shape == (400,) and terms.dtype == torch.float64
    assert bool((terms > 0).all()) and float(terms.mean()) == pytest.approx(
        scored.cv_nll[method], rel=1e-12
    )
    if method in ("ms", "dirichlet"):  # the penalty's cross-validation computed them
        chosen = list(scored.calibrator.l2_grid_).index(scored.calibrator.l2_)
        assert scored.cv_nll[method] == pytest.approx(scored.calibrator.cv_scores_[chosen])


def test_the_paired_gain_agrees_with_the_reported_nlls_on_separable_logits():
    """Unpenalised Dirichlet calibration chosen on a few separable validation samples (the
    wine set's case): refitting the folds at l2=0 reached other points than the
    cross-validation's path did (a held-out NLL of 0.72 against its 0.03), and the paired
    gain contradicted the two NLLs it was reported with. Its terms are the
    cross-validation's own now."""
    g = torch.Generator().manual_seed(3)
    y = torch.arange(30) % 3
    z = 6.0 * nn.functional.one_hot(y, 3).double() + torch.randn(
        30, 3, generator=g, dtype=torch.float64
    )
    cal = cogcal.calibrate(z, y, "auto", cv=2, candidates=("ts", "ms", "dirichlet"))
    cog = 0.5 * z
    mean, _ = paired_gain(cog, cal.held_out_nll, y)
    reported = float(nn.functional.cross_entropy(cog, y)) - cal.cv_nll[cal.method]
    assert mean == pytest.approx(reported, rel=1e-9)


def test_the_post_hoc_side_is_judged_by_its_cross_validated_nll_not_in_sample():
    """A calibrator fitted on validation looks better on validation than it is: its
    in-sample NLL (0.01 here) must not decide."""
    cog, ce = _records(0.30)
    made = choose(cog, ce, _cal({"dirichlet": 0.31}, in_sample=0.01), {"nll": 0.01}, (-0.01, 0.001))
    assert made["side"] == "cog" and made["posthoc"]["val_nll_in_sample"] == 0.01


def test_only_the_default_method_at_the_default_path_is_weighed():
    assert weighs(TrainConfig(), "multiclass")
    assert not weighs(TrainConfig(), "multilabel")
    assert not weighs(TrainConfig(lr=1e-3), "multiclass")
    assert not weighs(TrainConfig(method="ce"), "multiclass")
    assert not weighs(TrainConfig(preset="paper"), "multiclass")
    assert not weighs(TrainConfig(extra={METHOD_GIVEN: True}), "multiclass")
    assert sides_folder("runs/a") == Path("runs/a.sides")


def test_method_given_on_the_command_line_is_marked_and_not_weighed():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = config_from_args(parser.parse_args([]))
    given = config_from_args(parser.parse_args(["--method", "cog-fc"]))
    assert default.method == given.method == "cog-fc"
    assert weighs(default, "multiclass") and not weighs(given, "multiclass")
    assert METHOD_GIVEN not in default.extra and given.extra[METHOD_GIVEN] is True


def test_the_report_line_names_the_choice_and_both_figures():
    cog, ce = _records(0.30)
    made = choose(cog, ce, _cal({"ts": 0.25}), {"nll": 0.2, "ece_15": 0.012}, (0.05, 0.01))
    line = choice_line({"choice": made})
    assert line == (
        "default path: chose cross-entropy + ts by validation NLL (COG-FC 0.3000, ECE-15 "
        "0.0500; cross-entropy at lr 0.001 + ts 0.2500 cross-validated, ECE-15 0.0120 "
        "in-sample)"
    )
    assert choice_line({"table": []}) is None and choice_line(None) is None
    kept = choice_module._kept(cog, "12 validation samples: too few to cross-validate")
    assert choice_line({"choice": kept}) == (
        "default path: COG-FC, validation NLL 0.3000 (12 validation samples: too few to "
        "cross-validate; COG-FC kept)"
    )
    record = RunRecord(config={}, val={}, test={}, selection={"table": [], "choice": made})
    section = health_section(record)
    assert section is not None
    assert any(
        "Default path: chose cross-entropy + ts" in getattr(b, "text", "") for b in section.blocks
    )


# --------------------------------------------------------------------------- end to end, small


def _problem(n: int = 300):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _fit(out: Path, **kwargs):
    x, y = _problem()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # under-trained, the edge of the grid
        return cogcal.fit(
            kwargs.pop("net", None) or _net(), (x, y), epochs=3, out=out,
            progress=kwargs.pop("progress", False), checkpoint_seconds=0, **kwargs,
        )  # fmt: skip


def _force(monkeypatch, side: str) -> None:
    real = choice_module.choose

    def forced(cog, ce, cal, calibrated, gain):
        made = real(cog, ce, cal, calibrated, gain)
        made["side"], made["chosen"] = side, (cal.method if side == "posthoc" else COG_SIDE)
        return made

    monkeypatch.setattr(choice_module, "choose", forced)


@pytest.mark.parametrize("side", ["cog", "posthoc"])
def test_the_chosen_run_is_a_valid_run_of_its_method_with_the_choice_recorded(
    side, tmp_path, monkeypatch
):
    _force(monkeypatch, side)
    out = tmp_path / "run"
    net = _net()
    result = _fit(out, net=net)
    made = result.selection["choice"]
    saved = json.loads((out / "metrics.json").read_text())
    method = saved["config"]["method"]
    assert saved["selection"]["choice"] == made and made["side"] == side
    assert method == (COG_SIDE if side == "cog" else made["posthoc"]["method"])
    assert set(made["posthoc"]["cv_nll"]) >= {"ts", "vs", "ms"}
    assert made["posthoc"]["val_nll_cv"] == min(made["posthoc"]["cv_nll"].values())
    sides = sides_folder(out)
    assert RunDir(sides / "cog-fc").is_complete() and RunDir(sides / "ce").is_complete()
    if side == "posthoc":  # the network is the ce run's, the calibrator fitted on validation
        assert (out / "calibrator.pt").is_file() and saved["val_uncalibrated"][
            "nll"
        ] == pytest.approx(made["posthoc"]["val_nll_uncalibrated"], rel=1e-5)
        assert saved["config"]["lr"] == made["posthoc"]["lr"]
    # load_run, the export and predict apply the chosen model (its calibrator folded in)
    x, _ = _problem()
    loaded = cogcal.load_run(out, model=_net())
    assert loaded.config.method == method
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x[:7]), result.model(x[:7]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(net(x[:7]), result.model.network(x[:7]))  # the caller's
        exported = loaded.model.export()
        torch.testing.assert_close(
            exported(x[:7]).softmax(1), loaded.model(x[:7]).softmax(1), atol=1e-5, rtol=1e-5
        )
    got = predict(loaded, x[:7])
    assert got.notes == [f"{method} model; {choice_line(saved['selection'])}"]


def test_few_validation_samples_of_three_classes_weigh_the_parametric_calibrators():
    """24 validation samples of 3 classes in 2 folds, too few a fold for histogram binning's
    15 bins: the fallback tries the parametric calibrators that take 3 classes (not the
    two-class Platt and Beta, which made the whole weighing fail on wine)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(24) % 3
    z = torch.randn(24, 3, generator=g, dtype=torch.float64) + 3 * F.one_hot(y, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = choice_module._calibrate(z, y, 2)
    tried = set(cal.cv_nll)
    assert {"ts", "vs", "ms"} <= tried and cal.method in tried
    assert not tried & {"platt", "beta", "isotonic", "histogram", "bbq"}


def _logged_nll_ts(point: Path, epochs: int) -> float:
    """The point's validation NLL after the best temperature at its kept checkpoint after
    ``epochs`` epochs, read from its CSV log (the first epoch of lowest validation Brier)."""
    with (point / "logs" / "stage1.csv").open() as f:
        rows = list(csv.DictReader(f))[:epochs]
    kept = min(range(len(rows)), key=lambda i: (float(rows[i]["val_brier"]), i))
    return float(rows[kept]["val_nll_ts"])


def test_the_cross_entropy_side_tries_the_rate_a_temperature_made_best(tmp_path):
    """COG-FC's first-step λ_f with the lowest validation NLL after the best temperature at
    the first rung (read here from the points' CSV logs) is nominated; cross-entropy is
    trained at COG-FC's λ_f and the nominated one (the runner-up when COG-FC's own is
    nominated and the runner-up is lower; COG-FC's alone when it is higher) to the first
    rung, and the better one after a temperature continues to the end."""
    result = _fit(tmp_path / "run")
    made = result.selection["choice"]["posthoc"]
    sides = sides_folder(tmp_path / "run")
    cog = json.loads((sides / "cog-fc" / "metrics.json").read_text())
    selection = cog["selection"]
    at = selection["rungs"][0]["epoch"]
    logged = {
        f"{row['lr']:g}": _logged_nll_ts(Path(selection["folder"]) / row["run"], at)
        for row in selection["table"]
        if row["ratio"] == BASE_RATIO
    }
    rate = made["rate"]
    assert len(logged) >= 2 and rate["epoch"] == at
    assert rate["val_nll_ts"] == pytest.approx(logged, rel=1e-6)
    assert rate["nominated"] == float(min(logged, key=logged.__getitem__))
    own = result.selection["choice"]["cog"]["lr"]
    ranked = [float(lr) for lr in sorted(logged, key=logged.__getitem__)]
    other = ranked[1] if ranked[0] == own else ranked[0]
    if ranked[0] == own and other > own:  # a higher runner-up is not tried
        assert rate["tried"] is None and made["lr"] == rate["lr"] == own
        return
    tried = {  # both to the first rung, the lower NLL after a temperature kept
        f"{lr:g}": _logged_nll_ts(sides / "ce.select" / f"lr{lr:g}", at) for lr in (own, other)
    }
    assert rate["tried"] == pytest.approx(tried, rel=1e-6)
    assert made["lr"] == rate["lr"] == float(min(tried, key=tried.__getitem__))


def test_two_rates_are_tried_to_the_first_rung_and_the_better_after_a_temperature_kept(
    tmp_path, monkeypatch
):
    """COG-FC's λ_f and a nominated one (forced here): cross-entropy trains both to the
    first rung in ``ce.select``, the one with the lower validation NLL after the best
    temperature (read here from the CSV logs) continues to the end and is the side."""
    real = choice_module.posthoc_rates

    def nominate(cog):
        rates, record = real(cog)
        other = 1e-3 if not math.isclose(rates[0], 1e-3) else 1e-2
        return (rates[0], other), {**record, "nominated": other}

    monkeypatch.setattr(choice_module, "posthoc_rates", nominate)
    result = _fit(tmp_path / "run")
    made = result.selection["choice"]["posthoc"]
    rate, sides = made["rate"], sides_folder(tmp_path / "run")
    own = result.selection["choice"]["cog"]["lr"]
    select = json.loads((sides / "ce.select" / "tune.json").read_text())
    assert select["compared_by"] == "val_nll_ts" and select["runs"] == 2
    tried = {
        f"{lr:g}": _logged_nll_ts(sides / "ce.select" / f"lr{lr:g}", rate["epoch"])
        for lr in (own, rate["nominated"])
    }
    assert rate["tried"] == pytest.approx(tried, rel=1e-6)
    best = float(min(tried, key=tried.__getitem__))
    assert made["lr"] == rate["lr"] == best
    ce = json.loads((sides / "ce" / "metrics.json").read_text())
    assert ce["config"]["lr"] == best and RunDir(sides / "ce").is_complete()
    stopped = [r for r in select["table"] if r["status"] == "stopped"]
    assert [f"{r['lr']:g}" for r in stopped] == [max(tried, key=tried.__getitem__)]


def _point(folder: Path, label: str, rows: list[tuple[float, float, float]]) -> None:
    """A point's folder whose last.ckpt holds the log rows (val_brier, val_nll,
    val_nll_ts)."""
    keys = ("val_brier", "val_nll", "val_nll_ts")
    history = [dict(zip(keys, row, strict=True)) for row in rows]
    path = RunDir(folder / label).checkpoints / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save({"format": CHECKPOINT_FORMAT, "history": history}, path)


def test_the_nominated_rate_is_the_first_step_point_a_temperature_made_best(tmp_path):
    """COG-FC chose 3e-4 by its uncalibrated NLL; after a temperature 1e-3 was best at the
    first rung (after 2 epochs, each point read at its kept checkpoint: the lowest
    validation Brier so far): cross-entropy tries 3e-4 and 1e-3. A lower figure at an
    epoch that was not kept, or after the rung, or of a point of the second step (another
    ratio) does not count."""
    folder = tmp_path / "cog-fc.select"
    _point(folder, "lo", [(0.30, 0.40, 0.39), (0.29, 0.38, 0.37), (0.10, 0.20, 0.10)])
    _point(folder, "mid", [(0.25, 0.45, 0.35), (0.26, 0.40, 0.30), (0.20, 0.50, 0.20)])
    _point(folder, "hi", [(0.40, 0.60, 0.34), (0.35, 0.55, 0.36)])
    _point(folder, "ratio", [(0.20, 0.30, 0.20), (0.19, 0.29, 0.19)])
    cog, _ = _records(0.3)
    cog["config"]["lr"] = 3e-4
    cog["selection"] = {
        "folder": str(folder), "rungs": [{"rung": 1, "epoch": 2}],
        "table": [{"lr": 3e-4, "ratio": BASE_RATIO, "run": "lo"},
                  {"lr": 1e-3, "ratio": BASE_RATIO, "run": "mid"},
                  {"lr": 3e-3, "ratio": BASE_RATIO, "run": "hi"},
                  {"lr": 3e-4, "ratio": 0.3, "run": "ratio"}],
    }  # fmt: skip
    rates, rate = posthoc_rates(cog)
    assert rates == (3e-4, 1e-3) and rate["nominated"] == 1e-3 and rate["epoch"] == 2
    assert rate["val_nll_ts"] == {"0.0003": 0.37, "0.001": 0.35, "0.003": 0.36}


@pytest.mark.parametrize(
    ("own", "expected"),
    [(1e-3, (1e-3, 3e-4)), (3e-4, (3e-4,))],
    ids=["lower-runner-up-confirms", "higher-runner-up-not-tried"],
)
def test_cog_fcs_own_nominated_is_confirmed_only_by_a_lower_runner_up(tmp_path, own, expected):
    """COG-FC's own λ_f nominated (lowest NLL after a temperature at the first rung):
    cross-entropy also tries the runner-up when it is a lower rate, and trains once, at
    COG-FC's λ_f, when the runner-up is higher (cross-entropy over-fits at high rates)."""
    folder = tmp_path / "cog-fc.select"
    nll_ts = {1e-4: 0.50, 3e-4: 0.36, 1e-3: 0.35, 3e-3: 0.40}
    if own == 3e-4:  # 3e-4 best, 1e-3 the (higher) runner-up
        nll_ts = {1e-4: 0.50, 3e-4: 0.34, 1e-3: 0.35, 3e-3: 0.40}
    table = []
    for i, (lr, value) in enumerate(nll_ts.items()):
        _point(folder, f"p{i}", [(0.30, 0.40, value)])
        table.append({"lr": lr, "ratio": BASE_RATIO, "run": f"p{i}"})
    cog, _ = _records(0.3)
    cog["config"]["lr"] = own
    cog["selection"] = {"folder": str(folder), "rungs": [{"rung": 1, "epoch": 1}],
                        "table": table}  # fmt: skip
    rates, rate = posthoc_rates(cog)
    assert rates == expected and rate["nominated"] == own


def test_cog_fcs_first_step_lr_is_read_where_the_first_step_compared_its_points():
    """COG-FC's λ_f after its first step: the λ_c/λ_f = 0.1 point with the lowest figure the
    step compared (the first rung's NLL; the final one without halving), the first visited
    on a tie; a second-step point (another ratio) or one without a figure does not count;
    COG-FC's λ_f when nothing is there to read."""
    table = [
        {"lr": 1e-3, "ratio": BASE_RATIO, "rung1_val_nll": 0.40, "val_nll": None},
        {"lr": 3e-3, "ratio": BASE_RATIO, "rung1_val_nll": 0.30, "val_nll": 0.10},
        {"lr": 1e-2, "ratio": BASE_RATIO, "rung1_val_nll": 0.30, "val_nll": 0.20},
        {"lr": 3e-3, "ratio": 0.3, "rung1_val_nll": 0.20, "val_nll": None},
        {"lr": 3e-2, "ratio": BASE_RATIO, "rung1_val_nll": None, "val_nll": None},
    ]
    record = {"config": {"lr": 1e-2}, "selection": {"rungs": [{"epoch": 2}], "table": table}}
    assert first_step_lr(record) == 3e-3  # the later rungs kept 1e-2: not the first step's
    record["selection"]["rungs"] = []
    assert first_step_lr(record) == 3e-3  # without halving: the final NLLs
    assert first_step_lr({"config": {"lr": 1e-2}}) == 1e-2


def test_the_progress_line_names_a_first_step_rate_that_is_not_cog_fcs_final_one():
    """The cross-entropy side's rate is COG-FC's λ_f after its first step; where a later
    rung kept another λ_f, the line says so and names the final one."""
    rate = {"epoch": 2, "first_step_lr": 3e-3, "nominated": 3e-3, "val_nll_ts": {}}
    line = choice_module._rate_text((3e-3,), rate, 1e-2)
    assert line == "lr 0.003, COG-FC's λ_f after its first step; its final λ_f is 0.01"
    assert choice_module._rate_text((3e-3,), rate, 3e-3) == "lr 0.003, COG-FC's λ_f"
    assert choice_module._rate_text((3e-3,), rate) == "lr 0.003, COG-FC's λ_f"  # (early)
    two = choice_module._rate_text((3e-3, 1e-3), {**rate, "val_nll_ts": {"0.003": 0.5}}, 1e-2)
    assert two.startswith("lr 0.003 (COG-FC's λ_f after its first step; its final λ_f is 0.01)")


def test_without_temperature_scaled_figures_the_cross_entropy_side_takes_cog_fcs_rate(
    tmp_path,
):
    """A COG-FC record without a selection, or whose points' logs lack ``val_nll_ts``
    (written before it was logged): cross-entropy trains at COG-FC's λ_f alone."""
    cog, _ = _records(0.3)
    assert posthoc_rates(cog) == ((1e-2,), {
        "rule": RATE_RULE, "epoch": None, "first_step_lr": 1e-2, "nominated": 1e-2,
        "val_nll_ts": {},
    })  # fmt: skip
    folder = tmp_path / "cog-fc.select"
    for label in ("a", "b"):
        RunDir(folder / label).path.mkdir(parents=True)
    cog["selection"] = {
        "folder": str(folder), "rungs": [],
        "table": [{"lr": 3e-3, "ratio": BASE_RATIO, "run": "a"},
                  {"lr": 1e-2, "ratio": 0.3, "run": "b"}],
    }  # fmt: skip
    rates, rate = posthoc_rates(cog)
    assert rates == (1e-2,) and rate["val_nll_ts"] == {"0.003": None}


def test_an_explicit_method_is_trained_alone(tmp_path):
    result = _fit(tmp_path / "run", method="cog-fc")
    assert "choice" not in result.selection and not sides_folder(tmp_path / "run").exists()
    # the NLL after the best temperature is logged only where the default path reads it
    with (tmp_path / "run" / "logs" / "stage1.csv").open() as f:
        assert "val_nll_ts" not in next(csv.reader(f))


def test_an_interrupted_default_path_resumes_the_same_choice(tmp_path, monkeypatch):
    """Killed after the COG side finished (in the cross-entropy side): the same call with
    ``resume`` trains no COG epoch again and ends with the uninterrupted result."""
    reference = _fit(tmp_path / "reference")
    calls: list[str] = []
    real_side = choice_module._side

    def side(cfg, *args, **kwargs):
        calls.append(cfg.method)
        if cfg.method == "ce" and stop[0]:
            raise KeyboardInterrupt
        return real_side(cfg, *args, **kwargs)

    stop = [True]
    monkeypatch.setattr(choice_module, "_side", side)
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path / "run")
    assert calls == ["cog-fc", "ce"] and not (tmp_path / "run" / "metrics.json").exists()
    assert RunDir(sides_folder(tmp_path / "run") / "cog-fc").is_complete()
    stop[0] = False
    epochs: list[int] = []
    real_seed = loop.epoch_seed

    def counted(seed: int, epoch: int) -> int:
        epochs.append(epoch)
        return real_seed(seed, epoch)

    monkeypatch.setattr(loop, "epoch_seed", counted)
    resumed = _fit(tmp_path / "run", resume=True)
    ref_ce = reference.selection["choice"]["posthoc"]
    assert resumed.selection["choice"]["side"] == reference.selection["choice"]["side"]
    assert resumed.selection["choice"]["cog"] == reference.selection["choice"]["cog"]
    assert resumed.selection["choice"]["posthoc"]["cv_nll"] == ref_ce["cv_nll"]
    assert resumed.metrics == reference.metrics
    points = (sides_folder(tmp_path / "run") / "ce.select").glob("*/logs/stage1.csv")
    ce_epochs = sum(len(list(csv.DictReader(log.open()))) for log in points)
    assert len(epochs) == ce_epochs  # the COG side was reused: only the ce side trained
    assert not math.isnan(resumed.metrics["nll"])


_FORKS = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the second process is forked: Linux only"
)


def _trained_by(tmp_path: Path, monkeypatch) -> Path:
    """Record, in a file, the process that trains each cross-entropy side (``_side`` is
    looked up when called, also in a forked process)."""
    real, where = choice_module._side, tmp_path / "ce-pids.txt"

    def side(cfg, *args, **kwargs):
        if cfg.method == "ce":
            with where.open("a") as f:
                f.write(f"{os.getpid()}\n")
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(choice_module, "_side", side)
    return where


@_FORKS
def test_the_cross_entropy_side_trains_in_a_second_process_with_the_same_result(
    tmp_path, monkeypatch
):
    """Where a second process is allowed, the cross-entropy side is started in one as soon
    as COG-FC's first step is over; the choice and every figure are those of the same
    default path trained in one process (one torch thread in both, so that not even the
    float rounding differs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (the second process trains on one)
    try:
        _compare_overlapped_with_serial(tmp_path, monkeypatch)
    finally:
        torch.set_num_threads(threads)


def _compare_overlapped_with_serial(tmp_path: Path, monkeypatch) -> None:
    pids = _trained_by(tmp_path, monkeypatch)
    monkeypatch.setattr(choice_module, "second_process_allowed", lambda accelerator: False)
    serial = _fit(tmp_path / "serial")
    assert {int(p) for p in pids.read_text().split()} == {os.getpid()}
    pids.unlink()
    monkeypatch.setattr(choice_module, "second_process_allowed", lambda accelerator: True)
    overlapped = _fit(tmp_path / "overlapped")
    seen = [int(p) for p in pids.read_text().split()]
    assert len(seen) == 2 and seen[0] != os.getpid() and seen[1] == os.getpid()  # then reused
    made, want = overlapped.selection["choice"], serial.selection["choice"]
    assert {k: v for k, v in made.items() if k != "folder"} == {
        k: v for k, v in want.items() if k != "folder"
    }  # the rule, the choice, its reason, both sides' figures, the rates tried
    assert overlapped.metrics == serial.metrics


@_FORKS
def test_a_failed_second_process_leaves_the_side_to_this_one(tmp_path, monkeypatch, capfd):
    """The cross-entropy side's second process fails (here: any error in it): this process
    says so, trains the side itself and ends with the result of an undisturbed run."""
    monkeypatch.setattr(choice_module, "second_process_allowed", lambda accelerator: True)
    reference = _fit(tmp_path / "reference")
    real, parent = choice_module._side, os.getpid()

    def side(cfg, *args, **kwargs):
        if cfg.method == "ce" and os.getpid() != parent:
            raise RuntimeError("disk full")
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(choice_module, "_side", side)
    capfd.readouterr()
    result = _fit(tmp_path / "run", progress=True)
    err = capfd.readouterr().err
    assert "second process beside COG-FC's search" in err
    assert "second process stopped (exit code 1); training it here" in err
    assert result.selection["choice"]["chosen"] == reference.selection["choice"]["chosen"]
    assert result.metrics == pytest.approx(reference.metrics, rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_digits_at_defaults_end_to_end(tmp_path, capsys, monkeypatch):
    """`cogcal train --dataset digits` without --method: both sides trained, the choice in
    metrics.json, the report and `cogcal predict`'s output; the chosen model's test logits
    are those load_run predicts; the OOD and shift sets evaluated once, on the chosen
    model (the sides leave them to it)."""
    evaluated = []
    real = robustness.evaluate_robustness

    def counted(*args, **kwargs):
        evaluated.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(robustness, "evaluate_robustness", counted)
    monkeypatch.setattr(choice_module, "second_process_allowed", lambda accelerator: False)
    out, data = tmp_path / "run", ["--data-root", str(tmp_path / "data")]
    argv = ["train", "--dataset", "digits", "--epochs", "3", "--no-progress", *data]
    assert main([*argv, "--out", str(out)]) == 0
    saved = json.loads((out / "metrics.json").read_text())
    made = saved["selection"]["choice"]
    assert saved["config"]["method"] == made["chosen"]
    assert saved["ood"] and saved["shift"] and evaluated == [1]
    for side in ("cog-fc", "ce"):
        record = json.loads((sides_folder(out) / side / "metrics.json").read_text())
        assert record["unavailable"]["ood"] == {"all": robustness.DEFERRED}
    assert main(["report", str(out)]) == 0
    assert "Default path: chose" in (out / "report.md").read_text()
    loaded = cogcal.load_run(out)
    data = load_dataset("digits", root=tmp_path / "data")
    with torch.no_grad():
        logits = loaded.model(data.test.x)  # raw inputs: the run's standardisation inside
    with np.load(out / "test_logits.npz") as f:
        torch.testing.assert_close(logits, torch.from_numpy(f["logits"]), rtol=1e-5, atol=1e-5)
    np.save(tmp_path / "x.npy", data.test.x[:20].numpy())
    capsys.readouterr()
    assert main(["predict", str(out), "--input", str(tmp_path / "x.npy")]) == 0
    err = capsys.readouterr().err
    assert f"cogcal: {made['chosen']} model; default path: chose" in err


def test_cog_fc_is_kept_when_cross_entropy_classifies_validation_without_error(tmp_path):
    """Three well-separated clusters: the cross-entropy network classifies every validation
    sample correctly, so no validation NLL can price the confidence a calibrator adds (each
    fitted there only sharpens, its cross-validated NLL toward 0): COG-FC is kept and the
    reason says why; no calibrator is fitted."""
    g = torch.Generator().manual_seed(1)
    y = torch.arange(300) % 3
    x = torch.randn(300, 8, generator=g) + 8.0 * F.one_hot(y, 8).float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = cogcal.fit(
            _net(), (x, y), epochs=3, out=tmp_path / "run", progress=False, checkpoint_seconds=0
        )  # fmt: skip
    made = result.selection["choice"]
    z, labels = RunDir(sides_folder(tmp_path / "run") / "ce").read_logits("val")
    assert (z.argmax(1) == labels).all()  # the premise: no validation error
    assert (made["side"], made["chosen"], made["posthoc"]) == ("cog", COG_SIDE, None)
    assert made["reason"] == (
        f"the cross-entropy network classifies all {labels.size} validation samples "
        "correctly, so no validation NLL can price the confidence a post-hoc calibrator "
        "adds; COG-FC kept"
    )
    assert "no error on the validation split" in made["rule"]
    assert result.config.method == COG_SIDE
