"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for a module whose fits run on tiny tensors (more threads only
    add contention on a shared machine); the previous count is restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def lock_holder() -> Iterator[Callable[[Path], subprocess.Popen]]:
    """``lock_holder(folder)``: another process holding ``folder``'s lock (returned once it
    holds it); killed with SIGKILL at the end of the test, so its lock file stays behind."""
    procs: list[subprocess.Popen] = []
    code = (
        "import sys, time\n"
        "from cogcal.runs import lock_folder\n"
        "with lock_folder(sys.argv[1], what='folder ' + sys.argv[1]):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(120)\n"
    )

    def start(folder: Path) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": SRC}
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True, env=env
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        proc.stdout.close()
