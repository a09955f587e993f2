"""The columns of the tables of a bench folder: written by the bench
(:mod:`cogcal.bench.results`, which describes each row), read by the report
(:mod:`cogcal.report.frame`).

``results.csv`` (docs/method.md §6) is tidy, one value per row; ``split`` is one of
:data:`SPLITS`, ``task`` is ``mean`` or a task name for multi-task datasets, ``condition``
names a corruption or an OOD set and ``severity`` is 1-5 for shift rows, all empty
otherwise. ``runs.csv`` has one row per planned run, ``tuning.csv`` one per trained grid
point, ``effect.csv`` one value per row of the effect comparison.
"""

from __future__ import annotations

#: The two protocols of docs/method.md §1, in report order.
PROTOCOLS: tuple[str, ...] = ("paper", "fair")
#: The ``protocol`` of the effect comparison's folders and tuning rows.
EFFECT = "effect"

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
    "adaece_15": "adaECE-15 ↓",
    "cwece_15": "cwECE-15 ↓",
    "smece": "smECE ↓",
    "aurc": "AURC ↓",
    "auroc": "AUROC ↑",
    "fpr95": "FPR95 ↓",
}
#: Metric names in sentences.
METRIC_NAMES = {m: label.rstrip(" ↑↓") for m, label in METRIC_LABELS.items()} | {"acc": "accuracy"}
