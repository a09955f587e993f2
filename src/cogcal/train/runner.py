"""Run one training job end to end (``cogcal train``), following the method's definition.

:func:`run`:

1. checks the run folder (:mod:`cogcal.runs`: never clobber, resume only the same
   configuration) and holds its lock;
2. stage 1 trains the network (COG: with its calibrator on λ_c) on the training split,
   keeping the best-validation-Brier checkpoint (:func:`cogcal.train.loop.fit_stage`);
3. stage 2 (``tst``/``vtst``) freezes the body and trains a new TST / V-TST head on the
   training split, again keeping the best-validation-Brier checkpoint;
4. post hoc (``ts``/``vs``/``ms``): fits the calibrator on the *validation* logits;
5. evaluates on validation and test, OOD and shift sets (while the last checkpoints are
   written in the background), and writes the run folder, ``metrics.json`` last, once
   every checkpoint is on the disk.

The test split is only ever evaluated, never used for fitting, tuning or selection.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cogcal import _io
from cogcal.cog import CalibratedModel
from cogcal.data import Dataset, load_dataset, with_augment
from cogcal.metrics import evaluate
from cogcal.models import create_model
from cogcal.runs import RunDir, RunRecord, config_digest
from cogcal.runs.methods import METHODS, Method, get_method
from cogcal.train.assemble import final_model, posthoc_calibrator, stage1_model, stage2_model
from cogcal.train.checkpoints import CheckpointWriter
from cogcal.train.checkup import run_health
from cogcal.train.choice import weigh_and_train, weighs
from cogcal.train.config import LOG_NLL_TS, ConfigError, TrainConfig
from cogcal.train.devices import launch
from cogcal.train.loop import NonFiniteLossError, Stage, fit_stage
from cogcal.train.methods import loss_function
from cogcal.train.robustness import (
    DEFER_ROBUSTNESS,
    DEFERRED,
    evaluate_robustness,
    inputs,
    predict_logits,
)
from cogcal.train.search import Outcome, Search
from cogcal.train.select import describe_budget, select_and_train, train_size
from cogcal.train.sources import EVAL_BATCH, DatasetSource, DataSource
from cogcal.train.tuning import (
    Grid,
    check_tune_folder,
    mark_tune_folder,
    point_config,
    point_label,
    point_status,
    with_data_model,
    write_tables,
)

__all__ = [
    "EVAL_BATCH",
    "STAGE2_LR",
    "is_complete",
    "execute",
    "predict_logits",
    "run",
    "tune",
]

STAGE2_LR = 1e-4  # TST / V-TST stage-2 head learning rate (Adam), docs/method.md §2


def _stage1_groups(method: Method, model: nn.Module, config: TrainConfig) -> list[dict[str, Any]]:
    lr, cal_lr = config.learning_rates()
    if isinstance(model, CalibratedModel):
        return model.param_groups(lr, cal_lr, allow_fast_calibrator=config.allow_fast_calibrator)
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": params, "lr": lr, "name": "network"}]


def _check_applies(method: Method, source: DataSource) -> None:
    """Refuse, before any training, a method the data cannot take: one without a multi-task
    form on multi-label data, a two-class method on K != 2 classes."""
    problem = method.classes_problem(source.num_classes, source.name)
    if source.task == "multiclass" and problem is not None:
        raise ConfigError(lambda n: f"{n('method')} {method.name} {problem}.")
    if source.task == "multilabel" and not method.supports_multilabel:
        usable = [m for m, spec in METHODS.items() if spec.supports_multilabel]
        raise ConfigError(
            lambda n: (
                f"{n('method')} {method.name} has no multi-task form; on the multi-label "
                f"dataset {source.name!r} use one of: {', '.join(usable)}."
            )
        )


def run(config: TrainConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train, calibrate and evaluate one run; write everything into ``config.out``.

    ``resume`` continues an interrupted run in ``config.out`` from its last checkpoint (the
    configuration must be the same); ``overwrite`` first deletes what cogcal wrote there.
    Without either, a folder holding a finished or unfinished run is refused, and a folder
    cogcal did not write is never used unless empty (:meth:`RunDir.prepare`).

    Returns the content of ``metrics.json`` (:class:`~cogcal.runs.RunRecord`):
    ``{"config", "val", "test", "ood", "shift", "unavailable", "timing", "status"}`` (plus
    ``"val_uncalibrated"`` for post-hoc methods); other processes of a multi-device run
    return ``{"status": "worker"}``. Files written: see :mod:`cogcal.runs`.
    """
    return execute(config, resume=resume, overwrite=overwrite)[0]


