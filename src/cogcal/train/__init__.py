"""Training: the methods registry, the Lightning module, and the run/tune entry points."""

from __future__ import annotations

from cogcal.train.config import TrainConfig
from cogcal.train.methods import METHODS, Method, get_method, list_methods
from cogcal.train.runner import is_complete, run, tune

__all__ = [
    "TrainConfig",
    "METHODS",
    "Method",
    "get_method",
    "list_methods",
    "run",
    "tune",
    "is_complete",
]
