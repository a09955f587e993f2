"""The files a bench folder holds for the report: one schema, used by the bench (which
writes them) and the report (which reads them).

``results.csv`` (docs/method.md §6): tidy, one value per row, columns
:data:`RESULT_COLUMNS`; ``split`` in {val, test, shift, ood}; ``task`` is ``mean`` or a
task name for multi-task datasets, empty otherwise; ``condition`` names a corruption or an
OOD set and ``severity`` 1-5 for shift, both empty otherwise.

``runs.csv``: one row per planned run (:data:`RUN_COLUMNS`): status (``complete``,
``diverged``, ``failed``, ``interrupted``), the resolved learning rates and schedule,
run times, and where a reused run was copied from.

``tuning.csv``: one row per trained grid point of every tuning group
(:data:`TUNING_COLUMNS`); ``protocol`` is one of :data:`TUNING_PROTOCOLS` (``effect`` is
the learning-rate search of the effect comparison's CE without a schedule); ``group`` is the method trained at the points and ``used_by``
the methods (space-separated) whose seed runs use the chosen point; ``chosen`` marks the
selected point; ``at_edge``/``edges``/``extensions``/``cap_reached`` describe the group's
final choice and repeat on each of its rows.

``effect.csv``: the runs of the "Where COG's effect comes from" comparison
(:data:`EFFECT_COLUMNS`), one value per row; ``variant`` is one of ``ce (no schedule)``,
``ce (step schedule)`` or ``cog-fc (ratio R)``.

``bench.json``: the suite, per-protocol budgets per method family (epochs, schedule,
step size, early stopping, stage-2 epochs, the epoch at which the 1e-8 floor is reached),
dataset facts, machine stamp and one entry per bench session with its counts.
"""

from __future__ import annotations

#: The two protocols of docs/method.md §1, in report order.
PROTOCOLS: tuple[str, ...] = ("paper", "fair")
#: The ``protocol`` of the effect comparison's folders and tuning rows.
EFFECT = "effect"
#: Protocols a ``tuning.csv`` row may name.
TUNING_PROTOCOLS: tuple[str, ...] = (*PROTOCOLS, EFFECT)

RESULT_COLUMNS: tuple[str, ...] = (
    "dataset",
    "method",
    "protocol",
    "seed",
    "split",
    "metric",
    "value",
    "task",
    "condition",
    "severity",
)
SPLITS: tuple[str, ...] = ("val", "test", "shift", "ood")

RUN_STATUSES: tuple[str, ...] = ("complete", "diverged", "failed", "interrupted")
RUN_COLUMNS: tuple[str, ...] = (
    "dataset",
    "method",
    "protocol",
    "seed",
    "status",
    "model",
    "epochs",
    "schedule",
    "lr",
    "calibrator_lr",
    "train_seconds",
    "total_seconds",
    "copied_from",
    "run_dir",
    "log",
)

TUNING_COLUMNS: tuple[str, ...] = (
    "protocol",
    "dataset",
    "group",
    "used_by",
    "lr",
    "ratio",
    "calibrator_lr",
    "schedule",
    "val_nll",
    "val_brier",
    "val_acc",
    "status",
    "chosen",
    "at_edge",
    "edges",
    "extensions",
    "cap_reached",
)

EFFECT_VARIANTS: tuple[str, ...] = ("ce (no schedule)", "ce (step schedule)", "cog-fc (ratio R)")
EFFECT_COLUMNS: tuple[str, ...] = (
    "dataset",
    "variant",
    "schedule",
    "lr",
    "calibrator_lr",
    "seed",
    "split",
    "metric",
    "value",
)

#: Column labels of the metrics, with the direction that is better.
METRIC_LABELS: dict[str, str] = {
    "acc": "Acc ↑",
    "nll": "NLL ↓",
    "brier": "Brier ↓",
    "ece_15": "ECE-15 ↓",
    "rmsce_15": "RMSCE-15 ↓",
    "mce_15": "MCE-15 ↓",
    "auroc": "AUROC ↑",
    "fpr95": "FPR95 ↓",
}
