"""The default path's choice between COG and cross-entropy + post-hoc calibration
(docs/method.md §1, "defaults").

Without a method (``cogcal train`` without ``--method``, :func:`cogcal.fit` without
``method=``) and without ``lr``, the default path trains two sides:

* COG-FC (``cog-fc``), its learning rates chosen by the default search
  (:mod:`cogcal.train.select`);
* cross-entropy (``ce``), then calibrated post hoc on the validation split: the post-hoc
  calibrator is chosen among those of :func:`cogcal.calibrators.auto_candidates` by
  cross-validated NLL on the validation logits (:func:`cogcal.posthoc.calibrate` with
  ``method="auto"``). Its rate (:func:`posthoc_rates`, :data:`RATE_RULE`): COG-FC's λ_f
  after its first step (:func:`first_step_lr`) and the λ_f of that step with the lowest
  validation NLL *after the best temperature* at the first rung (``val_nll_ts`` of the
  training log, :func:`cogcal.metrics.temperature_scaled_nll`), or the runner-up when
  that is COG-FC's own and the runner-up is a lower rate: both to the first rung, and the
  better one after a temperature to the end (a third of a run more than one run); a
  higher runner-up is not tried (cross-entropy, which over-fits at high rates, is not
  expected to gain there), and cross-entropy is trained once, at COG-FC's λ_f. COG-FC's
  λ_f is chosen by its *uncalibrated* NLL, which is right for COG-FC (it must calibrate
  itself) but can favour a cautious rate whose only merit is an over-confidence the
  post-hoc calibrator removes anyway; COG-FC's points nominate the rate at no cost, and
  the cross-entropy network confirms it, since at high rates it over-fits where COG-FC,
  whose final layer learns ten times slower, does not (on mnist1d on an AMD EPYC,
  COG-FC's λ_f 3e-2 nominated itself, and cross-entropy there alone ended at test NLL
  0.705 with SMS; against the runner-up, 1e-2 was kept: 0.605 with MS; docs/defaults.md).

The cross-entropy side is planned as soon as COG-FC's first step is over, and where a
second process is allowed (:func:`cogcal.train.background.second_process_allowed`: Linux,
the CPU, two threads or more) it is trained in one while this process goes on with
COG-FC's search (:class:`_EarlySide`); it is then reused as a finished side. The same
configuration is trained either way.

COG-FC, the default, is replaced by cross-entropy + post hoc only when the latter's
validation NLL is clearly lower (:data:`CHOICE_RULE`). A post-hoc calibrator fitted on the
validation split and judged by its NLL on the same split is judged optimistically, so the
cross-entropy side is judged by the **cross-validated** NLL of the chosen calibrator (each
sample scored by the calibrator fitted on the other folds); COG-FC by its validation NLL
(no parameter of it is fitted on validation). "Clearly": the mean per-sample difference
exceeds :data:`Z_SWITCH` standard errors (:func:`paired_gain`), so that a few hundred
nearly perfectly classified validation samples do not swap the model on noise. When the
cross-entropy network classifies every validation sample correctly, COG-FC is kept without
calibrating: a calibrator fitted there only sharpens, and nothing on the split can say by
how much is too much. The test split plays no part.

The sides live in ``<out>.sides/``: ``cog-fc/`` (a finished run, its points in
``cog-fc.select/``), ``ce/`` (its two rates, when it tried two, in ``ce.select/``) and,
when cross-entropy + post-hoc is
chosen, ``<kind>/``: a run of the post-hoc method ``kind`` (``ts``, ``dirichlet``, ...)
whose network is the ``ce`` run's (its stage-1 checkpoints copied, the calibrator fitted by
the runner on resuming it). The chosen run is copied into ``out``, a valid run of its
method (``load_run``, ``export``, ONNX and ``cogcal predict`` apply its calibrator), with
the choice recorded under ``selection["choice"]`` in ``metrics.json``. Running the same
call again (``resume`` or not) reuses every finished side, so an interrupted default path
continues the same choice.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cogcal import _io
from cogcal.calibrators import auto_candidates
from cogcal.cog import CalibratedModel
from cogcal.metrics import evaluate
from cogcal.posthoc import AUTO, Calibration, calibrate
from cogcal.runs import RunDir, RunFolderError, config_digest, load_checkpoint
from cogcal.train.background import Background, second_process_allowed
from cogcal.train.config import LOG_NLL_TS, METHOD_GIVEN, TrainConfig
from cogcal.train.robustness import DEFER_ROBUSTNESS, add_robustness
from cogcal.train.search import Search, rung_nll
from cogcal.train.select import (
    BASE_RATIO,
    TrainRun,
    adopt_run,
    load_back,
    select_and_train,
    selection_folder,
    take_out,
)
from cogcal.train.sources import DataSource
from cogcal.train.tuning import Grid

__all__ = [
    "CHOICE_RULE",
    "COG_SIDE",
    "METHOD_GIVEN",
    "POSTHOC_SIDE",
    "RATE_RULE",
    "choose",
    "first_step_lr",
    "paired_gain",
    "posthoc_rates",
    "sides_folder",
    "weigh_and_train",
    "weighs",
]

COG_SIDE = "cog-fc"  # the default method
POSTHOC_SIDE = "ce"  # the network of the other side, calibrated post hoc
CV_FOLDS = 5  # at most; fewer when the validation split holds under 10 samples a fold
MIN_PER_FOLD = 10  # as cogcal.posthoc.calibrate requires
NONPARAMETRIC = ("isotonic", "histogram", "bbq")  # need more samples a fold than the others
Z_SWITCH = 2.0  # standard errors of the paired NLL difference needed to leave COG-FC
CHOICE_RULE = (
    "cross-entropy + post-hoc calibration replaces COG-FC when its validation NLL, "
    "cross-validated on the validation split (the calibrator chosen among the post-hoc "
    f"methods by that NLL; {CV_FOLDS} folds, fewer below {CV_FOLDS * MIN_PER_FOLD} samples, "
    f"none below {2 * MIN_PER_FOLD}: COG-FC kept), is lower than COG-FC's by more than "
    f"{Z_SWITCH:g} standard errors of the paired per-sample difference; else COG-FC is kept, "
    "as it is when the cross-entropy network makes no error on the validation split (no NLL "
    "there can price the confidence a calibrator adds); the test split is not used"
)
#: why COG-FC is kept when the cross-entropy network classifies the validation split without
#: an error: each calibrator fitted there only sharpens, and its cross-validated NLL falls
#: toward 0 with the confidence it adds, which no validation sample can contradict (digits
#: on an AMD EPYC: every candidate scored 0.0007, and cross-entropy + VS, chosen, had test
#: NLL 0.049 against COG-FC's 0.028; docs/defaults.md)
_NO_ERROR = (
    "the cross-entropy network classifies all {n} validation samples correctly, so no "
    "validation NLL can price the confidence a post-hoc calibrator adds"
)


RATE_RULE = (
    "cross-entropy is trained at COG-FC's λ_f after its first step and at one more λ_f of "
    "that step "
    f"(λ_c/λ_f = {BASE_RATIO:g}): the one whose point had the lowest validation NLL after the "
    "best temperature at the first rung, or the second lowest when that is COG-FC's own "
    "and the second lowest is a lower rate (a higher one is not tried: COG-FC's λ_f alone); "
    "both to the first rung, and the one with the lower validation NLL after the best "
    "temperature (the checkpoint kept then) to the end"
)
TS_KEY = "val_nll_ts"  # the training log's NLL after the best temperature


def weighs(config: TrainConfig, task: str) -> bool:
    """Whether the default path of ``config`` weighs COG-FC against cross-entropy +
    post-hoc calibration: the default method with no ``lr``, single-label data, one
    process."""
    return (
        config.method == COG_SIDE
        and config.selects_learning_rates
        and not config.extra.get(METHOD_GIVEN)
        and task == "multiclass"
        and config.devices * config.num_nodes == 1
    )


def sides_folder(out: str | Path) -> Path:
    """Where the two sides of the default path are trained: ``<out>.sides``."""
    out = Path(out)
    return out.with_name(out.name + ".sides")


def _say(config: TrainConfig, text: str) -> None:
    if config.progress:
        print(text, file=sys.stderr, flush=True)


def _side_config(config: TrainConfig, method: str, folder: Path) -> TrainConfig:
    extra = {**config.extra, METHOD_GIVEN: True, DEFER_ROBUSTNESS: True, LOG_NLL_TS: True}
    return config.replace(method=method, out=str(folder / method), extra=extra)


_SAME = ("dataset", "seed", "preset", "epochs", "batch_size", "selection", "target", "lr")


def _side(
    cfg: TrainConfig, source: DataSource, model: nn.Module | None, *, train: TrainRun,
    overwrite: bool, search: Search | None = None,
    on_first_step: Callable[[Search], None] | None = None,
) -> tuple[dict[str, Any], CalibratedModel | None]:  # fmt: skip
    """One side: reused when its folder holds the finished run of the same budget; else
    chosen and trained by ``search`` (COG-FC: the default search; its finished points
    reused, unfinished ones resumed), or trained, or resumed, as one run (``lr`` given)."""
    folder = RunDir(cfg.out)
    record = folder.read_record()
    if record is not None and not overwrite:
        saved = folder.read_config() or {}
        given = {k: getattr(cfg, k) for k in _SAME if getattr(cfg, k) is not None}
        if any(saved.get(k) != v for k, v in given.items()):
            raise RunFolderError(
                f"{folder.path} holds a side of another configuration; pass overwrite "
                "(--overwrite) to train it again."
            )
        return record.to_dict(), load_back(folder.path, model)
    if not cfg.selects_learning_rates:  # the cross-entropy side at one rate
        resume = folder.has_state() and not overwrite  # an interrupted side continues
        return train(cfg, resume=resume, overwrite=overwrite, data=source, model=model)
    return select_and_train(
        cfg, source, model, train=train, resume=not overwrite, overwrite=overwrite,
        search=search, on_first_step=on_first_step,
    )  # fmt: skip


def first_step_lr(cog: dict[str, Any]) -> float:
    """COG-FC's λ_f after the first step of its search, from its record ``cog``: the point
    at λ_c/λ_f = :data:`BASE_RATIO` with the lowest validation NLL where the step compared
    the points (at the first rung; at the end without halving), the first visited on a
    tie; COG-FC's λ_f where the record holds no such figure. It is COG-FC's final λ_f except
    where a later rung of the halving kept another point, and it is known as soon as the
    first step is over, so the cross-entropy side can start then (:func:`weigh_and_train`)."""
    selection = cog.get("selection") or {}
    column = "rung1_val_nll" if selection.get("rungs") else "val_nll"
    best: tuple[float, float] | None = None
    for row in selection.get("table") or []:
        nll, ratio = row.get(column), row.get("ratio")
        if ratio is None or not math.isclose(float(ratio), BASE_RATIO) or nll is None:
            continue
        if math.isfinite(float(nll)) and (best is None or float(nll) < best[0]):
            best = (float(nll), float(row["lr"]))
    return best[1] if best is not None else float(cog["config"]["lr"])


def _first_step_record(search: Search, folder: Path) -> dict[str, Any]:
    """What :func:`posthoc_rates` reads of COG-FC's record, taken from its ``search`` (its
    points in ``folder``) once the first step is over; ``config.lr`` None."""
    at = search.search_at
    column = "rung1_val_nll" if at is not None else "val_nll"
    table = []
    for label in search.outcomes:
        point, nll = search.points[label], search.nll(label, at)
        table.append({"lr": point["lr"], "ratio": point.get("ratio"), "run": label,
                      column: nll if math.isfinite(nll) else None})  # fmt: skip
    rungs = [{"rung": 1, "epoch": at}] if at is not None else []
    return {"config": {"lr": None}, "selection": {"folder": str(folder), "rungs": rungs,
                                                  "table": table}}  # fmt: skip


def posthoc_rates(cog: dict[str, Any]) -> tuple[tuple[float, ...], dict[str, Any]]:
    """The learning rates the cross-entropy side tries (:data:`RATE_RULE`), from the COG-FC
    side's record ``cog`` (its ``selection``: the points, their folders and rungs): COG-FC's
    λ_f, then the one nominated when it differs, else the runner-up when it is lower
    (COG-FC's alone when it tried one λ_f or the runner-up is higher); and the record of the
    nomination: the rule,
    the epoch compared (None: the whole runs, without halving), the nominated λ_f and each
    first-step λ_f with its validation NLL after the best temperature (None where its log
    has none, e.g. written before it was logged). COG-FC's λ_f is the one of its first step
    (:func:`first_step_lr`, recorded as ``first_step_lr``)."""
    own = first_step_lr(cog)
    selection = cog.get("selection") or {}
    rungs = selection.get("rungs") or []
    at = int(rungs[0]["epoch"]) if rungs else None
    figures: dict[str, float | None] = {}
    ranked: list[tuple[float, float]] = []  # (validation NLL after a temperature, λ_f)
    for row in selection.get("table") or []:
        if row.get("ratio") is None or not math.isclose(float(row["ratio"]), BASE_RATIO):
            continue
        history = RunDir(Path(selection["folder"]) / row["run"]).read_history()
        nll = rung_nll(history, at, key=TS_KEY)
        figures[f"{float(row['lr']):g}"] = nll if math.isfinite(nll) else None
        if math.isfinite(nll):
            ranked.append((nll, float(row["lr"])))
    ranked.sort()
    nominated = ranked[0][1] if ranked else own
    if not math.isclose(nominated, own):
        rates: tuple[float, ...] = (own, nominated)
    elif len(ranked) > 1 and ranked[1][1] < own:  # own nominated: a lower runner-up
        rates = (own, ranked[1][1])  # confirms it or not (cross-entropy over-fits higher)
    else:
        rates = (own,)
    record = {
        "rule": RATE_RULE, "epoch": at, "first_step_lr": own, "nominated": nominated,
        TS_KEY: figures,
    }  # fmt: skip
    return rates, record


def paired_gain(
    cog_logits: torch.Tensor, held_out_nll: torch.Tensor, labels: torch.Tensor
) -> tuple[float, float]:
    """How much lower the post-hoc side's held-out NLL is than COG-FC's, sample by sample
    on the validation split: the mean and the standard error of ``nll_cog - nll_cv``, where
    ``held_out_nll`` holds each sample's ``nll_cv``, its NLL under the chosen calibrator
    fitted on the other folds (:attr:`cogcal.posthoc.Calibration.held_out_nll`, the terms
    of its ``cv_nll``: the mean of the difference is exactly the difference of the two
    validation NLLs the choice reports)."""
    cog = F.cross_entropy(cog_logits.double(), labels, reduction="none")
    diff = cog - held_out_nll.to(cog.dtype)
    se = float(diff.std()) / math.sqrt(len(diff)) if len(diff) > 1 else math.inf
    return float(diff.mean()), se


def choose(
    cog: dict[str, Any], ce: dict[str, Any], cal: Calibration, calibrated: dict[str, float],
    gain: tuple[float, float],
) -> dict[str, Any]:  # fmt: skip
    """The choice between the COG side's record ``cog`` and the cross-entropy side's
    record ``ce`` calibrated by ``cal`` (:data:`CHOICE_RULE`); ``gain``: the mean and
    standard error of the paired validation NLL difference (:func:`paired_gain`);
    ``calibrated``: the validation metrics after the calibrator (in-sample, shown, not
    compared)."""
    cog_nll = float(cog["val"]["nll"])
    cv_nll = float(cal.cv_nll.get(cal.method, math.inf))
    mean, se = gain
    clear = math.isfinite(cv_nll) and mean > 0 and mean > Z_SWITCH * se
    chosen = cal.method if clear else COG_SIDE
    verdict = "more" if clear else "not more"
    ccfg, ecfg = cog["config"], ce["config"]
    return {
        "rule": CHOICE_RULE,
        "chosen": chosen,
        "side": "posthoc" if chosen != COG_SIDE else "cog",
        "reason": (
            f"validation NLL {cog_nll:.4f} (COG-FC) vs {cv_nll:.4f} (cross-entropy + "
            f"{cal.method}, cross-validated): lower by {mean:.4f}, {verdict} than "
            f"{Z_SWITCH:g} standard errors ({se:.4f})"
        ),
        "gain": mean,
        "gain_se": se,
        "cog": {
            "method": COG_SIDE, "lr": ccfg.get("lr"), "calibrator_lr": ccfg.get("calibrator_lr"),
            "val_nll": cog_nll, "val_ece_15": cog["val"].get("ece_15"),
            "val_acc": cog["val"].get("acc"),
        },
        "posthoc": {
            "method": cal.method, "lr": ecfg.get("lr"), "val_nll_cv": cv_nll,
            "cv_nll": dict(cal.cv_nll), "folds": cal.folds,
            "val_nll_uncalibrated": float(ce["val"]["nll"]),
            "val_nll_in_sample": calibrated.get("nll"),
            "val_ece_15_in_sample": calibrated.get("ece_15"), "val_acc": calibrated.get("acc"),
        },
    }  # fmt: skip


def _posthoc_run(
    ce_path: Path, kind: str, cfg: TrainConfig, source: DataSource, model: nn.Module | None,
    *, train: TrainRun, overwrite: bool,
) -> tuple[dict[str, Any], CalibratedModel | None]:  # fmt: skip
    """The run of post-hoc method ``kind`` on the network of the ``ce`` run in ``ce_path``:
    its stage-1 checkpoints copied (bound to the new configuration) and the run resumed,
    so the runner fits the calibrator on validation and evaluates, as for any ``kind``
    run."""
    folder = RunDir(Path(cfg.out).parent / kind)
    saved = RunDir(ce_path).read_config() or {}
    kcfg = TrainConfig.from_record(saved).replace(
        method=kind, out=str(folder.path), progress=False, extra=cfg.extra
    )
    record = folder.read_record()
    if record is not None and not overwrite:
        return record.to_dict(), load_back(folder.path, model)
    resolved = {k: v for k, v in saved.items() if k not in ("cogcal_run", "cogcal_version")}
    resolved.update(method=kind, out=str(folder.path), extra=cfg.extra)
    digest = config_digest(resolved)
    with folder.lock():
        if folder.is_marked():
            folder.clear()
        for path in sorted(Path(ce_path).rglob("*")):
            rel = path.relative_to(ce_path)
            if not path.is_file() or rel.parts[0] not in ("checkpoints", "logs"):
                continue
            if path.suffix == ".ckpt":  # the same weights, bound to this configuration
                _io.save_torch(
                    folder.path / rel, {**load_checkpoint(path), "config_sha256": digest}
                )
            else:
                _io.link_or_copy(path, folder.path / rel)
        folder.write_config(resolved)
    net = copy.deepcopy(model) if model is not None else None
    return train(kcfg, resume=True, data=source, model=net)


def _kept(cog: dict[str, Any], why: str) -> dict[str, Any]:
    """The choice of COG-FC without weighing (``why``: the reason)."""
    return {
        "rule": CHOICE_RULE, "chosen": COG_SIDE, "side": "cog", "reason": f"{why}; COG-FC kept",
        "cog": {"method": COG_SIDE, "lr": cog["config"].get("lr"),
                "calibrator_lr": cog["config"].get("calibrator_lr"),
                "val_nll": float(cog["val"]["nll"]), "val_ece_15": cog["val"].get("ece_15"),
                "val_acc": cog["val"].get("acc")},
        "posthoc": None,
    }  # fmt: skip


def _folds(n: int) -> int:
    """The folds of the post-hoc side's cross-validation on ``n`` validation samples
    (under 2: too few to weigh it)."""
    return min(CV_FOLDS, n // MIN_PER_FOLD)


def _calibrate(z: torch.Tensor, y: torch.Tensor, folds: int) -> Calibration:
    """``calibrate(method="auto")`` with ``folds`` folds; when a candidate cannot be fitted
    on folds this small (the non-parametric ones need more samples), among the parametric
    ones only."""
    try:
        return calibrate(z, y, AUTO, cv=folds)
    except ValueError:
        parametric = tuple(c for c in auto_candidates(z.shape[1]) if c not in NONPARAMETRIC)
        return calibrate(z, y, AUTO, cv=folds, candidates=parametric)


def _rate_text(rates: tuple[float, ...], rate: dict[str, Any], final: float | None = None) -> str:
    """The rates the cross-entropy side tries, and why, in one line; ``final``: COG-FC's
    final λ_f, once its search is over (named where it is not its first step's)."""
    own = "COG-FC's λ_f"
    if final is not None and not math.isclose(final, rate["first_step_lr"]):
        own = f"COG-FC's λ_f after its first step; its final λ_f is {final:g}"
    where = f"after {rate['epoch']} epochs" if rate["epoch"] is not None else "at the end"
    shown = ", ".join(
        f"{lr} {'n/a' if nll is None else f'{nll:.4f}'}" for lr, nll in rate[TS_KEY].items()
    )
    why = f"(COG-FC's points, validation NLL after the best temperature {where}: {shown})"
    if len(rates) == 1:
        return f"lr {rates[0]:g}, {own} {why if shown else ''}".rstrip()
    return f"lr {rates[0]:g} ({own}) and {rates[1]:g} {why}, the better one kept"


def _tried(selection: dict[str, Any] | None) -> dict[str, float | None]:
    """The cross-entropy side's rates with the figure they were compared by (at the first
    rung, or at the end without halving)."""
    rows = (selection or {}).get("table") or []
    column = "rung1_val_nll" if (selection or {}).get("rungs") else "val_nll"
    return {f"{float(r['lr']):g}": r.get(column) for r in rows}


def _cross_entropy_plan(
    config: TrainConfig, sides: Path, cog: dict[str, Any]
) -> tuple[tuple[float, ...], dict[str, Any], TrainConfig, Search | None]:
    """The cross-entropy side as :data:`RATE_RULE` plans it from COG-FC's record ``cog``:
    the rates, the record of their nomination, the side's configuration and, for two
    rates, its race (both to the first rung, the better one after a temperature to the
    end)."""
    rates, rate = posthoc_rates(cog)
    ce_cfg, search = _side_config(config, POSTHOC_SIDE, sides), None
    if len(rates) == 1:
        ce_cfg = ce_cfg.replace(lr=rates[0])
    else:
        plan = [(rate["epoch"], 1)] if rate["epoch"] is not None else []
        search = Search(
            Grid(tuple(sorted(rates))), max_extensions=0, rungs=plan, key=TS_KEY,
            schedule=ce_cfg.resolved()["schedule"],
        )  # fmt: skip
    return rates, rate, ce_cfg, search


class _EarlySide:
    """The cross-entropy side started in a second process as soon as COG-FC's first step is
    over (:mod:`cogcal.train.background`), while this process goes on with COG-FC's
    search; :meth:`start` is the search's ``on_first_step``."""

    def __init__(
        self, config: TrainConfig, sides: Path, source: DataSource, model: nn.Module | None,
        *, train: TrainRun, overwrite: bool,
    ) -> None:  # fmt: skip
        self.config, self.sides, self.source, self.model = config, sides, source, model
        self.train, self.overwrite = train, overwrite
        self.job = Background()
        self.rates: tuple[float, ...] | None = None

    def start(self, search: Search) -> None:
        config = self.config
        if not (second_process_allowed(config.accelerator) and self.source.in_memory):
            return
        if search.searches[0].best is None:  # every first-step point diverged
            return
        folder = selection_folder(_side_config(config, COG_SIDE, self.sides).out)
        rates, rate, ce_cfg, ce_search = _cross_entropy_plan(
            config, self.sides, _first_step_record(search, folder)
        )
        if RunDir(ce_cfg.out).read_record() is not None and not self.overwrite:
            return  # finished before: reused
        val = self.source.split("val")
        if val is None or _folds(sum(len(y) for _, y in val)) < 2:  # no side to train
            return
        _say(config, f"cross-entropy side: {_rate_text(rates, rate)}; trained in a second "
                     "process beside COG-FC's search")  # fmt: skip
        quiet, net = ce_cfg.replace(progress=False), copy.deepcopy(self.model)
        self.job.start(
            lambda: _side(quiet, self.source, net, train=self.train, overwrite=self.overwrite,
                          search=ce_search),
            name="cogcal-cross-entropy-side",
        )  # fmt: skip
        self.rates = rates

    def polled(self, train: TrainRun) -> TrainRun:
        """``train`` that first takes back the thread the second process had, once it has
        ended (COG-FC's points go on with all the threads)."""

        def polled(*args: Any, **kwargs: Any) -> tuple[dict[str, Any], CalibratedModel | None]:
            self.job.poll()
            return train(*args, **kwargs)

        return polled

    def wait(self, rates: tuple[float, ...]) -> bool:
        """Wait for the second process; whether it trained the side (else, or when none was
        started, this process trains it, resuming what it left)."""
        if not self.job.running:
            return False
        code = self.job.wait()
        if rates != self.rates:  # the same rule on the same figures: never
            raise RuntimeError(
                f"the cross-entropy side was started at {self.rates} and is now planned at "
                f"{rates}; please report this."
            )
        if code != 0:
            _say(self.config, f"the cross-entropy side's second process stopped (exit code "
                              f"{code}); training it here")  # fmt: skip
        return code == 0


def _weigh(
    config: TrainConfig, sides: Path, cog: dict[str, Any], source: DataSource,
    model: nn.Module | None, *, train: TrainRun, folds: int, overwrite: bool, early: _EarlySide,
) -> tuple[dict[str, Any], tuple[Path, CalibratedModel | None, Any] | None]:  # fmt: skip
    """Train the cross-entropy side (or take it from ``early``), calibrate its validation
    logits post hoc and choose; returns the choice and, when cross-entropy + post hoc
    wins, its run folder, model and selection record."""
    rates, rate, ce_cfg, search = _cross_entropy_plan(config, sides, cog)
    if early.wait(rates):
        overwrite_ce = False  # trained by the second process just now: reused as it is
    else:
        overwrite_ce = overwrite
        _say(config, f"cross-entropy side: {_rate_text(rates, rate, cog['config']['lr'])}")
    ce, _ = _side(ce_cfg, source, copy.deepcopy(model), train=train, overwrite=overwrite_ce,
                  search=search)  # fmt: skip
    ce_cfg = ce_cfg.replace(lr=ce["config"]["lr"], out=ce["config"]["out"])
    rate["lr"] = ce["config"]["lr"]
    rate["tried"] = _tried(ce.get("selection")) if search is not None else None
    z, y = (torch.from_numpy(a) for a in RunDir(ce_cfg.out).read_logits("val"))
    if not bool((z.argmax(1) != y).any()):
        return _kept(cog, _NO_ERROR.format(n=len(y))), None
    try:
        cal = _calibrate(z, y, folds)
    except ValueError as err:  # e.g. one class only in the validation split
        return _kept(cog, f"no post-hoc calibrator could be cross-validated ({err})"), None
    with torch.no_grad():
        calibrated = evaluate(cal.calibrator(z.double()).float(), y)
    cog_z, cog_y = RunDir(cog["config"]["out"]).read_logits("val")
    if not np.array_equal(cog_y, y.numpy()):
        raise RunFolderError(f"{sides}: the two sides were validated on different samples.")
    assert cal.held_out_nll is not None  # (method="auto")
    gain = paired_gain(torch.from_numpy(cog_z), cal.held_out_nll, y)
    choice = choose(cog, ce, cal, calibrated, gain)
    choice["posthoc"]["rate"] = rate
    if choice["side"] == "cog":
        return choice, None
    _, trained = _posthoc_run(
        Path(ce_cfg.out), cal.method, ce_cfg, source, model, train=train, overwrite=overwrite
    )
    return choice, (sides / cal.method, trained, cog["selection"])


def weigh_and_train(
    config: TrainConfig,
    source: DataSource,
    model: nn.Module | None,
    *,
    train: TrainRun,
    resume: bool = False,
    overwrite: bool = False,
) -> tuple[dict[str, Any], CalibratedModel | None]:
    """The default path that weighs COG-FC against cross-entropy + post-hoc calibration
    (module docstring); returns the chosen run as :func:`cogcal.train.runner.execute`
    does."""
    out = RunDir(config.out)
    sides = sides_folder(config.out)
    with contextlib.ExitStack() as held:
        take_out(held, out, resume=resume, overwrite=overwrite, config=config)
        _say(config, f"weighing COG-FC against cross-entropy + post-hoc calibration in {sides}")
        # each side trains (or loads back) copies: the caller's model gets the winner's weights
        early = _EarlySide(config, sides, source, model, train=train, overwrite=overwrite)
        held.callback(early.job.stop)  # on any way out: the second process ends with this one
        cog, cog_model = _side(
            _side_config(config, COG_SIDE, sides), source, copy.deepcopy(model),
            train=early.polled(train), overwrite=overwrite, on_first_step=early.start,
        )  # fmt: skip
        assert cog_model is not None
        path, trained, selection = Path(cog["config"]["out"]), cog_model, cog["selection"]
        n = len(RunDir(path).read_logits("val")[1])
        folds = _folds(n)
        if folds < 2:  # too few validation samples to judge a post-hoc calibrator honestly
            choice = _kept(
                cog, f"{n} validation samples: too few to cross-validate a post-hoc calibrator"
            )
        else:
            choice, found = _weigh(config, sides, cog, source, model, train=train, folds=folds,
                                   overwrite=overwrite, early=early)  # fmt: skip
            if found is not None:
                path, trained, selection = found
        choice["folder"] = str(sides)
        won = "COG-FC" if choice["side"] == "cog" else f"cross-entropy + {choice['chosen']}"
        _say(config, f"default path: chose {won}: {choice['reason']}")
        record = adopt_run(path, out, config, {**(selection or {}), "choice": choice})
        if model is not None and trained is not None:
            model.load_state_dict(trained.network.state_dict())
        if source.dataset is not None and trained is not None:
            add_robustness(record, out, trained, source.dataset, config)
        out.write_record(record)
        return record.to_dict(), trained
