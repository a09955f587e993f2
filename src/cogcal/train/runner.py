"""Run one training job end to end, and tune learning rates by validation cross-entropy.

:func:`run` follows the method's definition (:mod:`cogcal.train.methods`):

1. stage 1: train the network (COG: with its calibrator on λ_c) on the training split,
   keeping the checkpoint with the best validation Brier score;
2. stage 2 (``tst``/``vtst``): freeze the body, train a new TST / V-TST head on the
   training split, again keeping the best validation Brier checkpoint;
3. post hoc (``ts``/``vs``/``ms``): fit the calibrator on the *validation* logits;
4. evaluate on validation and test and write the run directory.

The test split is only ever evaluated, never used for fitting, tuning or selection.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from cogcal import _io
from cogcal.calibrators import (
    MatrixScaling,
    TaskAffine,
    TaskTemperature,
    Temperature,
    TSTHead,
    VectorScaling,
    VTSTHead,
)
from cogcal.cog import CalibratedModel
from cogcal.data import BatchLoader, Dataset, load_dataset
from cogcal.metrics import evaluate, ood
from cogcal.models import create_model
from cogcal.train.config import TrainConfig
from cogcal.train.methods import METHODS, Method, get_method, loss_function
from cogcal.train.module import (
    AtomicCheckpointIO,
    CalibrationModule,
    FrozenBodyHead,
    LearningRateFloor,
    ProgressBar,
    load_checkpoint,
)

__all__ = ["run", "tune", "predict_logits", "is_complete", "STAGE2_LR"]

STAGE2_LR = 1e-4  # TST / V-TST stage-2 head learning rate (Adam), SPEC §2
EVAL_BATCH = 1024


def is_complete(out: str | Path) -> bool:
    """Whether ``out`` holds a finished run (``metrics.json`` with status complete)."""
    path = Path(out) / "metrics.json"
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("status") == "complete"
    except (OSError, ValueError):
        return False


def _device(config: TrainConfig) -> torch.device:
    if config.accelerator == "gpu" or (config.accelerator == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("--accelerator gpu was given but no CUDA GPU is available; use cpu.")
        return torch.device("cuda")
    return torch.device("cpu")


@contextlib.contextmanager
def _deterministic(enabled: bool) -> Iterator[None]:
    """Deterministic kernels inside the block (restored afterwards), without filling every
    new tensor with NaN.

    ``torch.use_deterministic_algorithms(True)`` also turns on
    ``torch.utils.deterministic.fill_uninitialized_memory``, which writes NaN into every
    ``torch.empty`` result (``aten::fill_`` in a profile: a visible share of a small CPU
    step), to guard against kernels that read memory they never wrote. Repeatability does not rest on it: runs
    still repeat and resume bit for bit without it (tested). Lightning's
    ``deterministic=True`` would also leave both flags set in the caller's process.
    """
    if not enabled:
        yield
        return
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.utils.deterministic.fill_uninitialized_memory = previous[2]


class _DropLightningTips(logging.Filter):
    """Lightning advertises its cloud services at every ``Trainer``; not our users' output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in record.getMessage()


