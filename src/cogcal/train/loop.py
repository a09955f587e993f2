"""The training loop: one stage of the recipe, readable top to bottom (docs/method.md §1).

:func:`fit_stage` is the whole recipe of one training stage:

* one forward, one backward and one optimizer step per minibatch (Adam on the parameter
  groups the method defines: for COG the network on λ_f and the calibrator on λ_c; the
  calibrator is nothing but a parameter group);
* at the end of every epoch: a check that the training loss stayed finite (before anything
  is saved), a streaming validation pass (Brier, NLL, accuracy, ECE-15; memory independent
  of the split size), the step schedule (every rate divided by 10 every ``step_size``
  epochs), and a checkpoint: ``last.ckpt`` at most every ``checkpoint_seconds`` and after
  the stage's last epoch, ``best.ckpt`` with it whenever the validation Brier score has
  improved since the previous write (the best weights are kept in memory until then);
* stopping: after ``epochs``, once every learning rate has decayed below the 1e-8 floor
  (later steps cannot change the result), or after ``patience`` epochs without a better
  validation Brier score;
* resume: model, optimizer, schedule, loop counters and the epoch (which seeds the
  shuffling, the augmentation and the global RNG) come back from ``last.ckpt``, so an
  interrupted run ends exactly where an uninterrupted one does (a kill loses at most the
  epochs trained since the last write: they are trained again, identically).

Lightning Fabric provides devices, DDP, mixed precision and process launching; the loop
is ours. Checkpoints are written by a background thread from a CPU copy of the state, in
order and durably (fsync before the rename), so saving overlaps with training; on a small
model whose epochs take milliseconds, writing every epoch would still cost a visible share
of the run (docs/performance.md), hence the time interval.
"""

from __future__ import annotations

import csv
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from cogcal import _io
from cogcal._errors import ArgumentError
from cogcal.metrics import StreamingMetrics
from cogcal.train.config import LR_FLOOR

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "CheckpointWriter",
    "NonFiniteLossError",
    "Stage",
    "StageResult",
    "epoch_seed",
    "seed_global_rng",
    "fit_stage",
    "load_checkpoint",
]

