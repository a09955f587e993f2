""":func:`cogcal.fit`: the paper's recipe on your own model and data, from Python.

It builds a :class:`~cogcal.train.TrainConfig` and runs the same code as ``cogcal train``
(:func:`cogcal.train.runner.execute`): the same loop, checks, checkpoints and errors.
"""

from __future__ import annotations

import csv
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from cogcal._constraints import FRACTION, check
from cogcal._errors import ArgumentError
from cogcal.cog import CalibratedModel, find_classifier
from cogcal.data import SPLIT_SEED, stratified_split
from cogcal.health import CalibrationWarning, HealthReport
from cogcal.train.choice import COG_SIDE, METHOD_GIVEN
from cogcal.train.config import PAPER_BATCH, TrainConfig, auto_budget, field_default
from cogcal.train.runner import execute
from cogcal.train.sources import EVAL_BATCH, LoaderSource
from cogcal.train.tuning import edge_warning

__all__ = ["FitResult", "fit"]


@dataclass
class FitResult:
    """What :func:`cogcal.fit` returns.

    Attributes
    ----------
    model : CalibratedModel
        The trained model in eval mode with the best-validation-Brier weights, predicting
        calibrated logits (for post-hoc methods the fitted calibrator is appended).
    metrics : dict
        Validation metrics of ``model`` (``acc``, ``nll``, ``brier``, ``ece_15``, ...).
    history : list of dict
        One row per epoch and stage (learning rates, training loss, validation metrics).
    out : Path or None
        The run folder when ``out`` was given (a ``cogcal train`` run folder: resumable,
        loadable with :func:`cogcal.load_run`).
    config : TrainConfig
        The configuration that ran.
    validation : str
        Where the validation data came from (given, or the split taken from the training
        data).
    timing : dict
        Seconds per stage (``timing["stage1"]["seconds"]``: the training loop) and in total.
    health : HealthReport
        The calibration health check on the validation data (:mod:`cogcal.health`); each
        finding was also raised as a :class:`cogcal.health.CalibrationWarning`.
    selection : dict or None
        Without ``lr``: the learning rates tried, their validation NLL, the choice and
        its cost in runs and seconds.
    """

    model: CalibratedModel
    metrics: dict[str, float]
    history: list[dict[str, Any]]
    out: Path | None
    config: TrainConfig
    validation: str
    timing: dict[str, Any]
    health: HealthReport
    selection: dict[str, Any] | None = None


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as err:
        raise ArgumentError(
            f"`{name}` must be a tensor or an array, got {type(value).__name__} ({err})."
        ) from None


