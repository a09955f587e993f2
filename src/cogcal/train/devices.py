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

The processes of a multi-process run (``devices`` x ``num_nodes`` > 1) wait at most
:func:`rendezvous_timeout` seconds (300, or ``$COGCAL_RENDEZVOUS_TIMEOUT``) for each other
to start; a node that never comes (``--num-nodes 2`` on one machine) ends the run with one
line saying so, instead of a wait without end.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import warnings
from typing import Any

import torch
from torch import nn

from cogcal.train.config import ConfigError, TrainConfig

__all__ = ["RENDEZVOUS_TIMEOUT", "SingleProcess", "launch", "needs_fabric", "rendezvous_timeout"]

#: Seconds the processes of a multi-process run wait for each other to start (all nodes
#: and devices), unless the environment variable :data:`RENDEZVOUS_ENV` says otherwise:
#: then the run ends with one line instead of waiting for a node that never comes.
RENDEZVOUS_TIMEOUT = 300.0
RENDEZVOUS_ENV = "COGCAL_RENDEZVOUS_TIMEOUT"
#: The timeout of collective operations once every process has joined (torch's default).
_COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


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

    world = config.devices * config.num_nodes
    strategy: Any = config.strategy
    timeout = rendezvous_timeout() if world > 1 else None
    if timeout is not None:  # every strategy cogcal offers is DDP: wait at most `timeout`
        from lightning_fabric.strategies import DDPStrategy  # with Fabric (start-up time)

        strategy = DDPStrategy(
            timeout=datetime.timedelta(seconds=timeout),
            find_unused_parameters=config.strategy == "ddp_find_unused_parameters_true",
        )
    fabric = Fabric(
        accelerator=accelerator,
        devices=config.devices,
        num_nodes=config.num_nodes,
        strategy=strategy,
        precision="32-true" if config.precision == "32" else config.precision,
    )
    try:
        fabric.launch()
    except Exception as err:
        if timeout is None or not _is_rendezvous_timeout(err):
            raise
        reason = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
        raise ConfigError(
            lambda n: (
                f"the {world} processes of this run ({n('num_nodes')} {config.num_nodes} x "
                f"{n('devices')} {config.devices}) did not all start within {timeout:g} s "
                f"({reason}); start the same "
                "command on every node (NODE_RANK, MASTER_ADDR and MASTER_PORT set, or under "
                f"SLURM or torchrun), or on one machine leave {n('num_nodes')} at 1; "
                f"{RENDEZVOUS_ENV} sets the wait in seconds."
            )
        ) from err
    _restore_collective_timeout()
    return fabric


def rendezvous_timeout() -> float:
    """Seconds the processes of a multi-process run wait for each other to start:
    ``$COGCAL_RENDEZVOUS_TIMEOUT`` when set, else :data:`RENDEZVOUS_TIMEOUT` (300).

    Raises
    ------
    ArgumentError
        The variable is set to something other than a positive number of seconds.

    Examples
    --------
    >>> saved = os.environ.pop("COGCAL_RENDEZVOUS_TIMEOUT", None)
    >>> rendezvous_timeout()
    300.0
    >>> os.environ["COGCAL_RENDEZVOUS_TIMEOUT"] = "20"
    >>> rendezvous_timeout()
    20.0
    >>> del os.environ["COGCAL_RENDEZVOUS_TIMEOUT"]
    >>> if saved is not None: os.environ["COGCAL_RENDEZVOUS_TIMEOUT"] = saved
    """
    text = os.environ.get(RENDEZVOUS_ENV, "").strip()
    if not text:
        return RENDEZVOUS_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ConfigError(
            lambda n: (
                f"{RENDEZVOUS_ENV}={text!r}: expected a positive number of seconds (the wait "
                f"for every process of a multi-process run to start; default "
                f"{RENDEZVOUS_TIMEOUT:g})."
            )
        )
    return value


def _is_rendezvous_timeout(err: BaseException) -> bool:
    """Whether ``err`` is torch's store timing out while the processes gather."""
    dist_error = getattr(torch.distributed, "DistError", None)
    text = str(err).lower()
    return (dist_error is not None and isinstance(err, dist_error)) or (
        isinstance(err, RuntimeError) and ("timed out" in text or "timeout" in text)
    )


def _restore_collective_timeout() -> None:
    """Every process has joined: collectives get torch's default timeout again, so a long
    evaluation on one process is not cut short by the rendezvous timeout."""
    dist = torch.distributed
    set_timeout = getattr(dist, "set_timeout", None) or getattr(
        dist.distributed_c10d, "_set_pg_timeout", None
    )  # public in recent torch, private before
    if set_timeout is None or not dist.is_initialized():
        return
    with contextlib.suppress(Exception), warnings.catch_warnings():  # best effort
        warnings.simplefilter("ignore")
        set_timeout(_COLLECTIVE_TIMEOUT)
