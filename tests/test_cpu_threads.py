"""The commands' CPU threads (cogcal.commands._common.free_cpu_threads, on_free_cpus):
torch's threads lowered to the share of the CPUs other processes leave idle, unless the
user set them; restored after the command."""

from __future__ import annotations

import os

import pytest
import torch

from cogcal.commands import _common
from cogcal.commands._common import THREAD_VARIABLES, free_cpu_threads, on_free_cpus


@pytest.fixture
def machine(monkeypatch):
    """A machine of ``cpus`` CPUs under ``load``, no thread variable set."""
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_machine(cpus: int, load: float) -> None:
        monkeypatch.setattr(os, "cpu_count", lambda: cpus)
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))

    return set_machine


@pytest.mark.parametrize(
    ("cpus", "load", "threads", "expected"),
    [
        (2, 0.0, 2, 2),  # idle: torch's default
        (2, 0.4, 2, 2),  # a fifth busy: still both
        (2, 1.0, 2, 1),  # one core busy: one thread (13-19 s -> 3.2-3.4 s, measured)
        (2, 7.0, 2, 1),  # overloaded: at least one
        (8, 2.0, 8, 6),
        (8, 0.0, 4, 4),  # never more than torch had
        (64, 32.0, 2, 1),  # a 2-CPU container on a half-busy 64-CPU host
    ],
)
def test_threads_follow_the_idle_share_of_the_cpus(machine, cpus, load, threads, expected):
    machine(cpus, load)
    assert free_cpu_threads(threads) == expected


@pytest.mark.parametrize("name", THREAD_VARIABLES)
def test_a_thread_variable_set_by_the_user_is_left_alone(machine, monkeypatch, name):
    machine(2, 2.0)
    monkeypatch.setenv(name, "2")
    assert free_cpu_threads(2) == 2


def test_the_command_runs_on_the_free_threads_and_restores_them(machine, monkeypatch):
    machine(2, 1.0)
    state = {"threads": 2}
    monkeypatch.setattr(_common.torch, "get_num_threads", lambda: state["threads"])
    monkeypatch.setattr(_common.torch, "set_num_threads", lambda n: state.update(threads=n))
    seen = []

    @on_free_cpus
    def command(fail: bool) -> int:
        seen.append(state["threads"])
        if fail:
            raise RuntimeError("the command failed")
        return 0

    assert command(False) == 0
    with pytest.raises(RuntimeError, match="the command failed"):
        command(True)
    assert seen == [1, 1] and state["threads"] == 2
    assert torch.get_num_threads() >= 1  # (the real pool was never touched)
