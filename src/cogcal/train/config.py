"""One typed configuration for a training run: the only place a training option is defined.

Every field of :class:`TrainConfig` carries its meaning, unit and command-line help in its
metadata; ``cogcal train`` / ``cogcal tune`` build their flags from these fields
(:func:`add_arguments`), suites are validated by building ``TrainConfig`` objects, and a
run folder records the resolved configuration (:meth:`TrainConfig.resolved`), which the
run contract (:mod:`cogcal.runs`) compares field by field.

Validation happens once, when a ``TrainConfig`` is built. Errors are
:class:`ConfigError` s that name the field in Python (``lr``) and the flag on the command
line (``--lr``).

Left to their defaults (``preset="auto"``), the budget scales with the training set and
the learning rates are chosen by validation cross-entropy (docs/method.md §1, "defaults");
``preset="paper"`` gives the paper's settings:

>>> cfg = TrainConfig(method="cog-ms").with_budget(1149)
>>> cfg.batch_size, cfg.epochs, cfg.step_size, cfg.schedule_name, cfg.selects_learning_rates
(32, 42, 14, 'step', True)
>>> paper = TrainConfig(method="cog-ms", preset="paper").with_budget(1149)
>>> paper.batch_size, paper.epochs, paper.step_size, paper.learning_rates()
(256, 300, 10, (0.001, 0.0001))
>>> TrainConfig(method="ce", preset="paper").resolved()["schedule"]
'none'
>>> TrainConfig(lr=0)
Traceback (most recent call last):
...
cogcal.train.config.ConfigError: `lr` must be a positive finite number, got 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cogcal._constraints import COUNT, POSITIVE, SEED, Boolean, Constraint, NamedError, Real
from cogcal._errors import ArgumentError
from cogcal.data import (
    AUGMENTATIONS,
    NORMALIZATIONS,
    default_augment,
    default_model,
    list_datasets,
)
from cogcal.models import list_models
from cogcal.runs.identity import result_fields  # the run contract's rule, re-exported
from cogcal.runs.methods import get_method, list_methods

__all__ = [
    "ConfigError",
    "TrainConfig",
    "LOG_NLL_TS",
    "LR_FLOOR",
    "PRESETS",
    "SCHEDULES",
    "SELECTIONS",
    "auto_budget",
    "add_argument",
    "add_arguments",
    "config_from_args",
    "field_default",
    "flag",
    "result_fields",
]

LR_FLOOR = 1e-8  # every learning rate below this: a run stops (docs/method.md §1)
SCHEDULES = ("step", "none")
PRESETS = ("auto", "paper")
#: How the default path chooses the learning rates (``selection``, docs/method.md §1).
SELECTIONS = ("halving", "full")
#: The automatic budget (``preset="auto"``, docs/method.md §1): the batch is the largest power
#: of two giving at least AUTO_STEPS_PER_EPOCH steps per epoch, within [AUTO_MIN_BATCH,
#: PAPER_BATCH]; the epochs give at least AUTO_MIN_STEPS optimizer steps and at least
#: AUTO_MIN_EPOCHS; the step schedule divides every rate by 10 after each third of the run.
AUTO_MIN_STEPS = 1500
AUTO_MIN_EPOCHS = 30
AUTO_STEPS_PER_EPOCH = 20
AUTO_MIN_BATCH = 16
AUTO_DECAYS = 3  # the run is cut into this many equal parts, each at a tenth of the rate before
#: The paper's settings (``preset="paper"``, paper App. B): batch 256, rates divided by 10
#: every 10 epochs, 300 epochs single-task and 100 multi-task.
PAPER_BATCH = 256
PAPER_STEP_SIZE = 10
PAPER_EPOCHS = {"multiclass": 300, "multilabel": 100}
ACCELERATORS = ("cpu", "gpu", "auto")
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
STRATEGIES = ("auto", "ddp", "ddp_find_unused_parameters_true")
#: ``--augment``: the data's augmentations, ``none`` for :data:`AUGMENTATIONS`' ``None``
AUGMENTS = tuple("none" if a is None else a for a in AUGMENTATIONS)
#: Default of ``checkpoint_seconds``: a kill loses at most this much training; writing
#: every epoch costs small models a visible share of their run (docs/performance.md).
CHECKPOINT_SECONDS = 30.0


def flag(name: str) -> str:
    """The command-line flag of a field: ``calibrator_lr`` -> ``--calibrator-lr``."""
    return "--" + name.replace("_", "-")


class ConfigError(NamedError):
    """An invalid :class:`TrainConfig` field: a :class:`~cogcal._constraints.NamedError`
    whose names are fields, shown as Python arguments (`` `lr` ``) and as their flags
    (``--lr``, :func:`flag`).

    >>> err = ConfigError(lambda n: f"{n('lr')} must be positive.")
    >>> str(err), err.cli_message
    ('`lr` must be positive.', '--lr must be positive.')
    """

    def __init__(self, message: Callable[[Callable[[str], str]], str]) -> None:
        super().__init__(message, flag)


#: The interval of ``checkpoint_seconds``.
CHECKPOINT_INTERVAL = Real(
    0, noun="a finite number of seconds", note="(0: a checkpoint after every epoch)"
)


def _opt(
    help: str,
    *,
    results: bool = True,
    cli: bool = True,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    rule: Constraint | None = None,
) -> dict[str, Any]:
    """Field metadata: ``help`` (meaning and unit), whether the field can change a run's
    results (``results=False``: ignored when two runs are compared), whether it is a
    command-line flag, its choices, and the ``rule`` (a :mod:`cogcal._constraints`
    constraint) its value obeys, in Python and as a flag (``None`` for an optional field
    is always allowed)."""
    return {
        "help": help,
        "results": results,
        "cli": cli,
        "choices": choices,
        "metavar": metavar,
        "rule": rule,
    }


#: The ``extra`` key marking a method given explicitly (``--method``, ``cogcal.fit(method=)``):
#: the default path then trains that method alone instead of weighing COG-FC against
#: cross-entropy + post-hoc calibration (:mod:`cogcal.train.choice`).
METHOD_GIVEN = "method_given"
#: The ``extra`` key asking the training loop to log the validation NLL after the best
#: temperature every epoch (``val_nll_ts``): set by the default path on the runs that
#: compare by it (:mod:`cogcal.train.choice`), off elsewhere (it costs a pass over 49
#: temperatures of the validation logits each epoch).
LOG_NLL_TS = "log_nll_ts"


@dataclass
class TrainConfig:
    """Everything that defines one training run (the recipe of docs/method.md §1).

    Fields left as ``None`` resolve to defaults that depend on ``preset``:

    * ``"auto"`` (the default): ``batch_size``, ``epochs`` and ``step_size`` come from the
      training-set size (:func:`auto_budget`, applied by :meth:`with_budget` once the data
      is loaded), every method uses the ``step`` schedule, and without ``lr`` the learning
      rates are chosen by validation cross-entropy (:attr:`selects_learning_rates`; the
      runner trains a small grid and keeps the chosen run);
    * ``"paper"``: the paper's settings (App. B): batch 256, 300 epochs (100 multi-task),
      ``lr`` 1e-3 for COG methods and 1e-4 for the others, ``calibrator_lr`` = ``lr / 10``,
      schedule ``step`` every 10 epochs for COG and ``none`` for the others.

    ``model`` defaults to the dataset's backbone. A field given explicitly always wins.
    """

    dataset: str = field(
        default="mnist1d",
        metadata=_opt(
            "dataset: a registered name, folder:PATH (ImageFolder layout), csv:PATH (with "
            "--target) or package.module:function (a plugin)",
            metavar="NAME",
        ),
    )
    model: str | None = field(
        default=None,
        metadata=_opt(
            "backbone name (default: the dataset's; python:NAME: a model given to cogcal.fit)",
            metavar="NAME",
        ),
    )
    method: str = field(
        default="cog-fc",
        metadata=_opt(
            "training method (default: cog-fc; without --method and --lr, at the auto "
            "preset, on single-label data in one process, `cogcal train` weighs it against "
            "cross-entropy + post-hoc calibration and keeps the one with the lower "
            "validation NLL: docs/method.md §1)",
            metavar="NAME",
        ),
    )
    seed: int = field(
        default=0,
        metadata=_opt(
            "seed of initialisation, shuffling and augmentation (splits are fixed)", rule=SEED
        ),
    )
    preset: str = field(
        default="auto",
        metadata=_opt(
            "what unset budget fields become (default: auto): auto (batch, epochs and "
            "schedule from the "
            "training-set size; without --lr the learning rates are chosen by validation "
            "cross-entropy) or paper (batch 256, lr 1e-3 COG / 1e-4 others, calibrator lr/10, "
            "rates /10 every 10 epochs for COG, 300 epochs)",
            choices=PRESETS,
        ),
    )
    epochs: int | None = field(
        default=None,
        metadata=_opt(
            f"stage-1 training epochs (default auto: at least {AUTO_MIN_STEPS} optimizer steps "
            f"and {AUTO_MIN_EPOCHS} epochs; paper: 300)",
            rule=COUNT,
        ),
    )
    stage2_epochs: int = field(default=40, metadata=_opt("TST / V-TST stage-2 epochs", rule=COUNT))
    batch_size: int | None = field(
        default=None,
        metadata=_opt(
            "global minibatch size in samples, split across devices (default auto: the "
            f"largest power of two in [{AUTO_MIN_BATCH}, {PAPER_BATCH}] giving "
            f"{AUTO_STEPS_PER_EPOCH} steps per epoch; paper: {PAPER_BATCH})",
            rule=COUNT,
        ),
    )
    lr: float | None = field(
        default=None,
        metadata=_opt(
            "network learning rate λ_f, Adam (default auto: chosen by validation cross-entropy "
            "on a small grid; paper: 1e-3 COG, 1e-4 others)",
            rule=POSITIVE,
        ),
    )
    calibrator_lr: float | None = field(
        default=None,
        metadata=_opt(
            "calibrator learning rate λ_c of COG methods (default: lr/10)", rule=POSITIVE
        ),
    )
    selection: str = field(
        default="halving",
        metadata=_opt(
            "how the learning rates are chosen by validation cross-entropy when no --lr is "
            "given: halving (successive halving: every grid point trained for the first "
            "third of the epochs, the best two continued to half of them, the best one to the "
            "end) or full (every point trained to the end)",
            choices=SELECTIONS,
        ),
    )
    allow_fast_calibrator: bool = field(
        default=False,
        metadata=_opt(
            "permit calibrator_lr >= lr (breaks COG's slower-calibrator hierarchy)", rule=Boolean()
        ),
    )
    schedule: str | None = field(
        default=None,
        metadata=_opt(
            "learning-rate schedule: step (divide every rate by 10 every --step-size epochs) "
            "or none (default auto: step; paper: step for COG methods, none for the others)",
            choices=SCHEDULES,
        ),
    )
    step_size: int | None = field(
        default=None,
        metadata=_opt(
            "step schedule period in epochs (default auto: a third of the run; paper: 10)",
            rule=COUNT,
        ),
    )
    patience: int | None = field(
        default=None,
        metadata=_opt(
            "early stopping: epochs without a better validation Brier (default: off)", rule=COUNT
        ),
    )
    target: str | None = field(
        default=None,
        metadata=_opt("class column of a csv: dataset (required there)", metavar="COLUMN"),
    )
    image_size: int | None = field(
        default=None,
        metadata=_opt(
            "side, in pixels, of the square images a folder: dataset is resized to (default: 32)",
            metavar="PIXELS",
            rule=COUNT,
        ),
    )
    augment: str | None = field(
        default=None,
        metadata=_opt(
            "training augmentation: none, flip (random horizontal flip) or crop_flip (random "
            "crop of the 4-pixel padded image + flip) (default: the data's: crop_flip for "
            "cifar10/cifar100/svhn, flip for celeba, none for everything else, folder: images "
            "included)",
            choices=AUGMENTS,
        ),
    )
    normalization: str = field(
        default="auto",
        metadata=_opt(
            "input normalisation: auto (each dataset's own; user data: training-split "
            "statistics), none, imagenet (RGB images), per-column or one-scale (feature "
            "vectors: each column its own training-split mean/std, or one for all cells)",
            choices=NORMALIZATIONS,
        ),
    )
    accelerator: str = field(default="cpu", metadata=_opt("device kind", choices=ACCELERATORS))
    devices: int = field(default=1, metadata=_opt("devices (processes) per node", rule=COUNT))
    num_nodes: int = field(default=1, metadata=_opt("number of nodes", rule=COUNT))
    strategy: str = field(
        default="auto", metadata=_opt("Lightning Fabric strategy", choices=STRATEGIES)
    )
    precision: str = field(
        default="32",
        metadata=_opt("numeric precision (16-mixed needs a GPU)", choices=PRECISIONS),
    )
    channels_last: bool = field(
        default=False,
        metadata=_opt("NHWC memory layout for image models (faster on GPUs)", rule=Boolean()),
    )
    compile: bool = field(default=False, metadata=_opt("torch.compile the model", rule=Boolean()))
    data_root: str = field(
        default="data", metadata=_opt("folder holding the datasets", results=False, metavar="DIR")
    )
    download: bool = field(
        default=False,
        metadata=_opt(
            "download missing dataset files (checksums verified)", results=False, rule=Boolean()
        ),
    )
    mirror: str | None = field(
        default=None,
        metadata=_opt(
            "base URL of a mirror to download from (default: $COGCAL_DATA_MIRROR, else the "
            "official URLs)",
            results=False,
            metavar="URL",
        ),
    )
    out: str = field(default="runs/default", metadata=_opt("run folder", results=False, cli=False))
    progress: bool = field(
        default=True,
        metadata=_opt(
            "progress bars (the summary and the run folder are printed either way)",
            results=False,
            rule=Boolean(),
        ),
    )
    checkpoint_seconds: float = field(
        default=CHECKPOINT_SECONDS,
        metadata=_opt(
            "minimum wall seconds between two writes of last.ckpt (0: after every epoch); "
            "each stage's last epoch is always written, and a resumed run trains the epochs "
            "since the last write again, identically",
            results=False,
            metavar="S",
            rule=CHECKPOINT_INTERVAL,
        ),
    )
    extra: dict[str, Any] = field(
        default_factory=dict,
        metadata=_opt("free-form notes recorded with the run", results=False, cli=False),
    )

    def __post_init__(self) -> None:
        self._normalise_names()
        self._validate()

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a mapping of field values; unknown keys are an error, never ignored.

        Keys that only a resolved record holds (``task``, ``data``) are not fields and are
        refused too; use :meth:`from_record` for a recorded ``config.json``.
        """
        if not isinstance(data, dict):
            raise ArgumentError(f"a training config must be a mapping, got {type(data).__name__}.")
        data = dict(data)
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in data if k not in names]
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(str(key), names, n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ArgumentError(
                f"unknown training config key(s) {', '.join(hints)}; allowed keys: "
                f"{', '.join(names)}."
            )
        return cls(**data)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TrainConfig:
        """Rebuild the configuration recorded in a run's ``config.json``."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls.from_dict({k: v for k, v in record.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy of the fields as given."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        """A validated copy with ``changes`` applied."""
        return TrainConfig.from_dict({**self.to_dict(), **changes})

    # -- validation ----------------------------------------------------------------------
    def _normalise_names(self) -> None:
        for name in ("method", "model", "dataset"):
            value = getattr(self, name)
            if isinstance(value, str) and not _is_path_dataset(value):
                setattr(self, name, value.strip().lower())

    def _validate(self) -> None:
        """Check every field (in this order: the fields alone, then the learning rates,
        then the data and paths); the first problem is raised."""
        self._validate_fields()
        self._validate_rates()
        self._validate_data()

    def _validate_fields(self) -> None:
        """Names, integers, choices and switches, and what the devices allow."""
        if not isinstance(self.dataset, str) or not self.dataset:
            raise ConfigError(
                lambda n: f"{n('dataset')} must be a dataset name, got {self.dataset!r}."
            )
        if not _is_path_dataset(self.dataset):
            _check_name("dataset", self.dataset, list_datasets())
        if self.model is not None and not self.model.startswith("python:"):
            _check_name("model", self.model, list_models())
        _check_name("method", self.method, list_methods())
        for f in dataclasses.fields(self):
            rule, value = f.metadata.get("rule"), getattr(self, f.name)
            if rule is not None and not (value is None and f.default is None):
                _check_rule(f.name, value, rule)
        for name, allowed in (
            ("preset", PRESETS),
            ("selection", SELECTIONS),
            ("schedule", SCHEDULES),
            ("strategy", STRATEGIES),
            ("precision", PRECISIONS),
            ("accelerator", ACCELERATORS),
            ("normalization", NORMALIZATIONS),
            ("augment", AUGMENTS),
        ):
            value = getattr(self, name)
            if value is None and name in ("schedule", "augment"):
                continue
            if value not in allowed:
                raise ConfigError(
                    lambda n, name=name, allowed=allowed, value=value: (
                        f"{n(name)} must be one of {', '.join(allowed)}, got {value!r}."
                    )
                )
        world = self.devices * self.num_nodes
        if self.batch_size is not None and self.batch_size % world:
            raise ConfigError(
                lambda n: (
                    f"{n('batch_size')} {self.batch_size} (the global batch) must be "
                    f"divisible by the {world} processes ({n('devices')} x {n('num_nodes')})."
                )
            )
        if self.precision == "16-mixed" and self.accelerator == "cpu":
            raise ConfigError(
                lambda n: (
                    f"{n('precision')} 16-mixed needs a GPU ({n('accelerator')} is cpu); "
                    "use bf16-mixed on the CPU."
                )
            )

    def _validate_rates(self) -> None:
        """The learning rates, given or chosen, and the checkpoint interval."""
        if self.lr is not None and self.lr < LR_FLOOR:
            raise ConfigError(
                lambda n: (
                    f"{n('lr')} {self.lr:g} is below {LR_FLOOR:g}, where training stops at "
                    f"once (no update that small changes the result); use a larger {n('lr')}."
                )
            )
        if self.calibrator_lr is not None and not get_method(self.method).is_cog:
            raise ConfigError(
                lambda n: (
                    f"{n('calibrator_lr')} applies to COG methods only; method "
                    f"{self.method!r} trains with one learning rate (use {n('lr')})."
                )
            )
        if self.selects_learning_rates and self.calibrator_lr is not None:
            raise ConfigError(
                lambda n: (
                    f"{n('calibrator_lr')} is given without {n('lr')}: give {n('lr')} too (one "
                    "configuration is trained), or neither (both are chosen by validation "
                    f"cross-entropy), or pass {n('preset')} paper (lr 1e-3)."
                )
            )
        lr, cal_lr = self.learning_rates()
        if (
            cal_lr is not None
            and lr is not None
            and cal_lr >= lr
            and not self.allow_fast_calibrator
        ):
            raise ConfigError(
                lambda n: (
                    f"{n('calibrator_lr')} {cal_lr:g} must be smaller than {n('lr')} "
                    f"{lr:g} (COG's calibrator moves on the slower timescale); lower it or pass "
                    f"{n('allow_fast_calibrator')}."
                )
            )

    def _validate_data(self) -> None:
        """What the dataset takes (augmentation, a csv: table's target), the paths, the
        mirror and ``extra``."""
        if self.augment not in (None, "none") and self.dataset.startswith("csv:"):
            raise ConfigError(
                lambda n: f"{n('augment')} {self.augment} flips images; a csv: table takes none."
            )
        if self.target is not None and (not isinstance(self.target, str) or not self.target):
            raise ConfigError(
                lambda n: f"{n('target')} must be a column name, got {self.target!r}."
            )
        if self.target is not None and not self.dataset.startswith("csv:"):
            raise ConfigError(lambda n: f"{n('target')} applies to csv: datasets only.")
        if self.dataset.startswith("csv:") and not self.target:
            raise ConfigError(
                lambda n: (
                    f"{n('dataset')} {self.dataset} needs {n('target')}, the name of the "
                    "column holding the class labels."
                )
            )
        for name in ("data_root", "out"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(
                    lambda n, name=name, value=value: (
                        f"{n(name)} must be a non-empty path, got {value!r} (use . for the "
                        "current folder)."
                    )
                )
        if self.mirror is not None and (not isinstance(self.mirror, str) or not self.mirror):
            raise ConfigError(lambda n: f"{n('mirror')} must be a URL, got {self.mirror!r}.")
        if not isinstance(self.extra, dict):
            raise ConfigError(
                lambda n: f"{n('extra')} must be a mapping, got {type(self.extra).__name__}."
            )

    # -- resolution ----------------------------------------------------------------------
    @property
    def model_name(self) -> str | None:
        """The backbone used: ``model``, else the dataset's default (``None`` for plugins,
        whose default is known only once loaded)."""
        return self.model or default_model(self.dataset)

    @property
    def selects_learning_rates(self) -> bool:
        """Whether the run chooses its learning rates by validation cross-entropy: no
        ``lr`` given and ``preset="auto"`` (docs/method.md §1, "defaults")."""
        return self.lr is None and self.preset == "auto"

    def learning_rates(self) -> tuple[float | None, float | None]:
        """``(λ_f, λ_c)`` after defaults; ``λ_c`` is None for non-COG methods, both are None
        while they are still to be chosen (:attr:`selects_learning_rates`)."""
        method = get_method(self.method)
        if self.selects_learning_rates:
            return None, None
        lr = self.lr if self.lr is not None else method.default_lr
        if not method.is_cog:
            return float(lr), None
        cal = self.calibrator_lr if self.calibrator_lr is not None else lr / 10
        return float(lr), float(cal)

    @property
    def augment_name(self) -> str:
        """The training augmentation used: ``augment``, else the data's default
        (:func:`cogcal.data.default_augment`; ``"auto"`` for plugins: their own)."""
        if self.augment is not None:
            return self.augment
        if self.dataset.startswith("python:"):
            return "none"  # cogcal.fit: the user's data as given
        return default_augment(self.dataset)

    @property
    def schedule_name(self) -> str:
        """The schedule used: ``schedule``, else the preset's (auto: ``step``; paper: the
        method's, ``step`` for COG and ``none`` for the others)."""
        if self.schedule:
            return self.schedule
        return "step" if self.preset == "auto" else get_method(self.method).default_schedule

    @property
    def budget_resolved(self) -> bool:
        """Whether ``epochs``, ``batch_size`` and (with the step schedule) ``step_size`` are
        set, so the run's length no longer depends on the data (:meth:`with_budget`)."""
        if self.preset == "paper":  # only the epochs depend on the data (its task)
            return self.epochs is not None
        needs_step = self.schedule_name == "step"
        return None not in (self.epochs, self.batch_size) and (
            self.step_size is not None or not needs_step
        )

    def with_budget(self, train_size: int, *, task: str = "multiclass") -> TrainConfig:
        """A copy with ``epochs``, ``batch_size``, ``schedule`` and ``step_size`` set from
        the training-set size (``preset="auto"``: :func:`auto_budget`) or to the paper's
        values (``preset="paper"``); fields already given are kept. Learning rates are
        left alone (auto: chosen by the runner; paper: the method's defaults).

        >>> cfg = TrainConfig(method="cog-fc", epochs=5).with_budget(10_000)
        >>> cfg.epochs, cfg.batch_size, cfg.step_size
        (5, 256, 2)
        """
        if COUNT.problem(train_size) is not None:
            raise ArgumentError(
                f"the training split must hold at least one sample, got {train_size!r}."
            )
        world = self.devices * self.num_nodes
        if self.preset == "paper":
            batch = self.batch_size or PAPER_BATCH
            epochs = self.epochs or PAPER_EPOCHS.get(task, PAPER_EPOCHS["multiclass"])
            step = self.step_size or PAPER_STEP_SIZE
        else:
            auto = auto_budget(train_size, batch_size=self.batch_size, epochs=self.epochs)
            batch, epochs = auto["batch_size"], auto["epochs"]
            step = self.step_size or max(1, math.ceil(epochs / AUTO_DECAYS))
        if self.batch_size is None and batch % world:  # a multiple of the processes
            batch = world * math.ceil(batch / world)
        changes: dict[str, Any] = {
            "batch_size": batch,
            "epochs": epochs,
            "schedule": self.schedule_name,
        }
        if self.schedule_name == "step":
            changes["step_size"] = step
        return self.replace(**changes)

    def resolved(self) -> dict[str, Any]:
        """Every field with its default filled in: what ``config.json`` records.

        Budget fields left to ``preset="auto"`` stay None until :meth:`with_budget` has
        seen the data, and so do the learning rates while they are still to be chosen.
        """
        lr, cal_lr = self.learning_rates()
        out = {
            **self.to_dict(),
            "model": self.model_name,
            "lr": lr,
            "calibrator_lr": cal_lr,
            "schedule": self.schedule_name,
            "augment": self.augment_name,
        }
        if self.preset == "paper":
            out["batch_size"] = self.batch_size or PAPER_BATCH
            if out["schedule"] == "step":
                out["step_size"] = self.step_size or PAPER_STEP_SIZE
        return out


def auto_budget(
    train_size: int, *, batch_size: int | None = None, epochs: int | None = None
) -> dict[str, int]:
    """The automatic budget of a training set of ``train_size`` samples (docs/method.md §1).

    The batch (unless given) is the largest power of two that gives at least
    ``AUTO_STEPS_PER_EPOCH`` optimizer steps per epoch, kept within [``AUTO_MIN_BATCH``,
    ``PAPER_BATCH``]; the epochs (unless given) give at least ``AUTO_MIN_STEPS`` steps in
    all and at least ``AUTO_MIN_EPOCHS``. Returns ``batch_size``, ``epochs``,
    ``steps_per_epoch`` and ``steps``.

    >>> auto_budget(1149)  # digits: 1,149 training images
    {'batch_size': 32, 'epochs': 42, 'steps_per_epoch': 36, 'steps': 1512}
    >>> auto_budget(40_000)["batch_size"], auto_budget(40_000)["epochs"]
    (256, 30)
    >>> auto_budget(114)  # scikit-learn wine: 16 samples a batch, 8 steps an epoch
    {'batch_size': 16, 'epochs': 188, 'steps_per_epoch': 8, 'steps': 1504}
    """
    if batch_size is None:
        target = max(1, train_size // AUTO_STEPS_PER_EPOCH)
        batch_size = min(PAPER_BATCH, max(AUTO_MIN_BATCH, 1 << (target.bit_length() - 1)))
    steps_per_epoch = max(1, math.ceil(train_size / batch_size))
    if epochs is None:
        epochs = max(AUTO_MIN_EPOCHS, math.ceil(AUTO_MIN_STEPS / steps_per_epoch))
    return {
        "batch_size": batch_size,
        "epochs": epochs,
        "steps_per_epoch": steps_per_epoch,
        "steps": steps_per_epoch * epochs,
    }


def _is_path_dataset(name: str) -> bool:
    """``folder:PATH``, ``csv:PATH`` or ``package.module:function``."""
    return isinstance(name, str) and ":" in name


def _check_name(name: str, value: Any, names: list[str]) -> None:
    if value not in names:
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            lambda n: f"{n(name)} {value!r} is unknown; choose one of: {', '.join(names)}.{hint}"
        )


def _check_rule(name: str, value: Any, rule: Constraint) -> None:
    """Refuse a field's value that breaks its rule, in the one template of
    :func:`cogcal._constraints.violation` (the field as `` `name` `` or ``--flag``)."""
    problem = rule.problem(value)  # the template of cogcal._constraints.violation
    if problem is not None:
        raise ConfigError(lambda n: f"{n(name)} {problem}")


# --------------------------------------------------------------------------- comparison


# --------------------------------------------------------------------------- command line


def field_default(name: str) -> Any:
    """The default of a :class:`TrainConfig` field (the one place defaults are stated).

    >>> field_default("method"), field_default("data_root")
    ('cog-fc', 'data')
    """
    return _FIELDS[name].default


def _field_help(name: str) -> str:
    """The command-line help of a :class:`TrainConfig` field, with its default."""
    f = _FIELDS[name]
    help_text = f.metadata["help"]
    if f.metadata["choices"]:
        help_text += f" [{', '.join(f.metadata['choices'])}]"
    # a None default is described by the help text itself (or means "not set")
    if f.default is not None and "default" not in help_text:
        help_text += f" (default: {f.default})"
    return help_text


def _field_type(name: str) -> Any:
    """The type a flag converts to: the field's annotation without ``None``.

    >>> _field_type("lr"), _field_type("epochs"), _field_type("allow_fast_calibrator")
    (<class 'float'>, <class 'int'>, <class 'bool'>)
    """
    hint = _HINTS[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
#: The fields' annotations, resolved once: ``typing.get_type_hints`` evaluates every string
#: annotation anew on each call (~0.4 ms, once per flag of every parser built).
_HINTS = typing.get_type_hints(TrainConfig)


def add_arguments(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """Add one flag per command-line field of :class:`TrainConfig` to ``parser``
    (:func:`add_argument` for each)."""
    for f in dataclasses.fields(TrainConfig):
        if f.metadata["cli"] and f.name not in exclude:
            add_argument(parser, f.name)


def add_argument(parser: argparse.ArgumentParser, name: str) -> None:
    """Add the flag of the :class:`TrainConfig` field ``name`` to ``parser``.

    Flag, type (the field's annotation), default and help all come from the field; a
    boolean field whose default is true becomes ``--no-<name>``. Values are checked by
    :class:`TrainConfig` itself, so parsing only converts types.
    """
    f = _FIELDS[name]
    kind = _field_type(name)
    if kind is bool:
        if f.default:
            parser.add_argument(
                "--no-" + name.replace("_", "-"),
                dest=name,
                action="store_false",
                help=f"no {f.metadata['help']}",
            )
        else:
            parser.add_argument(flag(name), action="store_true", help=f.metadata["help"])
        return
    parser.add_argument(
        flag(name),
        dest=name,
        type=kind,
        # --method: None when not given, so that the default path can tell (METHOD_GIVEN)
        default=None if name == "method" else f.default,
        metavar=f.metadata["metavar"],
        help=_field_help(name),
    )


def config_from_args(args: argparse.Namespace, **fields: Any) -> TrainConfig:
    """The :class:`TrainConfig` of parsed flags (plus ``fields``, e.g. ``out``); a
    ``--method`` given on the command line is marked in ``extra`` (:data:`METHOD_GIVEN`)."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if f.metadata["cli"] and hasattr(args, f.name)
    }
    if values.get("method") is None:
        values.pop("method", None)
    else:
        values["extra"] = {**values.get("extra", {}), METHOD_GIVEN: True}
    return TrainConfig.from_dict({**values, **fields})
