"""When the training loop writes checkpoints (``checkpoint_seconds``), and that ``best.ckpt``
always ends up holding the best epoch, also after a kill between the two writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import cogcal.train.checkpoints as ckpts
import cogcal.train.loop as loop
from cogcal.cli import main
from cogcal.metrics import StreamingMetrics
from cogcal.train import TrainConfig, run
from cogcal.train.config import ConfigError, result_fields


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


def _epochs(folder: Path, improvements: list[bool], interval: float) -> list[torch.Tensor]:
    """Drive the checkpoint policy through epochs whose weights are all different; return
    the weights of each epoch."""
    model = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    state = ckpts.LoopState()
    weights = []
    with ckpts.CheckpointWriter() as writer:
        saver = ckpts.StageCheckpoints(
            writer, folder, interval, model=model, optimizer=optimizer, scheduler=None,
            state=state, history=[],
        )  # fmt: skip
        for epoch, improved in enumerate(improvements):
            with torch.no_grad():
                model.weight.fill_(float(epoch))
            weights.append(model.weight.detach().clone())
            if improved:
                state.best_epoch = epoch
            state.epoch = epoch + 1
            saver.epoch_end(improved=improved)
        saver.stage_end()
    return weights


def _count_writes(monkeypatch) -> list[str]:
    written: list[str] = []
    real = ckpts._io.save_torch

    def counting(path, obj, **kw):
        written.append(Path(path).name)
        return real(path, obj, **kw)

    monkeypatch.setattr(ckpts._io, "save_torch", counting)
    return written


@pytest.mark.parametrize(
    ("interval", "writes"),
    [
        (0.0, ["last.ckpt"] * 5),  # every epoch; best.ckpt is a link to the best one
        (math.inf, ["last.ckpt", "best.ckpt"]),  # once, at the end; best epoch 2 on its own
    ],
)
def test_best_ckpt_holds_the_best_epoch_whatever_the_interval(
    interval, writes, tmp_path, monkeypatch
):
    written = _count_writes(monkeypatch)
    weights = _epochs(tmp_path, [True, False, True, False, False], interval)
    assert written == writes
    last = ckpts.load_checkpoint(tmp_path / "last.ckpt")
    best = ckpts.load_checkpoint(tmp_path / "best.ckpt")
    assert last["loop"]["epoch"] == 5 and torch.equal(last["model"]["weight"], weights[4])
    assert best["loop"]["best_epoch"] == 2 and torch.equal(best["model"]["weight"], weights[2])


def test_a_last_epoch_that_is_the_best_is_linked_not_written_twice(tmp_path, monkeypatch):
    written = _count_writes(monkeypatch)
    weights = _epochs(tmp_path, [True, False, True, False, True], math.inf)
    assert written == ["last.ckpt"]
    assert (tmp_path / "best.ckpt").samefile(tmp_path / "last.ckpt")
    best = ckpts.load_checkpoint(tmp_path / "best.ckpt")
    assert "best" not in best and torch.equal(best["model"]["weight"], weights[4])


def test_a_kill_between_last_and_best_is_repaired_on_resume(tmp_path, monkeypatch):
    class Killed(Exception):
        pass

    def killed(*args):
        raise Killed

    _epochs(tmp_path, [True, False, False], 0.0)  # best.ckpt: epoch 0
    monkeypatch.setattr(ckpts, "_write_best", killed)
    with pytest.raises(Killed):  # the process dies after last.ckpt, before best.ckpt
        _epochs(tmp_path, [True, False, True, False], math.inf)
    monkeypatch.undo()
    ckpt = ckpts.load_checkpoint(tmp_path / "last.ckpt")
    assert ckpts.load_checkpoint(tmp_path / "best.ckpt")["loop"]["best_epoch"] == 0  # stale
    ckpts._restore_best(tmp_path, ckpts.LoopState(**ckpt["loop"]), ckpt)
    best = ckpts.load_checkpoint(tmp_path / "best.ckpt")
    assert best["loop"]["best_epoch"] == 2
    assert torch.equal(best["model"]["weight"], torch.full((2, 2), 2.0))


def _fake_brier(monkeypatch, values: list[float]) -> None:
    """Validation Brier scores per epoch (the best epoch is not the last one)."""
    real = StreamingMetrics.compute
    calls = {"n": 0}

    def scripted(self):
        out = {**real(self), "brier": values[calls["n"] % len(values)]}
        calls["n"] += 1
        return out

    monkeypatch.setattr(StreamingMetrics, "compute", scripted)


@pytest.mark.slow
def test_results_and_resume_do_not_depend_on_the_interval(data_root, tmp_path, monkeypatch):
    base = dict(method="cog-ts", preset="paper", epochs=4, data_root=str(data_root), progress=False)
    _fake_brier(monkeypatch, [0.5, 0.4, 0.45, 0.47])
    every = run(TrainConfig(**base, out=str(tmp_path / "every"), checkpoint_seconds=0))
    assert every["timing"]["stage1"]["best_epoch"] == 1
    written = _count_writes(monkeypatch)
    once = run(TrainConfig(**base, out=str(tmp_path / "once"), checkpoint_seconds=1e9))
    assert written.count("last.ckpt") == 1  # the stage's last epoch only
    assert once["test"] == every["test"]

    # killed between writing last.ckpt and best.ckpt: --resume repairs best.ckpt
    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpts, "_write_best", killed)
    out = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        run(TrainConfig(**base, out=str(out), checkpoint_seconds=1e9))
    monkeypatch.undo()  # the real writes (and validation) again
    assert not (out / "metrics.json").exists()
    resumed = run(TrainConfig(**base, out=str(out), checkpoint_seconds=1e9), resume=True)
    assert resumed["test"] == every["test"]
    assert ckpts.load_checkpoint(out / "checkpoints" / "best.ckpt")["loop"]["best_epoch"] == 1


def test_checkpoint_seconds_is_checked_and_changes_no_result():
    with pytest.raises(
        ConfigError, match="`checkpoint_seconds` must be a finite number of seconds >= 0"
    ):
        TrainConfig(checkpoint_seconds=-1)
    with pytest.raises(ConfigError, match="got inf"):
        TrainConfig(checkpoint_seconds=math.inf)
    a, b = TrainConfig(checkpoint_seconds=0), TrainConfig(checkpoint_seconds=60)
    assert result_fields(a.resolved()) == result_fields(b.resolved())


def test_checkpoint_seconds_flag(tmp_path, capsys):
    assert main(["train", "--checkpoint-seconds", "-2", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint-seconds must be a finite number of seconds >= 0" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "r" / "metrics.json").exists()
    assert json.dumps(TrainConfig().resolved()["checkpoint_seconds"]) == "30.0"


def test_seed_global_rng_seeds_the_cpu_generator_as_torch_manual_seed_does():
    torch.manual_seed(123)
    expected = torch.rand(5), torch.randn(3)
    torch.manual_seed(0)
    loop.seed_global_rng(123, "cpu")
    drawn = torch.rand(5), torch.randn(3)
    assert all(torch.equal(a, b) for a, b in zip(expected, drawn, strict=True))
    loop.seed_global_rng(123, torch.device("cpu"))
    assert torch.equal(torch.rand(5), expected[0])
