"""The Lightning side of training: one module for every method and stage, and callbacks.

The recipe in one screen (SPEC §1): Adam on the parameter groups the method defines (COG:
network on λ_f, calibrator on λ_c; baselines: one group), optional StepLR dividing every
group's learning rate by 10 every ``step_size`` epochs, the training loss of the method on
each minibatch, and validation Brier / NLL / accuracy computed in streaming form at the end
of every epoch for checkpoint selection (best validation Brier).

Each ``training_step`` call runs ``steps_per_call`` minibatches in a row (8 by default), as
Keras' ``steps_per_execution`` does: the trainer's bookkeeping between calls (hooks, batch
transfer, progress counters) is paid once per group instead of once per minibatch, which
matters for small models (docs/performance.md). The optimizer still steps once per
minibatch, in the same order, so the result does not depend on ``steps_per_call`` (tested).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from cogcal import _io
from cogcal.metrics import StreamingMetrics
from cogcal.train.config import LR_FLOOR

__all__ = [
    "CalibrationModule",
    "FrozenBodyHead",
    "LearningRateFloor",
    "ProgressBar",
    "AtomicCheckpointIO",
    "NonFiniteLossError",
]


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; the run stops before saving that state."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written atomically (temporary file, then rename) and read with
    ``torch.load(weights_only=True)``: a crash never leaves a truncated checkpoint, and a
    checkpoint cannot execute code when loaded."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        # atomic (rename) but not fsynced: rewritten every epoch, a flush each time would
        # cost more than a small model's epoch
        _io.save_torch(path, checkpoint, fsync=False)

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return load_checkpoint(path)


def load_checkpoint(path: Any) -> dict[str, Any]:
    """Load a checkpoint safely; a missing, truncated or foreign file raises ``ValueError``."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"checkpoint {path} does not exist.") from None
    except Exception as err:  # noqa: BLE001 - torch raises many types for a bad file
        raise ValueError(
            f"checkpoint {path} is corrupt or not a cogcal checkpoint ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]}); delete it (and resume from another) or start "
            "over with --overwrite."
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"checkpoint {path} has no 'state_dict': not a cogcal checkpoint.")
    return ckpt


def epoch_seed(seed: int, epoch: int) -> int:
    """The global RNG seed of one epoch, so that a resumed run repeats it exactly."""
    return int(np.random.SeedSequence([seed, epoch, 7]).generate_state(1)[0])


