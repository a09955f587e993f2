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

Ctrl-C (or SIGTERM to the process group) ends a multi-process run with the one line
``cogcal: interrupted (SIGINT)`` and the exit status 130 (143), as a single process does: the
processes other than 0 end silently (:func:`_quiet_when_interrupted`), and Lightning's
watcher of the child processes, which would SIGKILL the main process ("Forcefully
terminating") as soon as a child exits non-zero, is replaced by :class:`_ChildWatcher`, which
takes a child's interruption for the run's: when the main process does not handle the
signal itself within :data:`_GRACE` seconds (it may be waiting in C code, e.g. for the other
processes to join, where Python's handlers cannot run), the watcher stops the other children
with SIGTERM, prints the one line and ends the main process with ``128 + signal``. A run
started with SIGINT or SIGTERM ignored (``nohup ... &``) ignores it in every process.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cogcal._errors import QUIET_EXIT, other_rank
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
        with _interruptible_children() if world > 1 else contextlib.nullcontext():
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


# ---------------------------------------------------------------------- interruptions

#: The exit status of a process other than 0 that ends quietly on signal ``n``:
#: ``_QUIET + n`` (:func:`_quiet_when_interrupted`); the main process then prints the line.
_QUIET = QUIET_EXIT
#: Exit statuses of an interrupted child process: its signal, and whether the child printed
#: ``cogcal: interrupted`` itself (128 + n: interrupted before it was quiet, while importing).
_INTERRUPTED = {
    128 + signal.SIGINT: (signal.SIGINT, True), 128 + signal.SIGTERM: (signal.SIGTERM, True),
    _QUIET + signal.SIGINT: (signal.SIGINT, False), _QUIET + signal.SIGTERM: (signal.SIGTERM, False),
    -signal.SIGINT: (signal.SIGINT, False), -signal.SIGTERM: (signal.SIGTERM, False),
}  # fmt: skip
#: Seconds the watcher gives the main process to handle the signal itself.
_GRACE = 1.0
#: Seconds after which a main process that handled the interruption but still has not
#: ended (waiting on the children it lost) is ended, silently (it printed the line).
_HANDLED_LIMIT = 30.0
#: Seconds between two looks at the child processes.
_POLL = 0.2


class _Interruption:
    """Who ends the run on an interruption: the main thread's handler (``handled``) or the
    watcher (``taken``), never both (one line)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handled = False
        self.taken = False


_STATE = _Interruption()


def _quiet_when_interrupted() -> None:
    """In a process other than 0: SIGINT and SIGTERM end it at once and silently, with the
    status ``_QUIET + n`` that tells the main process's watcher to print the one line. A
    signal the run was started ignoring (``nohup cmd &``, a background job of a script:
    the main process ignores it too) stays ignored, so the processes keep running together
    instead of the children ending under a main process that goes on alone."""

    def quiet(signum: int, frame: Any) -> None:
        with contextlib.suppress(OSError):  # nothing more from this process on stderr
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        os._exit(_QUIET + signum)  # rank 0 writes the run; this process has nothing to keep

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, quiet)


def _note_main_handles() -> None:
    """In the main process: SIGINT and SIGTERM, once Python handles them, mark the
    interruption as the main thread's (the watcher then prints nothing)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)

        def note(num: int, frame: Any, previous: Any = previous) -> None:
            with _STATE.lock:
                taken = _STATE.taken
                _STATE.handled = True
            if taken:  # the watcher is ending the process with the line already printed
                time.sleep(60)
            if previous is signal.SIG_IGN:
                return
            if callable(previous):
                previous(num, frame)
            raise KeyboardInterrupt

        signal.signal(signum, note)


class _ChildWatcher(threading.Thread):
    """Lightning's watcher of the child processes (``lightning_check``: its ``_run``, which
    SIGKILLs everything when a child fails), except that a child that was interrupted
    (:data:`_INTERRUPTED`) ends the run as an interruption (the module docstring)."""

    def __init__(self, children: list[subprocess.Popen], lightning_check: Callable[[], bool],
                 exit: Callable[[int], None] = os._exit) -> None:  # fmt: skip
        super().__init__(daemon=True, name="cogcal-child-watcher")
        self.children, self.lightning_check, self.exit = children, lightning_check, exit

    def run(self) -> None:
        last_lightning = time.monotonic()
        while True:
            time.sleep(_POLL)
            codes = [child.poll() for child in self.children]
            found = next((_INTERRUPTED[c] for c in codes if c in _INTERRUPTED), None)
            if found is not None:
                self.interrupted(*found)
                return
            if time.monotonic() - last_lightning >= 5 or all(c == 0 for c in codes):
                last_lightning = time.monotonic()
                if self.lightning_check():
                    return

    def interrupted(self, signum: int, printed: bool = False) -> None:
        """A child was interrupted: stop the others; unless the main thread handles the
        signal within :data:`_GRACE`, print the one line (unless the child ``printed`` it)
        and end the main process."""
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(OSError):
                    child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _GRACE
        while time.monotonic() < deadline and not _STATE.handled:
            time.sleep(0.05)
        with _STATE.lock:
            handled = _STATE.handled
            _STATE.taken = not handled
        if handled:  # the main thread prints the line and ends; at the latest, now:
            time.sleep(_HANDLED_LIMIT)
            self.exit(128 + signum)
            return
        if not printed:  # else the child printed it, while it was still importing
            with contextlib.suppress(Exception):
                sys.stderr.write(f"cogcal: interrupted ({signal.Signals(signum).name})\n")
                sys.stderr.flush()
        self.exit(128 + signum)


@contextlib.contextmanager
def _interruptible_children() -> Any:
    """While Fabric launches: children quiet on an interruption, and the main process's
    child processes watched by :class:`_ChildWatcher` instead of Lightning's watcher."""
    if other_rank():
        with contextlib.suppress(ValueError):  # not the main thread: signals left alone
            _quiet_when_interrupted()
        yield
        return
    # Lightning's launcher module, only here (its import costs seconds, module docstring)
    from lightning_fabric.strategies.launchers import subprocess_script

    def watch(children: list[subprocess.Popen]) -> None:
        lightning = subprocess_script._ChildProcessObserver(
            main_pid=os.getpid(), child_processes=children
        )
        _ChildWatcher(children, lightning._run).start()

    with contextlib.suppress(ValueError):
        _note_main_handles()
    original = subprocess_script._launch_process_observer
    subprocess_script._launch_process_observer = watch
    try:
        yield
    finally:
        subprocess_script._launch_process_observer = original
