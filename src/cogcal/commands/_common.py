"""What the commands share: the error of the user's input, default folders, warnings."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from cogcal._errors import ArgumentError
from cogcal.train.checkup import findings_of

__all__ = ["UserError", "default_out", "free_cpu_threads", "on_free_cpus", "print_health"]

#: The environment variables by which a user sets torch's CPU threads: when one is set, the
#: commands leave the threads as they are.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_Command = TypeVar("_Command", bound=Callable[..., int])


def free_cpu_threads(threads: int) -> int:
    """``threads`` (torch's CPU threads) times the share of the CPUs that other processes
    leave idle by the 1-minute load average, rounded, at least 1 and at most ``threads``;
    ``threads`` itself when :data:`THREAD_VARIABLES` set them or the load is unknown.

    torch runs one thread per core, and each parallel operation waits for all of them: a
    thread that another process keeps off its core stalls every operation. On a 2-core
    machine with one core busy, a 2-epoch ``cogcal train`` took 13-19 s with torch's 2
    threads against 3.2-3.4 s with 1 (docs/performance.md, "CPU threads"; the rule is
    tested in tests/test_cpu_threads.py on machines of 2 to 64 CPUs under several loads).
    """
    if any(os.environ.get(name) for name in THREAD_VARIABLES) or not hasattr(os, "getloadavg"):
        return threads
    busy = min(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    return max(1, min(threads, round(threads * (1.0 - busy))))


def on_free_cpus(command: _Command) -> _Command:
    """Run ``command`` with torch's CPU threads lowered to :func:`free_cpu_threads`, and
    restore them after it (the commands also run in-process, from Python and the tests)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        before = torch.get_num_threads()
        chosen = free_cpu_threads(before)
        if chosen == before:
            return command(*args, **kwargs)
        torch.set_num_threads(chosen)
        try:
            return command(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper  # type: ignore[return-value]


class UserError(ArgumentError):
    """An error caused by the user's input; reported as one line, without a traceback."""


def default_out(dataset: str, method: str, seed: int) -> str:
    """The run folder of ``cogcal train`` when ``--out`` is not given.

    >>> default_out("csv:data/x.csv", "ce", 0)
    'runs/x.csv-ce-seed0'
    """
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(dataset).name)
    return f"runs/{safe}-{method}-seed{seed}"


def print_health(record: Mapping[str, Any]) -> None:
    """The run's health-check findings (validation only), one warning line each."""
    for message in findings_of(dict(record)):
        print(f"cogcal: warning: {message}", file=sys.stderr)
