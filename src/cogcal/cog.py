"""Calibration in One Go: wrap a model so its calibrator trains in the same pass.

COG (SPEC §1) trains the network parameters θ_f and the calibrator parameters θ_c on the
same loss and the same minibatch, in one forward and one backward pass; the only change
from ordinary training is that θ_c gets a slower learning rate λ_c < λ_f.
:class:`CalibratedModel` provides exactly that: it finds or adds the calibrator and
:meth:`CalibratedModel.param_groups` splits the parameters for any ``torch.optim``
optimiser.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from cogcal.calibrators import (
    MatrixScaling,
    TaskAffine,
    TaskTemperature,
    Temperature,
    TSTHead,
    VectorScaling,
)

__all__ = ["CalibratedModel", "find_classifier", "CALIBRATORS"]

#: Calibrator names accepted by :class:`CalibratedModel` (or pass an ``nn.Module``).
CALIBRATORS = ("fc", "ts", "vs", "ms", "tst")
_TASKS = ("multiclass", "multilabel")
# Attribute paths tried, in order, for the final linear layer of common model families:
# torchvision (fc: ResNet; classifier: MobileNet/EfficientNet/VGG; heads: ViT; head: Swin),
# timm (head, head.fc), and user models following either convention.
_HEAD_PATHS = ("fc", "classifier", "head", "heads", "head.fc", "heads.head", "classifier.fc")


def _last_linear(module: nn.Module, prefix: str) -> tuple[str, nn.Linear] | None:
    if isinstance(module, nn.Linear):
        return prefix, module
    if isinstance(module, nn.Sequential):
        for key, child in reversed(list(module.named_children())):
            if isinstance(child, nn.Linear):
                return f"{prefix}.{key}" if prefix else key, child
            if _has_parameters(child):  # something with weights after the last Linear
                return None
    return None


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _name_of(model: nn.Module, target: nn.Module) -> str | None:
    for name, mod in model.named_modules():
        if mod is target:
            return name
    return None


def find_classifier(model: nn.Module, classifier_name: str | None = None) -> tuple[str, nn.Linear]:
    """Return ``(name, layer)`` of the final linear layer of ``model``.

    Tried in order: ``classifier_name`` if given; timm's ``get_classifier()`` (and the
    cogcal backbones, which follow the same contract); the attributes ``fc``,
    ``classifier``, ``head``, ``heads``, ``head.fc`` (a Linear, or the last Linear of a
    Sequential with nothing trainable after it); the last ``nn.Linear`` of a model that is
    itself an ``nn.Sequential``.

    Raises
    ------
    ValueError
        When no rule applies, listing every ``nn.Linear`` in the model so the caller can
        pass ``classifier_name=``.

    Examples
    --------
    >>> from torch import nn
    >>> from cogcal import find_classifier
    >>> find_classifier(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))[0]
    '2'
    """
    if classifier_name is not None:
        try:
            layer = model.get_submodule(classifier_name)
        except AttributeError:
            raise ValueError(
                f"classifier_name={classifier_name!r} is not a submodule of "
                f"{type(model).__name__}; candidates: {_linear_names(model)}."
            ) from None
        if not isinstance(layer, nn.Linear):
            raise ValueError(
                f"classifier_name={classifier_name!r} is a {type(layer).__name__}, not an "
                f"nn.Linear; candidates: {_linear_names(model)}."
            )
        return classifier_name, layer

    get_classifier = getattr(model, "get_classifier", None)
    if callable(get_classifier):
        try:
            head = get_classifier()
        except Exception:  # noqa: BLE001 - a user method may fail; fall back to attributes
            head = None
        if isinstance(head, nn.Module):
            found = _last_linear(head, _name_of(model, head) or "")
            if found is not None and found[0]:
                return found

    for path in _HEAD_PATHS:
        try:
            sub = model.get_submodule(path)
        except AttributeError:
            continue
        found = _last_linear(sub, path)
        if found is not None:
            return found

    if isinstance(model, nn.Sequential):
        found = _last_linear(model, "")
        if found is not None:
            return found

    raise ValueError(
        f"Cannot tell which layer of {type(model).__name__} is its final linear classifier "
        f"(looked for get_classifier(), {', '.join(_HEAD_PATHS)}, and the last Linear of an "
        f"nn.Sequential). nn.Linear layers in the model: {_linear_names(model) or 'none'}. "
        "Pass classifier_name='<one of them>' (or use a calibrator appended after the logits, "
        "e.g. calibrator='ts')."
    )


def _linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(parent, nn.Sequential | nn.ModuleList) and leaf.isdigit():
        parent[int(leaf)] = new
    else:
        setattr(parent, leaf, new)


class CalibratedModel(nn.Module):
    """A model whose calibrator is trained with it, in one go, on a slower learning rate.

    Parameters
    ----------
    model : nn.Module
        The user's network producing logits. It is wrapped **in place**: its parameters
        are the wrapped model's parameters (no copy). For ``"tst"`` its final layer is
        replaced by a :class:`~cogcal.calibrators.TSTHead`.
    calibrator : {"fc", "ts", "vs", "ms", "tst"} or nn.Module, default "fc"
        ``"fc"``: the model's own final linear layer is the calibrator (no new parameters).
        ``"ts"``, ``"vs"``, ``"ms"``: temperature, vector or matrix scaling appended after
        the logits (multi-label: one temperature, or one affine map, per task).
        ``"tst"``: a TST head replaces the final linear layer. An ``nn.Module`` is appended
        after the logits as given.
    task : {"multiclass", "multilabel"}, default "multiclass"
        ``"multilabel"`` makes ``"ts"`` / ``"vs"`` / ``"ms"`` per-output (per-task) maps.
    classifier_name : str, optional
        Dotted name of the final linear layer, when automatic detection cannot tell.
    num_outputs : int, optional
        Number of logits K (or tasks T), needed for ``"vs"``/``"ms"`` only when no final
        linear layer can be found.
    latent_dim : int, optional
        TST latent size Z (default 128 for 10 classes, 512 for 100, 256 otherwise).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from cogcal import CalibratedModel
    >>> net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    >>> model = CalibratedModel(net, calibrator="ts")
    >>> opt = torch.optim.Adam(model.param_groups(lr=1e-3, calibrator_lr=1e-4))
    >>> x, y = torch.randn(8, 10), torch.randint(0, 3, (8,))
    >>> loss = nn.functional.cross_entropy(model(x), y)
    >>> loss.backward(); opt.step()
    >>> [g["lr"] for g in opt.param_groups]
    [0.001, 0.0001]
    """

    def __init__(
        self,
        model: nn.Module,
        calibrator: str | nn.Module = "fc",
        *,
        task: str = "multiclass",
        classifier_name: str | None = None,
        num_outputs: int | None = None,
        latent_dim: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ValueError(f"`model` must be a torch nn.Module, got {type(model).__name__}.")
        if task not in _TASKS:
            raise ValueError(f"`task` must be one of {_TASKS}, got {task!r}.")
        if not isinstance(calibrator, nn.Module) and calibrator not in CALIBRATORS:
            raise ValueError(
                f"`calibrator` must be one of {', '.join(map(repr, CALIBRATORS))} or an "
                f"nn.Module, got {calibrator!r}."
            )
        if num_outputs is not None and (isinstance(num_outputs, bool) or num_outputs < 1):
            raise ValueError(f"`num_outputs` must be a positive integer, got {num_outputs!r}.")
        self.backbone = model
        self.task = task
        self.kind = calibrator if isinstance(calibrator, str) else "module"
        self.classifier_name: str | None = None
        self.appended: nn.Module | None = None  # a calibrator applied after the logits
        self._verified = False

        head: nn.Linear | None = None
        needs_width = self.kind in ("vs", "ms") or (self.kind == "ts" and task == "multilabel")
        if (
            self.kind in ("fc", "tst")
            or (needs_width and num_outputs is None)
            or classifier_name is not None
        ):
            self.classifier_name, head = find_classifier(model, classifier_name)
        k = num_outputs if num_outputs is not None else (head.out_features if head else None)

        if self.kind == "tst":
            if task != "multiclass":
                raise ValueError("calibrator='tst' supports task='multiclass' only.")
            assert head is not None and self.classifier_name is not None
            tst = TSTHead(head.in_features, head.out_features, latent_dim=latent_dim)
            tst.to(device=head.weight.device, dtype=head.weight.dtype)
            _set_submodule(model, self.classifier_name, tst)
        elif self.kind == "module":
            self.appended = calibrator  # type: ignore[assignment]
        elif self.kind != "fc":
            self.appended = self._make_appended(self.kind, k, task)
            if head is not None:
                self.appended.to(device=head.weight.device)

    @staticmethod
    def _make_appended(kind: str, k: int | None, task: str) -> nn.Module:
        if task == "multilabel":
            if k is None:
                raise ValueError("task='multilabel' needs the number of tasks: pass num_outputs=T.")
            return TaskTemperature(k) if kind == "ts" else TaskAffine(k)
        if kind == "ts":
            return Temperature()
        return VectorScaling(k) if kind == "vs" else MatrixScaling(k)

    @property
    def calibrator(self) -> nn.Module:
        """The module trained on the calibrator learning rate."""
        if self.appended is not None:
            return self.appended
        assert self.classifier_name is not None
        return self.backbone.get_submodule(self.classifier_name)

    def calibrator_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the calibrator."""
        return [p for p in self.calibrator.parameters() if p.requires_grad]

    def network_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of everything but the calibrator."""
        cal = {id(p) for p in self.calibrator.parameters()}
        return [p for p in self.parameters() if p.requires_grad and id(p) not in cal]

    def param_groups(
        self,
        lr: float,
        calibrator_lr: float,
        *,
        allow_fast_calibrator: bool = False,
        **optimizer_kwargs: Any,
    ) -> list[dict[str, Any]]:
        """Optimiser parameter groups: the network on ``lr``, the calibrator on ``calibrator_lr``.

        Every trainable parameter appears in exactly one group. Extra keyword arguments
        (``weight_decay=...``, ``betas=...``) go into both groups. Each group carries a
        ``"name"`` key (``"network"`` / ``"calibrator"``) that torch optimisers keep.

        Raises
        ------
        ValueError
            If a learning rate is not a positive finite number, or if
            ``calibrator_lr >= lr`` without ``allow_fast_calibrator=True`` (the leader must
            move on the slower timescale, SPEC §1).
        """
        for name, value in (("lr", lr), ("calibrator_lr", calibrator_lr)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
            if value != value or value == float("inf"):
                raise ValueError(f"`{name}` must be finite, got {value!r}.")
        if calibrator_lr >= lr:
            msg = (
                f"param_groups(lr={lr:g}, calibrator_lr={calibrator_lr:g}): the calibrator "
                "learning rate must be smaller than the network's (COG's leader moves on the "
                "slower timescale)"
            )
            if not allow_fast_calibrator:
                raise ValueError(
                    msg + "; lower calibrator_lr (default lr/10) or pass "
                    "allow_fast_calibrator=True to train anyway."
                )
            warnings.warn(msg + "; continuing because allow_fast_calibrator=True.", stacklevel=2)
        network = self.network_parameters()
        calibrator = self.calibrator_parameters()
        if not calibrator:
            raise ValueError(
                f"The calibrator ({type(self.calibrator).__name__}) has no trainable parameters; "
                "it must be built with its size (e.g. MatrixScaling(num_classes)) and not frozen."
            )
        groups = [{"params": calibrator, "lr": calibrator_lr, "name": "calibrator"}]
        if network:
            groups.insert(0, {"params": network, "lr": lr, "name": "network"})
        return [{**g, **optimizer_kwargs} for g in groups]

    def forward(self, x: Any) -> torch.Tensor:
        if not self._verified and self.kind in ("fc", "tst"):
            return self._checked_forward(x)
        out = self.backbone(x)
        return out if self.appended is None else self.appended(out)

    def _checked_forward(self, x: Any) -> torch.Tensor:
        """First forward: check that the detected head's output is the model's output."""
        seen: list[torch.Tensor] = []
        handle = self.calibrator.register_forward_hook(lambda m, i, o: seen.append(o))
        try:
            out = self.backbone(x)
        finally:
            handle.remove()
        if not seen:
            raise RuntimeError(
                f"The detected final layer {self.classifier_name!r} was not called in the "
                "forward pass; pass classifier_name= naming the layer that produces the logits."
            )
        last = seen[-1]
        if not (last is out or (last.shape == out.shape and torch.equal(last, out))):
            raise RuntimeError(
                f"The output of the detected final layer {self.classifier_name!r} is not the "
                "model's output (something transforms the logits after it); COG needs the "
                "final layer's output to be the logits: pass classifier_name= or remove the "
                "post-processing from forward()."
            )
        self._verified = True
        return out

    def extra_repr(self) -> str:
        return f"calibrator={self.kind!r}, task={self.task!r}, classifier={self.classifier_name!r}"
