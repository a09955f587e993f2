"""What there was to calibrate: per dataset, cross-entropy's test ECE-15 and the direction
of its miscalibration (over- or under-confident), so that a reader of a bench report sees
whether the calibrators had anything to fix.

The direction compares ``ce``'s mean top-label confidence with its accuracy on the test
split, seed by seed (from the runs' saved test logits): the per-seed gaps ``confidence -
accuracy`` give a mean with its 95% Student-t interval, Holm-corrected over the datasets of
a protocol like every other statement of the report (:data:`~cogcal.report.stats.PAIRED_RULE`);
the direction is stated only when that test decides it.

>>> import numpy as np
>>> conf, acc = confidence_and_accuracy(np.array([[2.0, 0.0], [0.0, 1.0]]), np.array([0, 0]))
>>> round(conf, 4), acc
(0.8059, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cogcal.report.blocks import Table, Text
from cogcal.report.frame import seed_values
from cogcal.report.stats import Paired, holm, paired
from cogcal.report.tables import cell

__all__ = ["Regime", "confidence_and_accuracy", "regime_table", "regimes"]

#: The method whose miscalibration the regime describes: the uncalibrated network.
BASE = "ce"
OVER, UNDER, NEITHER = "over-confident", "under-confident", "no decided direction"
UNKNOWN = "direction unknown (no saved test logits)"


def confidence_and_accuracy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Mean top-label confidence and accuracy of ``(N, K)`` multi-class logits with ``N``
    labels, or of ``(N, T)`` multi-label logits with ``(N, T)`` 0/1 labels (per task
    ``p = sigmoid(z)``, confidence ``max(p, 1 - p)``; means over every sample and task),
    as docs/method.md §3 defines them."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)
    if z.ndim != 2 or z.shape[0] != y.shape[0] or y.ndim not in (1, 2):
        raise ValueError(
            f"expected (N, K) logits with N labels or (N, T) labels, got {z.shape} and {y.shape}."
        )
    if y.ndim == 2:  # multi-label: T binary tasks
        p = 1.0 / (1.0 + np.exp(-z))
        return float(np.maximum(p, 1 - p).mean()), float(((p > 0.5) == (y > 0.5)).mean())
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return float(p.max(axis=1).mean()), float((p.argmax(axis=1) == y).mean())


@dataclass(frozen=True)
class Regime:
    """``ce``'s calibration on one dataset: test ECE-15 (mean and sample std over
    ``seeds``), accuracy and mean confidence (means over the seeds with saved logits) and
    ``gap``, the paired comparison of confidence with accuracy (``None`` without logits;
    ``p_adj`` Holm-adjusted over the protocol's datasets)."""

    dataset: str
    protocol: str
    seeds: int
    ece: float
    ece_sd: float
    acc: float
    confidence: float
    gap: Paired | None

    @property
    def direction(self) -> str:
        """``over-confident``, ``under-confident``, ``no decided direction`` or, without
        logits, ``direction unknown (no saved test logits)``."""
        if self.gap is None:
            return UNKNOWN
        if not (self.gap.p_adj < 0.05) or self.gap.diff == 0:
            return NEITHER
        return OVER if self.gap.diff > 0 else UNDER

    def text(self) -> str:
        """``ce's test ECE-15 is 0.072, over-confident (confidence − accuracy Δ +0.071
        [+0.060, +0.082])``."""
        out = f"ce's test ECE-15 is {self.ece:.3f}"
        if self.gap is None:
            return out + f" ({UNKNOWN})"
        return out + f", {self.direction} (confidence − accuracy {self.gap.text()})"


def regimes(
    df: pd.DataFrame,
    protocol: str,
    calibration: Mapping[str, pd.DataFrame],
) -> dict[str, Regime]:
    """The :class:`Regime` of every dataset of ``protocol`` whose ``ce`` runs have a test
    ECE-15 in ``df`` (results.csv). ``calibration[dataset]`` holds the ce runs' per-seed
    ``confidence`` and ``accuracy`` (columns ``seed``, ``confidence``, ``accuracy``; from
    :func:`confidence_and_accuracy` of their saved test logits); a dataset without it gets
    no direction. The confidence-accuracy tests are Holm-corrected together."""
    ece = seed_values(df, "test", protocol=protocol, method=BASE, metric="ece_15")
    found: dict[str, tuple[pd.Series, pd.DataFrame | None]] = {}
    for ds, g in ece.groupby("dataset"):
        per_seed = calibration.get(str(ds))
        usable = per_seed is not None and not per_seed.empty
        found[str(ds)] = (g.set_index("seed")["value"], per_seed if usable else None)
    tests = holm(
        [
            None if c is None else paired(
                c.set_index("seed")["confidence"], c.set_index("seed")["accuracy"],
                higher_is_better=False,
            )
            for _, c in found.values()
        ]
    )  # fmt: skip
    out = {}
    for (ds, (values, c)), gap in zip(found.items(), tests, strict=True):
        sd = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        acc, conf = (
            (math.nan, math.nan) if c is None else (c["accuracy"].mean(), c["confidence"].mean())
        )
        out[ds] = Regime(ds, protocol, len(values), float(values.mean()), sd, acc, conf, gap)
    return out


def regime_table(
    found: Mapping[str, Mapping[str, Regime]], classes: Mapping[str, int]
) -> Table | None:
    """One row per protocol and dataset: classes, ce's test accuracy, mean confidence,
    confidence − accuracy with its interval, ECE-15 and the direction."""
    body = []
    for p, by_dataset in found.items():
        for ds, r in by_dataset.items():
            gap = "—" if r.gap is None else r.gap.text()
            row = [p, ds, str(classes.get(ds, "")) or "—", _num(r.acc), _num(r.confidence), gap]
            ece = f"{r.ece:.3f}" + (f" ± {r.ece_sd:.3f}" if math.isfinite(r.ece_sd) else "")
            decided = r.direction in (OVER, UNDER)
            body.append([*map(cell, row), cell(ece), cell(r.direction, bold=decided)])
    if not body:
        return None
    header = ["Protocol", "Dataset", "Classes", "ce test acc", "ce mean confidence",
              "Confidence − accuracy [95% CI]", "ce test ECE-15", "Direction"]  # fmt: skip
    notes: Sequence[Text] = [
        "The uncalibrated network (ce, tuned like every method) on the test split: what the "
        "calibrators had to fix. ECE-15: mean ± sample std over seeds (results.csv); accuracy "
        "and mean top-label confidence (multi-task: over every task): means over the seeds "
        "whose test logits were saved; confidence − accuracy: per seed, mean with its 95% "
        "Student-t interval; the direction is stated when the paired t-test, Holm-adjusted "
        "over the datasets of the protocol, is below 0.05."
    ]
    return Table("What there was to calibrate", header, body, list(notes), "regime")


def _num(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else "—"
