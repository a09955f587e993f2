"""The health check at the end of every run (:mod:`cogcal.health`), with fixes that name
the run's own settings (docs/method.md §1, "health check").

:func:`run_health` is what ``cogcal train``, :func:`cogcal.fit` and ``cogcal tune`` record
under ``health`` in ``metrics.json``: the validation split only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cogcal.health import HealthReport, diagnose
from cogcal.runs.methods import Method
from cogcal.train.config import AUTO_MIN_STEPS, TrainConfig, flag

__all__ = ["SELECTED", "advice", "run_health"]

#: ``extra`` key marking a run whose learning rates were chosen by validation cross-entropy.
SELECTED = "selected_by"


def advice(config: TrainConfig, method: Method, steps: int) -> dict[str, str]:
    """Fix sentences for each finding kind, naming the settings of ``config``'s run: as
    flags (``--epochs``) for the command line, as arguments (`` `epochs` ``) for a
    :func:`cogcal.fit` run (dataset ``python:``)."""
    python = config.dataset.startswith("python:")

    def n(field: str) -> str:
        return f"`{field}`" if python else flag(field)

    def setting(field: str, value: str) -> str:
        return f"`{field}={value!r}`" if python else f"{flag(field)} {value}"

    lr, cal_lr = config.learning_rates()
    selected = SELECTED in config.extra
    longer = (
        f"leave {n('epochs')} and {n('batch_size')} unset (the automatic budget gives at "
        f"least {AUTO_MIN_STEPS} optimizer steps) or raise {n('epochs')} (now {config.epochs})"
    )
    posthoc = (
        f"fit a temperature on validation data instead: {setting('method', 'ts')} "
        "(cross-entropy, then temperature scaling), or cogcal.calibrators.Temperature in "
        "your own code"
    )
    if method.is_cog and cal_lr is not None:
        if selected:
            under = (
                f"the learning rates chosen by validation cross-entropy (calibrator lr "
                f"{cal_lr:g}) leave it under-confident after {steps} steps; train longer "
                f"(more epochs) or {posthoc}"
            )
            over = f"no learning rate of the grid removes it; {posthoc}"
        else:
            under = (
                f"the calibrator learning rate {cal_lr:g} is too small for {steps} optimizer "
                f"steps: raise {n('calibrator_lr')} (e.g. to {min(3 * cal_lr, 0.95 * lr):.2g}), "
                f"train longer, or leave {n('lr')} unset so that the learning rates are chosen "
                "by validation cross-entropy"
            )
            over = (
                f"lower {n('calibrator_lr')} (now {cal_lr:g}), leave {n('lr')} unset so that "
                f"the learning rates are chosen by validation cross-entropy, or {posthoc}"
            )
    elif method.posthoc:
        under = over = (
            f"the post-hoc {method.posthoc} calibrator did not remove it: try "
            f"{setting('method', 'ms')} (matrix scaling) or a larger validation split"
        )
    elif method.stage2:
        under = over = f"train the head longer ({n('stage2_epochs')}, now {config.stage2_epochs})"
    else:
        under = over = posthoc
    return {"under-trained": longer, "under-confident": under, "over-confident": over}


def run_health(
    config: TrainConfig,
    method: Method,
    val_logits: torch.Tensor,
    val_labels: torch.Tensor,
    *,
    task: str,
    history: Sequence[dict[str, float]],
    steps_per_epoch: int,
    epochs_run: int,
) -> HealthReport:
    """The health check of a finished run's validation predictions (the model as it
    predicts: calibrated for post-hoc methods) and of its stage-1 history."""
    steps = steps_per_epoch * epochs_run
    return diagnose(
        val_logits, val_labels, task=task, history=list(history), steps=steps,
        advice=advice(config, method, steps),
    )  # fmt: skip


def findings_of(record: dict[str, Any]) -> list[str]:
    """The finding sentences recorded in a run's ``metrics.json`` (empty: none, or a run
    written before the check existed)."""
    health = record.get("health") or {}
    return [str(f.get("message", "")) for f in health.get("findings") or []]