def _fit(
    module: CalibrationModule,
    data: Dataset,
    config: TrainConfig,
    *,
    epochs: int,
    ckpt_dir: Path,
    log_name: str,
    device: torch.device,
    resume: bool,
) -> dict[str, Any]:
    """Train ``module`` with Lightning; load the best-validation-Brier weights back into it.

    With ``resume``, a stage that already finished (``ckpt_dir/done.json``) is not trained
    again, and an interrupted one continues from ``ckpt_dir/last.ckpt``.
    """
    done = ckpt_dir / "done.json"
    last = ckpt_dir / "last.ckpt"
    module.seed = config.seed
    if resume and done.is_file():
        summary = json.loads(done.read_text())
        module.load_state_dict(load_checkpoint(ckpt_dir / "best.ckpt")["state_dict"])
        return {**summary, "resumed": "finished earlier"}
    ckpt_path = str(last) if resume and last.is_file() else None
    if ckpt_path is not None:
        load_checkpoint(ckpt_path)  # fail early and clearly on a corrupt checkpoint

    loader_device = device if device.type == "cuda" else None

    def loaders(world: int, rank: int) -> tuple[BatchLoader, BatchLoader]:
        # the global batch is split across processes; validation is sharded without
        # padding, so every sample is counted once when the metric states are summed
        shard = dict(num_replicas=world, rank=rank, device=loader_device)
        train = data.loader("train", config.batch_size // world, seed=config.seed, **shard)
        return train, data.loader("val", EVAL_BATCH, pad=False, **shard)

    module.attach_data(loaders, channels_last=config.channels_last)
    calls_per_epoch = -(-len(data.train) // (config.batch_size * module.steps_per_call))
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir,
        filename="best",
        monitor="val_brier",
        mode="min",
        save_last=True,
        save_on_train_epoch_end=True,  # validation runs at the end of the training epoch
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    floor = LearningRateFloor()
    callbacks: list[L.Callback] = [checkpoint, floor]
    if config.progress:
        callbacks.append(ProgressBar())
    if config.patience is not None:
        callbacks.append(
            EarlyStopping(
                monitor="val_brier",
                mode="min",
                patience=config.patience,
                check_on_train_epoch_end=True,
            )
        )
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=config.devices,
        num_nodes=config.num_nodes,
        strategy=config.strategy,
        precision=config.precision,
        deterministic=None,  # left alone here: set by _deterministic() below, CPU only
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        logger=CSVLogger(
            save_dir=str(config.out), name="logs", version=_log_version(config, log_name)
        ),
        enable_progress_bar=config.progress,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,  # the module validates itself at each epoch's end
        log_every_n_steps=max(1, calls_per_epoch),
        default_root_dir=str(config.out),
    )
    start = time.perf_counter()
    # deterministic kernels on the CPU, so that runs repeat and resume exactly (tested);
    # GPU runs favour speed
    with warnings.catch_warnings(), _deterministic(device.type == "cpu"):
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*is deprecated.*")
        warnings.filterwarnings("ignore", ".*Checkpoint directory .* exists and is not empty.*")
        # TST/V-TST stage 2 keeps the frozen body in eval mode on purpose
        warnings.filterwarnings("ignore", ".*module\\(s\\) in eval mode at the start of training.*")
        trainer.fit(module, ckpt_path=ckpt_path)
    best = checkpoint.best_model_path
    if not best or not Path(best).is_file():
        raise RuntimeError(f"training produced no checkpoint in {ckpt_dir}.")
    best_ckpt = load_checkpoint(best)
    module.load_state_dict(best_ckpt["state_dict"])
    summary = {
        "seconds": time.perf_counter() - start,
        "epochs_run": trainer.current_epoch,
        "best_epoch": int(best_ckpt["epoch"]),
        "best_val_brier": float(checkpoint.best_model_score),
        "stopped_at_lr_floor": floor.stopped_epoch,
    }
    if ckpt_path is not None:
        summary["resumed_from"] = ckpt_path
    if trainer.global_rank == 0:
        _io.write_json(done, summary)
    return {**summary, "rank": trainer.global_rank}


def _log_version(config: TrainConfig, name: str) -> str:
    """A fresh CSV log directory per attempt, so resuming never deletes earlier logs."""
    logs = Path(config.out) / "logs"
    if not (logs / name).exists():
        return name
    k = 1
    while (logs / f"{name}-resume{k}").exists():
        k += 1
    return f"{name}-resume{k}"


@torch.no_grad()
def predict_logits(
    model: nn.Module,
    data: Dataset,
    split: str | torch.Tensor,
    *,
    device: torch.device,
    seed: int = 0,
    labels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 logits (on the CPU, in order, no augmentation) of a split of ``data`` or of
    raw inputs in ``data``'s stored format (normalised with ``data``'s statistics)."""
    model.eval().to(device)
    torch.manual_seed(seed)  # V-TST draws its Monte Carlo samples from the global RNG
    if isinstance(split, str):
        s = data.split(split)
        x, labels = s.x, s.y
    else:
        x = split
    loader = BatchLoader(
        x, x.new_zeros(len(x)), batch_size=EVAL_BATCH, shuffle=False, transform=data.transform
    )
    outs = [model(xb.to(device)).float().cpu() for xb, _ in loader]
    return torch.cat(outs), labels


def _robustness(
    predict: Callable[[torch.Tensor], torch.Tensor],
    data: Dataset,
    test_logits: torch.Tensor,
    config: TrainConfig,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """OOD detection and covariate-shift metrics of the final (calibrated) model.

    Returns ``(ood, shift, unavailable)``: ``ood[set] = {"auroc", "fpr95"}`` plus
    ``"pooled"``; ``shift[condition][severity] = {metric: value}`` plus ``"mean"`` over
    conditions per severity; ``unavailable`` names the sets that could not be loaded.
    """
    from cogcal.data import ood_sets, shift_sets
    from cogcal.data.robustness import ROBUSTNESS_DATASETS, shift_conditions

    if data.name not in ROBUSTNESS_DATASETS:
        reason = f"no OOD or shift sets are defined for {data.name!r}"
        return {}, {}, {"ood": {"all": reason}, "shift": {"all": reason}}
    ood_inputs, ood_missing = ood_sets(data, root=config.data_root)
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
        loaded, missing = shift_sets(data, root=config.data_root, conditions=[condition])
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


def _posthoc_calibrator(kind: str, task: str) -> nn.Module:
    if task == "multilabel":
        return TaskTemperature() if kind == "ts" else TaskAffine()
    return {"ts": Temperature, "vs": VectorScaling, "ms": MatrixScaling}[kind]()


def _stage1_model(method: Method, backbone: nn.Module, task: str) -> nn.Module:
    if method.cog:
        return CalibratedModel(backbone, calibrator=method.cog, task=task)
    return backbone


def _stage1_groups(
    method: Method, model: nn.Module, config: TrainConfig
) -> Callable[[], list[dict[str, Any]]]:
    lr, cal_lr = config.learning_rates()
    if isinstance(model, CalibratedModel):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if config.allow_fast_calibrator else "default")
            groups = model.param_groups(
                lr, cal_lr, allow_fast_calibrator=config.allow_fast_calibrator
            )
        return lambda: groups
    params = [p for p in model.parameters() if p.requires_grad]
    return lambda: [{"params": params, "lr": lr, "name": "network"}]


def _prepare_out(out: Path, resolved: dict[str, Any], *, resume: bool, overwrite: bool) -> None:
    """Protect what ``out`` already holds: never silently clobber a run."""
    has_state = (
        any((out / "checkpoints").rglob("*.ckpt")) if (out / "checkpoints").is_dir() else False
    )
    if overwrite:
        for name in ("checkpoints", "logs"):
            if (out / name).is_dir():
                shutil.rmtree(out / name)
        for name in ("metrics.json", "val_logits.npz", "test_logits.npz", "calibrator.pt"):
            (out / name).unlink(missing_ok=True)
        return
    if is_complete(out):
        raise ValueError(
            f"--out {out} already holds a finished run (metrics.json); choose another --out or "
            "pass --overwrite to replace it."
        )
    if has_state and not resume:
        raise ValueError(
            f"--out {out} holds an unfinished run (checkpoints/); pass --resume to continue it "
            "or --overwrite to start over."
        )
    saved = out / "config.json"
    if resume and has_state and saved.is_file():
        before = json.loads(saved.read_text())
        ignore = {"out", "progress", "data", "extra"}
        diff = [
            f"{k}: {before.get(k)!r} -> {v!r}"
            for k, v in resolved.items()
            if k not in ignore and before.get(k) != v
        ]
        if diff:
            raise ValueError(
                f"--resume: the run in {out} was started with other settings ({'; '.join(diff)}); "
                "resume with the same flags, or use another --out."
            )


def run(config: TrainConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train, calibrate and evaluate one run; write everything into ``config.out``.

    ``resume`` continues an interrupted run in ``config.out`` from its last checkpoint (the
    settings must match); ``overwrite`` deletes a previous run there first. Without either,
    a directory holding a finished or unfinished run is refused, so nothing is lost by
    mistake.

    Returns the content of ``metrics.json``: ``{"config", "val", "test", "timing",
    "status"}``. Files written: ``config.json``, ``checkpoints/{best,last}.ckpt`` (stage-1
    checkpoints of two-stage methods under ``checkpoints/stage1/``), ``logs/*/metrics.csv``,
    ``val_logits.npz`` and ``test_logits.npz`` (arrays ``logits``, ``labels``; calibrated
    when the method calibrates), ``calibrator.pt`` for post-hoc methods, and last
    ``metrics.json``.
    """
    config.validate()
    method = get_method(config.method)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    device = _device(config)
    started = time.perf_counter()
    if not config.progress:
        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    lightning_info = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropLightningTips) for f in lightning_info.filters):
        lightning_info.addFilter(_DropLightningTips())

    data = load_dataset(config.dataset, root=config.data_root)
    if data.task == "multilabel" and not method.supports_multilabel:
        usable = [m for m, spec in METHODS.items() if spec.supports_multilabel]
        raise ValueError(
            f"--method {method.name} has no multi-task form; on the multi-label dataset "
            f"{config.dataset!r} use one of: {', '.join(usable)}."
        )
    L.seed_everything(config.seed, workers=False, verbose=False)
    backbone = create_model(
        config.model_name, num_classes=data.num_classes, input_shape=data.input_shape
    )
    if config.channels_last:
        backbone = backbone.to(memory_format=torch.channels_last)
    if config.compile:
        backbone.compile()  # in place: parameter names (and checkpoints) are unchanged
    resolved = {**config.resolved(), "task": data.task, "data": data.info}
    _prepare_out(out, resolved, resume=resume, overwrite=overwrite)
    _io.write_json(out / "config.json", resolved)

    timing: dict[str, Any] = {}
    # -- stage 1 ------------------------------------------------------------------------
    model = _stage1_model(method, backbone, data.task)
    module = CalibrationModule(
        model,
        loss_fn=loss_function(method, data.task),
        param_groups=_stage1_groups(method, model, config),
        step_size=config.step_size if method.uses_step_schedule else None,
        task=data.task,
        steps_per_call=config.steps_per_call,
    )
    timing["stage1"] = _fit(
        module,
        data,
        config,
        epochs=config.epochs,
        ckpt_dir=out / "checkpoints" / ("stage1" if method.stage2 else ""),
        log_name="stage1",
        device=device,
        resume=resume,
    )
    final: nn.Module = model

    # -- stage 2: TST / V-TST head on the frozen body -----------------------------------
    if method.stage2:
        L.seed_everything(config.seed + 1, workers=False, verbose=False)
        head_cls = VTSTHead if method.stage2 == "vtst" else TSTHead
        head = head_cls(backbone.num_features, data.num_classes)
        final = FrozenBodyHead(backbone, head)
        module2 = CalibrationModule(
            final,
            loss_fn=F.cross_entropy,
            param_groups=lambda: [{"params": list(head.parameters()), "lr": STAGE2_LR}],
            step_size=None,
            task=data.task,
            variational=method.stage2 == "vtst",
            steps_per_call=config.steps_per_call,
        )
        timing["stage2"] = _fit(
            module2,
            data,
            config.replace(patience=None),
            epochs=config.stage2_epochs,
            ckpt_dir=out / "checkpoints",
            log_name="stage2",
            device=device,
            resume=resume,
        )

    ranks = {stage.pop("rank", 0) for stage in timing.values()}
    if ranks != {0}:
        return {"status": "worker"}  # other processes of a multi-device run: rank 0 reports

    # -- predictions, post-hoc calibration on validation only ---------------------------
    val_logits, val_labels = predict_logits(final, data, "val", device=device, seed=config.seed)
    calibrator: nn.Module = nn.Identity()
    if method.posthoc:
        start = time.perf_counter()
        calibrator = _posthoc_calibrator(method.posthoc, data.task).fit(val_logits, val_labels)
        timing["posthoc_seconds"] = time.perf_counter() - start
        _io.save_torch(out / "calibrator.pt", calibrator.state_dict())

    def predict(x: str | torch.Tensor) -> torch.Tensor:
        logits, _ = predict_logits(final, data, x, device=device, seed=config.seed)
        with torch.no_grad():
            return calibrator(logits)

    with torch.no_grad():
        val_logits = calibrator(val_logits)
    test_logits, test_labels = predict("test"), data.test.y
    start = time.perf_counter()
    ood_result, shift, unavailable = _robustness(predict, data, test_logits, config)
    timing["robustness_seconds"] = time.perf_counter() - start

    names = data.class_names if data.task == "multilabel" else None
    result = {
        "config": resolved,
        "val": evaluate(val_logits, val_labels, task=data.task, task_names=names),
        "test": evaluate(test_logits, test_labels, task=data.task, task_names=names),
        "ood": ood_result,
        "shift": shift,
        "unavailable": unavailable,
        "timing": {**timing, "total_seconds": time.perf_counter() - started},
        "status": "complete",
    }
    _io.save_npz(out / "val_logits.npz", logits=val_logits.numpy(), labels=val_labels.numpy())
    _io.save_npz(out / "test_logits.npz", logits=test_logits.numpy(), labels=test_labels.numpy())
    _io.write_json(out / "metrics.json", _finite(result))
    return result


