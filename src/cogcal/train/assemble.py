"""The model a method trains and predicts with, and :func:`load_run` to get it back.

One place says how a method's model is put together (the runner trains it, ``load_run``
rebuilds it from a run folder): COG wraps the network in a
:class:`~cogcal.CalibratedModel`; TST / V-TST stage 2 puts a new head on the frozen body
(:class:`FrozenBodyHead`); post-hoc methods append a calibrator fitted on validation
logits. Nothing here imports Lightning: a deployed model loads without it.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cogcal._constraints import COUNT, Real
from cogcal._errors import ArgumentError
from cogcal.calibrators import TSTHead, VTSTHead, make_calibrator
from cogcal.cog import CalibratedModel, find_classifier
from cogcal.data.transforms import Preprocess
from cogcal.models import create_model
from cogcal.runs import RunDir, RunFolderError, RunRecord, load_checkpoint
from cogcal.runs.methods import Method, get_method
from cogcal.train.config import TrainConfig

__all__ = [
    "FrozenBodyHead",
    "LoadedRun",
    "final_model",
    "load_run",
    "posthoc_calibrator",
    "stage1_model",
    "stage2_model",
]


class FrozenBodyHead(nn.Module):
    """Stage 2 of TST / V-TST: a frozen body (eval mode, BatchNorm statistics frozen) and a
    new trainable head on the features entering the body's final linear layer.

    The features come from ``body.forward_features`` when the body follows the backbone
    head contract, otherwise from the input of its final linear layer
    (:func:`cogcal.find_classifier`), captured with a forward hook.
    """

    def __init__(self, body: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.head = head
        for p in self.body.parameters():
            p.requires_grad_(False)
        self.body.eval()
        self._classifier: nn.Module | None = None
        if not callable(getattr(body, "forward_features", None)):
            self._classifier = find_classifier(body)[1]

    def train(self, mode: bool = True) -> FrozenBodyHead:
        super().train(mode)
        self.body.eval()  # BatchNorm statistics never drift (the original TST code let them)
        return self

    @torch.no_grad()
    def features(self, x: Any) -> torch.Tensor:
        if self._classifier is None:
            return self.body.forward_features(x)
        seen: list[torch.Tensor] = []
        hook = self._classifier.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        try:
            self.body(x)
        finally:
            hook.remove()
        return seen[-1]

    def forward(self, x: Any) -> torch.Tensor:
        return self.head(self.features(x))

    def forward_with_kl(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head.forward_with_kl(self.features(x))


def stage1_model(method: Method, network: nn.Module, task: str) -> nn.Module:
    """What stage 1 trains: the network, wrapped with its calibrator for COG methods."""
    if method.cog:
        return CalibratedModel(network, calibrator=method.cog, task=task)
    return network


def stage2_model(method: Method, network: nn.Module, num_classes: int) -> FrozenBodyHead:
    """TST / V-TST stage 2: a new head on the frozen network's features."""
    width = int(getattr(network, "num_features", 0)) or find_classifier(network)[1].in_features
    head = (VTSTHead if method.stage2 == "vtst" else TSTHead)(width, num_classes)
    return FrozenBodyHead(network, head)


def posthoc_calibrator(kind: str, task: str) -> nn.Module:
    """A fresh post-hoc calibrator of ``kind`` (``"ts"``, ``"vs"``, ``"ms"``)."""
    return make_calibrator(kind, task)


def final_model(
    method: Method,
    network: nn.Module,
    stage1: nn.Module,
    *,
    task: str,
    head: nn.Module | None = None,
    calibrator: nn.Module | None = None,
) -> CalibratedModel:
    """The trained model as one :class:`~cogcal.CalibratedModel` predicting what the run
    evaluates: the stage-1 ``CalibratedModel`` for COG methods; the network with the fitted
    post-hoc ``calibrator`` appended; the network with the TST / V-TST ``head`` in place of
    its final linear layer; or the network itself (its final layer as the ``"fc"``
    calibrator) for the train-time baselines."""
    if method.cog:
        assert isinstance(stage1, CalibratedModel)
        return stage1
    if method.stage2:
        model = CalibratedModel(network, calibrator="tst")
        parent, _, leaf = (model.classifier_name or "").rpartition(".")
        setattr(network.get_submodule(parent) if parent else network, leaf, head)
        return model
    if method.posthoc:
        return CalibratedModel(network, calibrator=calibrator, task=task)
    return CalibratedModel(network, calibrator="fc", task=task)


