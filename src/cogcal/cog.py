"""Calibration in One Go: wrap a model so its calibrator trains in the same pass.

COG (docs/method.md §1) trains the network parameters θ_f and the calibrator parameters
θ_c on the same loss and the same minibatch, in one forward and one backward pass; the
only change from ordinary training is that θ_c gets a slower learning rate λ_c < λ_f.
:class:`CalibratedModel` provides exactly that: it finds or adds the calibrator,
:meth:`CalibratedModel.param_groups` splits the parameters for any ``torch.optim``
optimiser, an optimiser step hook warns (:class:`CalibratorRateWarning`) when an
optimiser moves the calibrator at least as fast as the network, and
:meth:`CalibratedModel.export` turns the trained pair into a plain ``nn.Module``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import warnings
import weakref
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from cogcal._constraints import COUNT, NON_NEGATIVE_REAL, POSITIVE, Boolean, Integer, check
from cogcal.calibrators import (
    MatrixScaling,
    TaskAffine,
    TaskTemperature,
    Temperature,
    TSTHead,
    VectorScaling,
    VTSTHead,
    make_calibrator,
)

__all__ = ["CalibratedModel", "CalibratorRateWarning", "find_classifier", "CALIBRATORS"]

#: Calibrator names accepted by :class:`CalibratedModel` (or pass an ``nn.Module``).
CALIBRATORS = ("fc", "ts", "vs", "ms", "tst")
_TASKS = ("multiclass", "multilabel")
# Attribute paths tried, in order, for the final linear layer of common model families:
# torchvision (fc: ResNet; classifier: MobileNet/EfficientNet/VGG; heads: ViT; head: Swin),
# timm (head, head.fc), HuggingFace sequence classifiers (classifier: BERT, ViT, DistilBERT;
# classifier.out_proj: RoBERTa; score: GPT-2, Llama, Mistral) and user models following any
# of these conventions.
_HEAD_PATHS = (
    "fc",
    "classifier",
    "head",
    "heads",
    "head.fc",
    "heads.head",
    "classifier.fc",
    "classifier.out_proj",
    "score",
)
_COMPILED = "_orig_mod"  # attribute under which torch.compile keeps the original module


class CalibratorRateWarning(UserWarning):
    """An optimiser stepped a calibrator at a learning rate not below its network's.

    COG needs the calibrator on the slower timescale, λ_c < λ_f (docs/method.md §1).
    Emitted once per :class:`CalibratedModel`, at the first optimiser step where it
    happens: an optimiser built from ``model.parameters()`` (one group for everything, as
    ``torch.optim.Adam(model.parameters())`` or timm's ``create_optimizer_v2(model)`` do)
    or a scheduler that rewrote the rates (``OneCycleLR(max_lr=0.1)`` sets every group to
    the same rate). Silence it with ``CalibratedModel(..., allow_fast_calibrator=True)``.

    Examples
    --------
    >>> import warnings, torch
    >>> from torch import nn
    >>> from cogcal import CalibratedModel
    >>> from cogcal.cog import CalibratorRateWarning
    >>> model = CalibratedModel(nn.Sequential(nn.Linear(4, 3)), calibrator="ts")
    >>> opt = torch.optim.Adam(model.parameters(), lr=1e-3)   # one group: COG is lost
    >>> model(torch.randn(2, 4)).sum().backward()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     opt.step()
    >>> caught[0].category is CalibratorRateWarning
    True
    """


# -- detection ------------------------------------------------------------------------------


def _unwrap(module: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``), or ``module``."""
    while isinstance(getattr(module, _COMPILED, None), nn.Module):
        module = getattr(module, _COMPILED)
    return module


def _strip_compiled(name: str) -> str:
    while name.startswith(_COMPILED + "."):
        name = name[len(_COMPILED) + 1 :]
    return name


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
    ``classifier``, ``head``, ``heads``, ``head.fc``, ``heads.head``, ``classifier.fc``,
    ``classifier.out_proj`` and ``score`` (HuggingFace GPT-2/Llama sequence classifiers),
    each a Linear or the last Linear of a Sequential with nothing trainable after it; the
    last ``nn.Linear`` of a model that is itself an ``nn.Sequential``. A model wrapped by
    ``torch.compile`` is looked into (its layers are named ``_orig_mod.*``; the returned
    name includes that prefix, so ``model.get_submodule(name)`` works).

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
    inner = _unwrap(model)
    if inner is not model:
        prefix = _name_of(model, inner) or ""
        inner_name = None if classifier_name is None else _strip_compiled(classifier_name)
        name, layer = find_classifier(inner, inner_name)
        return (f"{prefix}.{name}" if prefix else name), layer

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


# -- structured outputs (HuggingFace ModelOutput, dicts, dataclasses, tuples) ---------------


def _field(out: Any, key: str | int) -> Any:
    """``out[key]`` / ``out.key`` of a structured output, or None when it has no such field."""
    if isinstance(out, Mapping):
        return out.get(key) if isinstance(key, str) else None
    if isinstance(key, int):
        if isinstance(out, tuple | list) and -len(out) <= key < len(out):
            return out[key]
        return None
    return getattr(out, key, None)


def _replace(out: Any, key: str | int, value: torch.Tensor) -> Any:
    """A copy of ``out`` of the same type with its field ``key`` set to ``value``."""
    if dataclasses.is_dataclass(out) and not isinstance(out, type):  # HF ModelOutput
        return dataclasses.replace(out, **{key: value})  # type: ignore[arg-type]
    if isinstance(out, tuple | list):
        if isinstance(key, str):  # a namedtuple
            return out._replace(**{key: value})  # type: ignore[union-attr]
        items = list(out)
        items[key] = value
        return type(out)(items) if type(out) in (tuple, list) else type(out)(*items)
    if isinstance(out, MutableMapping):
        new = copy.copy(out)
        new[key] = value
        return new
    if isinstance(out, Mapping):
        return {**out, key: value}
    new = copy.copy(out)
    setattr(new, key, value)  # type: ignore[arg-type]
    return new


def _is_selection(head_out: Any, out: torch.Tensor) -> bool:
    """Whether ``out`` consists of rows of ``head_out`` unchanged.

    True when ``out`` *is* the head's output, and also when the model picks some of the
    head's output rows (GPT-2/Llama sequence classifiers apply ``score`` to every token and
    return the logits of the last one): a calibrator acting row by row commutes with that.
    """
    if not isinstance(head_out, torch.Tensor):
        return False
    if head_out is out:
        return True
    with torch.no_grad():
        head_out = head_out.detach().to(out.dtype)
        if head_out.shape == out.shape:
            return bool(torch.equal(head_out, out))
        k = out.shape[-1] if out.dim() else 0
        if out.dim() == 0 or head_out.dim() == 0 or head_out.shape[-1] != k or k == 0:
            return False
        if head_out.numel() < out.numel():
            return False
        if head_out.dim() > out.dim() and head_out.shape[0] == out.shape[0] and out.dim() >= 1:
            rows = head_out.reshape(out.shape[0], -1, k)  # per sample: pooled over tokens
            targets = out.reshape(out.shape[0], -1, k)
            found = (targets[:, :, None, :] == rows[:, None, :, :]).all(-1).any(-1)
            return bool(found.all())
        rows, targets = head_out.reshape(-1, k), out.reshape(-1, k)
        step = max(1, (1 << 24) // max(1, rows.shape[0] * k))
        for start in range(0, targets.shape[0], step):
            chunk = targets[start : start + step]
            if not bool((chunk[:, None, :] == rows[None, :, :]).all(-1).any(-1).all()):
                return False
        return True


# -- the optimiser guard ---------------------------------------------------------------------

# Every live CalibratedModel; the guard finds its calibrator among an optimiser's groups.
_LIVE: weakref.WeakSet[CalibratedModel] = weakref.WeakSet()
# Cached on each optimiser under this attribute (not part of its state_dict or pickle):
# (registry version, number of groups, [(model ref, calibrator groups, network groups)]).
_PLAN_ATTR = "_cogcal_guard_plan"
_version = 0
_hook_handle: Any = None


def _bump() -> None:
    global _version
    _version += 1


def _register(model: CalibratedModel) -> None:
    global _hook_handle
    _LIVE.add(model)
    _bump()
    if _hook_handle is None:
        _hook_handle = register_optimizer_step_pre_hook(_guard)


@contextlib.contextmanager
def _suspend_guard() -> Iterator[None]:
    """Remove the global step hook for the duration (bench/overhead.py times a plain step)."""
    global _hook_handle
    handle, _hook_handle = _hook_handle, None
    if handle is not None:
        handle.remove()
    try:
        yield
    finally:
        if handle is not None and _hook_handle is None:
            _hook_handle = register_optimizer_step_pre_hook(_guard)


def _build_plan(groups: list[dict[str, Any]]) -> list[Any]:
    """For each guarded model found in ``groups``: which groups hold calibrator / network."""
    where: dict[int, int] = {}
    for i, group in enumerate(groups):
        for p in group["params"]:
            where.setdefault(id(p), i)
    plan = []
    for model in list(_LIVE):
        if model._allow_fast or model._rate_warned:
            continue
        try:
            cal = {id(p) for p in model.calibrator.parameters()}
        except Exception:  # noqa: BLE001 - a model the user broke is not the guard's business
            continue
        cal_groups = {where[i] for i in cal if i in where}
        if not cal_groups:
            continue
        net_groups = {
            where[id(p)] for p in model.parameters() if id(p) not in cal and id(p) in where
        }
        if net_groups:
            plan.append((weakref.ref(model), tuple(sorted(cal_groups)), tuple(sorted(net_groups))))
    return plan


def _rate(value: Any) -> float | None:
    if isinstance(value, float | int):
        return float(value)
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.numel() == 1:
        return float(value)
    return None  # a rate on an accelerator: reading it would synchronise every step


def _guard(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Global optimiser step pre-hook: warn when a calibrator is not on the slower rate.

    Runs before every step of every optimiser, so the common path is a few comparisons:
    the plan (which groups hold which model's calibrator and network) is cached on the
    optimiser and rebuilt only when the groups or the set of models change.
    """
    groups = optimizer.param_groups
    plan = optimizer.__dict__.get(_PLAN_ATTR)
    if plan is None or plan[0] != _version or plan[1] != len(groups):
        plan = (_version, len(groups), _build_plan(groups))
        optimizer.__dict__[_PLAN_ATTR] = plan
    for ref, cal_idx, net_idx in plan[2]:
        if len(cal_idx) == 1 and len(net_idx) == 1:  # param_groups(): one group each
            cal_lr, net_lr = groups[cal_idx[0]]["lr"], groups[net_idx[0]]["lr"]
            if type(cal_lr) is float and type(net_lr) is float and cal_lr < net_lr:
                continue
        _check_rates(optimizer, groups, ref, cal_idx, net_idx)


def _check_rates(
    optimizer: torch.optim.Optimizer,
    groups: list[dict[str, Any]],
    ref: weakref.ref[CalibratedModel],
    cal_idx: tuple[int, ...],
    net_idx: tuple[int, ...],
) -> None:
    cal = [_rate(groups[i]["lr"]) for i in cal_idx]
    net = [_rate(groups[i]["lr"]) for i in net_idx]
    if None in cal or None in net:
        return
    cal_lr, net_lr = max(cal), max(net)  # type: ignore[type-var]
    if cal_lr < net_lr:  # type: ignore[operator]
        return
    model = ref()
    if model is not None and not model._rate_warned and not model._allow_fast:
        model._rate_warned = True
        _bump()
        shared = bool(set(cal_idx) & set(net_idx))
        _warn_rate(model, optimizer, cal_lr, net_lr, shared)  # type: ignore[arg-type]


def _warn_rate(
    model: CalibratedModel,
    optimizer: torch.optim.Optimizer,
    cal_lr: float,
    net_lr: float,
    shared: bool,
) -> None:
    where = (
        "the calibrator and the network share a parameter group (an optimiser built from "
        "model.parameters(), such as torch.optim.Adam(model.parameters()) or timm's "
        "create_optimizer_v2(model), puts everything in one group)"
        if shared
        else "a learning-rate scheduler may have rewritten the rates (OneCycleLR with one "
        "max_lr sets every group to the same rate)"
    )
    warnings.warn(
        f"{type(optimizer).__name__} steps the calibrator of CalibratedModel(calibrator="
        f"{model.kind!r}) at lr={cal_lr:.3g}, not below its network's lr={net_lr:.3g}: "
        f"{where}. COG needs the calibrator on the slower rate (docs/method.md §1); as it is "
        "this trains a plain network. Build the optimiser from "
        "model.param_groups(lr, calibrator_lr), and with OneCycleLR pass one max_lr per "
        "group, max_lr=[lr, calibrator_lr]; pass allow_fast_calibrator=True to "
        "CalibratedModel to silence this warning.",
        CalibratorRateWarning,
        stacklevel=5,
    )


# -- export helpers --------------------------------------------------------------------------


def _affine_of(cal: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(A, c)`` in float64 on the CPU with ``cal(z) = A z + c`` (A scalar, vector or matrix).

    None for a calibrator that is not an affine map of the logits.
    """

    def f64(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device="cpu", dtype=torch.float64)

    if type(cal) in (Temperature, TaskTemperature):  # not a subclass (Laplace smoothing)
        if getattr(cal, "num_outputs", 0) is None:
            return None
        return torch.exp(-f64(cal.log_temperature)), None
    if isinstance(cal, VectorScaling | TaskAffine | MatrixScaling):
        if cal.num_outputs is None:
            return None
        return f64(cal.weight), f64(cal.bias)
    if type(cal) is nn.Linear:
        return f64(cal.weight), None if cal.bias is None else f64(cal.bias)
    return None


def _apply_affine(
    a: torch.Tensor, c: torch.Tensor | None, w: torch.Tensor, b: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``A (W h + b) + c`` as ``(A W) h + (A b + c)``."""
    if a.dim() == 2:
        w2, b2 = a @ w, None if b is None else a @ b
    elif a.dim() == 1:
        w2, b2 = a[:, None] * w, None if b is None else a * b
    else:
        w2, b2 = a * w, None if b is None else a * b
    if c is not None:
        b2 = c if b2 is None else b2 + c
    return w2, b2


def _as_torch_nn(cal: nn.Module) -> nn.Module:
    """The calibrator as an equivalent module built from ``torch.nn`` classes only."""
    ref = next(iter(cal.parameters()), None)
    kw: dict[str, Any] = {}
    if ref is not None:
        kw = {"device": ref.device, "dtype": ref.dtype}
    affine = _affine_of(cal)
    if affine is None:
        return copy.deepcopy(cal)
    a, c = affine
    with torch.no_grad():
        if a.dim() == 0:  # one temperature, any number of classes: scale a trailing axis of 1
            scale = nn.Linear(1, 1, bias=False, **kw)
            scale.weight.copy_(a.reshape(1, 1))
            return nn.Sequential(nn.Unflatten(-1, (-1, 1)), scale, nn.Flatten(-2, -1))
        weight = torch.diag(a) if a.dim() == 1 else a
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=c is not None, **kw)
        linear.weight.copy_(weight)
        if c is not None:
            linear.bias.copy_(c)
    return linear


def _shared(model: nn.Module, tensor: torch.Tensor | None) -> bool:
    if tensor is None:
        return False
    return sum(p is tensor for _, p in model.named_parameters(remove_duplicate=False)) > 1


def _example_call(example_input: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example_input, Mapping):
        return (), dict(example_input)
    if isinstance(example_input, tuple):
        return example_input, {}
    return (example_input,), {}


class CalibratedModel(nn.Module):
    """A model whose calibrator is trained with it, in one go, on a slower learning rate.

    Parameters
    ----------
    model : nn.Module
        The user's network producing logits. It is wrapped **in place**: its parameters
        are the wrapped model's parameters (no copy), and ``backbone`` is ``model`` itself.
        A ``torch.compile``d model is looked into for detection and keeps running compiled.
        Any forward signature works (``model(**batch)`` for HuggingFace models): the
        arguments are passed through unchanged.
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
    output_key : str or int, default "logits"
        When the model returns a mapping, a dataclass or an object (a HuggingFace
        ``ModelOutput``), the field holding the logits; an ``int`` indexes a tuple output.
        The calibrator acts on that field and the output keeps its type. Plain tensor
        outputs ignore it.
    allow_fast_calibrator : bool, default False
        Silence :class:`CalibratorRateWarning`, which is emitted (once per model) the first
        time an optimiser steps the calibrator at a learning rate not below the network's.
    preprocess : nn.Module, optional
        Applied to the first positional input before the model (a run loaded with
        :func:`cogcal.load_run` sets it to the run's input standardisation, so that raw
        inputs go in); :meth:`export` keeps it as the first module. It holds no trainable
        parameters of the model and is not part of :meth:`param_groups`.
    class_names : sequence of str, optional
        One name per output; :meth:`export` copies it onto the exported module as its
        ``class_names`` attribute.

    Notes
    -----
    **``calibrator="tst"`` changes ``model``**: its final linear layer is replaced, in
    ``model`` itself, by a freshly initialised :class:`~cogcal.calibrators.TSTHead` (so
    ``model(x)`` and the wrapper give the same logits and ``model.state_dict()`` holds the
    TST head). Deep-copy the network first (``CalibratedModel(copy.deepcopy(net), "tst")``)
    to keep the original. The other calibrators never modify ``model``.

    On the first forward pass the wrapper checks that the detected final layer's output
    *is* the model's output (or a selection of its rows, as when GPT-2 pools the last
    token): a ``ValueError`` for ``"fc"``/``"tst"`` when it is not (a model ending in a
    softmax, a clamp, a sum over positions); for the appended calibrators
    the result only decides whether :meth:`export` may fold them into that layer.

    When the model returns a structured output that carries a ``loss`` (a HuggingFace
    model called with ``labels=``), an appended calibrator raises ``ValueError``: that loss
    was computed from the uncalibrated logits, so the calibrator would get no gradient.
    Compute the loss from the returned logits instead (with ``transformers.Trainer``, pass
    ``compute_loss_func=``; see docs/recipes.md). ``"fc"`` and ``"tst"`` live inside the
    model, so the model's own loss is the COG loss.

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

    Mappings (and HuggingFace outputs) keep their type, the calibrator acting on
    ``output_key``:

    >>> class DictNet(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nn.Linear(4, 3)
    ...     def forward(self, x, scale=1.0):
    ...         return {"logits": self.fc(x) * scale, "features": x}
    >>> out = CalibratedModel(DictNet(), calibrator="ts")(torch.randn(2, 4), scale=2.0)
    >>> sorted(out), out["logits"].shape
    (['features', 'logits'], torch.Size([2, 3]))
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
        output_key: str | int = "logits",
        allow_fast_calibrator: bool = False,
        preprocess: nn.Module | None = None,
        class_names: Sequence[str] | None = None,
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
        if num_outputs is not None:
            check(num_outputs, COUNT, "num_outputs")
        if not isinstance(output_key, str) and Integer().problem(output_key) is not None:
            raise TypeError(
                f"`output_key` must be a field name (str) or a tuple index (int), got "
                f"{output_key!r}."
            )
        _check_allow_fast(allow_fast_calibrator)
        if preprocess is not None and not isinstance(preprocess, nn.Module):
            raise TypeError(
                f"`preprocess` must be an nn.Module or None, got {type(preprocess).__name__}."
            )
        if class_names is not None and (
            isinstance(class_names, str) or not all(isinstance(c, str) for c in class_names)
        ):
            raise TypeError(f"`class_names` must be a sequence of strings, got {class_names!r}.")
        self.preprocess = preprocess
        self.class_names = None if class_names is None else list(class_names)
        self.backbone = model
        self.task = task
        self.kind = calibrator if isinstance(calibrator, str) else "module"
        self.output_key = output_key
        self.classifier_name: str | None = None
        self.appended: nn.Module | None = None  # a calibrator applied after the logits
        self._allow_fast = allow_fast_calibrator
        self._rate_warned = False
        self._head_is_output: bool | None = None  # set by the first forward pass
        self._structured: bool | None = None  # whether the model returns a structured output

        net = self.network
        if classifier_name is not None:
            classifier_name = _strip_compiled(classifier_name)
        head: nn.Linear | None = None
        needs_width = self.kind in ("vs", "ms") or (self.kind == "ts" and task == "multilabel")
        if (
            self.kind in ("fc", "tst")
            or (needs_width and num_outputs is None)
            or classifier_name is not None
        ):
            self.classifier_name, head = find_classifier(net, classifier_name)
        k = num_outputs if num_outputs is not None else (head.out_features if head else None)
        # The layer an appended calibrator could be folded into by export(); a soft guess
        # when nothing required detecting it.
        self._head_name = self.classifier_name
        if self._head_name is None:
            try:
                self._head_name = find_classifier(net)[0]
            except ValueError:
                self._head_name = None

        if self.kind == "tst":
            if task != "multiclass":
                raise ValueError("calibrator='tst' supports task='multiclass' only.")
            assert head is not None and self.classifier_name is not None
            tst = TSTHead(head.in_features, head.out_features, latent_dim=latent_dim)
            tst.to(device=head.weight.device, dtype=head.weight.dtype)
            _set_submodule(net, self.classifier_name, tst)
        elif self.kind == "module":
            self.appended = calibrator  # type: ignore[assignment]
        elif self.kind != "fc":
            self.appended = self._make_appended(self.kind, k, task)
            if head is not None:
                self.appended.to(device=head.weight.device)
        self._verified = self._head_name is None  # nothing to check on the first forward
        _register(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        _register(self)  # copies (copy.deepcopy, pickle) are guarded too

    @staticmethod
    def _make_appended(kind: str, k: int | None, task: str) -> nn.Module:
        if task == "multilabel" and k is None:
            raise ValueError("task='multilabel' needs the number of tasks: pass num_outputs=T.")
        return make_calibrator(kind, task, k)

    @property
    def network(self) -> nn.Module:
        """The wrapped network, looked into if ``torch.compile`` wrapped it (else ``backbone``)."""
        return _unwrap(self.backbone)

    @property
    def calibrator(self) -> nn.Module:
        """The module trained on the calibrator learning rate."""
        if self.appended is not None:
            return self.appended
        assert self.classifier_name is not None
        return self.network.get_submodule(self.classifier_name)

    @property
    def allow_fast_calibrator(self) -> bool:
        """Whether :class:`CalibratorRateWarning` is silenced for this model."""
        return self._allow_fast

    @allow_fast_calibrator.setter
    def allow_fast_calibrator(self, value: bool) -> None:
        _check_allow_fast(value)
        self._allow_fast = value
        _bump()

    @property
    def accepts_loss_kwargs(self) -> bool:
        """Whether the wrapped model's forward takes ``**kwargs`` (read by ``transformers.Trainer``).

        The wrapper passes every argument through, so it accepts what the model accepts.
        """
        net = self.network
        value = getattr(net, "accepts_loss_kwargs", None)
        if isinstance(value, bool):
            return value
        try:
            params = inspect.signature(net.forward).parameters.values()
        except (TypeError, ValueError):
            return False
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

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
        calibrator_weight_decay: float = 0.0,
        **optimizer_kwargs: Any,
    ) -> list[dict[str, Any]]:
        """Optimiser parameter groups: the network on ``lr``, the calibrator on ``calibrator_lr``.

        Every trainable parameter appears in exactly one group, network first. Each group
        carries a ``"name"`` key (``"network"`` / ``"calibrator"``) that torch optimisers
        keep; per-group scheduler arguments follow that order (``OneCycleLR(opt,
        max_lr=[lr, calibrator_lr])``).

        Parameters
        ----------
        lr, calibrator_lr : float
            Learning rates of the network and of the calibrator, ``calibrator_lr < lr``.
        allow_fast_calibrator : bool, default False
            Accept ``calibrator_lr >= lr`` (with a warning); also silences
            :class:`CalibratorRateWarning` for this model.
        calibrator_weight_decay : float, default 0.0
            Weight decay of the calibrator group, always set explicitly (so that an
            optimiser whose default decay is not zero, such as ``AdamW``, does not decay
            the calibrator unasked). Optimiser weight decay pulls parameters toward 0:
            that is the identity for a temperature (parametrised as ``log T``) and an
            ordinary decay for ``"fc"``/``"tst"`` heads, but not for vector or matrix
            scaling, whose identity is ``w = 1`` / ``W = I``; a positive value is refused
            for those (``ValueError``).
        **optimizer_kwargs
            Other optimiser options. ``weight_decay`` goes into the network group only;
            anything else (``betas``, ``eps``, ``momentum``) into both groups.

        Raises
        ------
        ValueError
            If a learning rate is not a positive finite number, if ``calibrator_lr >= lr``
            without ``allow_fast_calibrator=True`` (the leader must move on the slower
            timescale, docs/method.md §1), or if ``calibrator_weight_decay`` is negative
            or positive for a vector/matrix scaling calibrator.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> from cogcal import CalibratedModel
        >>> model = CalibratedModel(nn.Sequential(nn.Linear(4, 3)), calibrator="ts")
        >>> groups = model.param_groups(1e-3, 1e-4, weight_decay=0.05, betas=(0.9, 0.99))
        >>> [(g["name"], g["lr"], g["weight_decay"], g["betas"]) for g in groups]
        [('network', 0.001, 0.05, (0.9, 0.99)), ('calibrator', 0.0001, 0.0, (0.9, 0.99))]
        """
        _check_param_group_args(
            lr, calibrator_lr, allow_fast_calibrator, calibrator_weight_decay, self.calibrator
        )
        wd = calibrator_weight_decay
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
        if allow_fast_calibrator:
            self.allow_fast_calibrator = True
        network = self.network_parameters()
        calibrator = self.calibrator_parameters()
        if not calibrator:
            raise ValueError(
                f"The calibrator ({type(self.calibrator).__name__}) has no trainable parameters; "
                "it must be built with its size (e.g. MatrixScaling(num_classes)) and not frozen."
            )
        shared = {k: v for k, v in optimizer_kwargs.items() if k != "weight_decay"}
        groups = [
            {"params": calibrator, "lr": calibrator_lr, "name": "calibrator", **shared}
            | {"weight_decay": float(wd)}
        ]
        if network:
            groups.insert(0, {"params": network, "lr": lr, "name": "network", **optimizer_kwargs})
        return groups

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's output with the calibrator applied; arguments pass through unchanged.

        A tensor output is the calibrated logits; a structured output (mapping,
        dataclass, HuggingFace ``ModelOutput``, tuple with an ``int`` ``output_key``) is
        returned as the same type with its ``output_key`` field calibrated.
        """
        if self.preprocess is not None and args:
            args = (self.preprocess(args[0]), *args[1:])
        if not self._verified:
            return self._checked_forward(args, kwargs)
        out = self.backbone(*args, **kwargs)
        if self.appended is None:
            return out
        if isinstance(out, torch.Tensor):
            return self.appended(out)
        return self._calibrate_structured(out)

    def _calibrate_structured(self, out: Any) -> Any:
        assert self.appended is not None
        logits = _field(out, self.output_key)
        if not isinstance(logits, torch.Tensor):
            raise self._no_logits(out)
        if not isinstance(out, tuple | list) and _field(out, "loss") is not None:
            raise ValueError(
                f"The wrapped model returned a {type(out).__name__} with a `loss`, computed "
                f"from its uncalibrated logits, so the {self.kind!r} calibrator appended after "
                "them would get no gradient from it. Do not pass the labels to the model: "
                f"compute the loss from the calibrated `{self.output_key}` this wrapper "
                "returns (with transformers.Trainer pass compute_loss_func=..., which also "
                "keeps the labels away from the model; see docs/recipes.md)."
            )
        return _replace(out, self.output_key, self.appended(logits))

    def _no_logits(self, out: Any) -> TypeError:
        return TypeError(
            f"The wrapped model returned a {type(out).__name__} without a tensor field "
            f"{self.output_key!r}; pass output_key= naming the field that holds the logits "
            "(an int index for a tuple output), or return the logits tensor."
        )

    def _probe(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the network once, eagerly, recording whether the head's output is the logits."""
        assert self._head_name is not None
        net = self.network
        head = net.get_submodule(self._head_name)
        seen: list[Any] = []
        handle = head.register_forward_hook(lambda m, i, o: seen.append(o))
        try:
            out = net(*args, **kwargs)
        finally:
            handle.remove()
        self._structured = not isinstance(out, torch.Tensor)
        logits = out if isinstance(out, torch.Tensor) else _field(out, self.output_key)
        if not isinstance(logits, torch.Tensor):
            raise self._no_logits(out)
        self._head_is_output = bool(seen) and _is_selection(seen[-1], logits)
        if self.kind in ("fc", "tst") and not seen:
            raise ValueError(
                f"The detected final layer {self.classifier_name!r} was not called in the "
                "forward pass; pass classifier_name= naming the layer that produces the logits."
            )
        if self.kind in ("fc", "tst") and not self._head_is_output:
            raise ValueError(
                f"The output of the detected final layer {self.classifier_name!r} is not the "
                "model's output (something transforms the logits after it); COG needs the "
                "final layer's output to be the logits: pass classifier_name= or remove the "
                "post-processing from forward()."
            )
        return out

    def _checked_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """First forward: check that the detected head's output is the model's output."""
        out = self._probe(args, kwargs)
        self._verified = True
        if self.appended is None:
            return out
        if isinstance(out, torch.Tensor):
            return self.appended(out)
        return self._calibrate_structured(out)

    def export(self, example_input: Any = None) -> nn.Module:
        """A plain ``nn.Module`` computing the calibrated logits, for deployment.

        The wrapped model is never modified: the export starts from a deep copy of the
        network (so later training of this model does not change it, and vice versa), is
        in eval mode, and gives the same outputs as this model in eval mode (float32:
        within 1e-5).

        * ``"fc"``: the copy of the network itself (the calibrator is its own final layer).
        * ``"ts"``, ``"vs"``, ``"ms"`` (and the per-task temperature/affine maps, and a
          square ``nn.Linear`` given as calibrator) when the final linear layer produces
          the logits: the calibrator folded into that layer, computed in float64 and cast
          back, so the export has exactly the network's architecture and parameter count
          (one exception: folding a calibrator with a bias into a layer without one, such
          as GPT-2's ``score``, gives that layer a bias).
        * ``"tst"``: the network with its :class:`~cogcal.calibrators.TSTHead` rewritten as
          the equivalent ``nn.Sequential(Linear, ReLU, Linear, Linear)``; a
          :class:`~cogcal.calibrators.VTSTHead` (V-TST) stays as it is, since its
          prediction, the mean of the softmaxes of its fixed draws, is no composition of
          ``torch.nn`` layers.
        * otherwise (no foldable head, another calibrator module):
          ``nn.Sequential(network, calibrator)``, the calibrator rewritten with ``torch.nn``
          classes where it is one of cogcal's (a temperature becomes
          ``Unflatten -> Linear(1, 1) -> Flatten``, vector/matrix scaling an ``nn.Linear``)
          and deep-copied as given otherwise.

        With ``preprocess`` set (a run loaded by :func:`cogcal.load_run`) the export is
        ``nn.Sequential(preprocess, model)``: raw inputs in, calibrated logits out; with
        ``class_names`` set, the export carries them as its ``class_names`` attribute.

        Models returning structured outputs (a HuggingFace ``ModelOutput``) export as
        their own type when the calibrator lives in or folds into the final layer (the
        export returns the same output type, logits calibrated). When it cannot be folded,
        ``ValueError``: an ``nn.Sequential`` cannot carry that output type.

        Parameters
        ----------
        example_input : Tensor, tuple or dict, optional
            An input for one forward pass (a tuple of positional arguments, or a dict of
            keyword arguments such as a HuggingFace batch). Folding an appended calibrator
            needs to know that the final layer's output is the model's output, which the
            wrapper learns on its first forward pass; a model that has not run a forward
            pass yet (one just loaded from a checkpoint) needs ``example_input``, else it
            is exported unfolded with a warning.

        Returns
        -------
        nn.Module

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> from cogcal import CalibratedModel
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> model = CalibratedModel(net, calibrator="ms").eval()
        >>> x = torch.randn(5, 4)
        >>> plain = model.export(example_input=x)
        >>> plain                                       # the network's own architecture
        Sequential(
          (0): Linear(in_features=4, out_features=8, bias=True)
          (1): ReLU()
          (2): Linear(in_features=8, out_features=3, bias=True)
        )
        >>> bool((plain(x) - model(x)).abs().max() <= 1e-5)
        True
        """
        if example_input is not None and self.appended is not None and self._head_name:
            args, kwargs = _example_call(example_input)
            modes = [(m, m.training) for m in self.modules()]
            try:
                with torch.no_grad():
                    self.eval()
                    if self.preprocess is not None and args:
                        args = (self.preprocess(args[0]), *args[1:])
                    self._probe(args, kwargs)
            finally:
                for m, mode in modes:
                    m.training = mode
        net = self.network
        exported = copy.deepcopy(net)
        for p in exported.parameters():
            p.grad = None
        if self.kind == "tst":
            assert self.classifier_name is not None
            tst = exported.get_submodule(self.classifier_name)
            assert isinstance(tst, TSTHead)
            if not isinstance(tst, VTSTHead):  # V-TST: the head itself (its predictive mean)
                _set_submodule(
                    exported, self.classifier_name, nn.Sequential(*tst.encoder, tst.classifier)
                )
        elif self.appended is not None:
            exported = self._export_appended(exported)
        if self.preprocess is not None:
            exported = nn.Sequential(copy.deepcopy(self.preprocess), exported)
        if self.class_names is not None:
            exported.class_names = list(self.class_names)
        return exported.eval()

    def _export_appended(self, exported: nn.Module) -> nn.Module:
        assert self.appended is not None
        affine = _affine_of(self.appended)
        reason = "the calibrator is not an affine map of the logits"
        if affine is not None and self._head_name is None:
            reason = "no final linear layer was found"
        elif affine is not None and self._head_is_output is False:
            reason = f"the output of {self._head_name!r} is not the model's output"
        elif affine is not None and self._head_is_output is None:
            reason = "the model has not run a forward pass through the wrapper"
            warnings.warn(
                f"CalibratedModel.export: cannot check that {self._head_name!r} produces the "
                "logits, because the model has not run a forward pass through the wrapper; "
                "exporting nn.Sequential(network, calibrator) instead of folding the "
                "calibrator into that layer. Pass example_input= to fold it.",
                UserWarning,
                stacklevel=3,
            )
        elif affine is not None:
            assert self._head_name is not None
            folded = self._fold(exported, self._head_name, *affine)
            if folded is not None:
                return folded
            reason = "its shape does not match the final layer"
        if self._structured:
            raise ValueError(
                f"CalibratedModel.export: the wrapped model returns structured outputs and "
                f"the {type(self.appended).__name__} calibrator cannot be folded into its "
                f"final linear layer ({reason}); an nn.Sequential(network, calibrator) "
                "cannot carry that output type. Export a network that returns the logits "
                "tensor, followed by the calibrator, yourself, or pass classifier_name= "
                "naming the linear layer that produces the logits."
            )
        return nn.Sequential(exported, _as_torch_nn(self.appended))

    @staticmethod
    def _fold(
        exported: nn.Module,
        name: str,
        a: torch.Tensor,
        c: torch.Tensor | None,
    ) -> nn.Module | None:
        head = exported.get_submodule(name)
        if not isinstance(head, nn.Linear):
            return None
        k = head.out_features
        if (a.dim() >= 1 and a.shape[-1] != k) or (c is not None and c.shape[0] != a.shape[0]):
            return None
        w = head.weight.detach().to(device="cpu", dtype=torch.float64)
        b = None if head.bias is None else head.bias.detach().to("cpu", torch.float64)
        w2, b2 = _apply_affine(a, c, w, b)
        if b2 is not None and head.bias is None and not bool(b2.any()):
            b2 = None  # a zero bias added to a layer without one: keep the layer as it is
        kw = {"device": head.weight.device, "dtype": head.weight.dtype}
        same_shape = w2.shape == head.weight.shape and (b2 is None) == (head.bias is None)
        if same_shape and not _shared(exported, head.weight) and not _shared(exported, head.bias):
            with torch.no_grad():
                head.weight.copy_(w2)
                if b2 is not None:
                    head.bias.copy_(b2)
            return exported
        new = nn.Linear(w2.shape[1], w2.shape[0], bias=b2 is not None, **kw)
        new.train(head.training)
        with torch.no_grad():
            new.weight.copy_(w2)
            if b2 is not None:
                new.bias.copy_(b2)
        _set_submodule(exported, name, new)
        return exported

    def extra_repr(self) -> str:
        return f"calibrator={self.kind!r}, task={self.task!r}, classifier={self.classifier_name!r}"


def _check_allow_fast(value: Any) -> None:
    """``allow_fast_calibrator`` must be a bool; a ``TypeError`` (a wrong type, not value)."""
    problem = Boolean().problem(value)
    if problem is not None:
        raise TypeError(f"`allow_fast_calibrator` {problem}")


def _check_param_group_args(
    lr: Any, calibrator_lr: Any, allow_fast_calibrator: Any, wd: Any, calibrator: nn.Module
) -> None:
    """The argument checks of :meth:`CalibratedModel.param_groups` (not the rate order)."""
    check(lr, POSITIVE, "lr")
    check(calibrator_lr, POSITIVE, "calibrator_lr")
    _check_allow_fast(allow_fast_calibrator)
    check(wd, NON_NEGATIVE_REAL, "calibrator_weight_decay")
    if wd > 0 and isinstance(calibrator, VectorScaling | MatrixScaling | TaskAffine):
        raise ValueError(
            f"calibrator_weight_decay={wd:g} would pull the {type(calibrator).__name__} "
            "calibrator toward zero weights, not toward its identity (w = 1 for vector "
            "scaling and per-task affine maps, W = I for matrix scaling), so it is refused: "
            "keep calibrator_weight_decay=0.0 (network decay goes in weight_decay=), or use "
            "calibrator='ts', whose decay pulls the temperature toward 1."
        )