CHECKPOINT_FORMAT = "cogcal-checkpoint/2"
#: The CSV log is flushed at most this often (seconds): on a small model a flush per epoch
#: waits on the checkpoint writer's fsync and costs a visible share of the epoch.
LOG_FLUSH_SECONDS = 2.0
LOG_COLUMNS = ("epoch", "train_loss", "val_brier", "val_nll", "val_acc", "val_ece_15", "seconds")


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the run stopped before saving that state."""


class CheckpointError(ArgumentError):
    """A checkpoint is missing, empty, truncated or not a cogcal checkpoint (a run folder
    the user pointed at that cannot be used: a user error, exit 2 on the command line)."""


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


@dataclass
class StageResult:
    """What a stage did (recorded under ``timing`` in ``metrics.json``)."""

    seconds: float
    epochs_run: int
    best_epoch: int
    best_val_brier: float
    stopped: str | None = None  # None (all epochs) | "lr_floor" | "patience"
    resumed_from_epoch: int | None = None
    history: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("history")
        return d


@dataclass
class _LoopState:
    """Counters saved in every checkpoint."""

    epoch: int = 0  # epochs completed
    best_brier: float = math.inf
    best_epoch: int = -1
    bad_epochs: int = 0
    stopped: str | None = None


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
) -> StageResult:
    """Train one stage; on return ``stage.model`` holds its best-validation-Brier weights.

    Parameters
    ----------
    fabric : lightning_fabric.Fabric or cogcal.train.devices.SingleProcess
        Launched Fabric (devices, strategy, precision), see :func:`cogcal.train.devices.launch`.
    stage : Stage
    train_loader : iterable of (x, y) with ``set_epoch(epoch)`` and ``len()``
        This process's shard of the training split (shuffled per epoch).
    val_loader : iterable of (x, y)
        This process's shard of the validation split (every sample on exactly one process).
    folder : Path
        Where ``last.ckpt``, ``best.ckpt`` and ``done.json`` go.
    writer : CheckpointWriter
        Writes them in the background, in order (the caller closes it, which waits for
        the writes, before it reports the run as complete: see :func:`cogcal.train.run`).
    log_path : Path, optional
        CSV file receiving one row per epoch (rank 0).
    resume : bool
        Continue from ``folder/last.ckpt`` (or skip a stage that already finished).
    progress : bool
        A progress bar on stderr, redrawn at most twice a second.
    channels_last : bool
        Feed 4-D inputs in NHWC layout.
    checkpoint_seconds : float
        Minimum wall time in seconds between two writes of ``last.ckpt`` (0: after every
        epoch). The last epoch of the stage is always written, also when it stops early.
    """
    done = folder / "done.json"
    if resume and done.is_file():  # this stage finished before the interruption
        summary = _io.read_json(done)
        _load_weights(stage.model, folder / "best.ckpt", load_checkpoint(folder / "best.ckpt"))
        return StageResult(
            **{k: summary[k] for k in StageResult.__dataclass_fields__ if k in summary}
        )

    model, optimizer = fabric.setup(stage.model, torch.optim.Adam(stage.param_groups))
    if stage.variational and hasattr(model, "mark_forward_method"):  # a Fabric wrapper (DDP):
        model.mark_forward_method("forward_with_kl")  # route V-TST's forward through it
    scheduler = (
        torch.optim.lr_scheduler.StepLR(optimizer, stage.step_size, gamma=0.1)
        if stage.step_size is not None
        else None
    )
    state = _LoopState()
    history: list[dict[str, float]] = []  # one row per epoch, saved in every checkpoint
    resumed_from = None
    last = folder / "last.ckpt"
    if resume and last.is_file():
        ckpt = load_checkpoint(last)
        _load_weights(stage.model, last, ckpt)
        try:
            optimizer.load_state_dict(ckpt["optimizer"])
        except (ValueError, KeyError) as err:
            raise CheckpointError(
                f"{last} does not fit this run's optimizer ({err}); it was made with other "
                "settings: start over."
            ) from None
        if scheduler is not None and ckpt.get("scheduler") is not None:
            scheduler.load_state_dict(ckpt["scheduler"])
        state = _LoopState(**ckpt["loop"])
        history = [dict(row) for row in ckpt.get("history", [])]
        resumed_from = state.epoch
        if fabric.is_global_zero:
            _restore_best(folder, state, ckpt)
    log = _EpochLog(log_path, history) if fabric.is_global_zero else None
    saver = _Checkpoints(
        writer, folder, checkpoint_seconds, model=stage.model, optimizer=optimizer,
        scheduler=scheduler, state=state, history=history,
    )  # fmt: skip
    metrics = StreamingMetrics(task=stage.task, n_bins=(15,)).to(fabric.device)
    steps = len(train_loader)
    bar = tqdm(
        total=stage.epochs * steps,
        initial=state.epoch * steps,
        disable=not (progress and fabric.is_global_zero),
        desc=stage.name,
        unit="batch",
        mininterval=0.5,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    started = time.perf_counter()
    epochs = range(state.epoch, stage.epochs) if state.stopped is None else range(0)
    try:
        for epoch in epochs:
            rates = [g["lr"] for g in optimizer.param_groups]
            if max(rates) < LR_FLOOR:  # no later step can change the result
                state.stopped = "lr_floor"
                if not bar.disable:
                    bar.write(
                        f"{stage.name}: stopping at epoch {epoch}: every learning rate is below "
                        f"{LR_FLOOR:g} ({', '.join(f'{r:.1e}' for r in rates)}).",
                        file=sys.stderr,
                    )
                break
            epoch_start = time.perf_counter()
            seed_global_rng(epoch_seed(stage.seed, epoch), fabric.device)
            train_loader.set_epoch(epoch)  # shuffling and augmentation
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
                bar.update()
            train_loss = float(fabric.all_reduce(loss_sum, reduce_op="mean")) / max(steps, 1)
            if not math.isfinite(train_loss):  # before anything of this epoch is saved
                kept = (
                    f"{folder.name}/last.ckpt holds epoch {saver.saved_epoch - 1}, the last one "
                    "written"
                    if saver.saved_epoch > 0
                    else "no checkpoint had been written yet"
                )
                raise NonFiniteLossError(
                    f"the training loss became {train_loss} in epoch {epoch}; the run stopped "
                    f"before saving that state ({kept}). Lower the learning rate(s) and retry."
                )
            val = _validate(model, val_loader, metrics, fabric, channels_last, epoch)
            if scheduler is not None:
                scheduler.step()
            improved = val["brier"] < state.best_brier
            if improved:
                state.best_brier, state.best_epoch, state.bad_epochs = val["brier"], epoch, 0
            else:
                state.bad_epochs += 1
            state.epoch = epoch + 1
            if stage.patience is not None and state.bad_epochs >= stage.patience:
                state.stopped = "patience"
            row = {
                "epoch": float(epoch),
                **{
                    f"lr_{g.get('name', i)}": r
                    for i, (g, r) in enumerate(zip(optimizer.param_groups, rates, strict=True))
                },
                "train_loss": train_loss,
                **{f"val_{k}": val[k] for k in ("brier", "nll", "acc", "ece_15")},
                "seconds": time.perf_counter() - epoch_start,
            }
            history.append(row)
            saver.epoch_end(improved=improved)
            if log is not None:
                log.write(row)
            bar.set_postfix(
                val_brier=f"{val['brier']:.4f}", val_acc=f"{val['acc']:.3f}", refresh=False
            )
            if state.stopped == "patience":
                if not bar.disable:
                    bar.write(
                        f"{stage.name}: stopping at epoch {epoch}: no better validation Brier "
                        f"score for {stage.patience} epochs (best: epoch {state.best_epoch}).",
                        file=sys.stderr,
                    )
                break
        saver.stage_end()
        bar.refresh()
    finally:
        bar.close()
        if log is not None:
            log.close()
    fabric.barrier()  # every process has finished the stage
    if state.best_epoch < 0:
        raise RuntimeError(f"{stage.name} trained no epoch, so it has no checkpoint in {folder}.")
    if saver.best_weights is not None:  # the copy best.ckpt was written from
        stage.model.load_state_dict(saver.best_weights)
    else:  # the best epoch is from before a resume
        best = load_checkpoint(folder / "best.ckpt")
        if best["loop"]["best_epoch"] != state.best_epoch:
            raise CheckpointError(
                f"{folder / 'best.ckpt'} holds epoch {best['loop']['best_epoch']} but the run's "
                f"best epoch is {state.best_epoch}; the checkpoints are inconsistent: start over."
            )
        _load_weights(stage.model, folder / "best.ckpt", best)
    result = StageResult(
        seconds=time.perf_counter() - started,
        epochs_run=state.epoch,
        best_epoch=state.best_epoch,
        best_val_brier=state.best_brier,
        stopped=state.stopped,
        resumed_from_epoch=resumed_from,
        history=history,
    )
    writer.write_json(done, result.to_dict())  # after the stage's last checkpoint
    return result


@torch.no_grad()
def _validate(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    metrics: StreamingMetrics,
    fabric: Any,
    channels_last: bool,
    epoch: int,
) -> dict[str, float]:
    """The epoch's validation pass in streaming form; with several processes each streams
    its shard and the sums are added, so every validation sample counts once."""
    model.eval()
    metrics.reset()
    bad = torch.zeros((), device=fabric.device)
    for x, y in loader:
        if channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        z = model(x).float()
        finite = bool(torch.isfinite(z).all())
        if finite:
            metrics.update(z, y)
        else:
            bad += 1
    if float(fabric.all_reduce(bad, reduce_op="sum")) > 0:  # every process stops together
        raise NonFiniteLossError(
            f"the validation logits became non-finite in epoch {epoch} (the training loss was "
            "still finite); the run diverged. Lower the learning rate(s) and retry."
        )
    metrics.sync()  # sums over processes (a no-op in a single process)
    return metrics.compute()


# --------------------------------------------------------------------------- checkpoints


def _cpu_copy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


def _snapshot(
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    state: _LoopState,
    history: list[dict[str, float]],
) -> dict:
    """A CPU copy of everything a resumed run needs (taken at an epoch boundary),
    including the per-epoch log rows so far."""
    return {
        "format": CHECKPOINT_FORMAT,
        "model": _cpu_copy(model.state_dict()),
        "optimizer": _cpu_copy(optimizer.state_dict()),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "loop": asdict(state),
        "history": [dict(row) for row in history],
    }


class _Checkpoints:
    """When a stage writes checkpoints (:class:`CheckpointWriter` writes them).

    ``last.ckpt`` is written at the end of an epoch once ``interval`` seconds have passed
    since the previous write (or the start of the stage), and at the end of the stage if
    its last epoch is not on disk yet. The weights of the best epoch so far are kept in
    memory (:attr:`best_weights`) from the epoch that found them; each write brings
    ``best.ckpt`` up to date: the same file as ``last.ckpt`` when the written epoch is the
    best one, otherwise (the best epoch came between two writes) a file of its own, written
    after ``last.ckpt``, which carries a copy of those weights (``"best"``) so that a run
    killed between the two writes repairs ``best.ckpt`` when it resumes.

    ``model``, ``optimizer``, ``scheduler``, ``state`` and ``history`` are the stage's own
    objects, read at each write.
    """

    def __init__(
        self,
        writer: CheckpointWriter,
        folder: Path,
        interval: float,
        *,
        model: nn.Module,
        optimizer: Any,
        scheduler: Any,
        state: _LoopState,
        history: list[dict[str, float]],
    ) -> None:
        self.writer, self.folder, self.interval = writer, folder, interval
        self._model, self._optimizer, self._scheduler = model, optimizer, scheduler
        self._state, self._history = state, history
        self.best_weights: dict[str, torch.Tensor] | None = None  # found in this session
        self._best_loop: dict[str, Any] | None = None  # the loop counters of that epoch
        self.saved_epoch = state.epoch  # epochs completed in last.ckpt
        self._saved_best = state.best_epoch  # the epoch best.ckpt holds
        self._last_write = time.monotonic()

    def epoch_end(self, *, improved: bool) -> None:
        if self.writer.enabled and time.monotonic() - self._last_write >= self.interval:
            self._write()
        elif improved:  # not written now: keep the best weights until the next write
            self.best_weights = _cpu_copy(self._model.state_dict())
            self._best_loop = asdict(self._state)

    def stage_end(self) -> None:
        """Write the stage's last epoch if it is not on disk yet (the model still holds it:
        no step is taken after the last epoch, whatever stopped the stage)."""
        if self.writer.enabled and self._state.epoch > self.saved_epoch:
            self._write()

    def _write(self) -> None:
        state = self._state
        snapshot = _snapshot(self._model, self._optimizer, self._scheduler, state, self._history)
        is_best = state.best_epoch == state.epoch - 1  # the epoch written is the best one
        if is_best:
            self.best_weights, self._best_loop = snapshot["model"], None
        elif state.best_epoch != self._saved_best:
            snapshot["best"] = {"model": self.best_weights, "loop": self._best_loop}
        self.writer.save(self.folder, snapshot, best=is_best)
        self.saved_epoch, self._saved_best = state.epoch, state.best_epoch
        self._last_write = time.monotonic()


class CheckpointWriter:
    """Writes checkpoints (and the files that must follow them) from a background thread,
    in order, each durably.

    ``save(folder, snapshot, best=...)`` queues a CPU snapshot; the thread writes it to
    ``folder/last.ckpt`` (temporary file, fsync, rename) and then brings ``best.ckpt`` up
    to date: with ``best=True`` (the snapshot is the best epoch) it makes ``best.ckpt`` the
    same file (a hard link renamed into place); when the snapshot carries an earlier best
    epoch (``snapshot["best"]``) it writes that one to ``best.ckpt``. So ``best.ckpt`` is
    never newer than ``last.ckpt``, and a run killed between the two writes repairs
    ``best.ckpt`` when it resumes. ``write_json(path, obj)`` queues a durable JSON file
    behind the checkpoints queued before it (a stage's ``done.json``).

    ``close()`` waits until everything queued is on the disk; a run calls it before it
    writes the record that says it is complete, so the last checkpoint's write overlaps
    with the final evaluation. An error in the thread (disk full) is raised at the next
    ``save``/``write_json`` or at ``close``. A disabled writer (processes other than 0 of a
    multi-process run) writes nothing.
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if enabled:
            self._thread = threading.Thread(target=self._work, name="cogcal-ckpt", daemon=True)
            self._thread.start()

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def save(self, folder: Path, snapshot: dict, *, best: bool) -> None:
        self._submit(lambda: _write_checkpoint(Path(folder), snapshot, best))

    def write_json(self, path: Path, obj: Any) -> None:
        self._submit(lambda: _io.write_json(path, obj))

    def close(self) -> None:
        """Wait for every queued write (a second call does nothing more)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._raise()

    def _submit(self, write: Callable[[], None]) -> None:
        self._raise()
        if self._thread is not None:
            self._queue.put(write)
        elif self.enabled:
            raise RuntimeError("this CheckpointWriter is closed.")

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _work(self) -> None:
        while (write := self._queue.get()) is not None:
            if self._error is not None:
                continue  # stop writing after a failure; the error is raised in the loop
            try:
                write()
            except BaseException as err:  # noqa: BLE001 - handed to the training thread
                self._error = err


def _write_checkpoint(folder: Path, snapshot: dict, best: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    last = _io.save_torch(folder / "last.ckpt", snapshot)
    if best:
        link_atomic(last, folder / "best.ckpt")
    elif "best" in snapshot:
        _write_best(folder, snapshot["best"])


def link_atomic(src: Path, dst: Path) -> None:
    """Make ``dst`` the same file as ``src`` atomically (hard link, else a durable copy)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}link{_io.TMP_SUFFIX}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:  # no hard links on this file system
        _io.write_bytes(tmp, src.read_bytes())
    os.replace(tmp, dst)
    _io.fsync_dir(dst.parent)