def execute(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    data: DataSource | None = None,
    model: nn.Module | None = None,
    fabric: Any | None = None,
    stop_at_epoch: int | None = None,
) -> tuple[dict[str, Any], CalibratedModel | None]:
    """:func:`run`, returning also the trained model (a :class:`~cogcal.CalibratedModel`
    predicting the calibrated logits the run evaluated; None on processes other than 0).

    ``data`` and ``model`` replace the dataset and backbone named by ``config`` (this is
    how :func:`cogcal.fit` trains the user's own model on the user's own data, through the
    same loop, checks and files).

    Used by the learning-rate selection (:mod:`cogcal.train.select`) to train its points:
    ``fabric`` is a launched Fabric (or :class:`~cogcal.train.devices.SingleProcess`) to
    train with instead of launching one (every point of a multi-process selection trains
    in the processes launched once for all of them); ``stop_at_epoch`` pauses stage 1 once
    that many epochs are done, the stage not otherwise over: the state is saved, nothing is
    evaluated, and ``({"status": "paused", "epoch": N}, None)`` is returned; a later call
    with ``resume=True`` continues the run exactly as if it had never paused.
    """
    method = get_method(config.method)
    source = data if data is not None else DatasetSource(_load(config))
    _check_applies(method, source)
    # the budget left unset: from the training-set size (auto) or the paper's (fields given
    # are kept, so a fully specified configuration is unchanged)
    config = config.with_budget(train_size(source), task=source.task)
    if weighs(config, source.task):  # no method, no lr: COG-FC or cross-entropy + post hoc
        return weigh_and_train(
            config, source, model, train=execute, resume=resume, overwrite=overwrite
        )
    if config.selects_learning_rates:  # no lr given: chosen by validation cross-entropy
        return select_and_train(
            config, source, model, train=execute, resume=resume, overwrite=overwrite
        )
    if fabric is None:
        fabric = launch(config)
    folder = RunDir(config.out)
    if model is None:
        network, model_name = _network(config, source.dataset)
    else:
        network, model_name = model, config.model
    resolved = {
        **config.resolved(),
        "model": model_name,
        "task": source.task,
        "num_classes": source.num_classes,
        "input_shape": list(source.dataset.input_shape) if source.dataset is not None else None,
        "data": source.info,
        # what load_run/predict need to take raw inputs without the data (None: as given)
        "input": source.dataset.input_record() if source.dataset is not None else None,
        "class_names": list(source.class_names),
    }
    failure: BaseException | None = None
    resumed = False
    lock = contextlib.ExitStack()
    if fabric.is_global_zero:
        try:  # the lock before anything in the folder is read, cleared or written
            lock.enter_context(folder.lock())
            resumed = folder.prepare(config, resolved, resume=resume, overwrite=overwrite)
        except BaseException as err:  # noqa: BLE001 - re-raised below, after telling the others
            failure = err
            lock.close()
    ok, resumed = fabric.broadcast((failure is None, resumed), src=0)
    if failure is not None:
        raise failure
    if not ok:
        raise RuntimeError("process 0 could not prepare the run folder; see its error.")
    if fabric.is_global_zero and config.progress:
        print(describe_budget(resolved, train_size(source)), file=sys.stderr)
    with lock:
        if fabric.is_global_zero:
            folder.write_config(resolved)
        fabric.barrier()
        try:
            digest = config_digest(resolved)  # every checkpoint names its configuration
            with CheckpointWriter(enabled=fabric.is_global_zero, config_sha256=digest) as writer:
                return _train(
                    config, method, fabric, folder, source, network, resolved, resumed, writer,
                    stop_at_epoch,
                )  # fmt: skip
        except NonFiniteLossError as err:
            if fabric.is_global_zero:  # a result, not a crash: tune and bench record it
                folder.write_record(
                    RunRecord(config=resolved, val={}, test={}, status="diverged", error=str(err))
                )
            raise


