"""The training loop: one stage of the recipe, readable top to bottom (docs/method.md §1).

:func:`fit_stage` is the whole recipe of one training stage:

* Adam on the parameter groups the method defines (for COG: the network on λ_f, the
  calibrator on λ_c; the calibrator is nothing but a slower parameter group);
* one forward, one backward and one optimizer step per minibatch;
* at the end of every epoch: a check that the training loss stayed finite (before anything
  is saved), a streaming validation pass (Brier, NLL, accuracy, ECE-15; when the stage
  asks, also ``nll_ts``, the NLL after the best temperature:
  :func:`cogcal.metrics.temperature_scaled_nll`), the step schedule
  (every rate divided by 10 every ``step_size`` epochs), best-by-validation-Brier, and a
  checkpoint (:mod:`cogcal.train.checkpoints`: when, how, and how a run resumes);
* stopping: after ``epochs``, once every learning rate has decayed below the 1e-8 floor
  (later steps cannot change the result), or after ``patience`` epochs without a better
  validation Brier score;
* pausing (``stop_at``, the rungs of a learning-rate selection by successive halving,
  :mod:`cogcal.train.select`): after that many epochs the stage saves its state and
  returns unfinished; resumed, it continues exactly as if it had never paused.

Lightning Fabric provides devices, DDP, mixed precision and process launching; the loop
is ours. Progress bar, messages and the CSV log are :class:`_Progress`.
"""

from __future__ import annotations

import csv
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from cogcal.metrics import StreamingMetrics, TemperatureScaledNLL
from cogcal.train.checkpoints import (
    CheckpointWriter,
    LoopState,
    StageCheckpoints,
    finished_stage,
    resume_stage,
)
from cogcal.train.config import LR_FLOOR

__all__ = [
    "NonFiniteLossError",
    "Stage",
    "StageResult",
    "epoch_seed",
    "seed_global_rng",
    "fit_stage",
]

