"""What the commands share: the error of the user's input, default folders, warnings."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cogcal._errors import ArgumentError
from cogcal.train.checkup import findings_of

__all__ = ["UserError", "default_out", "print_health"]


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
