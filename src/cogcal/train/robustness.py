"""Predictions of a trained model, and its evaluation on the OOD and covariate-shift sets.

:func:`predict_logits` gives the float32 logits of any batches; :func:`evaluate_robustness`
the OOD-detection and shift metrics of a final (calibrated) model (docs/method.md §3-§4);
:func:`add_robustness` fills them into a record whose run left them to its caller
(:data:`DEFER_ROBUSTNESS`: the points of a learning-rate selection and the sides of the
default path, of which only the chosen one is evaluated on them). Both the runner (:mod:`cogcal.train.runner`) and the
selection (:mod:`cogcal.train.select`) use them; neither imports the other for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from cogcal.data import BatchLoader, Dataset, ood_sets, shift_sets
from cogcal.data.robustness import ROBUSTNESS_DATASETS, shift_conditions
from cogcal.metrics import evaluate, ood
from cogcal.runs import RunDir, RunRecord
from cogcal.train.config import TrainConfig
from cogcal.train.loop import NonFiniteLossError, seed_global_rng
from cogcal.train.sources import EVAL_BATCH

__all__ = [
    "DEFERRED",
    "DEFER_ROBUSTNESS",
    "add_robustness",
    "evaluate_robustness",
    "inputs",
    "predict_logits",
]

#: ``extra`` key of a run whose OOD and shift evaluation its caller does afterwards
#: (:func:`add_robustness`): the points of a learning-rate selection, and the two sides of
#: the default path (:mod:`cogcal.train.choice`), of which only the chosen one is evaluated
#: on them.
DEFER_ROBUSTNESS = "defer_robustness"
#: Why such a run's record has no OOD or shift results (its ``unavailable`` entry).
DEFERRED = "left to the chosen run of the learning-rate selection"


@torch.no_grad()
def predict_logits(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, device: torch.device,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Float32 logits (on the CPU, in the batches' order) and the batches' labels."""
    model.eval().to(device)
    seed_global_rng(seed, device)  # V-TST draws its Monte Carlo samples from the global RNG
    logits, labels = [], []
    for x, y in batches:
        logits.append(model(x.to(device)).float().cpu())
        labels.append(y.cpu())
    return torch.cat(logits), torch.cat(labels)


def inputs(data: Dataset, x: torch.Tensor) -> BatchLoader:
    """Batches of raw stored inputs (e.g. OOD images), normalised like ``data``."""
    return BatchLoader(
        x, x.new_zeros(len(x)), batch_size=EVAL_BATCH, shuffle=False, transform=data.transform
    )


def evaluate_robustness(
    predict: Callable[[torch.Tensor], torch.Tensor],
    data: Dataset,
    test_logits: torch.Tensor,
    config: TrainConfig,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """OOD detection and covariate-shift metrics of the final (calibrated) model.

    ``predict`` maps raw stored inputs to the final model's logits. Returns ``(ood, shift,
    unavailable)``: ``ood[set] = {"auroc", "fpr95"}`` plus ``"pooled"``;
    ``shift[condition][severity] = {metric: value}`` plus ``"mean"`` over conditions per
    severity; ``unavailable`` names the sets that could not be loaded.
    """
    if data.name not in ROBUSTNESS_DATASETS:
        reason = f"no OOD or shift sets are defined for {data.name!r}"
        return {}, {}, {"ood": {"all": reason}, "shift": {"all": reason}}
    fetch = dict(download=config.download, mirror=config.mirror, progress=config.progress)
    ood_inputs, ood_missing = ood_sets(data, root=config.data_root, **fetch)
    ood_result: dict[str, Any] = {}
    pooled = []
    for name, x in ood_inputs.items():
        logits = predict(x)
        pooled.append(logits)
        ood_result[name] = ood(test_logits, logits, task=data.task)
    if len(pooled) > 1:
        ood_result["pooled"] = ood(test_logits, torch.cat(pooled), task=data.task)

    names = data.class_names if data.task == "multilabel" else None
    shift: dict[str, Any] = {}
    shift_missing: dict[str, str] = {}
    for condition in shift_conditions(data.name):  # one at a time: CIFAR-C is 150 MB each
        loaded, missing = shift_sets(data, root=config.data_root, conditions=[condition], **fetch)
        shift_missing.update(missing)
        for cond, severities in loaded.items():
            shift[cond] = {
                str(sev): evaluate(predict(split.x), split.y, task=data.task, task_names=names)
                for sev, split in sorted(severities.items())
            }
    if len(shift) > 1:
        sevs = sorted({s for c in shift.values() for s in c}, key=int)
        shift["mean"] = {
            s: {
                k: float(np.mean([c[s][k] for c in shift.values() if s in c]))
                for k in next(c[s] for c in shift.values() if s in c)
            }
            for s in sevs
        }
    return ood_result, shift, {"ood": ood_missing, "shift": shift_missing}


def add_robustness(
    record: RunRecord, folder: RunDir, model: nn.Module, data: Dataset, config: TrainConfig
) -> None:
    """Evaluate the OOD and shift sets deferred by :data:`DEFER_ROBUSTNESS` into
    ``record``, with the run's final ``model`` (as :func:`cogcal.train.runner.execute`
    returned it) and the test logits saved in ``folder``; a record evaluated already is
    left as it is."""
    if (record.unavailable.get("ood") or {}).get("all") != DEFERRED:
        return
    device = next(model.parameters()).device

    def predict(x: torch.Tensor) -> torch.Tensor:
        logits = predict_logits(model, inputs(data, x), device=device, seed=config.seed)[0]
        if not bool(torch.isfinite(logits).all()):
            raise NonFiniteLossError(
                "the final model's OOD or shift logits are non-finite; the run diverged. "
                "Lower the learning rate(s) and retry."
            )
        return logits

    start = time.perf_counter()
    test_logits = torch.from_numpy(folder.read_logits("test")[0])
    record.ood, record.shift, record.unavailable = evaluate_robustness(
        predict, data, test_logits, config
    )
    record.timing["robustness_seconds"] = time.perf_counter() - start