@dataclass
class LoadedRun:
    """A finished run, loaded back (:func:`load_run`).

    Attributes
    ----------
    model : CalibratedModel
        The trained model in eval mode, predicting what the run evaluated (calibrated
        logits) from **raw** inputs: its ``preprocess`` is the run's input standardisation
        (None for a model given in Python, which took its inputs as given), its
        ``class_names`` the run's classes. ``model.export()`` keeps both.
    config : TrainConfig
        The run's configuration.
    record : RunRecord
        Its ``metrics.json``.
    which : str
        ``"best"`` or ``"last"``: the checkpoint loaded.
    input : dict or None
        The run's input record (``config.json``: shape, dtype, mean/std, image size,
        feature columns); None for a model given in Python.
    input_shape : list of int or None
        Per-sample shape of the inputs, when recorded.
    """

    model: CalibratedModel
    config: TrainConfig
    record: RunRecord
    which: str
    input: dict[str, Any] | None = None
    input_shape: list[int] | None = None

    @property
    def class_names(self) -> list[str]:
        """One name per output (class, or task for multi-label runs)."""
        return list(self.model.class_names or [])

    @property
    def task(self) -> str:
        """``"multiclass"`` or ``"multilabel"``."""
        return self.model.task

    def to_onnx(self, path: str | os.PathLike[str], *, opset_version: int | None = None) -> Path:
        """Write ``model.export()`` as an ONNX file taking raw inputs (batch axis dynamic).

        The graph's input is ``x`` (raw inputs, float32, shape ``(N, *input_shape)``) and
        its output ``logits`` (calibrated). The model's metadata (``metadata_props``) holds
        ``class_names`` (a JSON list, one per output), ``task`` and ``input`` (the JSON
        input record: mean, std, scale, image size, feature columns). Needs the ``onnx``
        package (``pip install onnx``).
        """
        try:
            import onnx  # optional, and slow to import: only when exporting
        except ImportError:  # an optional dependency
            raise ImportError("to_onnx needs the onnx package: pip install onnx") from None
        shape = self.input_shape
        if not shape:
            raise ValueError(
                "the run does not record its input shape (a model given in Python through "
                "a DataLoader): export with torch.onnx.export(run.model.export(), example)."
            )
        path = Path(path)
        exported = self.model.export()
        example = torch.zeros(2, *shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                exported, (example,), str(path), input_names=["x"], output_names=["logits"],
                dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False,
                **({} if opset_version is None else {"opset_version": opset_version}),
            )  # fmt: skip
        proto = onnx.load(str(path))
        meta = {
            "class_names": json.dumps(self.class_names),
            "task": self.task,
            "input": json.dumps(self.input),
        }
        for key, value in meta.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(proto, str(path))
        return path


def _final_state(folder: RunDir, which: str, record: RunRecord) -> dict[str, torch.Tensor]:
    """The weights of ``checkpoints/<which>.ckpt``, checked to be the file the record was
    written with and to carry the digest of the run's configuration."""
    name = f"checkpoints/{which}.ckpt"
    ckpt = load_checkpoint(folder.path / name)  # an empty or truncated file is named first
    folder.check_file(name, record)
    if ckpt.get("config_sha256") != (record.integrity or {}).get("config"):
        raise RunFolderError(
            f"{folder.path / name} was not trained with the run's configuration "
            f"({folder.config_path}); train the run again."
        )
    return ckpt["model"]


def _damaged(folder: RunDir, field: str, problem: str) -> RunFolderError:
    return RunFolderError(
        f"{folder.config_path}: {field!r} {problem}; the run record is damaged: restore "
        "config.json or train the run again."
    )


#: Any finite number (a recorded mean or standard deviation).
_FINITE = Real()


def _positive_ints(value: Any) -> bool:
    return isinstance(value, list) and all(COUNT.problem(v) is None for v in value)


def _finite_numbers(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(_FINITE.problem(v) is None for v in value)
    )