def _finite(obj: Any) -> Any:
    """Replace non-finite floats by None so that metrics.json stays valid JSON."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def tune(config: TrainConfig, grid: list[dict[str, Any]], out: str | Path) -> dict[str, Any]:
    """Train ``config`` at every grid point and choose by validation cross-entropy (NLL).

    Each point is a dict of config changes, e.g. ``{"lr": 1e-3, "calibrator_lr": 1e-4}``;
    each run goes to ``out/<point>/`` and is skipped when already complete (resumable).
    Writes ``out/tune.csv`` (every point with its validation metrics) and ``out/tune.json``
    (the table and the chosen point). The test split plays no part in the choice.
    """
    if not grid:
        raise ValueError("the tuning grid is empty; give at least one point.")
    out = Path(out)
    rows: list[dict[str, Any]] = []
    for point in grid:
        cfg = config.replace(**point)  # validates each point (e.g. λ_c < λ_f)
        run_dir = out / "_".join(
            f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in point.items()
        )
        cfg = cfg.replace(out=str(run_dir), progress=False)
        if is_complete(run_dir):
            result = json.loads((run_dir / "metrics.json").read_text())
        else:
            result = run(cfg, resume=True)
        val = result["val"]
        rows.append(
            {
                **point,
                "val_nll": val["nll"],
                "val_brier": val["brier"],
                "val_acc": val["acc"],
                "run": str(run_dir),
            }
        )
    finite = [r for r in rows if r["val_nll"] is not None and math.isfinite(r["val_nll"])]
    if not finite:
        raise RuntimeError(f"every tuning run in {out} diverged (no finite validation NLL).")
    best = min(finite, key=lambda r: r["val_nll"])
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    _io.write_text(out / "tune.csv", buf.getvalue())
    chosen = {k: best[k] for k in grid[0]}
    summary = {"selection": "validation NLL (cross-entropy)", "best": chosen, "table": rows}
    _io.write_json(out / "tune.json", summary)
    return summary