def _pair(data: Any, name: str, task: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(x, y)`` tensors from a pair or a TensorDataset; None for other kinds."""
    if isinstance(data, TensorDataset):
        if len(data.tensors) != 2:
            raise ArgumentError(
                f"`{name}` is a TensorDataset of {len(data.tensors)} tensors; expected 2 "
                "(inputs, labels)."
            )
        data = data.tensors
    if not isinstance(data, tuple | list) or isinstance(data, str):
        return None
    if len(data) != 2:
        raise ArgumentError(
            f"`{name}` must be a pair (x, y), a torch Dataset or a DataLoader; got a sequence "
            f"of {len(data)} items."
        )
    x, y = _as_tensor(data[0], f"{name}[0]"), _as_tensor(data[1], f"{name}[1]")
    if len(x) != len(y):
        raise ArgumentError(
            f"`{name}` has {len(x)} inputs but {len(y)} labels; they must describe the same "
            "samples."
        )
    if len(x) == 0:
        raise ArgumentError(f"`{name}` is empty.")
    if x.is_floating_point() or x.dtype not in (torch.uint8, torch.int64, torch.int32):
        x = x.float()
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).reshape(len(x), -1).any(dim=1).nonzero()[0])
        raise ArgumentError(
            f"`{name}[0]` holds non-finite inputs (NaN or inf; first in sample {bad}); "
            "training on them makes every loss NaN: clean or impute them first."
        )
    if task == "multiclass":
        if y.is_floating_point() and not torch.equal(y, y.round()):
            raise ArgumentError(
                f"`{name}` labels must be class indices (integers); got fractional values. "
                "For several binary targets per sample pass task='multilabel'."
            )
        if y.ndim != 1:
            raise ArgumentError(
                f"`{name}` labels must have shape (N,) with class indices, got "
                f"{tuple(y.shape)}; for (N, T) 0/1 targets pass task='multilabel'."
            )
        y = y.long()
    else:
        if y.ndim != 2:
            raise ArgumentError(f"`{name}` multi-label targets must have shape (N, T) of 0/1.")
        y = y.long()
    return x, y


def _labels_of(dataset: Dataset) -> np.ndarray:
    return np.asarray([int(dataset[i][1]) for i in range(len(dataset))])


def fit(
    model: nn.Module,
    train_data: Any,
    val_data: Any = None,
    *,
    method: str | None = None,
    epochs: int | None = field_default("epochs"),
    lr: float | None = field_default("lr"),
    calibrator_lr: float | None = field_default("calibrator_lr"),
    batch_size: int | None = field_default("batch_size"),
    out: str | Path | None = None,
    val_fraction: float = 0.2,
    task: str = "multiclass",
    num_classes: int | None = None,
    seed: int = field_default("seed"),
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = field_default("progress"),
    **options: Any,
) -> FitResult:
    """Train ``model`` with the paper's recipe and a method of the registry.

    Parameters
    ----------
    model : nn.Module
        Your network, producing logits (its final linear layer is found as in
        :class:`~cogcal.CalibratedModel`). With ``lr`` given it is trained in place;
        without, copies of it are trained (one per learning rate tried) and the chosen
        weights are loaded into it.
    train_data, val_data
        Each a pair ``(x, y)`` of tensors or arrays (the fast path), a
        ``torch.utils.data.Dataset`` yielding ``(x, y)``, or a ``DataLoader`` (used as
        given: its batch size, shuffling and workers). ``val_data=None`` takes a stratified
        ``val_fraction`` of the training data (fixed seed) for validation, stated in
        :attr:`FitResult.validation`. Validation data is used for checkpoint choice and, for
        post-hoc methods, to fit the calibrator — never for the gradient steps of COG.
    method : str, optional
        A method of the registry (``cogcal.train.list_methods()``). Unset, with ``lr`` unset
        too (the default path): ``"cog-fc"`` weighed against cross-entropy + post-hoc
        calibration on the validation data, the one with the lower validation NLL kept
        (:mod:`cogcal.train.choice`; recorded in :attr:`FitResult.selection`
        ``["choice"]``); unset with ``lr``: ``"cog-fc"``.
    epochs, lr, calibrator_lr, batch_size, seed
        As in ``cogcal train``. Left unset (``preset="auto"``, the default), the batch size
        and the epochs come from the training-set size (at least 1,500 optimizer steps,
        :func:`cogcal.train.config.auto_budget`), the rates are divided by 10 after each
        third of the run, and without ``lr`` the rates are chosen by validation
        cross-entropy on a small grid (at most 5 points for COG methods, 3 for the others;
        :mod:`cogcal.train.select`), by successive halving (``selection="halving"``, about
        2.2 runs of that budget) or every point to the end (``"full"``); the chosen run is
        the result. ``lr=`` trains one configuration (λ_c = λ_f/10 unless
        ``calibrator_lr``); ``preset="paper"`` gives the paper's settings.
    out : path, optional
        A run folder to write (checkpoints, logs, metrics.json; resumable with
        ``resume=True``). Without it, checkpoints live in a temporary folder.
    task : {"multiclass", "multilabel"}
        ``"multilabel"``: labels of shape (N, T) with 0/1 entries, one logit per task.
    num_classes : int, optional
        Outputs of the model; by default those of its final linear layer.
    **options
        Any other :class:`~cogcal.train.TrainConfig` field (``schedule``, ``step_size``,
        ``patience``, ``stage2_epochs``, ``allow_fast_calibrator``, ``precision``, ...).

    Returns
    -------
    FitResult

    Examples
    --------
    >>> import torch, cogcal
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(600, 8, generator=g); y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    >>> result = cogcal.fit(net, (x, y), epochs=3, batch_size=64, lr=1e-3, progress=False)
    >>> result.validation
    'stratified 20% of train_data (120 samples, seed 20240917)'
    >>> sorted(result.metrics)[:3], len(result.history)
    (['acc', 'adaece_15', 'aurc'], 3)
    >>> [f.kind for f in result.health.findings]  # 3 epochs of 8 steps: too short
    ['under-trained']
    """
    num_classes, inferred = _check_call(model, task, val_fraction, options, num_classes)
    source, batch_size = _data(
        model, train_data, val_data, task=task, num_classes=num_classes, inferred=inferred,
        val_fraction=val_fraction, batch_size=batch_size, epochs=epochs,
        preset=options.get("preset", field_default("preset")),
    )  # fmt: skip
    validation = source.info["validation"]
    with tempfile.TemporaryDirectory(prefix="cogcal-fit-") as tmp:
        fields = {"epochs": epochs, "lr": lr, "calibrator_lr": calibrator_lr, "seed": seed}
        fields.update(batch_size=batch_size, progress=progress, **options)
        config = _config(model, method, out if out is not None else Path(tmp) / "run", fields)
        record, trained = execute(
            config, resume=resume, overwrite=overwrite, data=source, model=model
        )
        history = _history(Path(config.out))
    return _result(record, trained, history, config, out=out, validation=validation)


def _config(
    model: nn.Module, method: str | None, out: str | Path, fields: dict[str, Any]
) -> TrainConfig:
    """The configuration :func:`fit` runs: ``method`` unset is the default path (COG-FC,
    weighed against cross-entropy + post hoc without ``lr``); a method given is trained
    alone (:data:`~cogcal.train.choice.METHOD_GIVEN`)."""
    if method is not None:
        fields["extra"] = {**fields.get("extra", {}), METHOD_GIVEN: True}
    return TrainConfig.from_dict(
        {
            "dataset": "python:data", "model": f"python:{type(model).__name__}",
            "method": method or COG_SIDE, "out": str(out), **fields,
        }
    )  # fmt: skip


def _result(
    record: dict[str, Any], trained: Any, history: list[dict[str, Any]], config: TrainConfig,
    *, out: str | Path | None, validation: str,
) -> FitResult:  # fmt: skip
    """The :class:`FitResult` of a run, its health findings and edge warning raised (at
    the caller of :func:`fit`)."""
    health = HealthReport.from_dict(record.get("health") or {})
    for finding in health.findings:
        warnings.warn(finding.message, CalibrationWarning, stacklevel=3)
    if message := edge_warning(record.get("selection"), python=True):
        warnings.warn(message, UserWarning, stacklevel=3)
    return FitResult(
        model=trained, metrics=record["val"], history=history,
        out=Path(out) if out is not None else None, config=config, validation=validation,
        timing=record["timing"], health=health, selection=record.get("selection"),
    )  # fmt: skip


def _check_call(
    model: Any, task: str, val_fraction: float, options: dict[str, Any], num_classes: int | None
) -> tuple[int, bool]:
    """Check the arguments of :func:`fit` that are not data; returns the number of outputs
    (``num_classes``, or the model's final linear layer's) and whether it was inferred."""
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"`model` must be a torch nn.Module, got {type(model).__name__}.")
    if task not in ("multiclass", "multilabel"):
        raise ArgumentError(f"`task` must be 'multiclass' or 'multilabel', got {task!r}.")
    check(val_fraction, FRACTION, "val_fraction")
    if (
        options.get("devices", field_default("devices")) != 1
        or options.get("num_nodes", field_default("num_nodes")) != 1
    ):
        raise ArgumentError(
            "cogcal.fit trains in one process; for several devices use `cogcal train` with "
            "--devices/--strategy ddp, or CalibratedModel in your own distributed loop."
        )
    if num_classes is not None:
        return num_classes, False
    try:
        return find_classifier(model)[1].out_features, True
    except ValueError:
        raise ArgumentError(
            "cannot tell the number of outputs of `model` (no final linear layer found); "
            "pass num_classes=."
        ) from None


Pair = tuple[torch.Tensor, torch.Tensor]


def _data(
    model: nn.Module, train_data: Any, val_data: Any, *, task: str, num_classes: int,
    inferred: bool, val_fraction: float, batch_size: int | None, epochs: int | None,
    preset: str,
) -> tuple[LoaderSource, int]:  # fmt: skip
    """The data of :func:`fit` checked against ``model`` and split when no validation data
    is given, as the runner takes it, and the batch size it is trained with."""
    train = _pair(train_data, "train_data", task)
    val = None if val_data is None else _pair(val_data, "val_data", task)
    _check_pairs(model, train, val, num_classes, task, inferred=inferred)
    if val_data is None:
        train, val, train_data, val_data, validation = _split(train, train_data, val_fraction, task)
    else:
        validation = "val_data as given"
    batch_size = _batch_size(batch_size, train, train_data, epochs=epochs, preset=preset)
    source = _source(
        train if train is not None else _loader(train_data, batch_size, shuffle=True),
        val if val is not None else _loader(val_data, EVAL_BATCH, shuffle=False),
        task=task, num_classes=num_classes, validation=validation,
    )  # fmt: skip
    return source, batch_size


def _check_pairs(
    model: nn.Module, train: Pair | None, val: Pair | None, num_classes: int, task: str,
    *, inferred: bool,
) -> None:  # fmt: skip
    """Probe ``model`` on the tensors given, and check that the training labels use every
    output when the number of outputs was inferred from the model."""
    for name, pair in (("train_data", train), ("val_data", val)):
        if pair is not None:
            _probe(model, pair, name, num_classes, task)
    if inferred and train is not None and task == "multiclass":
        used = int(train[1].max()) + 1
        if used < num_classes:
            raise ArgumentError(
                f"`model` has {num_classes} outputs but the labels of `train_data` use only "
                f"classes 0..{used - 1}; give the model {used} outputs, or pass "
                f"num_classes={num_classes} if classes {used}..{num_classes - 1} exist but are "
                "absent from the training data."
            )


def _split(
    train: Pair | None, train_data: Any, val_fraction: float, task: str
) -> tuple[Pair | None, Pair | None, Any, Any, str]:
    """Hold out a stratified ``val_fraction`` of the training data (fixed seed) for
    validation: ``(train, val, train_data, val_data, validation)``."""
    if isinstance(train_data, DataLoader):
        raise ArgumentError(
            "`val_data` is needed when `train_data` is a DataLoader (cogcal does not split "
            "your loader); pass a validation loader or dataset."
        )
    labels = train[1].numpy() if train is not None else _labels_of(train_data)
    if task == "multilabel":
        labels = labels[:, 0]
    keep, held = stratified_split(labels, val_fraction, seed=SPLIT_SEED)
    validation = (
        f"stratified {val_fraction:.0%} of train_data ({len(held)} samples, seed {SPLIT_SEED})"
    )
    if train is not None:
        x, y = train
        return (x[keep], y[keep]), (x[held], y[held]), None, None, validation
    held_out = Subset(train_data, held.tolist())
    return None, None, Subset(train_data, keep.tolist()), held_out, validation


def _batch_size(
    batch_size: int | None, train: Pair | None, train_data: Any, *, epochs: int | None,
    preset: str,
) -> int:  # fmt: skip
    """The batch size given, else the loader's own, else the automatic budget's (preset
    ``auto``), else the paper's."""
    if isinstance(train_data, DataLoader) and batch_size is None:
        batch_size = train_data.batch_size  # the loader's own (None: a batch sampler)
    if batch_size is None and preset == "auto":
        size = _size(train) if train is not None else _size(train_data)
        batch_size = auto_budget(size, epochs=epochs)["batch_size"]
    return PAPER_BATCH if batch_size is None else batch_size


def _source(train: Any, val: Any, *, task: str, num_classes: int, validation: str) -> LoaderSource:
    """The data of :func:`fit` as the runner takes it (labels checked against the
    outputs)."""
    for name, pair in (("train_data", train), ("val_data", val)):
        if isinstance(pair, tuple) and task == "multiclass":
            top = int(pair[1].max())
            if int(pair[1].min()) < 0 or top >= num_classes:
                raise ArgumentError(
                    f"`{name}` has labels outside 0..{num_classes - 1} (found {top}); the model "
                    f"has {num_classes} outputs."
                )
    info = {
        "source": "cogcal.fit",
        "validation": validation,
        "train_size": _size(train),
        "val_size": _size(val),
    }
    if isinstance(train, tuple):
        info["input_shape"] = list(train[0].shape[1:])
        info["input_dtype"] = str(train[0].dtype).removeprefix("torch.")
    return LoaderSource(
        name="python", task=task, num_classes=num_classes, train=train, val=val,
        class_names=[str(k) for k in range(num_classes)], info=info,
    )  # fmt: skip


def _history(folder: Path) -> list[dict[str, Any]]:
    """The per-epoch logs of a run folder, stage 1 then stage 2."""
    history = []
    for stage in ("stage1", "stage2"):
        log = folder / "logs" / f"{stage}.csv"
        if log.is_file():
            with log.open(newline="") as f:
                history += [{"stage": stage, **_numbers(row)} for row in csv.DictReader(f)]
    return history


def _probe(
    model: nn.Module, pair: tuple[torch.Tensor, torch.Tensor], name: str, num_classes: int,
    task: str,
) -> None:  # fmt: skip
    """Run ``model`` on two samples of ``pair`` before training, so that inputs it cannot
    take, or outputs that do not match the classes, are an error naming the argument
    (not an error from inside torch after the folder was prepared)."""
    x, y = pair
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    training = model.training
    what = f"`{name}[0]` (per-sample shape {tuple(x.shape[1:])}, dtype {x.dtype})"
    try:
        with torch.no_grad():
            model.eval()
            out = model(x[:2].to(device))
    except (RuntimeError, TypeError, ValueError, IndexError) as err:
        hint = ""
        if x.ndim == 1:
            hint = " Inputs need a feature axis: reshape a single feature to (N, 1)."
        elif not x.is_floating_point():
            hint = " Integer inputs are passed as they are (e.g. token ids); for features "
            hint += "pass floats (x.float())."
        raise ArgumentError(
            f"`model` cannot take the inputs of {what}: {type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]}.{hint}"
        ) from None
    finally:
        model.train(training)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[1] != num_classes:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        kind = "tasks" if task == "multilabel" else "classes"
        raise ArgumentError(
            f"`model` gives outputs of shape {shape} for 2 samples of `{name}`, but the data "
            f"has {num_classes} {kind} (num_classes={num_classes}); it must give logits of "
            f"shape (N, {num_classes}): one output per class."
        )


def _numbers(row: dict[str, str]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if v not in ("", None)}


def _size(data: Any) -> int:
    if isinstance(data, tuple):
        return len(data[0])
    if isinstance(data, DataLoader):
        return len(data.dataset)  # type: ignore[arg-type]
    return len(data)


def _loader(data: Any, batch_size: int, *, shuffle: bool) -> DataLoader:
    if isinstance(data, DataLoader):
        return data
    if isinstance(data, Dataset):
        return DataLoader(data, batch_size=batch_size, shuffle=shuffle)
    raise ArgumentError(
        f"data must be a pair (x, y), a torch Dataset or a DataLoader; got {type(data).__name__}."
    )
