"""One typed configuration for a training run (SPEC §1 recipe), validated once."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TrainConfig", "DEFAULT_MODELS"]

#: Backbone used when ``model`` is not given, per dataset.
DEFAULT_MODELS = {
    "mnist1d": "mlp",
    "digits": "cnn",
    "cifar10": "resnet18",
    "cifar100": "resnet18",
    "svhn": "resnet18",
    "mnist1d-mtl": "mlp",
    "digits-mtl": "cnn",
    "celeba": "resnet18",
}
ACCELERATORS = ("cpu", "gpu", "auto")
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
LR_FLOOR = 1e-8  # every learning rate below this: a run stops (SPEC §1)
STRATEGIES = ("auto", "ddp", "ddp_find_unused_parameters_true")


@dataclass
class TrainConfig:
    """Everything that defines one training run; units in the comments.

    ``lr`` and ``calibrator_lr`` left as ``None`` resolve to the method's defaults
    (:meth:`resolved`): 1e-3 for COG methods and 1e-4 for the others, and ``lr / 10``.
    """

    dataset: str = "mnist1d"
    model: str | None = None  # backbone name; None -> DEFAULT_MODELS[dataset]
    method: str = "cog-fc"
    seed: int = 0  # initialisation, shuffling, augmentation (the data split seed is fixed)
    epochs: int = 30  # stage-1 epochs (the paper: 300 single-task, 100 multi-task)
    stage2_epochs: int = 40  # TST / V-TST stage-2 epochs
    batch_size: int = 256  # global batch, split across devices
    steps_per_call: int = 8  # minibatches per Lightning training_step; never changes results
    lr: float | None = None  # λ_f, network learning rate (Adam)
    calibrator_lr: float | None = None  # λ_c, calibrator learning rate (COG methods)
    allow_fast_calibrator: bool = False  # permit λ_c >= λ_f (breaks the Stackelberg hierarchy)
    step_size: int = 10  # StepLR: divide COG learning rates by 10 every this many epochs
    patience: int | None = None  # early stopping on validation Brier, in validation checks
    accelerator: str = "cpu"
    devices: int = 1  # devices per node
    num_nodes: int = 1
    strategy: str = "auto"  # Lightning strategy: "auto", "ddp", ...
    precision: str = "32"  # Lightning precision: "32", "bf16-mixed", "16-mixed"
    channels_last: bool = False  # NHWC memory format for image models (faster on GPUs)
    compile: bool = False  # torch.compile the model (nn.Module.compile, keys unchanged)
    data_root: str = "data"
    out: str = "runs/default"
    progress: bool = True  # progress bar and end-of-run summary
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes recorded with the run

    def __post_init__(self) -> None:
        self.validate()

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a dict; unknown keys are an error, never ignored."""
        if not isinstance(data, dict):
            raise ValueError(f"a training config must be a mapping, got {type(data).__name__}.")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in data if k not in names]
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(str(key), names, n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(
                f"unknown training config key(s) {', '.join(hints)}; allowed keys: "
                f"{', '.join(names)}."
            )
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        """A validated copy with ``changes`` applied."""
        return TrainConfig.from_dict({**self.to_dict(), **changes})

    # -- validation ----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field (as its ``--flag``)."""
        from cogcal.data import list_datasets
        from cogcal.models import list_models
        from cogcal.train.methods import get_method

        _check_name("--dataset", self.dataset, list_datasets())
        if self.model is not None:
            _check_name("--model", self.model, list_models())
        method = get_method(self.method)
        _check_int("--seed", self.seed, minimum=0)
        _check_int("--epochs", self.epochs, minimum=1)
        _check_int("--stage2-epochs", self.stage2_epochs, minimum=1)
        _check_int("--batch-size", self.batch_size, minimum=1)
        _check_int("--steps-per-call", self.steps_per_call, minimum=1)
        _check_int("--step-size", self.step_size, minimum=1)
        _check_int("--devices", self.devices, minimum=1)
        _check_int("--num-nodes", self.num_nodes, minimum=1)
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"--strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}."
            )
        world = self.devices * self.num_nodes
        if self.batch_size % world:
            raise ValueError(
                f"--batch-size {self.batch_size} (the global batch) must be divisible by the "
                f"{world} processes (--devices x --num-nodes)."
            )
        if self.patience is not None:
            _check_int("--patience", self.patience, minimum=1)
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}."
            )
        if self.accelerator not in ACCELERATORS:
            raise ValueError(
                f"--accelerator must be one of {', '.join(ACCELERATORS)}, got {self.accelerator!r}."
            )
        for flag, value in (("--lr", self.lr), ("--calibrator-lr", self.calibrator_lr)):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value < float("inf")
            ):
                raise ValueError(f"{flag} must be a positive finite number, got {value!r}.")
        if self.lr is not None and self.lr < LR_FLOOR:
            raise ValueError(
                f"--lr {self.lr:g} is below {LR_FLOOR:g}, where training stops at once (no "
                "update that small changes the result); use a larger --lr."
            )
        if self.calibrator_lr is not None and not method.cog:
            raise ValueError(
                f"--calibrator-lr applies to COG methods only; method {self.method!r} trains "
                "with one learning rate (use --lr)."
            )
        lr, cal_lr = self.learning_rates()
        if cal_lr is not None and cal_lr >= lr and not self.allow_fast_calibrator:
            raise ValueError(
                f"--calibrator-lr {cal_lr:g} must be smaller than --lr {lr:g} (COG's calibrator "
                "moves on the slower timescale); lower it or pass --allow-fast-calibrator."
            )
        if not isinstance(self.extra, dict):
            raise ValueError(f"`extra` must be a mapping, got {type(self.extra).__name__}.")

    # -- resolution ----------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The backbone actually used."""
        return self.model or DEFAULT_MODELS.get(self.dataset, "resnet18")

    def learning_rates(self) -> tuple[float, float | None]:
        """``(λ_f, λ_c)`` after defaults; ``λ_c`` is None for non-COG methods."""
        from cogcal.train.methods import get_method

        method = get_method(self.method)
        lr = self.lr if self.lr is not None else method.default_lr
        if not method.cog:
            return float(lr), None
        cal = self.calibrator_lr if self.calibrator_lr is not None else lr / 10
        return float(lr), float(cal)

    def resolved(self) -> dict[str, Any]:
        """The config with every default filled in, as recorded in ``config.json``."""
        lr, cal_lr = self.learning_rates()
        return {**self.to_dict(), "model": self.model_name, "lr": lr, "calibrator_lr": cal_lr}


def _check_name(flag: str, value: Any, names: list[str]) -> None:
    if value not in names:
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{flag} {value!r} is unknown; choose one of: {', '.join(names)}.{hint}")


def _check_int(flag: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{flag} must be an integer >= {minimum}, got {value!r}.")
