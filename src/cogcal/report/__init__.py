"""Reports on top of :mod:`cogcal.metrics`: reliability diagrams and result tables.

This layer needs matplotlib (:mod:`cogcal.report.diagrams`) and pandas
(:mod:`cogcal.report.aggregate`), which the core does not; install them with
``pip install cogcal[cli]``. The two submodules are imported lazily, so the aggregation
works without matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "format_wins",
    "mean_std",
    "pairwise_wins",
    "pareto_front",
    "plot_reliability",
    "plot_reliability_per_task",
    "reliability_diagram",
    "summary_rank",
]

_WHERE = {
    "format_wins": "aggregate",
    "mean_std": "aggregate",
    "pairwise_wins": "aggregate",
    "pareto_front": "aggregate",
    "summary_rank": "aggregate",
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