def _load(config: TrainConfig) -> Dataset:
    return with_augment(_load_data(config), config.augment_name)


def _load_data(config: TrainConfig) -> Dataset:
    return load_dataset(
        config.dataset,
        root=config.data_root,
        download=config.download,
        mirror=config.mirror,
        target=config.target,
        image_size=config.image_size,
        normalization=config.normalization,
        progress=config.progress,
    )


def _network(config: TrainConfig, data: Dataset) -> tuple[nn.Module, str]:
    name = config.model or data.default_model
    if name is None:
        raise ConfigError(
            lambda n: (
                f"{n('dataset')} {config.dataset} names no default backbone; pass {n('model')}."
            )
        )
    torch.manual_seed(config.seed)  # the initial weights
    network = create_model(name, num_classes=data.num_classes, input_shape=data.input_shape)
    return network, name


def _train(
    config: TrainConfig,
    method: Method,
    fabric: Any,
    folder: RunDir,
    source: DataSource,
    network: nn.Module,
    resolved: dict[str, Any],
    resume: bool,
    writer: CheckpointWriter,
    stop_at_epoch: int | None = None,
) -> tuple[dict[str, Any], CalibratedModel | None]:
    started = time.perf_counter()
    if config.channels_last:
        network = network.to(memory_format=torch.channels_last)
    if config.compile:
        network.compile()  # in place: parameter names (and checkpoints) are unchanged
    world, rank = fabric.world_size, fabric.global_rank
    device = fabric.device if fabric.device.type == "cuda" else None
    train_loader = source.train_loader(
        config.batch_size // world, world=world, rank=rank, seed=config.seed, device=device
    )
    val_loader = source.val_loader(world=world, rank=rank, device=device)
    step_size = config.step_size if config.schedule_name == "step" else None
    timing: dict[str, Any] = {}
    two_stage = method.stage2 is not None

    histories: dict[str, list[dict[str, float]]] = {}

    def fit(stage: Stage, ckpt_dir: Path, stop_at: int | None = None) -> bool:
        """Train ``stage``; whether it paused at ``stop_at`` (unfinished)."""
        # CPU kernels are deterministic for a fixed thread count: CPU runs repeat and resume
        # bit for bit (tested) without torch.use_deterministic_algorithms, whose import of
        # torch._inductor costs seconds of start-up
        result = fit_stage(
                fabric, stage, train_loader, val_loader, ckpt_dir, writer=writer,
                log_path=folder.logs / f"{stage.name}.csv", resume=resume,
                progress=config.progress, channels_last=config.channels_last,
                checkpoint_seconds=float(config.checkpoint_seconds), stop_at=stop_at,
            )  # fmt: skip
        timing[stage.name] = result.to_dict()
        histories[stage.name] = result.history
        return result.stopped == "paused"

    # -- stage 1: the network (COG: with its calibrator on λ_c) ---------------------------
    model = stage1_model(method, network, source.task)
    paused = fit(
        Stage(
            "stage1", model, loss_function(method, source.task),
            _stage1_groups(method, model, config), config.epochs, step_size=step_size,
            patience=config.patience, task=source.task, seed=config.seed,
            temperature_nll=bool(config.extra.get(LOG_NLL_TS)),
        ),
        folder.stage_dir(two_stage),
        stop_at_epoch,
    )  # fmt: skip
    if paused:  # a rung of the learning-rate selection: the state is saved, nothing else
        writer.close()
        epoch = int(timing["stage1"]["epochs_run"])
        return ({"status": "paused", "epoch": epoch} if fabric.is_global_zero else
                {"status": "worker"}), None  # fmt: skip
    final: nn.Module = model

    # -- stage 2: TST / V-TST head on the frozen body -----------------------------------
    stage2: nn.Module | None = None
    if method.stage2:
        torch.manual_seed(config.seed + 1)
        final = stage2 = stage2_model(method, network, source.num_classes)
        fit(
            Stage(
                "stage2", final, F.cross_entropy,
                [{"params": list(final.head.parameters()), "lr": STAGE2_LR, "name": "head"}],
                config.stage2_epochs, task=source.task, variational=method.stage2 == "vtst",
                seed=config.seed,
            ),
            folder.checkpoints,
        )  # fmt: skip

    if not fabric.is_global_zero:
        return {"status": "worker"}, None  # other processes of a multi-device run
    stages = _Stages(network, model, stage2, timing, histories, len(train_loader), started)
    return _evaluate(config, method, fabric.device, folder, source, resolved, writer, stages)


