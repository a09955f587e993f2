"""Training budgets: the epochs, schedule and early stopping of a method family in a protocol.

A suite states its budgets under ``budget.<protocol>`` (docs/bench.md, "Suites"): per
family, ``baselines`` (methods without a jointly trained calibrator) and ``cog``, in the
``paper`` protocol; one mapping for every method in the ``fair`` one. A budget is never
implied and never set in a ``train`` section; its fields are :class:`TrainConfig` fields
(:data:`BUDGET_FIELDS`), checked by TrainConfig's rules.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from typing import Any

from cogcal.bench.suite_yaml import as_mapping, check_keys, yaml_number
from cogcal.runs.columns import PROTOCOLS
from cogcal.runs.methods import get_method
from cogcal.train.config import LR_FLOOR, ConfigError, TrainConfig

__all__ = ["BUDGET_FIELDS", "FAMILIES", "Budget", "family_of", "floor_epoch", "parse_budgets"]


#: Method families a budget is stated for: methods without a jointly trained calibrator,
#: and COG methods.
FAMILIES: tuple[str, ...] = ("baselines", "cog")

#: TrainConfig fields a budget sets (and that ``train`` sections may therefore not set).
BUDGET_FIELDS: tuple[str, ...] = (
    "epochs", "schedule", "step_size", "patience", "stage2_epochs", "lr", "calibrator_lr",
)  # fmt: skip
_BUDGET_REQUIRED = ("epochs", "schedule", "patience")


def family_of(method: str) -> str:
    """The budget family of a method: ``"cog"`` for COG methods, else ``"baselines"``.

    >>> family_of("cog-ts"), family_of("ts")
    ('cog', 'baselines')
    """
    return "cog" if get_method(method).is_cog else "baselines"


class _BudgetBase:
    """What a :class:`Budget` adds to its TrainConfig fields."""

    @property
    def tuned(self) -> bool:
        """Whether the family's learning rates are tuned (no fixed ``lr``)."""
        return self.lr is None  # type: ignore[attr-defined]

    def config_fields(self) -> dict[str, Any]:
        """The TrainConfig fields this budget sets (``patience`` even when None: off)."""
        fields = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {k: v for k, v in fields.items() if v is not None or k == "patience"}


_HINTS = typing.get_type_hints(TrainConfig)
#: The training budget of one method family in one protocol (see docs/bench.md): the
#: TrainConfig fields of :data:`BUDGET_FIELDS`, with their types, None where not stated
#: (``lr`` None: tuned; ``stage2_epochs`` None: the family has no TST / V-TST head).
Budget = dataclasses.make_dataclass(
    "Budget",
    [(name, _HINTS[name] | None, field(default=None)) for name in BUDGET_FIELDS],
    bases=(_BudgetBase,),
    frozen=True,
)
Budget.__module__ = __name__


def floor_epoch(lr: float, schedule: str, step_size: int | None, epochs: int) -> int | None:
    """The epoch at which a run starting at ``lr`` stops because every learning rate is
    below the 1e-8 floor (:data:`cogcal.train.config.LR_FLOOR`), or ``None`` when that
    does not happen within ``epochs``.

    The rates are divided by 10 every ``step_size`` epochs exactly as the training loop
    does (``torch.optim.lr_scheduler.StepLR`` multiplies by 0.1), and the loop checks the
    floor at the start of each epoch.

    >>> floor_epoch(1e-3, "step", 10, 300)   # five decades, then below: 6 steps
    60
    >>> floor_epoch(1e-4, "step", 100, 400) is None
    True
    >>> floor_epoch(1e-4, "none", None, 300) is None
    True
    """
    if schedule != "step" or step_size is None:
        return None
    rate, decays = float(lr), 0
    while rate >= LR_FLOOR:
        rate *= 0.1
        decays += 1
    epoch = decays * step_size
    return epoch if epoch < epochs else None


def _check_budget(value: Any, where: str, *, protocol: str, family: str) -> Budget:
    """One family's budget: the keys it may state here, then TrainConfig's rules."""
    d = as_mapping(value, where)
    allowed = ["epochs", "schedule", "step_size", "patience"]
    if family == "baselines":
        allowed.append("stage2_epochs")
    if protocol == "paper":
        allowed.append("lr")
        if family == "cog":
            allowed.append("calibrator_lr")
    for key in ("lr", "calibrator_lr"):
        if key in d and key not in allowed:
            raise ValueError(
                f"{where}: {key!r} cannot be fixed here: "
                + (
                    "the fair protocol tunes every method's learning rates (tune.lrs, "
                    "tune.ratios, tune.baseline_lrs)."
                    if protocol == "fair"
                    else "baselines have one learning rate (lr)."
                )
            )
    if "stage2_epochs" in d and family == "cog":
        raise ValueError(f"{where}: 'stage2_epochs' applies to the TST / V-TST baselines only.")
    check_keys(d, allowed, where)
    missing = [k for k in _BUDGET_REQUIRED if k not in d or (d[k] is None and k != "patience")]
    if missing:
        raise ValueError(
            f"{where} must state {', '.join(missing)} (a budget is never implied; write "
            "patience: null for no early stopping)."
        )
    if d["patience"] in (False, "none", "off"):
        d["patience"] = None
    d.update({k: yaml_number(d[k]) for k in ("lr", "calibrator_lr") if k in d})
    try:  # types and values: the TrainConfig rules (the hierarchy is checked per run)
        method = "cog-fc" if family == "cog" else "ce"
        TrainConfig(method=method, preset="paper", allow_fast_calibrator=True, **d)
    except ConfigError as err:
        raise ValueError(f"{where}: {err}") from None
    if d["schedule"] == "step" and d.get("step_size") is None:
        raise ValueError(f"{where}: schedule step needs step_size (epochs per division by 10).")
    if d["schedule"] != "step" and d.get("step_size") is not None:
        raise ValueError(f"{where}: step_size applies to schedule step only (schedule is none).")
    if "calibrator_lr" in d and "lr" not in d:
        raise ValueError(f"{where}: calibrator_lr is fixed only together with lr.")
    return Budget(**d)


def parse_budgets(value: Any, where: str) -> dict[str, dict[str, Budget]]:
    """A suite's ``budget`` section: ``{protocol: {family: Budget}}`` (the ``fair``
    protocol's one budget given to both families, the cog one without ``stage2_epochs``)."""
    d = as_mapping(value, where)
    check_keys(d, PROTOCOLS, where)
    out: dict[str, dict[str, Budget]] = {}
    for protocol, spec in d.items():
        if protocol == "fair":  # one budget for every method
            spec_map = as_mapping(spec, f"{where}.fair")
            if set(spec_map) & set(FAMILIES):
                raise ValueError(
                    f"{where}.fair is one budget for every method (the fair protocol gives "
                    "every method the same schedule, step size and epochs); write its fields "
                    "directly under budget.fair, not per family."
                )
            base = _check_budget(spec_map, f"{where}.fair", protocol="fair", family="baselines")
            cog = dataclasses.replace(base, stage2_epochs=None)
            out["fair"] = {"baselines": base, "cog": cog}
            continue
        fams = as_mapping(spec, f"{where}.{protocol}")
        check_keys(fams, FAMILIES, f"{where}.{protocol}")
        out[protocol] = {
            fam: _check_budget(
                fams[fam], f"{where}.{protocol}.{fam}", protocol=protocol, family=fam
            )
            for fam in FAMILIES
            if fam in fams
        }
    return out
