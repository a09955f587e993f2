"""cogcal: Calibration in One Go.

Train a neural-network classifier and its calibrator together, in the same forward
and backward pass, the calibrator on a slower learning rate.
"""

from __future__ import annotations

__version__ = "0.1.0"

from cogcal.cog import CalibratedModel, find_classifier

__all__ = ["CalibratedModel", "find_classifier", "__version__"]
