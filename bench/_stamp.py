"""A one-line stamp for benchmark output: machine, versions, date."""

from __future__ import annotations

import datetime
import os
import platform

import torch


def stamp() -> str:
    """Describe the machine and software that a benchmark ran on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} | {cpu} | "
        f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()} | {gpu} | "
        f"python {platform.python_version()}, torch {torch.__version__}"
    )
