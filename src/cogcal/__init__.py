"""cogcal: Calibration in One Go.

Train a neural-network classifier and its calibrator together, in the same forward
and backward pass, the calibrator on a slower learning rate.

The public names load their module when first used: :class:`CalibratedModel`, the
calibrators, losses and metrics, :func:`check_calibration` (the health check of a model on
validation data, :mod:`cogcal.health`) and :func:`calibrate` (a post-hoc calibrator for a
model trained elsewhere, :mod:`cogcal.posthoc`) the core only (torch and numpy); :func:`fit`
(the recipe on your own model and data), :func:`load_run` (a finished run as a model) and
:func:`load_calibrator` (the folder of ``cogcal calibrate``) the training layer. ``import
cogcal`` itself imports nothing heavy, so that the ``cogcal`` command (:mod:`cogcal.__main__`)
handles SIGINT and SIGTERM before torch is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cogcal._version import __version__

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from cogcal.cog import CalibratedModel, find_classifier
    from cogcal.health import check_calibration
    from cogcal.posthoc import Calibration, calibrate

__all__ = [
    "CalibratedModel",
    "Calibration",
    "calibrate",
    "check_calibration",
    "find_classifier",
    "fit",
    "load_calibrator",
    "load_run",
    "__version__",
]

_LAZY = {
    "CalibratedModel": "cogcal.cog",
    "Calibration": "cogcal.posthoc",
    "calibrate": "cogcal.posthoc",
    "check_calibration": "cogcal.health",
    "find_classifier": "cogcal.cog",
    "fit": "cogcal.train.fit",
    "load_calibrator": "cogcal.runs.calibration",
    "load_run": "cogcal.train.assemble",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # loaded once
        return value
    raise AttributeError(f"module 'cogcal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