#: The CSV log is flushed at most this often (seconds): on a small model a flush per epoch
#: waits on the checkpoint writer's fsync and costs a visible share of the epoch.
LOG_FLUSH_SECONDS = 2.0


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the run stopped before saving that state."""


# --------------------------------------------------------------------------- the stage


@dataclass
class Stage:
    """What one training stage trains, and how.

    Attributes
    ----------
    name : str
        ``"stage1"`` or ``"stage2"`` (log file name).
    model : nn.Module
        Produces logits (a ``CalibratedModel`` for COG, a backbone, or a frozen body with a
        new head for TST stage 2).
    loss_fn : callable
        ``loss_fn(logits, labels)``.
    param_groups : list of dict
        Optimizer parameter groups (``"params"``, ``"lr"``, optional ``"name"``).
    epochs : int
        Maximum number of epochs.
    step_size : int or None
        Period of the step schedule in epochs (γ = 0.1); None: constant rates.
    patience : int or None
        Epochs without a better validation Brier score before stopping; None: never.
    task : str
        ``"multiclass"`` or ``"multilabel"`` (validation metrics).
    variational : bool
        Train with ``model.forward_with_kl`` and add the KL term (V-TST).
    seed : int
        With the epoch, seeds the global RNG (dropout, V-TST sampling) at each epoch start.
    temperature_nll : bool
        Also log the validation NLL after the best temperature (``val_nll_ts``) each epoch
        (single-label tasks only).
    """

    name: str
    model: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    param_groups: list[dict[str, Any]]
    epochs: int
    step_size: int | None = None
    patience: int | None = None
    task: str = "multiclass"
    variational: bool = False
    seed: int = 0
    temperature_nll: bool = False


@dataclass
class StageResult:
    """What a stage did (recorded under ``timing`` in ``metrics.json``)."""

    seconds: float
    epochs_run: int
    best_epoch: int
    best_val_brier: float
    stopped: str | None = None  # None (all epochs) | "lr_floor" | "patience" | "paused"
    resumed_from_epoch: int | None = None
    history: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> StageResult:
        """The result of a finished stage from its ``done.json`` summary."""
        return cls(**{k: summary[k] for k in cls.__dataclass_fields__ if k in summary})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("history")
        return d


def epoch_seed(seed: int, epoch: int) -> int:
    """The global RNG seed of one epoch, so that a resumed run repeats it exactly."""
    return int(np.random.SeedSequence([seed, epoch, 7]).generate_state(1)[0])


def seed_global_rng(seed: int, device: torch.device | str) -> None:
    """Seed the global RNG that draws on ``device`` (dropout, V-TST samples).

    On the CPU this seeds the CPU generator only: ``torch.manual_seed`` also queues a
    seeding of every CUDA/XPU/MTIA device that a CUDA build of torch might use, formatting
    a stack trace each time (about 100 times slower: docs/performance.md). Elsewhere it is
    ``torch.manual_seed``.
    """
    if torch.device(device).type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def fit_stage(
    fabric: Any,
    stage: Stage,
    train_loader: Any,
    val_loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    folder: Path,
    *,
    writer: CheckpointWriter,
    log_path: Path | None,
    resume: bool = False,
    progress: bool = True,
    channels_last: bool = False,
    checkpoint_seconds: float = 0.0,
    stop_at: int | None = None,
) -> StageResult:
    """Train one stage; on return ``stage.model`` holds its best-validation-Brier weights.

    ``fabric``: a launched Fabric or :class:`~cogcal.train.devices.SingleProcess`; the
    loaders: this process's shards of the training (``set_epoch``, ``len``) and validation
    splits; ``folder``: where ``writer`` puts the checkpoints, at most every
    ``checkpoint_seconds`` (0: every epoch) and after the last epoch; ``resume``: continue
    from ``last.ckpt`` (or skip a finished stage); ``channels_last``: NHWC 4-D inputs.

    ``stop_at``: pause once that many epochs are done (the stage not otherwise over):
    ``last.ckpt`` then holds the state after epoch ``stop_at - 1`` and the result says
    ``stopped="paused"``; ``stage.model`` keeps its last weights and no ``done.json`` is
    written, so a later call with ``resume`` continues the stage exactly.
    """
    if resume and (summary := finished_stage(folder, stage.model)) is not None:
        return StageResult.from_summary(summary)  # the stage finished before an interruption
    model, optimizer, scheduler = _optimizer(fabric, stage)
    resumed = resume and resume_stage(
        folder, stage.model, optimizer, scheduler, repair_best=fabric.is_global_zero
    )  # fmt: skip
    state, history = resumed or (LoopState(), [])
    resumed_from = state.epoch if resumed else None
    saver = StageCheckpoints(
        writer, folder, checkpoint_seconds, model=stage.model, optimizer=optimizer,
        scheduler=scheduler, state=state, history=history,
    )  # fmt: skip
    steps = len(train_loader)
    show = _Progress(stage, steps, state.epoch, log_path, history, enabled=progress,
                     rank0=fabric.is_global_zero)  # fmt: skip
    metrics = StreamingMetrics(task=stage.task, n_bins=(15,)).to(fabric.device)
    scaled = (
        TemperatureScaledNLL() if stage.temperature_nll and stage.task == "multiclass" else None
    )
    started = time.perf_counter()
    paused = False
    with show:
        for epoch in range(state.epoch, stage.epochs) if state.stopped is None else ():
            if stop_at is not None and epoch >= stop_at:
                paused = True  # the state after epoch stop_at - 1 is saved below
                break
            rates = [g["lr"] for g in optimizer.param_groups]
            if max(rates) < LR_FLOOR:  # no later step can change the result
                state.stopped = "lr_floor"
                show.say(f"every learning rate is below {LR_FLOOR:g} ({_rates(rates)})", epoch)
                break
            epoch_start = time.perf_counter()
            seed_global_rng(epoch_seed(stage.seed, epoch), fabric.device)
            train_loader.set_epoch(epoch)  # shuffling and augmentation
            loss_sum = _train_epoch(fabric, stage, model, optimizer, train_loader, show,
                                    channels_last=channels_last)  # fmt: skip
            train_loss = float(fabric.all_reduce(loss_sum, reduce_op="mean")) / max(steps, 1)
            _check_finite(train_loss, epoch, folder, saver.saved_epoch)
            val = _validate(model, val_loader, metrics, scaled, fabric, channels_last, epoch)
            if scheduler is not None:
                scheduler.step()
            improved = val["brier"] < state.best_brier  # the checkpoint kept: best val Brier
            if improved:
                state.best_brier, state.best_epoch, state.bad_epochs = val["brier"], epoch, 0
            else:
                state.bad_epochs += 1
            state.epoch = epoch + 1
            if stage.patience is not None and state.bad_epochs >= stage.patience:
                state.stopped = "patience"  # recorded in this epoch's checkpoint
            history.append(_log_row(epoch, optimizer, rates, train_loss, val, epoch_start))
            saver.epoch_end(improved=improved)
            show.epoch_end(history[-1], val)
            if state.stopped == "patience":
                show.say(f"no better validation Brier since epoch {state.best_epoch}", epoch)
                break
        saver.stage_end()
    fabric.barrier()  # every process has finished the stage (or paused it)
    if paused:  # unfinished: no best weights loaded, no done.json
        return StageResult(
            time.perf_counter() - started, state.epoch, state.best_epoch, state.best_brier,
            "paused", resumed_from, history,
        )  # fmt: skip
    if state.best_epoch < 0:
        raise RuntimeError(f"{stage.name} trained no epoch, so it has no checkpoint in {folder}.")
    saver.load_best(stage.model)
    result = StageResult(
        time.perf_counter() - started, state.epoch, state.best_epoch, state.best_brier,
        state.stopped, resumed_from, history,
    )  # fmt: skip
    writer.write_json(folder / "done.json", result.to_dict())  # after the last checkpoint
    return result


def _optimizer(fabric: Any, stage: Stage) -> tuple[Any, torch.optim.Optimizer, Any]:
    """Adam on the stage's groups (COG's network on λ_f and its calibrator on λ_c), set up
    by ``fabric``, and the step schedule (every rate divided by 10 every ``step_size``
    epochs; None without one): ``(model, optimizer, scheduler)``."""
    model, optimizer = fabric.setup(stage.model, torch.optim.Adam(stage.param_groups))
    if stage.variational and hasattr(model, "mark_forward_method"):  # a Fabric wrapper (DDP):
        model.mark_forward_method("forward_with_kl")  # route V-TST's forward through it
    scheduler = None
    if stage.step_size is not None:
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, stage.step_size, gamma=0.1)
    return model, optimizer, scheduler


def _train_epoch(
    fabric: Any, stage: Stage, model: Any, optimizer: torch.optim.Optimizer, train_loader: Any,
    show: _Progress, *, channels_last: bool,
) -> torch.Tensor:  # fmt: skip
    """One epoch of training: one forward, one backward, one step per minibatch; returns
    the sum of the minibatch losses (on the device: no synchronisation per step)."""
    model.train()
    loss_sum = torch.zeros((), device=fabric.device)
    for x, y in train_loader:
        if channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if stage.variational:
            logits, kl = model.forward_with_kl(x)
            loss = stage.loss_fn(logits, y) + kl
        else:
            loss = stage.loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        fabric.backward(loss)
        optimizer.step()
        loss_sum += loss.detach()
        show.step()
    return loss_sum


def _rates(rates: list[float]) -> str:
    return ", ".join(f"{r:.1e}" for r in rates)


def _check_finite(train_loss: float, epoch: int, folder: Path, saved_epoch: int) -> None:
    """Stop before anything of an epoch whose training loss is not finite is saved."""
    if math.isfinite(train_loss):
        return
    kept = (
        f"{folder.name}/last.ckpt holds epoch {saved_epoch - 1}, the last one written"
        if saved_epoch > 0
        else "no checkpoint had been written yet"
    )
    raise NonFiniteLossError(
        f"the training loss became {train_loss} in epoch {epoch}; the run stopped before "
        f"saving that state ({kept}). Lower the learning rate(s) and retry."
    )


def _log_row(
    epoch: int,
    optimizer: Any,
    rates: list[float],
    train_loss: float,
    val: dict[str, float],
    epoch_start: float,
) -> dict[str, float]:
    """One row of the log: the epoch's rates (per named group), losses and seconds."""
    groups = optimizer.param_groups
    return {
        "epoch": float(epoch),
        **{f"lr_{g.get('name', i)}": r for i, (g, r) in enumerate(zip(groups, rates, strict=True))},
        "train_loss": train_loss,
        **{f"val_{k}": val[k] for k in ("brier", "nll", "acc", "ece_15", "nll_ts") if k in val},
        "seconds": time.perf_counter() - epoch_start,
    }