def _recorded_config(folder: RunDir, saved: dict[str, Any]) -> TrainConfig:
    """The configuration of ``config.json``, with the values load_run and predict use
    checked: a damaged value is a :class:`RunFolderError` naming the file and the field."""
    try:
        config = TrainConfig.from_record(saved)
    except ArgumentError as err:
        raise RunFolderError(
            f"{folder.config_path}: {err} The run record is damaged: restore config.json or "
            "train the run again."
        ) from None
    classes = saved.get("num_classes")
    if classes is not None and not _positive_ints([classes]):
        raise _damaged(folder, "num_classes", f"must be an integer >= 1, got {classes!r}")
    for key in ("input_shape",):
        if saved.get(key) is not None and not _positive_ints(saved[key]):
            raise _damaged(folder, key, f"must be a list of integers >= 1, got {saved[key]!r}")
    names = saved.get("class_names")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str | int) for n in names):
            raise _damaged(folder, "class_names", f"must be a list of names, got {names!r}")
        if isinstance(classes, int) and len(names) != classes:
            raise _damaged(folder, "class_names", f"holds {len(names)} names for {classes} outputs")
    inputs = saved.get("input")
    if inputs is None:
        return config
    if not isinstance(inputs, dict):
        raise _damaged(folder, "input", f"must be a mapping, got {inputs!r}")
    if not _positive_ints(inputs.get("input_shape")) or not inputs.get("input_shape"):
        raise _damaged(
            folder, "input.input_shape",
            f"must be a list of integers >= 1, got {inputs.get('input_shape')!r}",
        )  # fmt: skip
    for key in ("mean", "std"):
        if not _finite_numbers(inputs.get(key)):
            raise _damaged(
                folder, f"input.{key}", f"must be a list of finite numbers, got {inputs.get(key)!r}"
            )
    if len(inputs["mean"]) != len(inputs["std"]):
        raise _damaged(folder, "input.std", "must have one value per value of input.mean")
    if any(v <= 0 for v in inputs["std"]):
        raise _damaged(folder, "input.std", f"must be positive, got {inputs['std']!r}")
    scale = inputs.get("scale", 1.0)
    if not _finite_numbers([scale]) or scale <= 0:
        raise _damaged(folder, "input.scale", f"must be a positive number, got {scale!r}")
    size = inputs.get("image_size")
    if size is not None and not _positive_ints([size]):
        raise _damaged(folder, "input.image_size", f"must be an integer >= 1, got {size!r}")
    if inputs.get("dtype", "float32") not in ("float32", "uint8"):
        raise _damaged(
            folder, "input.dtype", f"must be 'float32' or 'uint8', got {inputs.get('dtype')!r}"
        )
    return config


