"""``cogcal bench``: suites of training runs, planned, run and tabulated into a bench folder.

>>> from cogcal.bench import list_suites, load_suite
>>> "quick" in list_suites()
True
>>> load_suite("quick").methods[:3]
('ce', 'ts', 'ms')

:func:`run_suite` (:mod:`cogcal.bench.session`) runs a suite and writes its tables; the
``bench`` command (:func:`cogcal.commands.bench.run_bench`) also renders the report.
"""

from __future__ import annotations

from cogcal.bench.session import (
    BenchFolderError,
    BenchSummary,
    budgets,
    check_requirements,
    run_suite,
)
from cogcal.bench.suite_yaml import list_suites
from cogcal.bench.suites import PROTOCOLS, Suite, load_suite

__all__ = [
    "PROTOCOLS",
    "BenchFolderError",
    "BenchSummary",
    "Suite",
    "budgets",
    "check_requirements",
    "list_suites",
    "load_suite",
    "run_suite",
]
