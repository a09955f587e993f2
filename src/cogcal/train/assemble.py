"""The model a method trains and predicts with, and :func:`load_run` to get it back.

One place says how a method's model is put together (the runner trains it, ``load_run``
rebuilds it from a run folder): COG wraps the network in a
:class:`~cogcal.CalibratedModel`; TST / V-TST stage 2 puts a new head on the frozen body
(:class:`FrozenBodyHead`); post-hoc methods append a calibrator fitted on validation
logits. Nothing here imports Lightning: a deployed model loads without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cogcal.calibrators import TSTHead, VTSTHead, make_calibrator
from cogcal.cog import CalibratedModel, find_classifier
from cogcal.models import create_model
from cogcal.train.checkpoints import load_checkpoint
from cogcal.train.config import TrainConfig
from cogcal.train.methods import Method, get_method
from cogcal.train.rundir import RunDir, RunFolderError, RunRecord

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
        The trained model in eval mode, predicting what the run evaluated (calibrated logits).
    config : TrainConfig
        The run's configuration.
    record : RunRecord
        Its ``metrics.json``.
    which : str
        ``"best"`` or ``"last"``: the checkpoint loaded.
    """

    model: CalibratedModel
    config: TrainConfig
    record: RunRecord
    which: str


def _final_state(folder: RunDir, which: str) -> dict[str, torch.Tensor]:
    return load_checkpoint(folder.checkpoints / f"{which}.ckpt")["model"]


def load_run(path: str | os.PathLike[str], *, which: str = "best") -> LoadedRun:
    """Load a finished ``cogcal train`` run folder as a :class:`~cogcal.CalibratedModel`.

    The model is rebuilt from ``config.json`` (backbone, method, calibrator) and its
    weights come from ``checkpoints/<which>.ckpt`` (the checkpoint the run kept, with the
    best validation Brier score, by default); a post-hoc calibrator comes from
    ``calibrator.pt``. The result predicts the logits the run evaluated:

    * COG methods: the trained ``CalibratedModel``;
    * post-hoc methods: the network with the fitted calibrator appended;
    * ``ce``/``ls``/``focal``: the network (its final layer as the ``"fc"`` calibrator);
    * ``tst``/``vtst``: the network with the TST / V-TST head in place of its final layer.

    Parameters
    ----------
    path : path
        A run folder written by ``cogcal train`` / :func:`cogcal.fit` with ``out=``.
    which : {"best", "last"}
        Which checkpoint to load.

    Raises
    ------
    RunFolderError
        The folder is not a finished cogcal run, or its files do not fit each other.
    """
    if which not in ("best", "last"):
        raise RunFolderError(f"`which` must be 'best' or 'last', got {which!r}.")
    folder = RunDir(path)
    record = folder.read_record()
    if record is None:
        raise RunFolderError(
            f"{folder.path} holds no finished cogcal run (no metrics.json with status "
            "complete); pass the folder of a finished `cogcal train` run."
        )
    saved = folder.read_config() or {}
    config = TrainConfig.from_record(saved)
    method = get_method(config.method)
    model_name = saved.get("model")
    if not isinstance(model_name, str) or model_name.startswith("python:"):
        raise RunFolderError(
            f"{folder.path} was trained on a model given in Python ({model_name}); rebuild that "
            "model yourself and load checkpoints/best.ckpt into it."
        )
    data = saved.get("data") or {}
    num_classes = int(saved.get("num_classes") or data.get("num_classes") or 0)
    input_shape = tuple(saved.get("input_shape") or data.get("input_shape") or ())
    if not num_classes or not input_shape:
        raise RunFolderError(
            f"{folder.config_path} does not record the number of classes and the input shape; "
            "it was written by an older cogcal: retrain the run."
        )
    task = saved.get("task", "multiclass")
    network = create_model(model_name, num_classes=num_classes, input_shape=input_shape)
    try:
        state = _final_state(folder, which)
        if method.stage2:
            stage2 = stage2_model(method, network, num_classes)
            stage2.load_state_dict(state)
            model = final_model(method, network, network, task=task, head=stage2.head)
        else:
            stage1 = stage1_model(method, network, task)
            stage1.load_state_dict(state)
            calibrator = None
            if method.posthoc:
                calibrator = posthoc_calibrator(method.posthoc, task)
                calibrator.load_state_dict(
                    torch.load(folder.path / "calibrator.pt", weights_only=True)
                )
                calibrator.requires_grad_(False)
            model = final_model(method, network, stage1, task=task, calibrator=calibrator)
    except (RuntimeError, KeyError, FileNotFoundError) as err:
        raise RunFolderError(
            f"{folder.path}: the checkpoints do not fit the model its config.json describes "
            f"({type(err).__name__}: {str(err).splitlines()[0][:160]})."
        ) from None
    model.eval()
    return LoadedRun(model=model, config=config, record=record, which=which)