def _write_best(folder: Path, best: dict[str, Any]) -> None:
    """Write ``best.ckpt`` from the best epoch's weights and loop counters."""
    _io.save_torch(
        folder / "best.ckpt",
        {"format": CHECKPOINT_FORMAT, "model": best["model"], "loop": best["loop"]},
    )


def _restore_best(folder: Path, state: _LoopState, ckpt: dict[str, Any]) -> None:
    """After a kill between writing ``last.ckpt`` and bringing ``best.ckpt`` up to date:
    make ``best.ckpt`` hold the best epoch ``last.ckpt`` names (the last checkpoint itself,
    or the copy of the best epoch it carries)."""
    last, best = folder / "last.ckpt", folder / "best.ckpt"
    if state.best_epoch == state.epoch - 1:
        if not (best.exists() and os.path.samefile(last, best)):
            link_atomic(last, best)
    elif "best" in ckpt:
        try:
            held = load_checkpoint(best)["loop"]["best_epoch"]
        except (CheckpointError, KeyError):
            held = None
        if held != state.best_epoch:
            _write_best(folder, ckpt["best"])


def _load_weights(model: nn.Module, path: Path, ckpt: dict[str, Any]) -> None:
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, KeyError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"{path} does not fit this run's model ({first}); it was made with another "
            "model or method: start over in a new folder."
        ) from None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a cogcal checkpoint safely (``torch.load(weights_only=True)``).

    Raises
    ------
    CheckpointError
        Missing, empty (0 bytes), truncated or foreign files, each named with the fix.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist.") from None
    if size == 0:
        raise CheckpointError(
            f"checkpoint {path} is empty (0 bytes): the run was interrupted while saving; "
            "delete it and resume (an earlier checkpoint is used), or start over."
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many types for a bad file
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: {detail}); "
            "delete it and resume, or start over."
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} is not a checkpoint of this cogcal version (format "
            f"{ckpt.get('format') if isinstance(ckpt, dict) else type(ckpt).__name__!r}, "
            f"expected {CHECKPOINT_FORMAT!r}); start the run over."
        )
    return ckpt


# --------------------------------------------------------------------------- the log


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