@torch.no_grad()
def _validate(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    metrics: StreamingMetrics,
    scaled: TemperatureScaledNLL | None,
    fabric: Any,
    channels_last: bool,
    epoch: int,
) -> dict[str, float]:
    """The epoch's validation pass in streaming form; with several processes each streams
    its shard and the sums are added, so every validation sample counts once. Non-finite
    logits end the run as diverged (every process stops together). ``scaled``: also the
    NLL after the best temperature (``nll_ts``)."""
    model.eval()
    metrics.reset()
    if scaled is not None:
        scaled.reset()
    bad = torch.zeros((), device=fabric.device)
    for x, y in loader:
        if channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        z = model(x).float()
        if bool(torch.isfinite(z).all()):
            metrics.update(z, y)
            if scaled is not None:
                scaled.update(z, y)
        else:
            bad += 1
    if float(fabric.all_reduce(bad, reduce_op="sum")) > 0:
        raise NonFiniteLossError(
            f"the validation logits became non-finite in epoch {epoch} (the training loss was "
            "still finite); the run diverged. Lower the learning rate(s) and retry."
        )
    metrics.sync()  # sums over processes (a no-op in a single process)
    if scaled is None:
        return metrics.compute()
    return {**metrics.compute(), "nll_ts": scaled.sync().compute()}


