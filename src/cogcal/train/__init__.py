"""Training: the methods registry, the configuration, the run-folder contract, the loop.

The registry (:mod:`~cogcal.train.methods`), :class:`TrainConfig`
(:mod:`~cogcal.train.config`), the run contract (:mod:`~cogcal.runs`) and the
learning-rate search (:mod:`~cogcal.train.tuning`) import neither Lightning nor the
training loop; :func:`run` and :func:`tune` (:mod:`~cogcal.train.runner`, on Lightning
Fabric) are imported when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from cogcal.runs import RunDir, RunRecord
from cogcal.runs.methods import METHODS, Method, get_method, is_cog, list_methods
from cogcal.train.config import ConfigError, TrainConfig
from cogcal.train.identity import same_config
from cogcal.train.tuning import Grid, GridSearch

__all__ = [
    "ConfigError",
    "Grid",
    "GridSearch",
    "METHODS",
    "Method",
    "RunDir",
    "RunRecord",
    "TrainConfig",
    "get_method",
    "is_cog",
    "is_complete",
    "list_methods",
    "run",
    "same_config",
    "tune",
]

_RUNNER = ("run", "tune", "is_complete")


def __getattr__(name: str) -> Any:
    # the runner imports Lightning Fabric: only load it when a run is asked for
    if name in _RUNNER:
        return getattr(importlib.import_module("cogcal.train.runner"), name)
    raise AttributeError(f"module 'cogcal.train' has no attribute {name!r}")
