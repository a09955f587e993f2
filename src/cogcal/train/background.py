"""A run trained in a second process while this one goes on: the default path's
cross-entropy side beside COG-FC's search (:mod:`cogcal.train.choice`, docs/method.md §1).

A small network trained on the CPU gains less from a second torch thread than from a
second process (docs/defaults.md, "The cross-entropy side beside COG-FC's search"), so
where the two sides of the default path are independent, they run side by side instead
of one after the other. Nothing changes in what is trained: each process writes its own
run folders, and a run is the same whichever process trained it (up to the float
rounding of another thread count).

The second process is **forked** (Linux), so that the data, the model and the training
function need no pickling and a user's script needs no ``if __name__ == "__main__"``
guard; it runs only on the CPU (a forked process cannot use a CUDA context its parent
made), only where this process may use two threads or more and two cores are there
(:func:`second_process_allowed`): it takes one thread, this process keeps the others
while it runs. It exits quietly, and with a non-zero code, on any error or interruption:
the caller then trains the same run itself (resuming it from its checkpoints), where an
error is raised as usual. It ends when this process does.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import warnings
from collections.abc import Callable
from multiprocessing.connection import wait as mp_wait

import torch

__all__ = ["Background", "second_process_allowed"]


def _cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def second_process_allowed(accelerator: str) -> bool:
    """Whether a run may train in a forked second process (module docstring): Linux, the
    CPU (``accelerator`` ``"cpu"``, or ``"auto"`` without a CUDA GPU), two threads or more
    allowed to this process and two cores or more."""
    cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    return (
        sys.platform.startswith("linux") and cpu and torch.get_num_threads() >= 2 and _cores() >= 2
    )


def _child(target: Callable[[], None]) -> None:
    """The second process: one thread, gone with its parent, silent on failure."""
    torch.set_num_threads(1)
    parent = multiprocessing.parent_process()
    if parent is not None:

        def watch() -> None:
            mp_wait([parent.sentinel])
            os._exit(3)

        threading.Thread(target=watch, name="cogcal-parent-watch", daemon=True).start()
    try:
        target()
    except BaseException:  # noqa: BLE001 - the parent trains the run again and reports it
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()


class Background:
    """One function run in a forked second process (module docstring).

    >>> job = Background()
    >>> job.running, job.wait()
    (False, None)
    """

    def __init__(self) -> None:
        self._process: multiprocessing.process.BaseProcess | None = None
        self._threads: int | None = None

    @property
    def running(self) -> bool:
        """Whether a process was started and not waited for yet."""
        return self._process is not None

    def start(self, target: Callable[[], None], *, name: str) -> None:
        """Run ``target()`` in a forked process; this one keeps all its threads but one
        until the other ends (:meth:`poll`, :meth:`wait` or :meth:`stop`)."""
        if self._process is not None:
            raise RuntimeError("Background.start: a process is already running.")
        process = multiprocessing.get_context("fork").Process(
            target=_child, args=(target,), name=name, daemon=True
        )
        with warnings.catch_warnings():
            # (Python 3.12+ warns of any fork beside other threads: here they are torch's
            # idle pool, and no cogcal thread runs between two runs, when this is called)
            warnings.filterwarnings("ignore", message=r".*fork\(\)", category=DeprecationWarning)
            process.start()
        self._process, self._threads = process, torch.get_num_threads()
        torch.set_num_threads(max(1, self._threads - 1))

    def poll(self) -> None:
        """Give this process its threads back as soon as the other one has ended (its exit
        code is still :meth:`wait`'s)."""
        process, threads = self._process, self._threads
        if process is not None and threads is not None and not process.is_alive():
            torch.set_num_threads(threads)
            self._threads = None

    def wait(self) -> int | None:
        """Wait for the process; its exit code (0: ``target`` returned), None when none
        was started."""
        process = self._process
        if process is None:
            return None
        try:
            process.join()
        finally:
            self._release()
        return process.exitcode

    def stop(self) -> None:
        """End the process if it still runs (its run stays resumable from its last
        checkpoint) and give this process its threads back."""
        process = self._process
        if process is None:
            return
        try:
            if process.is_alive():
                process.terminate()
            process.join()
        finally:
            self._release()

    def _release(self) -> None:
        if self._threads is not None:
            torch.set_num_threads(self._threads)
        self._process, self._threads = None, None