@dataclass
class _Stages:
    """What the training stages of a run left: the models, the timing and the logs."""

    network: nn.Module  # the backbone
    model: nn.Module  # stage 1's model (COG: with its calibrator)
    stage2: nn.Module | None  # the TST / V-TST model of stage 2
    timing: dict[str, Any]
    histories: dict[str, list[dict[str, float]]]
    steps_per_epoch: int
    started: float  # time.perf_counter() at the start of training

    @property
    def final(self) -> nn.Module:
        return self.stage2 if self.stage2 is not None else self.model


class _Predictor:
    """The final model's logits on some batches, through the post-hoc calibrator once it
    is fitted; non-finite logits are a divergence, wherever they show."""

    def __init__(self, final: nn.Module, device: Any, seed: int) -> None:
        self.final, self.device, self.seed = final, device, seed
        self.calibrator: nn.Module = nn.Identity()

    def __call__(self, batches: Any, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        logits, labels = predict_logits(self.final, batches, device=self.device, seed=self.seed)
        with torch.no_grad():
            out = self.calibrator(logits)
        if not bool(torch.isfinite(out).all()):
            raise NonFiniteLossError(
                f"the final model's {split} logits are non-finite"
                + ("" if isinstance(self.calibrator, nn.Identity) else " after its calibrator")
                + "; the run diverged. Lower the learning rate(s) and retry."
            )
        return out, labels


Metrics = Callable[[torch.Tensor, torch.Tensor], dict[str, float]]


def _evaluate(
    config: TrainConfig, method: Method, device: Any, folder: RunDir, source: DataSource,
    resolved: dict[str, Any], writer: CheckpointWriter, stages: _Stages,
) -> tuple[dict[str, Any], CalibratedModel]:  # fmt: skip
    """Process 0, after training: predictions, post-hoc calibration on validation only,
    the test, OOD and shift sets, the health check; writes the record (last) and returns
    it with the trained model."""
    predict = _Predictor(stages.final, device, config.seed)
    names = source.class_names if source.task == "multilabel" else None

    def metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        return evaluate(logits, labels, task=source.task, task_names=names)

    val_logits, val_labels = predict(source.split("val"), "validation")
    val_uncalibrated = None
    if method.posthoc:
        val_logits, val_uncalibrated = _posthoc(
            config, method, source.task, folder, predict, val_logits, val_labels, metrics,
            stages.timing,
        )  # fmt: skip
    test, robustness = _test(config, folder, source, predict, metrics, stages.timing)
    writer.close()  # the checkpoints are on the disk before the record says the run is complete
    timing = stages.timing
    timing["total_seconds"] = time.perf_counter() - stages.started
    health = run_health(
        config, method, val_logits, val_labels, task=source.task,
        history=stages.histories.get("stage1") or [], steps_per_epoch=stages.steps_per_epoch,
        epochs_run=int(timing["stage1"]["epochs_run"]),
    )  # fmt: skip
    record = RunRecord(
        health=health.to_dict(),
        config=resolved,
        val=metrics(val_logits, val_labels),
        test=test,
        val_uncalibrated=val_uncalibrated,
        timing=timing,
        **robustness,
    )
    _io.save_npz(
        folder.path / "val_logits.npz", logits=val_logits.numpy(), labels=val_labels.numpy()
    )
    folder.write_record(record)
    trained = final_model(
        method, stages.network, stages.model, task=source.task,
        head=None if stages.stage2 is None else stages.stage2.head,
        calibrator=predict.calibrator if method.posthoc else None,
    )  # fmt: skip
    return record.to_dict(), trained.eval()


def _posthoc(
    config: TrainConfig, method: Method, task: str, folder: RunDir, predict: _Predictor,
    val_logits: torch.Tensor, val_labels: torch.Tensor, metrics: Metrics,
    timing: dict[str, Any],
) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """Fit the method's post-hoc calibrator on the validation logits (saved, and used by
    ``predict`` from now on); returns the calibrated validation logits and the metrics
    before calibration."""
    start = time.perf_counter()
    val_uncalibrated = metrics(val_logits, val_labels)
    calibrator = posthoc_calibrator(method.posthoc, task)
    if config.progress and getattr(calibrator, "l2", None) == "cv":  # seconds, not instant
        print(
            f"post-hoc {method.posthoc}: choosing its penalty by {calibrator.cv}-fold "
            f"cross-validation on {tuple(val_logits.shape)} validation logits",
            file=sys.stderr,
        )
    calibrator.fit(val_logits, val_labels)
    calibrator.requires_grad_(False)
    predict.calibrator = calibrator
    timing["posthoc_seconds"] = time.perf_counter() - start
    _io.save_torch(folder.path / "calibrator.pt", calibrator.state_dict())
    with torch.no_grad():
        val_logits = calibrator(val_logits)
    if not bool(torch.isfinite(val_logits).all()):
        raise NonFiniteLossError(
            "the validation logits are non-finite after the post-hoc calibrator; the run "
            "diverged. Lower the learning rate(s) and retry."
        )
    return val_logits, val_uncalibrated


def _test(
    config: TrainConfig, folder: RunDir, source: DataSource, predict: _Predictor,
    metrics: Metrics, timing: dict[str, Any],
) -> tuple[dict[str, float], dict[str, Any]]:  # fmt: skip
    """The test metrics (the logits saved) and the OOD and shift results (``ood``,
    ``shift``, ``unavailable``), deferred when the run is a point of a selection."""
    test_batches = source.split("test")
    test: dict[str, float] = {}
    found: dict[str, Any] = {"ood": {}, "shift": {}, "unavailable": {}}
    if test_batches is None:
        return test, found
    test_logits, test_labels = predict(test_batches, "test")
    test = metrics(test_logits, test_labels)
    _io.save_npz(
        folder.path / "test_logits.npz", logits=test_logits.numpy(), labels=test_labels.numpy()
    )
    if source.dataset is not None and config.extra.get(DEFER_ROBUSTNESS):
        found["unavailable"] = {"ood": {"all": DEFERRED}, "shift": {"all": DEFERRED}}
    elif source.dataset is not None:
        start = time.perf_counter()
        found["ood"], found["shift"], found["unavailable"] = evaluate_robustness(
            lambda x: predict(inputs(source.dataset, x), "OOD or shift")[0], source.dataset,
            test_logits,
            config,
        )  # fmt: skip
        timing["robustness_seconds"] = time.perf_counter() - start
    return test, found


def is_complete(out: str | Path) -> bool:
    """Whether ``out`` holds a finished run (see :class:`cogcal.runs.RunDir`)."""
    return RunDir(out).is_complete()


def _tune_point(
    cfg: TrainConfig, *, overwrite: bool, data: DataSource | None = None
) -> tuple[str, RunRecord | None]:
    """Train (or reuse) one grid point: ``(status, record)``, ``status`` one of
    ``"complete"`` and ``"diverged"`` (the record of a diverged point: None, or its own)."""
    folder = RunDir(cfg.out)
    with folder.lock():  # held from the first read to the record (run() takes it again)
        status = point_status(folder, cfg, overwrite=overwrite)
        if status in ("complete", "diverged"):
            return status, folder.read_record()
        resume, replace = status == "unfinished", status == "replace"
        try:
            if data is None:
                run(cfg, resume=resume, overwrite=replace)
            else:
                execute(cfg, resume=resume, overwrite=replace, data=data)
        except NonFiniteLossError:
            return "diverged", None
        return "complete", folder.read_record()


def tune(
    config: TrainConfig,
    grid: Grid,
    out: str | Path,
    *,
    max_extensions: int = 2,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train ``config`` over ``grid``, extended while the choice is at an edge, and choose by
    validation cross-entropy (:mod:`cogcal.train.tuning`).

    Each point runs in ``out/<point_label>/``; a point folder already holding a finished
    (or diverged) run *of the same configuration* is reused, an unfinished one is resumed,
    and one holding a run of another configuration is an error unless ``overwrite``. A
    diverged point is recorded with ``status: diverged`` and excluded from the choice.
    Writes ``out/tune.csv`` and ``out/tune.json`` and returns the latter's content. ``out``
    is taken as ``cogcal train`` takes its folder: locked first, then refused unless it is
    new, empty or written by ``cogcal tune`` (:func:`~cogcal.train.tuning.check_tune_folder`),
    and marked as tune's before its first point trains.

    Raises
    ------
    ArgumentError
        ``out`` holds a ``cogcal train`` run, a bench or files cogcal did not write.
    NonFiniteLossError
        Every point diverged (the message names them); the tables are written first.
    """
    out = Path(out)
    with RunDir(out).lock():
        check_tune_folder(out)  # the lock first, then the folder's owner
        source = None
        # every point trains the same budget, a plugin's backbone is known once loaded, and
        # a two-class method is refused on other data before the folder is marked
        method = get_method(config.method)
        if not config.budget_resolved or config.model_name is None or method.two_class:
            source = DatasetSource(_load(config))
            _check_applies(method, source)
        if not config.budget_resolved:
            config = config.with_budget(train_size(source), task=source.task)
        config = with_data_model(config, source, None)
        search = Search(grid, max_extensions=max_extensions, schedule=config.resolved()["schedule"])
        mark_tune_folder(out)
        records: dict[str, RunRecord | None] = {}

        def train(point: dict[str, float], until: int | None) -> Outcome:
            cfg = config.replace(
                **point_config(point), out=str(out / point_label(point)), progress=False
            )
            status, record = _tune_point(cfg, overwrite=overwrite, data=source)
            records[point_label(point)] = record
            if record is None:
                return Outcome(status)
            return Outcome(status, record.selection_nll, dict(record.val))

        summary = search.run(train)
        if search.best is not None:  # the chosen run's health check (validation only)
            chosen = records[point_label(search.best)]
            summary["health"] = chosen.health if chosen is not None else None
        write_tables(out, summary)
    if search.best is None:
        raise NonFiniteLossError(
            f"every tuning point in {out} diverged "
            f"({', '.join(r['run'] for r in summary['table'])}); try smaller learning rates."
        )
    return summary
