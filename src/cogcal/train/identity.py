"""When two training configurations compute the same run.

The run contract compares resolved configurations (:func:`cogcal.runs.config_diff`); this
module resolves a :class:`~cogcal.train.config.TrainConfig`, or a mapping of its fields,
first (every default filled in), so that a field left to its default is compared too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cogcal.runs import MARK, config_diff
from cogcal.train.config import TrainConfig

__all__ = ["resolve", "same_config"]


def resolve(config: Mapping[str, Any] | TrainConfig) -> dict[str, Any]:
    """``config`` as ``config.json`` records it: a recorded configuration as it is, a
    :class:`TrainConfig` or a mapping of its fields resolved (defaults filled in)."""
    if isinstance(config, TrainConfig):
        return config.resolved()
    config = dict(config)
    if MARK in config or "task" in config or "data" in config:  # recorded: resolved already
        return config
    return TrainConfig.from_dict(config).resolved()


def same_config(a: Mapping[str, Any] | TrainConfig, b: Mapping[str, Any] | TrainConfig) -> bool:
    """Whether two configurations compute the same run.

    Both are resolved first (every default filled in), so a field left to its default is
    compared too; only the fields documented as not changing results (display, paths,
    downloads) and fields the method does not use are ignored.

    >>> same_config(TrainConfig(method="ce", preset="paper"),
    ...             TrainConfig(method="ce", preset="paper", lr=1e-4, out="x"))
    True
    >>> same_config(TrainConfig(method="ce"), TrainConfig(method="ls"))
    False
    """
    return not config_diff(resolve(a), resolve(b))
