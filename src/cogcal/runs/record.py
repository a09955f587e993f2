"""The record of a finished run: the content of ``metrics.json`` (:class:`RunRecord`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cogcal._constraints import Real
from cogcal.runs.identity import finite
from cogcal.runs.methods import get_method

__all__ = ["RunRecord"]


@dataclass
class RunRecord:
    """The content of ``metrics.json``: what a finished run reports.

    Attributes
    ----------
    config : dict
        The resolved configuration (as in ``config.json``).
    val, test : dict
        Metrics of the final (calibrated) model on the validation and test splits.
    val_uncalibrated : dict or None
        Post-hoc methods: validation metrics of the network before its calibrator was
        fitted (what their learning rate is chosen by).
    ood, shift, unavailable : dict
        Out-of-distribution and covariate-shift results, and the sets that were missing.
    timing : dict
        Seconds per stage and in total.
    status : str
        ``"complete"``, or ``"diverged"`` when the loss, the validation or the test logits
        became non-finite (then ``val``/``test`` hold what was measured, often nothing).
    copied_from : str or None
        Set when `cogcal bench` copied this run from an identical one.
    error : str or None
        Diverged runs: where the non-finite values appeared.
    health : dict or None
        The calibration health check of the validation split (:mod:`cogcal.health`,
        :meth:`cogcal.health.HealthReport.to_dict`).
    selection : dict or None
        When the learning rates were chosen by validation cross-entropy (no ``lr`` given):
        the grid trained, the choice and its cost (:mod:`cogcal.train.select`).
    integrity : dict or None
        ``{"config": digest, "files": {path: sha256}}``: the :func:`~cogcal.runs.config_digest` of
        ``config`` and the sha256 of each checkpoint and of ``calibrator.pt``, written by
        :meth:`RunDir.write_record <cogcal.runs.RunDir.write_record>`.
    """

    config: dict[str, Any]
    val: dict[str, Any]
    test: dict[str, Any]
    val_uncalibrated: dict[str, Any] | None = None
    ood: dict[str, Any] = field(default_factory=dict)
    shift: dict[str, Any] = field(default_factory=dict)
    unavailable: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    status: str = "complete"
    copied_from: str | None = None
    error: str | None = None
    health: dict[str, Any] | None = None
    selection: dict[str, Any] | None = None
    integrity: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "metrics.json") -> RunRecord:
        """Read a ``metrics.json`` mapping; a malformed one raises ``ValueError``."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{source} is not a JSON object.")
        missing = [k for k in ("config", "val", "test", "status") if k not in data]
        if missing:
            raise ValueError(f"{source} lacks {', '.join(missing)}: not a cogcal run record.")
        for key in ("config", "val", "test"):
            if not isinstance(data[key], Mapping):
                raise ValueError(f"{source}: {key!r} is not a mapping.")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        out = {
            "config": self.config,
            "val": self.val,
            "test": self.test,
            "ood": self.ood,
            "shift": self.shift,
            "unavailable": self.unavailable,
            "timing": self.timing,
            "status": self.status,
        }
        if self.val_uncalibrated is not None:
            out["val_uncalibrated"] = self.val_uncalibrated
        if self.copied_from is not None:
            out["copied_from"] = self.copied_from
        if self.error is not None:
            out["error"] = self.error
        for key in ("health", "selection", "integrity"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return finite(out)

    @property
    def selection_nll(self) -> float:
        """The validation NLL a learning rate is chosen by (docs/method.md §1-§2): of the
        network before calibration for post-hoc methods, of the final model otherwise.
        A diverged run (no finite value) gives ``inf``."""
        method = get_method(str(self.config.get("method")))
        section = self.val_uncalibrated if method.selects_before_calibration else self.val
        value = (section or {}).get("nll")
        return float(value) if Real().problem(value) is None else math.inf
