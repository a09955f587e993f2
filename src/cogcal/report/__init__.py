"""Reports on top of :mod:`cogcal.metrics`: result tables, reliability diagrams, and the
``report.md`` / ``report.html`` of a bench folder or of one run folder.

This layer needs pandas (the bench report's tables) and matplotlib (figures), which the
core does not. Every name is imported lazily from its submodule, so importing
``cogcal.report`` loads neither, and the aggregation works without matplotlib.

Entry points: :func:`build_any` (any folder: dispatches on :func:`report_kind`),
:func:`build_report` (a ``cogcal bench`` folder), :func:`build_run_report` (a
``cogcal train`` run folder), :func:`load_results` (``results.csv`` checked and
normalised).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "build_any",
    "build_report",
    "build_run_report",
    "format_wins",
    "load_results",
    "mean_std",
    "pairwise_wins",
    "pareto_front",
    "plot_reliability",
    "plot_reliability_per_task",
    "reliability_diagram",
    "report_kind",
    "summary_rank",
]

_WHERE = {
    "build_any": "build",
    "build_report": "build",
    "report_kind": "run_report",
    "build_run_report": "run_report",
    "load_results": "frame",
    "format_wins": "stats",
    "mean_std": "stats",
    "pairwise_wins": "stats",
    "pareto_front": "stats",
    "summary_rank": "stats",
    "plot_reliability": "diagrams",
    "plot_reliability_per_task": "diagrams",
    "reliability_diagram": "diagrams",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        module = importlib.import_module(f"cogcal.report.{_WHERE[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'cogcal.report' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