def _shown(name: str) -> str:
    for prefix in ("backbone.", "body."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _check_fits(target: nn.Module, state: dict[str, torch.Tensor], folder: RunDir,
                recorded: str, given: nn.Module) -> None:  # fmt: skip
    """Compare ``given`` (wrapped into ``target``) with the checkpoint ``state``, naming
    each parameter that is missing, unexpected or of another shape."""
    have = target.state_dict()
    problems = [
        f"{_shown(k)}: the run has shape {tuple(state[k].shape)}, `model` has "
        f"{tuple(have[k].shape)}"
        for k in state
        if k in have and tuple(state[k].shape) != tuple(have[k].shape)
    ]
    missing = [_shown(k) for k in state if k not in have]
    extra = [_shown(k) for k in have if k not in state]
    if missing:
        problems.append(f"`model` lacks {', '.join(missing[:5])}" + (" ..." if missing[5:] else ""))
    if extra:
        problems.append(f"the run has no {', '.join(extra[:5])}" + (" ..." if extra[5:] else ""))
    if problems:
        name = type(given).__name__
        trained = recorded.removeprefix("python:")
        kind = f" (the run trained a {trained}, `model` is a {name})" if trained != name else ""
        raise RunFolderError(
            f"`model` does not fit the run in {folder.path}{kind}: {'; '.join(problems)}. "
            "Pass the same architecture, built with the same arguments, as the one trained."
        )


def _read_finished(folder: RunDir) -> tuple[RunRecord, dict[str, Any]]:
    """The record and the config of a finished run folder, checked against each other."""
    record = folder.read_record()
    if record is None:
        raise RunFolderError(
            f"{folder.path} holds no finished cogcal run (no metrics.json with status "
            "complete); pass the folder of a finished `cogcal train` run."
        )
    saved = folder.read_config()
    if saved is None:
        raise RunFolderError(
            f"{folder.path} has a metrics.json but no config.json, so the model cannot be "
            "rebuilt (it records the backbone, method and data shape); the folder is "
            "incomplete: retrain the run, or restore config.json."
        )
    folder.check_record(record, saved)  # config.json is the record of the checkpoints
    return record, saved


def _model_name(folder: RunDir, saved: dict[str, Any], model: nn.Module | None) -> tuple[str, bool]:
    """The backbone a run recorded and whether it was a model given in Python (which
    ``model`` must then be: given exactly for those runs)."""
    model_name = saved.get("model")
    python_model = isinstance(model_name, str) and model_name.startswith("python:")
    if python_model and model is None:
        raise RunFolderError(
            f"{folder.path} was trained on a model given in Python ({model_name}); pass a fresh "
            f"instance of it: cogcal.load_run(path, model={model_name[7:]}(...))."
        )
    if model is not None and not python_model:
        raise RunFolderError(
            f"{folder.path} was trained on cogcal's {model_name!r} backbone, which load_run "
            "rebuilds from config.json; `model=` is for runs of cogcal.fit on your own model."
        )
    if not isinstance(model_name, str):
        raise RunFolderError(f"{folder.config_path} names no model; retrain the run.")
    return model_name, python_model


def _load_weights(
    folder: RunDir, which: str, record: RunRecord, method: Method, network: nn.Module, *,
    task: str, num_classes: int, model_name: str, model: nn.Module | None,
) -> CalibratedModel:  # fmt: skip
    """The run's final model on ``network``, with the weights of its checkpoint ``which``
    (and its post-hoc calibrator), each file checked against the record."""
    try:
        state = _final_state(folder, which, record)
        if method.stage2:
            stage2 = stage2_model(method, network, num_classes)
            if model is not None:
                _check_fits(stage2, state, folder, model_name, model)
            stage2.load_state_dict(state)
            return final_model(method, network, network, task=task, head=stage2.head)
        stage1 = stage1_model(method, network, task)
        if model is not None:
            _check_fits(stage1, state, folder, model_name, model)
        stage1.load_state_dict(state)
        calibrator = None
        if method.posthoc:
            calibrator = posthoc_calibrator(method.posthoc, task)
            calibrator.load_state_dict(torch.load(folder.path / "calibrator.pt", weights_only=True))
            folder.check_file("calibrator.pt", record)  # the one the run fitted
            calibrator.requires_grad_(False)
        return final_model(method, network, stage1, task=task, calibrator=calibrator)
    except pickle.UnpicklingError as err:  # not weights only: never unpickled
        raise RunFolderError(
            f"{folder.path}: a checkpoint or calibrator.pt holds more than tensors (weights_only "
            f"loading refused it: {str(err).splitlines()[0][:160]}); cogcal never unpickles "
            "arbitrary objects: retrain the run, or load the file yourself if you trust it."
        ) from None
    except (RuntimeError, KeyError, FileNotFoundError) as err:
        raise RunFolderError(
            f"{folder.path}: the checkpoints do not fit the model its config.json describes "
            f"({type(err).__name__}: {str(err).splitlines()[0][:160]})."
        ) from None


def _probe(model: CalibratedModel, shape: Any, dtype: str) -> None:
    """One forward pass on a zero input, so that :meth:`CalibratedModel.export` knows the
    final layer's output is the logits (and folds a post-hoc calibrator into it)."""
    if not shape:
        return
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    x = torch.zeros(1, *shape, dtype=getattr(torch, dtype, torch.float32), device=device)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # V-TST draws from the global RNG
        model(x)


def load_run(
    path: str | os.PathLike[str], *, which: str = "best", model: nn.Module | None = None
) -> LoadedRun:
    """Load a finished run folder as a :class:`~cogcal.CalibratedModel` taking raw inputs.

    The model is rebuilt from ``config.json`` (backbone, method, calibrator) and its
    weights come from ``checkpoints/<which>.ckpt`` (the checkpoint the run kept, with the
    best validation Brier score, by default); a post-hoc calibrator comes from
    ``calibrator.pt``. The result predicts the logits the run evaluated:

    * COG methods: the trained ``CalibratedModel``;
    * post-hoc methods: the network with the fitted calibrator appended;
    * ``ce``/``ls``/``focal``: the network (its final layer as the ``"fc"`` calibrator);
    * ``tst``/``vtst``: the network with the TST / V-TST head in place of its final layer.

    It takes the raw inputs of the run's data (table rows, ``uint8`` pixel values): its
    ``preprocess`` holds the run's recorded standardisation (from ``config.json``, not
    recomputed from data), and ``model.export()`` keeps it as its first module and carries
    the class names; a post-hoc calibrator is folded into the final linear layer (a zero
    input runs through the model once to check that layer's output is the logits).

    Parameters
    ----------
    path : path
        A run folder written by ``cogcal train`` / :func:`cogcal.fit` with ``out=``.
    which : {"best", "last"}
        Which checkpoint to load.
    model : nn.Module, optional
        For a run of :func:`cogcal.fit` on your own model: a fresh instance of the same
        architecture; the run's weights are loaded into it **in place** (TST / V-TST
        replace its final layer with their head, as during training). Checked against the
        checkpoint's parameter names and shapes (an error names each that differs).

    Raises
    ------
    RunFolderError
        The folder is not a finished cogcal run, its files do not fit each other, or
        ``model`` is missing, not needed or does not fit. Nothing edited or replaced after
        the run is trusted (:meth:`RunDir.check_record <cogcal.runs.RunDir.check_record>`):
        a ``config.json`` that differs from the record in ``metrics.json`` (the message names
        the fields) or holds a damaged value (names it), a checkpoint or ``calibrator.pt``
        whose sha256 is not the one the record holds (e.g. copied from another run).

    Examples
    --------
    >>> import tempfile, torch, cogcal
    >>> x, y = torch.randn(200, 6), torch.randint(0, 3, (200,))
    >>> net = lambda: torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
    ...                                   torch.nn.Linear(16, 3))
    >>> out = tempfile.mkdtemp() + "/run"
    >>> _ = cogcal.fit(net(), (x, y), method="ts", epochs=1, out=out, progress=False)
    >>> run = cogcal.load_run(out, model=net())
    >>> run.model.export()          # the temperature folded into the last layer
    Sequential(
      (0): Linear(in_features=6, out_features=16, bias=True)
      (1): ReLU()
      (2): Linear(in_features=16, out_features=3, bias=True)
    )
    """
    if which not in ("best", "last"):
        raise RunFolderError(f"`which` must be 'best' or 'last', got {which!r}.")
    if model is not None and not isinstance(model, nn.Module):
        raise RunFolderError(f"`model` must be an nn.Module or None, got {type(model).__name__}.")
    folder = RunDir(path)
    with folder.read_lock():  # no --overwrite can clear it while it is read
        record, saved = _read_finished(folder)
        config = _recorded_config(folder, saved)
        model_name, python_model = _model_name(folder, saved, model)
        data = saved.get("data") or {}
        num_classes = int(saved.get("num_classes") or data.get("num_classes") or 0)
        input_shape = tuple(saved.get("input_shape") or data.get("input_shape") or ())
        if not num_classes or (not input_shape and not python_model) or "input" not in saved:
            raise RunFolderError(
                f"{folder.config_path} does not record the number of classes, the input shape and "
                "the input preprocessing; it was written by an older cogcal: retrain the run."
            )
        network = model if model is not None else create_model(
            model_name, num_classes=num_classes, input_shape=input_shape
        )  # fmt: skip
        loaded = _load_weights(
            folder, which, record, get_method(config.method), network,
            task=saved.get("task", "multiclass"), num_classes=num_classes,
            model_name=model_name, model=model,
        )  # fmt: skip
    inputs = saved.get("input")
    names = saved.get("class_names") or data.get("class_names")
    loaded.class_names = [str(c) for c in names] if names else None
    loaded.preprocess = Preprocess.from_record(inputs) if inputs else None
    loaded.eval()
    if inputs:
        _probe(loaded, inputs["input_shape"], inputs.get("dtype", "float32"))
    elif input_shape:
        _probe(loaded, input_shape, data.get("input_dtype", "float32"))
    return LoadedRun(
        model=loaded, config=config, record=record, which=which, input=inputs,
        input_shape=list(inputs["input_shape"] if inputs else input_shape) or None,
    )  # fmt: skip
