"""Devices, processes and precision for the training loop: Lightning Fabric, when needed.

The loop (:mod:`cogcal.train.loop`) talks to one object with a handful of Fabric's methods
(``setup``, ``backward``, ``all_reduce``, ``broadcast``, ``barrier`` and the ``device`` /
``world_size`` / ``global_rank`` / ``is_global_zero`` attributes). :func:`launch` returns a
launched ``lightning_fabric.Fabric`` whenever a run needs what Fabric provides — several
processes or nodes (DDP), an accelerator, mixed precision — and otherwise
:class:`SingleProcess`, which does exactly what Fabric does for one CPU process in float32
(nothing but ``loss.backward()``). Importing Lightning Fabric costs about as much start-up
time as importing torch (it loads ``torch._dynamo`` and, when installed, torchmetrics), so
a small CPU run does not pay for it (docs/performance.md); tests run the same loop on both.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cogcal.train.config import ConfigError, TrainConfig

__all__ = ["SingleProcess", "launch", "needs_fabric"]


class SingleProcess:
    """One CPU process in float32: Fabric's single-device strategy, without the import."""

    device = torch.device("cpu")
    world_size = 1
    global_rank = 0
    is_global_zero = True

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        return model, optimizer

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def all_reduce(self, value: Any, reduce_op: str = "mean") -> Any:
        return value

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self) -> None:
        return None


def needs_fabric(config: TrainConfig) -> bool:
    """Whether a run needs Lightning Fabric (several processes, an accelerator other than
    the CPU, or mixed precision)."""
    return (
        config.devices * config.num_nodes > 1
        or config.accelerator != "cpu"
        or config.precision != "32"
        or config.strategy != "auto"
    )


def launch(config: TrainConfig) -> Any:
    """The launched Fabric (or :class:`SingleProcess`) a run of ``config`` trains with."""
    accelerator = config.accelerator
    cuda = torch.cuda.is_available()
    if accelerator == "gpu" and not cuda:
        raise ConfigError(
            lambda n: (
                f"{n('accelerator')} gpu was given but no CUDA GPU is available here; use cpu."
            )
        )
    if config.precision == "16-mixed" and not (
        accelerator == "gpu" or (accelerator == "auto" and cuda)
    ):
        raise ConfigError(
            lambda n: (
                f"{n('precision')} 16-mixed needs a GPU and none is used here; use "
                "bf16-mixed on the CPU."
            )
        )
    if not needs_fabric(config):
        return SingleProcess()
    from lightning_fabric import Fabric  # only here: its import costs seconds (see above)

    fabric = Fabric(
        accelerator=accelerator,
        devices=config.devices,
        num_nodes=config.num_nodes,
        strategy=config.strategy,
        precision="32-true" if config.precision == "32" else config.precision,
    )
    fabric.launch()
    return fabric
