"""Reports on top of :mod:`cogcal.metrics`: result tables, reliability diagrams, and the
``report.md`` / ``report.html`` of a bench folder (:func:`build_report`) or of one run
folder (:func:`build_run_report`); :func:`build_any` takes either.

Names are imported lazily from their submodules, so importing ``cogcal.report`` loads
neither pandas nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the submodule that defines it.
_WHERE = {
    name: module
    for module, names in {
        "build": "build_any build_report",
        "run_report": "report_kind build_run_report",
        "calibration_report": "build_calibration_report",
        "frame": "load_results",
        "stats": "format_wins pairwise_wins pareto_front summary_rank",
        "diagrams": "plot_reliability plot_reliability_per_task reliability_diagram",
    }.items()
    for name in names.split()
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        module = importlib.import_module(f"cogcal.report.{_WHERE[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'cogcal.report' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