class MinibatchGroups:
    """A train loader's minibatches in lists of ``k`` (the last list may be shorter): what
    Lightning iterates, one ``training_step`` call per list."""

    def __init__(self, loader: Any, k: int) -> None:
        self.loader = loader
        self.k = k

    def __len__(self) -> int:
        return -(-len(self.loader) // self.k)

    def __iter__(self) -> Iterator[list[Any]]:
        batches = iter(self.loader)  # at the first next(), like the loader's own epoch read
        while group := list(itertools.islice(batches, self.k)):
            yield group


class FrozenBodyHead(nn.Module):
    """Stage 2 of TST / V-TST: a frozen body (eval mode, BatchNorm statistics frozen) and a
    new trainable head on its features.

    ``body`` must follow the backbone head contract (``forward_features``).
    """

    def __init__(self, body: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.head = head
        for p in self.body.parameters():
            p.requires_grad_(False)
        self.body.eval()

    def train(self, mode: bool = True) -> FrozenBodyHead:
        super().train(mode)
        self.body.eval()  # BatchNorm statistics never drift (the original TST code let them)
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.body.forward_features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def forward_with_kl(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head.forward_with_kl(self.features(x))


class CalibrationModule(L.LightningModule):
    """Trains ``model`` with ``loss_fn`` on the given parameter groups.

    Parameters
    ----------
    model : nn.Module
        Produces logits (a ``CalibratedModel`` for COG, a backbone, or a
        :class:`FrozenBodyHead`).
    loss_fn : callable
        ``loss_fn(logits, labels)`` (already validated data; hot path).
    param_groups : callable
        Returns the optimizer parameter groups (called in ``configure_optimizers``).
    step_size : int or None
        StepLR period in epochs (γ = 0.1), or None for a constant learning rate.
    task : str
        ``"multiclass"`` or ``"multilabel"`` (validation metrics).
    variational : bool
        Train with ``model.forward_with_kl`` and add the KL term (V-TST stage 2).
    steps_per_call : int
        Minibatches per ``training_step`` call (see the module docstring); any value gives
        the same result.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        param_groups: Callable[[], list[dict[str, Any]]],
        step_size: int | None,
        task: str = "multiclass",
        variational: bool = False,
        loaders: Callable[[int, int], tuple[Any, Any]] | None = None,
        channels_last: bool = False,
        steps_per_call: int = 1,
    ) -> None:
        super().__init__()
        if isinstance(steps_per_call, bool) or not isinstance(steps_per_call, int):
            raise TypeError(f"steps_per_call must be an int, got {steps_per_call!r}.")
        if steps_per_call < 1:
            raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}.")
        self.steps_per_call = steps_per_call
        self.automatic_optimization = False  # see training_step
        self._loaders = loaders
        self.channels_last = channels_last
        self._train_loader: Any = None
        self._val_loader: Any = None
        self.model = model
        self.loss_fn = loss_fn
        self._param_groups = param_groups
        self.step_size = step_size
        self.task = task
        self.variational = variational
        self.val_metrics = StreamingMetrics(task=task, n_bins=(15,))
        self._loss_sum = torch.zeros(())
        self._loss_count = 0
        self._stopped_at_floor = False
        self._epoch_lrs: dict[str, float] = {}
        self._val_extra: dict[str, float] = {}
        self.seed = 0  # set by the runner; with the epoch it seeds the global RNG

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    # -- data: built once the process knows its rank (multi-device training) -------------
    def attach_data(
        self, loaders: Callable[[int, int], tuple[Any, Any]], *, channels_last: bool = False
    ) -> None:
        """Set the ``(world_size, rank) -> (train_loader, val_loader)`` factory and layout."""
        self._loaders = loaders
        self._train_loader = self._val_loader = None
        self.channels_last = channels_last

    def _build_loaders(self) -> None:
        if self._train_loader is None:
            if self._loaders is None:
                raise RuntimeError("CalibrationModule was built without `loaders`.")
            world, rank = self.trainer.world_size, self.trainer.global_rank
            self._train_loader, self._val_loader = self._loaders(world, rank)

    def train_dataloader(self) -> MinibatchGroups:
        self._build_loaders()
        return MinibatchGroups(self._train_loader, self.steps_per_call)

    @property
    def train_batches(self) -> int:
        """Minibatches per training epoch on this process (the progress bar's total)."""
        self._build_loaders()
        return len(self._train_loader)

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        # the loaders already place their tensors on the training device: skip Lightning's
        # generic walk over the group unless something is elsewhere
        if all(t.device == device for pair in batch for t in pair):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # -- training -----------------------------------------------------------------------
    def on_train_start(self) -> None:
        self._optimizer = self.optimizers()  # looked up once, not at every step

    def on_train_epoch_start(self) -> None:
        # dropout and V-TST sampling draw from the global RNG: reseed per epoch so a run
        # resumed from a checkpoint repeats the uninterrupted run exactly
        torch.manual_seed(epoch_seed(self.seed, self.current_epoch))
        if self._train_loader is not None:  # shuffling and augmentation seeded by the epoch
            self._train_loader.set_epoch(self.current_epoch)
        self._loss_sum = torch.zeros((), device=self.device)
        self._loss_count = 0
        groups = self.trainer.optimizers[0].param_groups
        self._epoch_lrs = {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(groups)}

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.ndim == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def training_step(
        self, batches: list[tuple[torch.Tensor, torch.Tensor]], batch_idx: int
    ) -> None:
        # The recipe, per minibatch: one forward, one backward, one step of every parameter
        # group (COG: network on λ_f, calibrator on λ_c). Written out (Lightning's manual
        # optimisation) because the automatic closure costs more than a small model's step.
        optimizer = self._optimizer
        for x, y in batches:
            x = self._input(x)
            if self.variational:
                logits, kl = self.model.forward_with_kl(x)
                loss = self.loss_fn(logits, y) + kl
            else:
                loss = self.loss_fn(self.model(x), y)
            optimizer.zero_grad(set_to_none=True)
            self.manual_backward(loss)
            optimizer.step()
            self._loss_sum += loss.detach()
            self._loss_count += 1

    def on_train_epoch_end(self) -> None:
        self._check_finite_loss()  # before validation, and before any checkpoint is saved
        self._validate()
        scheduler = self.lr_schedulers()
        if scheduler is not None:  # StepLR counts epochs; saved with the checkpoint
            scheduler.step()
        # One row for the CSV log, written straight to the logger: only the monitored and
        # displayed values go through self.log, whose bookkeeping costs ~1 ms a value.
        row: dict[str, float] = {"epoch": float(self.current_epoch), **self._epoch_lrs}
        if self._loss_count:
            loss = self._loss_sum / self._loss_count
            if self.trainer.world_size > 1:
                loss = self.trainer.strategy.reduce(loss, reduce_op="mean")
            row["train_loss"] = float(loss)
        row.update(self._val_extra)
        if self.logger is not None and self.trainer.is_global_zero:
            self.logger.log_metrics(row, step=self.global_step)

    def _check_finite_loss(self) -> None:
        """Stop before this epoch's weights reach a checkpoint if the loss diverged."""
        if self._loss_count and not bool(torch.isfinite(self._loss_sum)):
            raise NonFiniteLossError(
                f"the training loss became {float(self._loss_sum)} in epoch {self.current_epoch}; "
                "the run stopped before saving that state, so checkpoints/last.ckpt and "
                "best.ckpt hold the last good epoch. Lower --lr (or --calibrator-lr) and retry."
            )

    # -- validation ---------------------------------------------------------------------
    @torch.no_grad()
    def _validate(self) -> None:
        """The validation pass of the epoch, in streaming form (memory O(bins x classes)).

        It runs at the end of every training epoch, before the checkpoint callbacks (which
        monitor ``val_brier``); each process streams its shard and the sums are all-reduced,
        so every validation sample counts once. Done here rather than in Lightning's
        evaluation loop, whose fixed cost per epoch exceeds a small model's whole pass.
        """
        self._build_loaders()
        was_training = self.model.training
        self.model.eval()
        self.val_metrics.reset()
        self.val_metrics.to(self.device)
        for x, y in self._val_loader:
            x, y = x.to(self.device), y.to(self.device)
            self.val_metrics.update(self.model(self._input(x)).float(), y)
        self.model.train(was_training)
        state = self.val_metrics.state_dict()
        if self.trainer.world_size > 1:  # sums over processes: merge by all-reduce
            state = {k: self.trainer.strategy.reduce(v, reduce_op="sum") for k, v in state.items()}
            self.val_metrics.load_state_dict(state)
        m = self.val_metrics.compute()
        self.log("val_brier", m["brier"], prog_bar=True)  # monitored: checkpoints, early stop
        self.log("val_acc", m["acc"], prog_bar=True)
        self._val_extra = {f"val_{k}": m[k] for k in ("brier", "acc", "nll", "ece_15")}

    # -- optimisation ---------------------------------------------------------------------
    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self._param_groups())
        if self.step_size is None:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, self.step_size, gamma=0.1)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"},
        }

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        if self._stopped_at_floor:
            return -1  # skip the rest of the epoch: updates below the floor change nothing
        return None


class LearningRateFloor(L.Callback):
    """Stop once every learning rate has decayed below ``floor`` (SPEC §1), and say so."""

    def __init__(self, floor: float = LR_FLOOR) -> None:
        self.floor = floor
        self.stopped_epoch: int | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        lrs = [g["lr"] for opt in trainer.optimizers for g in opt.param_groups]
        if lrs and max(lrs) < self.floor:
            self.stopped_epoch = trainer.current_epoch
            trainer.should_stop = True
            if isinstance(pl_module, CalibrationModule):
                pl_module._stopped_at_floor = True
            rank_zero_info(
                f"Stopping early at epoch {trainer.current_epoch}: every learning rate is below "
                f"{self.floor:g} ({', '.join(f'{lr:.1e}' for lr in lrs)}); later steps cannot "
                "change the result."
            )

    def state_dict(self) -> dict[str, Any]:
        return {"stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stopped_epoch = state_dict.get("stopped_epoch")


class ProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar, counting minibatches (not ``training_step`` calls) and redrawn at
    most every ``interval`` seconds (and at the end of each epoch): a redraw costs about as
    much as a small model's step, so a step-count refresh rate would slow tiny models down.

    The validation values it shows are those of the last finished epoch; the module
    validates after the bar's end-of-epoch redraw, so the bar is redrawn once more when
    training ends, to show the final epoch's.
    """

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(refresh_rate=1)
        self.interval = interval
        self._last_draw = 0.0

    @property
    def total_train_batches(self) -> int | float:
        module = self.trainer.lightning_module
        if isinstance(module, CalibrationModule):
            return module.train_batches
        return super().total_train_batches

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        bar = self.train_progress_bar
        if bar.disable:
            return
        n = (batch_idx + 1) * getattr(pl_module, "steps_per_call", 1)
        if bar.total is not None:
            n = min(n, bar.total)
        now = time.monotonic()
        if n == bar.total or now - self._last_draw >= self.interval:
            self._last_draw = now
            bar.n = n
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # redraws

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
        super().on_train_end(trainer, pl_module)
