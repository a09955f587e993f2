"""A run in a forked second process (cogcal.train.background): exit codes, this process's
threads while it runs and after, and a stop that ends it."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from cogcal.train.background import Background, second_process_allowed

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the second process is forked: Linux only"
)


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_the_exit_code_says_whether_the_function_returned(tmp_path, two_threads):
    job = Background()
    job.start(lambda: (tmp_path / "done").write_text(str(torch.get_num_threads())), name="ok")
    assert job.running and torch.get_num_threads() == 1  # one thread left to it, one here
    assert job.wait() == 0 and not job.running and torch.get_num_threads() == 2
    assert (tmp_path / "done").read_text() == "1"  # the second process trains on one thread
    job.start(lambda: None, name="quick")
    deadline = time.monotonic() + 30
    while torch.get_num_threads() == 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the thread comes back once the other has ended
        job.poll()
    assert job.running and job.wait() == 0 and torch.get_num_threads() == 2

    def fail() -> None:
        raise RuntimeError("disk full")

    job.start(fail, name="fails")
    assert job.wait() == 1 and torch.get_num_threads() == 2


def test_stop_ends_a_running_process_and_gives_the_threads_back(tmp_path, two_threads):
    job = Background()
    job.start(lambda: time.sleep(60), name="sleeps")
    started = time.perf_counter()
    job.stop()
    assert time.perf_counter() - started < 10 and not job.running
    assert torch.get_num_threads() == 2
    job.stop()  # nothing running: nothing to do
    with pytest.raises(RuntimeError, match="already running"):
        job.start(lambda: None, name="a")
        job.start(lambda: None, name="b")
    assert job.wait() == 0


def test_a_second_process_needs_the_cpu_and_two_threads(two_threads):
    cores = len(os.sched_getaffinity(0))
    assert second_process_allowed("cpu") == (cores >= 2)
    assert not second_process_allowed("gpu")
    assert second_process_allowed("auto") == (cores >= 2 and not torch.cuda.is_available())
    torch.set_num_threads(1)
    assert not second_process_allowed("cpu")


def test_user_data_loaders_keep_the_sides_in_one_process():
    """A user ``DataLoader`` may start worker processes of its own, which a forked process
    cannot: data given that way is not ``in_memory``, so the default path does not fork."""
    from torch.utils.data import DataLoader, TensorDataset

    from cogcal.train.sources import DatasetSource, LoaderSource

    x, y = torch.zeros(8, 2), torch.zeros(8, dtype=torch.long)
    tensors = LoaderSource("a", "multiclass", 2, (x, y), (x, y))
    loader = LoaderSource("a", "multiclass", 2, (x, y), DataLoader(TensorDataset(x, y)))
    assert tensors.in_memory and not loader.in_memory and DatasetSource.in_memory
