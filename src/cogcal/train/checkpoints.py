"""Checkpoints of a training stage: when they are written, how, and how a run resumes.

A stage's folder holds ``last.ckpt`` (everything a resumed run needs: model, optimizer,
schedule, loop counters, the per-epoch log rows), ``best.ckpt`` (the best validation-Brier
epoch so far) and, once the stage has finished, ``done.json``.

* :class:`StageCheckpoints` decides *when*: ``last.ckpt`` at the end of an epoch once
  ``interval`` seconds have passed and after the stage's last epoch; the best epoch's
  weights stay in memory until the next write brings ``best.ckpt`` up to date.
* :class:`CheckpointWriter` decides *how*: a background thread writes CPU snapshots in
  order, each durably (temporary file, fsync, rename), so saving overlaps with training.
* :func:`resume_stage` and :func:`finished_stage` bring a stage back from its folder, so an
  interrupted run ends exactly where an uninterrupted one does.
* :func:`cogcal.runs.load_checkpoint` reads any of them safely (``weights_only=True``),
  naming a missing, empty, truncated or foreign file with the fix.

Every checkpoint carries, under ``"config_sha256"``, the digest of the configuration it was
trained with (:func:`cogcal.runs.config_digest`), so that a run resumes and loads
only checkpoints of its own configuration.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cogcal import _io
from cogcal.runs.checkpoints import CHECKPOINT_FORMAT, CheckpointError, load_checkpoint

__all__ = [
    "CheckpointWriter",
    "LoopState",
    "StageCheckpoints",
    "finished_stage",
    "load_weights",
    "resume_stage",
]


@dataclass
class LoopState:
    """The loop's counters, saved in every checkpoint."""

    epoch: int = 0  # epochs completed
    best_brier: float = math.inf
    best_epoch: int = -1
    bad_epochs: int = 0
    stopped: str | None = None  # None | "lr_floor" | "patience"


def resume_stage(
    folder: Path, model: nn.Module, optimizer: Any, scheduler: Any, *, repair_best: bool
) -> tuple[LoopState, list[dict[str, float]]] | None:
    """Load ``folder/last.ckpt`` into the stage's model, optimizer and schedule; return its
    loop counters and log rows (None when the stage has no checkpoint yet).
    ``repair_best`` (process 0) first makes ``best.ckpt`` hold the best epoch it names."""
    last = folder / "last.ckpt"
    if not last.is_file():
        return None
    ckpt = load_checkpoint(last)
    load_weights(model, last, ckpt)
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except (ValueError, KeyError) as err:
        raise CheckpointError(
            f"{last} does not fit this run's optimizer ({err}); it was made with other "
            "settings: start over."
        ) from None
    if scheduler is not None and ckpt.get("scheduler") is not None:
        scheduler.load_state_dict(ckpt["scheduler"])
    state = LoopState(**ckpt["loop"])
    if repair_best:
        _restore_best(folder, state, ckpt)
    return state, [dict(row) for row in ckpt.get("history", [])]


def finished_stage(folder: Path, model: nn.Module) -> dict[str, Any] | None:
    """A stage that finished before an interruption: load its best weights into ``model``
    and return its ``done.json`` summary; None when the stage has not finished."""
    done = folder / "done.json"
    if not done.is_file():
        return None
    load_weights(model, folder / "best.ckpt", load_checkpoint(folder / "best.ckpt"))
    return _io.read_json(done)


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
    state: LoopState,
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


class StageCheckpoints:
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
        state: LoopState,
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

    def load_best(self, model: nn.Module) -> None:
        """Load the stage's best epoch into ``model``: the copy kept in memory, or (the best
        epoch is from before a resume) ``best.ckpt``, checked to hold that epoch."""
        if self.best_weights is not None:  # the copy best.ckpt was written from
            model.load_state_dict(self.best_weights)
            return
        best = load_checkpoint(self.folder / "best.ckpt")
        if best["loop"]["best_epoch"] != self._state.best_epoch:
            raise CheckpointError(
                f"{self.folder / 'best.ckpt'} holds epoch {best['loop']['best_epoch']} but the "
                f"run's best epoch is {self._state.best_epoch}; the checkpoints are "
                "inconsistent: start over."
            )
        load_weights(model, self.folder / "best.ckpt", best)

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

    ``config_sha256`` (the digest of the run's configuration,
    :func:`cogcal.runs.config_digest`) is written into every checkpoint.
    """

    def __init__(self, *, enabled: bool = True, config_sha256: str | None = None) -> None:
        self.enabled = enabled
        self.config_sha256 = config_sha256
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
        if self.config_sha256 is not None:
            snapshot = {**snapshot, "config_sha256": self.config_sha256}
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
        _io.link_or_copy(last, folder / "best.ckpt", atomic=True)
    elif "best" in snapshot:
        _write_best(folder, snapshot["best"], snapshot.get("config_sha256"))


def _write_best(folder: Path, best: dict[str, Any], config_sha256: str | None) -> None:
    """Write ``best.ckpt`` from the best epoch's weights and loop counters."""
    ckpt = {"format": CHECKPOINT_FORMAT, "model": best["model"], "loop": best["loop"]}
    if config_sha256 is not None:
        ckpt["config_sha256"] = config_sha256
    _io.save_torch(folder / "best.ckpt", ckpt)


def _restore_best(folder: Path, state: LoopState, ckpt: dict[str, Any]) -> None:
    """After a kill between writing ``last.ckpt`` and bringing ``best.ckpt`` up to date:
    make ``best.ckpt`` hold the best epoch ``last.ckpt`` names (the last checkpoint itself,
    or the copy of the best epoch it carries)."""
    last, best = folder / "last.ckpt", folder / "best.ckpt"
    if state.best_epoch == state.epoch - 1:
        if not (best.exists() and os.path.samefile(last, best)):
            _io.link_or_copy(last, best, atomic=True)
    elif "best" in ckpt:
        try:
            held = load_checkpoint(best)["loop"]["best_epoch"]
        except (CheckpointError, KeyError):
            held = None
        if held != state.best_epoch:
            _write_best(folder, ckpt["best"], ckpt.get("config_sha256"))


def load_weights(model: nn.Module, path: Path, ckpt: dict[str, Any]) -> None:
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, KeyError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"{path} does not fit this run's model ({first}); it was made with another "
            "model or method: start over in a new folder."
        ) from None
