"""The default path's successive halving: which points stop at which rung, survivors
continued from their checkpoints (not trained again), the record, resuming, the full
search, and the import structure of the selection."""

from __future__ import annotations

import ast
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import cogcal
from cogcal.cli import main
from cogcal.runs import RunDir, load_checkpoint
from cogcal.train import loop
from cogcal.train.config import TrainConfig
from cogcal.train.select import HALVING_RUNGS, _halve, rung_nll, rungs, selection_folder
from cogcal.train.tuning import edge_warning, point_label

SRC = Path(cogcal.__file__).resolve().parent


def _problem(n: int = 600, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _count_epochs(monkeypatch, stop_after: int | None = None) -> list[int]:
    """Count the epochs the training loop runs (every point, every call); with
    ``stop_after``, interrupt the run that would start one more."""
    seen: list[int] = []
    real = loop.epoch_seed

    def counted(seed: int, epoch: int) -> int:
        if stop_after is not None and len(seen) >= stop_after:
            raise KeyboardInterrupt
        seen.append(epoch)
        return real(seed, epoch)

    monkeypatch.setattr(loop, "epoch_seed", counted)
    return seen


def _fit(out: Path, **kwargs):
    x, y = _problem()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # under-trained, and the edge of the grid
        kwargs.setdefault("method", "cog-fc")  # given: COG-FC alone (not weighed)
        return cogcal.fit(
            _net(), (x, y), epochs=6, out=out, progress=False, checkpoint_seconds=0, **kwargs
        )


# --------------------------------------------------------------------------- rungs


@pytest.mark.parametrize("n", [114, 455, 1149, 7680, 40_000])
def test_the_first_rung_is_the_first_decay_of_the_automatic_budget(n):
    config = TrainConfig().with_budget(n)
    plan = rungs(config.epochs)
    assert [keep for _, keep in plan] == [keep for _, keep in HALVING_RUNGS]
    assert plan[0][0] == config.step_size  # a third of the epochs: rates not yet decayed
    assert plan[1][0] == math.ceil(config.epochs / 2)
    assert rungs(config.epochs, "full") == []


def test_rung_nll_is_the_nll_of_the_checkpoint_kept_so_far():
    rows = [
        {"val_brier": 0.4, "val_nll": 1.0},
        {"val_brier": 0.2, "val_nll": 0.7},
        {"val_brier": 0.3, "val_nll": 0.5},  # lower NLL, but not the kept checkpoint
        {"val_brier": 0.1, "val_nll": 0.9},
    ]
    assert [rung_nll(rows, e) for e in (1, 2, 3, 4)] == [1.0, 0.7, 0.7, 0.9]
    assert rung_nll([]) == math.inf and rung_nll(rows[:0], 3) == math.inf


class _Fake:
    """What :func:`_halve` reads of a selection: NLLs per (point, epochs), and advances."""

    zero = False

    def __init__(self, nlls: dict[str, dict[int | None, float]]) -> None:
        self.points = {label: {"lr": float(i)} for i, label in enumerate(nlls)}
        self.labels = {i: label for i, label in enumerate(nlls)}
        self.table = nlls
        self.advanced: list[tuple[str, int | None]] = []

    def nll(self, label: str, epochs: int | None) -> float:
        return self.table[label].get(epochs, math.inf)

    def advance(self, point: dict[str, float], until: int | None) -> None:
        self.advanced.append((self.labels[int(point["lr"])], until))


def test_halving_keeps_the_best_at_each_rung_and_a_diverged_survivor_gives_way():
    inf = math.inf
    fake = _Fake(
        {
            "a": {14: 0.30, 21: 0.25, None: 0.20},
            "b": {14: 0.20, 21: inf},  # the best at rung 1, diverges before rung 2
            "c": {14: 0.40},
            "d": {14: 0.25, 21: 0.22, None: 0.21},
            "e": {14: inf},  # diverged during the search
        }
    )
    record, alive = _halve(fake, [(14, 2), (21, 1)], TrainConfig())
    # rung 1: b, d continue; b diverges on the way, so a (third) takes its place
    assert fake.advanced == [("b", 21), ("d", 21), ("a", 21), ("d", None)]
    assert [e["run"] for e in record[0]["continued"]] == ["b", "d", "a"]
    assert [e["run"] for e in record[0]["stopped"]] == ["c", "e"]
    assert record[0]["stopped"][1]["val_nll"] is None  # diverged: no NLL
    assert [e["run"] for e in record[1]["continued"]] == ["d"]
    assert [(e["run"], e["val_nll"]) for e in record[1]["stopped"]] == [("a", 0.25), ("b", None)]
    assert alive == ["d"] and record[1]["epoch"] == 21


# --------------------------------------------------------------------------- end to end


def test_halving_stops_the_worst_points_and_continues_the_best_from_their_checkpoints(
    tmp_path, monkeypatch
):
    epochs = _count_epochs(monkeypatch)
    out = tmp_path / "run"
    result = _fit(out)
    selection = result.selection
    assert selection["mode"] == "halving" and [r["epoch"] for r in selection["rungs"]] == [2, 3]
    table = {row["run"]: row for row in selection["table"]}
    # every point trained to rung 1 (2 of 6 epochs), the best two to 3, the best one to 6
    assert sorted(row["epochs"] for row in table.values()) == [2] * (len(table) - 2) + [3, 6]
    # the epochs the loop ran: exactly those, none twice (survivors were not retrained)
    assert len(epochs) == selection["epochs_trained"] == sum(r["epochs"] for r in table.values())
    assert selection["run_equivalents"] == pytest.approx(len(epochs) / 6, abs=1e-3)
    stopped = {e["run"]: e for rung in selection["rungs"] for e in rung["stopped"]}
    for run, row in table.items():
        point = RunDir(selection_folder(out) / run)
        if row["status"] == "stopped":  # paused in its folder: unfinished, resumable
            assert run in stopped and row["stopped_at_epoch"] == row["epochs"]
            assert row["val_nll"] is None and stopped[run]["val_nll"] == pytest.approx(
                row[f"rung{1 if row['epochs'] == 2 else 2}_val_nll"]
            )
            assert not point.is_complete() and point.has_state()
            assert (
                load_checkpoint(point.checkpoints / "last.ckpt")["loop"]["epoch"] == row["epochs"]
            )
        else:
            assert row["status"] == "complete" and run == point_label(selection["best"])
    # the rung-1 ranking decided who continued
    first = selection["rungs"][0]
    ranked = first["continued"] + first["stopped"]
    assert [e["val_nll"] for e in ranked] == sorted(e["val_nll"] for e in ranked)
    # the chosen run continued from epoch 3 (its checkpoint), and is the result
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["timing"]["stage1"]["resumed_from_epoch"] == 3
    assert saved["val"]["nll"] == pytest.approx(table[point_label(selection["best"])]["val_nll"])
    x, _ = _problem()
    with torch.no_grad():
        torch.testing.assert_close(
            result.model(x[:5]), cogcal.load_run(out, model=_net()).model(x[:5])
        )
    # the edge warning follows the final choice (here λ_f 1e-2, the top of the grid tried)
    assert selection["at_edge"] and selection["edges"][0] == "lr high"
    assert "train with `lr=0.1`" in edge_warning(selection, python=True)

    # the full search trains every point to the end; its run of the chosen point is the
    # same run, bit for bit: pausing and resuming changed nothing
    epochs.clear()
    full = _fit(tmp_path / "full", selection="full").selection
    assert full["mode"] == "full" and full["rungs"] == []
    assert all(r["status"] == "complete" and r["epochs"] == 6 for r in full["table"])
    assert len(epochs) == full["epochs_trained"] == 6 * full["runs"] > selection["epochs_trained"]
    assert full["best"] == selection["best"]
    same = next(r for r in full["table"] if r["run"] == point_label(selection["best"]))
    assert same["val_nll"] == table[point_label(selection["best"])]["val_nll"]  # exactly
    paused = selection_folder(out) / point_label(selection["best"]) / "logs" / "stage1.csv"
    whole = selection_folder(tmp_path / "full") / point_label(full["best"]) / "logs" / "stage1.csv"
    columns = [line.rsplit(",", 1)[0] for line in paused.read_text().splitlines()]  # not seconds
    assert columns == [line.rsplit(",", 1)[0] for line in whole.read_text().splitlines()]


def test_an_interrupted_halving_resumes_where_it_stopped(tmp_path, monkeypatch):
    """Killed while a survivor continues: the same call with ``resume`` trains only the
    epochs left (checkpoints every epoch here) and ends with the uninterrupted result."""
    reference = _fit(tmp_path / "reference")
    total = reference.selection["epochs_trained"]
    epochs = _count_epochs(monkeypatch, stop_after=total - 2)  # in the chosen run's last part
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path / "run")
    assert len(epochs) == total - 2
    assert not (tmp_path / "run" / "metrics.json").exists()
    monkeypatch.undo()
    epochs = _count_epochs(monkeypatch)
    resumed = _fit(tmp_path / "run", resume=True)
    assert len(epochs) == 2  # nothing trained again
    assert resumed.selection["best"] == reference.selection["best"]
    assert resumed.metrics == reference.metrics
    # and once more: every point is reused, none is trained
    epochs.clear()
    again = _fit(tmp_path / "run", overwrite=True)
    assert epochs == [] and again.metrics == reference.metrics


def test_the_selection_flag_and_its_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--selection" in capsys.readouterr().out
    argv = ["train", "--dataset", "digits", "--selection", "fast", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cogcal: error: --selection must be one of halving, full, got 'fast'."]


# --------------------------------------------------------------------------- structure


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_selection_and_the_runner_do_not_import_each_other():
    """The runner calls the selection (no ``lr``); the selection trains its points through
    the callable it is given, and takes the OOD and shift evaluation from its own module."""
    assert "cogcal.train.select" in _imports(SRC / "train" / "runner.py")
    assert "cogcal.train.runner" not in _imports(SRC / "train" / "select.py")
    for module in ("robustness.py", "tuning.py", "../runs/folder.py", "loop.py"):
        assert not {"cogcal.train.runner", "cogcal.train.select"} & _imports(SRC / "train" / module)