class _Progress:
    """The stage's progress bar (stderr, redrawn at most twice a second), its messages and
    its CSV log (process 0)."""

    def __init__(
        self,
        stage: Stage,
        steps: int,
        epoch: int,
        log_path: Path | None,
        history: list[dict[str, float]],
        *,
        enabled: bool,
        rank0: bool,
    ) -> None:
        self.name = stage.name
        self.bar = tqdm(
            total=stage.epochs * steps, initial=epoch * steps, disable=not (enabled and rank0),
            desc=stage.name, unit="batch", mininterval=0.5, file=sys.stderr, dynamic_ncols=True,
        )  # fmt: skip
        self.log = _EpochLog(log_path if rank0 else None, history)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.bar.refresh()
        self.bar.close()
        self.log.close()

    def step(self) -> None:
        self.bar.update()

    def epoch_end(self, row: dict[str, float], val: dict[str, float]) -> None:
        self.log.write(row)
        self.bar.set_postfix(
            val_brier=f"{val['brier']:.4f}", val_acc=f"{val['acc']:.3f}", refresh=False
        )

    def say(self, why: str, epoch: int) -> None:
        """A stopping message (with the bar only: runs without progress stay silent)."""
        if not self.bar.disable:
            self.bar.write(f"{self.name}: stopping at epoch {epoch}: {why}.", file=sys.stderr)


class _EpochLog:
    """The CSV log, one row per epoch. It starts from the rows saved in the checkpoint a
    run resumes from (so the epochs trained again after a kill are not listed twice and no
    row is lost), and is flushed at most every :data:`LOG_FLUSH_SECONDS` and at the end:
    the log may lag the run by that much, the checkpoints never do."""

    def __init__(self, path: Path | None, rows: list[dict[str, float]]) -> None:
        self._file = None
        self._writer: csv.DictWriter | None = None
        self._flushed = time.monotonic()
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", newline="")
        for row in rows:
            self._write(row)
        self._file.flush()

    def _write(self, row: dict[str, float]) -> None:
        assert self._file is not None
        if self._writer is None:
            self._writer = csv.DictWriter(self._file, fieldnames=list(row), extrasaction="ignore")
            self._writer.writeheader()
        self._writer.writerow({k: (int(v) if k == "epoch" else v) for k, v in row.items()})

    def write(self, row: dict[str, float]) -> None:
        if self._file is None:
            return
        self._write(row)
        if time.monotonic() - self._flushed >= LOG_FLUSH_SECONDS:
            self._file.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
