"""The bench folder: ``bench.json`` with the mark of ``cogcal bench``, the lock of
:func:`cogcal.runs.lock_folder`, the tables (:mod:`cogcal.runs.columns`) and one run folder
per planned run under ``runs/``. ``runs.csv`` lists every planned seed run: those a bench
has not started yet (it was interrupted) with the status :data:`NOT_STARTED`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cogcal import _io

__all__ = ["BENCH_FORMAT", "BENCH_MARK", "NOT_STARTED", "is_bench_folder", "write_bench_meta"]

#: The key of ``bench.json`` that marks a folder as written by ``cogcal bench``.
BENCH_MARK = "cogcal_bench"
BENCH_FORMAT = 1
#: The ``runs.csv`` status of a planned run that has not started (an interrupted bench).
NOT_STARTED = "not started"


def is_bench_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a ``bench.json`` with the mark of ``cogcal bench``."""
    try:
        data = json.loads((Path(path) / "bench.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get(BENCH_MARK) == BENCH_FORMAT


def write_bench_meta(path: str | os.PathLike[str], meta: Mapping[str, Any]) -> None:
    """Write ``bench.json`` (the bench's record of its sessions) with the bench mark."""
    _io.write_json(Path(path) / "bench.json", {BENCH_MARK: BENCH_FORMAT, **dict(meta)})
