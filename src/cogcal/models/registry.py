"""Backbone registry and the head contract shared by every backbone.

Every backbone built by :func:`create_model` is a :class:`Backbone`: a feature
extractor (``forward_features``) followed by one final ``nn.Linear`` stored as
``head``. The COG wrapper and the TST method rely on this contract to find the
final layer (the calibrator of ``cog-fc``) and the features entering it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from cogcal._constraints import COUNT, Integer, check
from cogcal._errors import ArgumentError
from cogcal._registry import Registry

__all__ = [
    "Backbone",
    "ModelInfo",
    "check_compatible",
    "create_model",
    "list_models",
    "model_info",
    "register_model",
]


class Backbone(nn.Module):
    """Base class of every registered backbone: features, then one linear head.

    Subclasses build their feature extractor, call ``super().__init__(num_features,
    num_classes)`` first, and implement :meth:`forward_features`. Everything about
    the final layer lives here.

    Parameters
    ----------
    num_features : int
        Dimension ``d`` of the features entering the final linear layer.
    num_classes : int
        Number of outputs: classes ``K`` (multiclass) or binary tasks ``T``
        (multi-label, one logit per task).

    Attributes
    ----------
    num_features : int
        Dimension of :meth:`forward_features`'s output.
    head : nn.Linear
        The final layer; its output is the model's output (no activation after it).
    input_shape : tuple of int
        The per-sample input shape the model was built for (set by :func:`create_model`).
    """

    def __init__(self, num_features: int, num_classes: int) -> None:
        super().__init__()
        self.num_features = int(num_features)
        self.head = nn.Linear(self.num_features, _check_num_classes(num_classes))
        self.input_shape: tuple[int, ...] = ()

    @property
    def num_classes(self) -> int:
        """Number of outputs of the final layer."""
        return self.head.out_features

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Return the pooled/flattened features, shape ``(N, num_features)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward_features")

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Apply the final linear layer, or return ``features`` when ``pre_logits``."""
        return features if pre_logits else self.head(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(N, num_classes)``: ``forward_head(forward_features(x))``."""
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Linear:
        """Return the final linear layer (the module stored as ``head``)."""
        return self.head

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the final layer by a fresh ``nn.Linear(num_features, num_classes)``.

        The new layer is created on the device and with the dtype of the old one.
        """
        old = self.head
        self.head = nn.Linear(self.num_features, _check_num_classes(num_classes)).to(
            device=old.weight.device, dtype=old.weight.dtype
        )


@dataclass(frozen=True)
class ModelInfo:
    """What the registry knows about one backbone.

    Attributes
    ----------
    name : str
        Registered name.
    builder : callable
        ``builder(num_classes=..., input_shape=..., **kwargs) -> nn.Module``.
    default_input_shape : tuple of int
        The per-sample input shape the backbone is designed for.
    description : str
        One line for listings and docs.
    input_check : callable or None
        ``input_check(input_shape)`` raises :class:`~cogcal._errors.ArgumentError` saying
        why the backbone cannot take inputs of that per-sample shape (used by
        :func:`check_compatible`); ``None``: any shape the builder accepts.
    """

    name: str
    builder: Callable[..., nn.Module]
    default_input_shape: tuple[int, ...]
    description: str = ""
    input_check: Callable[[tuple[int, ...]], None] | None = None


#: The registered backbones, name -> :class:`ModelInfo` (names matched case-insensitively).
MODELS: Registry[ModelInfo] = Registry(
    "model", unknown="unknown {kind} {name!r}.{hint} Available models: {known}.", cutoff=0.4
)

F = TypeVar("F", bound=Callable[..., nn.Module])


def register_model(
    name: str | None = None,
    *,
    default_input_shape: Sequence[int],
    description: str = "",
    overwrite: bool = False,
    input_check: Callable[[tuple[int, ...]], None] | None = None,
) -> Callable[[F], F]:
    """Decorator registering a backbone builder under ``name``.

    Parameters
    ----------
    name : str, optional
        Registry name; defaults to the decorated function's ``__name__``. Names are
        matched case-insensitively, so two names may not differ only in case.
    default_input_shape : sequence of int
        The backbone's natural per-sample input shape (e.g. ``(3, 32, 32)``).
    description : str, optional
        One-line description.
    overwrite : bool, default False
        Allow replacing an existing entry; otherwise a duplicate name raises ``ValueError``.
    input_check : callable, optional
        ``input_check(input_shape)`` raising :class:`~cogcal._errors.ArgumentError` (a
        ``ValueError``) when the backbone cannot take that per-sample shape; run by
        :func:`check_compatible` and :func:`create_model` before building.

    Returns
    -------
    callable
        A decorator returning the builder unchanged. The builder is called as
        ``builder(num_classes=K, input_shape=shape, **kwargs)`` and should return a
        :class:`Backbone` (or any module following the same head contract).

    Examples
    --------
    >>> import math, torch
    >>> from cogcal.models import Backbone, create_model, register_model
    >>> class Linear(Backbone):
    ...     def __init__(self, num_classes, input_shape):
    ...         super().__init__(math.prod(input_shape), num_classes)
    ...     def forward_features(self, x):
    ...         return x.flatten(1)
    >>> @register_model("toy_linear", default_input_shape=(5,), overwrite=True)
    ... def toy_linear(num_classes, input_shape):
    ...     return Linear(num_classes, input_shape)
    >>> create_model("toy_linear", num_classes=3, input_shape=(5,))(torch.zeros(2, 5)).shape
    torch.Size([2, 3])
    >>> from cogcal.models.registry import MODELS
    >>> _ = MODELS.unregister("toy_linear")  # keep the doctest from polluting the registry
    """

    def decorator(fn: F) -> F:
        key = name if name is not None else fn.__name__
        if not isinstance(key, str) or not key:
            raise ValueError(f"a model name must be a non-empty string, got {key!r}.")
        info = ModelInfo(
            name=key,
            builder=fn,
            default_input_shape=check_input_shape(default_input_shape),
            description=description,
            input_check=input_check,
        )
        MODELS.register(key, info, overwrite=overwrite)
        return fn

    return decorator


def list_models() -> list[str]:
    """Return the sorted names of all registered backbones.

    Returns
    -------
    list of str
        Names accepted by :func:`create_model`.
    """
    return MODELS.names()


def model_info(name: str) -> ModelInfo:
    """Return the registry entry of ``name`` (case-insensitive): builder, input shape, ...

    Raises
    ------
    ArgumentError
        If ``name`` is not registered (a ``ValueError``); the message lists the names and
        suggests the closest.
    """
    return MODELS.get(name)


def check_compatible(model_name: str, input_shape: Sequence[int]) -> None:
    """Raise when backbone ``model_name`` cannot take inputs of per-sample ``input_shape``.

    Parameters
    ----------
    model_name : str
        A registered backbone (case-insensitive).
    input_shape : sequence of int
        One sample's shape without the batch dimension (``Dataset.input_shape``).

    Raises
    ------
    ArgumentError
        A ``ValueError`` saying why (e.g. ``resnet18`` on tabular ``(20,)`` input needs
        ``(C, H, W)`` images) and which backbones suit the input; also for an unknown
        name or a malformed ``input_shape``.

    Examples
    --------
    >>> from cogcal.models import check_compatible
    >>> check_compatible("CNN", (3, 64, 64))  # fine: returns None
    >>> try:
    ...     check_compatible("resnet18", (20,))
    ... except ValueError as err:
    ...     print(str(err).split(";")[0])
    resnet18 needs images of shape (channels, height, width), e.g. (3, 32, 32)
    """
    info = model_info(model_name)
    shape = check_input_shape(input_shape)
    _run_check(info, shape)


def create_model(
    name: str, *, num_classes: int, input_shape: Sequence[int], **kwargs: Any
) -> nn.Module:
    """Build a freshly initialised backbone by name (never loads pretrained weights).

    Parameters
    ----------
    name : str
        One of :func:`list_models` (e.g. ``"mlp"``, ``"cnn"``, ``"resnet101"``;
        case-insensitive).
    num_classes : int
        Number of outputs (>= 1): classes ``K``, or binary tasks ``T`` for
        multi-label problems (one logit each).
    input_shape : sequence of int
        Per-sample input shape without the batch dimension, e.g. ``(40,)`` for
        mnist1d or ``(3, 32, 32)`` for CIFAR; the channel count is taken from it.
    **kwargs
        Backbone-specific options (e.g. ``dropout`` for ``wrn28_10``).

    Returns
    -------
    Backbone
        A module with ``num_features``, ``forward_features``, ``forward_head``,
        ``get_classifier``, ``reset_classifier`` and the final ``nn.Linear`` as ``head``.
        Initialisation is deterministic under ``torch.manual_seed``.

    Raises
    ------
    ArgumentError
        A ``ValueError``: an unknown name (the message suggests the closest),
        ``num_classes < 1``, or an ``input_shape`` the backbone cannot take
        (:func:`check_compatible`).

    Examples
    --------
    >>> import torch
    >>> from cogcal.models import create_model
    >>> _ = torch.manual_seed(0)
    >>> model = create_model("mlp", num_classes=10, input_shape=(40,))
    >>> model(torch.randn(4, 40)).shape
    torch.Size([4, 10])
    >>> model.forward_features(torch.randn(4, 40)).shape[1] == model.num_features
    True
    >>> model.get_classifier() is model.head
    True
    """
    info = model_info(name)
    num_classes = _check_num_classes(num_classes)
    shape = check_input_shape(input_shape)
    if not kwargs:  # options such as a ViT's patch_size change what fits: the builder checks
        _run_check(info, shape)
    model = info.builder(num_classes=num_classes, input_shape=shape, **kwargs)
    if isinstance(model, Backbone):
        model.input_shape = shape
    return model


# --------------------------------------------------------------------------- helpers


#: The outputs of a model: classes K, or tasks T for multi-label.
OUTPUTS = Integer(1, note="(classes K, or tasks T for multi-label)")


def _check_num_classes(num_classes: Any) -> int:
    return check(num_classes, OUTPUTS, "num_classes")


def check_input_shape(input_shape: Any) -> tuple[int, ...]:
    """Return ``input_shape`` as a tuple of positive ints, or raise ``ValueError``."""
    if isinstance(input_shape, int | str) or not isinstance(input_shape, Sequence | torch.Size):
        raise ArgumentError(
            "`input_shape` must be a sequence of positive ints giving one sample's shape "
            f"without the batch dimension, e.g. (40,) or (3, 32, 32); got {input_shape!r}."
        )
    try:
        dims = tuple(operator.index(d) for d in input_shape)
    except TypeError:
        dims = ()
    if not dims or any(COUNT.problem(d) is not None for d in input_shape):
        raise ArgumentError(
            "`input_shape` must be a non-empty sequence of positive ints (no batch "
            f"dimension), e.g. (40,) or (3, 32, 32); got {input_shape!r}."
        )
    return dims


def _kind(shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return "tabular features or a 1-D sequence"
    if len(shape) == 2:
        return "a 2-D input: a multi-channel sequence or a one-channel image"
    if len(shape) == 3:
        return "images"
    return f"a {len(shape)}-D input"


def _shape_error(model: str, problem: str) -> ArgumentError:
    return ArgumentError(f"{model} {problem}", cli_message=f"--model {model} {problem}")


def image_shape(
    model: str, input_shape: tuple[int, ...], *, min_size: int = 1, multiple_of: int = 1
) -> tuple[int, int, int]:
    """Validate an image shape ``(C, H, W)`` for backbone ``model``; return it.

    Raises :class:`~cogcal._errors.ArgumentError` (a ``ValueError``) saying what is wrong.
    """
    if len(input_shape) != 3:
        raise _shape_error(
            model,
            "needs images of shape (channels, height, width), e.g. (3, 32, 32); the input "
            f"has shape {tuple(input_shape)} ({_kind(tuple(input_shape))}).",
        )
    c, h, w = input_shape
    if h < min_size or w < min_size:
        raise _shape_error(
            model,
            f"needs images of at least {min_size}x{min_size} pixels, got {h}x{w} "
            f"(input_shape {input_shape}).",
        )
    if h % multiple_of or w % multiple_of:
        raise _shape_error(
            model,
            f"needs height and width divisible by {multiple_of} (its patch size), got {h}x{w} "
            f"(input_shape {input_shape}); crop or pad the images.",
        )
    return c, h, w


def sequence_shape(model: str, input_shape: tuple[int, ...]) -> tuple[int, int]:
    """Validate a sequence shape ``(L,)`` or ``(C, L)`` for ``model``; return ``(C, L)``."""
    if len(input_shape) not in (1, 2):
        raise _shape_error(
            model,
            "needs sequences: input_shape (length,) or (channels, length), e.g. (40,) for "
            f"mnist1d; the input has shape {tuple(input_shape)} ({_kind(tuple(input_shape))}).",
        )
    return (1, input_shape[0]) if len(input_shape) == 1 else (input_shape[0], input_shape[1])


def _run_check(info: ModelInfo, shape: tuple[int, ...]) -> None:
    """``info.input_check(shape)``; on failure add the backbones that do take ``shape``."""
    if info.input_check is None:
        return
    try:
        info.input_check(shape)
    except ValueError as err:
        fits = []
        for other in list_models():
            check = MODELS.get(other).input_check
            if other == info.name:
                continue
            try:
                if check is not None:
                    check(shape)
            except ValueError:
                continue
            fits.append(other)
        extra = f" Backbones that take input {shape}: {', '.join(fits)}." if fits else ""
        cli = getattr(err, "cli_message", str(err))
        raise ArgumentError(
            f"{err}{extra}",
            cli_message=f"{cli}{extra.replace('Backbones', 'Backbones (--model)', 1)}",
        ) from None


def check_batch(model: str, x: torch.Tensor, expected: tuple[int, ...]) -> None:
    """Raise ``ValueError`` when a batch ``x`` does not have per-sample shape ``expected``."""
    if tuple(x.shape[1:]) != expected:
        raise ValueError(
            f"{model} was built for inputs of shape (N, {', '.join(map(str, expected))}), "
            f"got a batch of shape {tuple(x.shape)}."
        )


def init_weights(module: nn.Module) -> None:
    """Standard initialisation: Kaiming-normal convolutions (fan-out, ReLU), BN/LN 1 and 0.

    Linear layers keep PyTorch's default initialisation.
    """
    for m in module.modules():
        if isinstance(m, nn.Conv1d | nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d | nn.GroupNorm | nn.LayerNorm):
            if m.weight is not None:
                nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
