"""The default path of ``cogcal train`` and :func:`cogcal.fit` when no learning rate is
given: choose it by validation cross-entropy, as the paper does (docs/method.md §1,
"defaults").

COG methods choose λ_f and the ratio λ_c/λ_f one axis at a time on small log grids that
grow while the choice is at an edge (:func:`default_search`, a
:class:`~cogcal.train.search.Search`: the driver ``cogcal tune`` and the bench run too):

1. λ_f on :data:`COG_LRS` at the ratio :data:`BASE_RATIO`;
2. the ratio on :data:`COG_RATIOS` at the chosen λ_f (the point of step 1 is reused; never
   to 1).

Other methods choose λ on :data:`BASELINE_LRS`. Each step's grid is extended in the
direction of its edge while the choice sits there, at most :data:`MAX_EXTENSIONS` times
(the budget), so at most :data:`MAX_RUNS` points are tried (:data:`BASELINE_MAX_RUNS` for
one-rate methods), each one exactly the run ``lr=`` would train. Without a method, the
default path runs this search for COG-FC, trains cross-entropy at the rate whose COG-FC
point a temperature made best, and keeps one of the two (:mod:`cogcal.train.choice`).

How far each point is trained is ``TrainConfig.selection``:

* ``"halving"`` (the default), successive halving on the rungs :data:`HALVING_RUNGS`
  (:func:`rungs`): the search above runs on the validation NLL each point reaches after
  the first rung's epochs (a third of the budget: the first decay of the step schedule);
  then the best two points (by that NLL) continue to the second rung (half of the
  budget) and the best one of those to the end. A point continues from its own
  checkpoint (model, optimizer, schedule and loop state), exactly as if it had never
  paused; the others stay paused in their folders. About 2.2 runs of the budget instead
  of 4 or 5.
* ``"full"``: every point is trained to the end and the lowest final NLL is chosen.

The validation NLL at a rung is the one of the checkpoint the run keeps at that time (the
best validation Brier score so far, from the per-epoch log saved in the checkpoint), the
rule the final choice uses on the finished run (:data:`~cogcal.train.tuning.SELECTION_RULE`).
The chosen run *is* the result (it is not trained again). The points live in
``<out>.select/`` (a ``cogcal tune`` folder: ``tune.json``, ``tune.csv``, one run folder
per point), the chosen run is copied into ``out`` (hard links where the file system
allows) with the selection recorded under ``selection`` in its ``metrics.json``: every
point with its NLL at each rung, the rung where it was stopped, and the epochs trained in
all. Running the same command again reuses finished points and resumes unfinished or
paused ones. The test split plays no part in the choice.

With several processes (``devices`` x ``num_nodes`` > 1) the processes are launched once
and every point is a multi-process run in them: each process runs this selection, process
0 alone reads and writes the folders and tells the others what it found.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from cogcal import _io
from cogcal.cog import CalibratedModel
from cogcal.runs import RunDir, RunFolderError, RunRecord, load_checkpoint
from cogcal.runs.methods import get_method
from cogcal.train.assemble import (
    final_model,
    load_run,
    posthoc_calibrator,
    stage1_model,
)
from cogcal.train.checkup import SELECTED
from cogcal.train.config import TrainConfig
from cogcal.train.devices import launch
from cogcal.train.loop import NonFiniteLossError
from cogcal.train.robustness import DEFER_ROBUSTNESS, add_robustness
from cogcal.train.search import HALVING_RUNGS, Outcome, Search, halve, rung_nll, rungs
from cogcal.train.sources import DataSource
from cogcal.train.tuning import (
    SELECTION_RULE,
    Grid,
    check_tune_folder,
    mark_tune_folder,
    open_edges,
    point_config,
    point_label,
    point_status,
    with_data_model,
    write_tables,
)

__all__ = [
    "BASELINE_LRS",
    "BASE_RATIO",
    "COG_LRS",
    "COG_RATIOS",
    "HALVING_RUNGS",
    "MAX_EXTENSIONS",
    "MAX_RUNS",
    "BASELINE_MAX_RUNS",
    "TrainRun",
    "adopt_run",
    "default_search",
    "describe_budget",
    "load_back",
    "rung_nll",
    "rungs",
    "select_and_train",
    "selection_folder",
    "take_out",
    "train_size",
]

COG_LRS = (1e-3, 3e-3)  # λ_f, step 1 (extensions by half-decades: 3e-4, 1e-4 or 1e-2, 3e-2)
BASE_RATIO = 0.1  # λ_c/λ_f during step 1: the paper's default
COG_RATIOS = (0.1, 0.3)  # step 2 (extensions: 0.03, 0.01 or 0.9; 1 is the bound)
BASELINE_LRS = (3e-4, 1e-3)  # λ of one-rate methods (extensions: 1e-4, 3e-5 or 3e-3, 1e-2)
MAX_EXTENSIONS = 2  # each step's grid grows at most twice while its choice is at an edge
MAX_RUNS = 7  # COG: 2 + 2 (λ_f) + 1 + 2 (ratio); one-rate methods: 4
BASELINE_MAX_RUNS = 4


class TrainRun(Protocol):
    """How the selection trains one point: :func:`cogcal.train.runner.execute` (passed in
    by the runner, so that this module does not import it)."""

    def __call__(
        self,
        config: TrainConfig,
        *,
        resume: bool = ...,
        overwrite: bool = ...,
        data: DataSource | None = ...,
        model: nn.Module | None = ...,
        fabric: Any | None = ...,
        stop_at_epoch: int | None = ...,
    ) -> tuple[dict[str, Any], CalibratedModel | None]: ...


def selection_folder(out: str | Path) -> Path:
    """Where the points of a run's selection are trained: ``<out>.select``."""
    out = Path(out)
    return out.with_name(out.name + ".select")


def train_size(source: DataSource) -> int:
    """Samples in the training split of ``source``."""
    if source.dataset is not None:
        return len(source.dataset.train)
    return int(source.info["train_size"])


def describe_budget(resolved: dict[str, Any], n_train: int) -> str:
    """One line stating a run's resolved budget and learning rates (printed at its start)."""
    batch, epochs = int(resolved["batch_size"]), int(resolved["epochs"])
    per_epoch = max(1, math.ceil(n_train / batch))
    schedule = (
        f"rates /10 every {resolved['step_size']} epochs"
        if resolved["schedule"] == "step"
        else "constant rates"
    )
    rates = (
        "chosen by validation cross-entropy"
        if resolved.get("lr") is None
        else f"lr {resolved['lr']:g}"
        + (
            f", calibrator lr {resolved['calibrator_lr']:g}"
            if resolved.get("calibrator_lr")
            else ""
        )
    )
    return (
        f"{resolved['method']} on {resolved['dataset']} (preset {resolved['preset']}): "
        f"{n_train} training samples, batch {batch} ({per_epoch} steps/epoch), {epochs} "
        f"epochs = {per_epoch * epochs} optimizer steps at most, {schedule}; {rates}"
    )


def _say(config: TrainConfig, text: str) -> None:
    if config.progress:
        print(text, file=sys.stderr, flush=True)


@dataclass
class _Point:
    """What process 0 found in a point's folder (broadcast to every process)."""

    status: str  # "complete" | "diverged" | "unfinished" | "new" | "replace"
    epochs: int = 0  # epochs of stage 1 done
    history: list[dict[str, float]] = field(default_factory=list)  # val_brier, val_nll
    nll: float = math.inf  # complete: the selection NLL of the record
    val: dict[str, Any] = field(default_factory=dict)


class _Selection:
    """How the default path trains one point (on every process): the
    :data:`~cogcal.train.search.Train` of its :class:`~cogcal.train.search.Search`."""

    def __init__(
        self,
        config: TrainConfig,
        folder: Path,
        *,
        fabric: Any,
        train: TrainRun,
        source: DataSource,
        model: nn.Module | None,
        overwrite: bool,
    ) -> None:
        self.config, self.folder, self.fabric, self.train_run = config, folder, fabric, train
        self.source, self.model, self.overwrite = source, model, overwrite
        self.two_stage = get_method(config.method).stage2 is not None
        self.trained: dict[str, CalibratedModel | None] = {}  # finished in this call (rank 0)

    @property
    def zero(self) -> bool:
        return bool(self.fabric.is_global_zero)

    def on_zero(self, read: Callable[[], Any]) -> Any:
        """``read()`` on process 0, its value on every process (its error raised on 0, a
        RuntimeError on the others)."""
        value, failure = None, None
        if self.zero:
            try:
                value = read()
            except BaseException as err:  # noqa: BLE001 - re-raised below, after telling the others
                failure = err
        ok, value = self.fabric.broadcast((failure is None, value), src=0)
        if failure is not None:
            raise failure
        if not ok:
            raise RuntimeError("process 0 of the learning-rate selection failed; see its error.")
        return value

    def config_of(self, point: dict[str, float]) -> TrainConfig:
        out = self.folder / point_label(point)
        return self.config.replace(**point_config(point), out=str(out), progress=False)

    def _look(self, cfg: TrainConfig) -> _Point:
        """What the point's folder holds (read by process 0)."""

        def read() -> _Point:
            folder = RunDir(cfg.out)
            status = point_status(folder, cfg, overwrite=self.overwrite)
            found = _Point(status)
            if status == "complete":
                record = folder.read_record()
                assert record is not None
                found.nll, found.val = record.selection_nll, dict(record.val)
            if status in ("complete", "unfinished"):
                found.history = folder.read_history(two_stage=self.two_stage)
                found.epochs = len(found.history)
            return found

        return self.on_zero(read)

    def train(self, point: dict[str, float], until: int | None) -> Outcome:
        """Train ``point`` until ``until`` epochs are done (None: to the end), unless its
        folder holds that already (reused as it is), and say what the folder holds then."""
        cfg = self.config_of(point)
        with contextlib.ExitStack() as held:
            # process 0 holds the point's folder from the first read to the record

            def hold() -> None:
                held.enter_context(RunDir(cfg.out).lock())

            self.on_zero(hold)
            state = self._look(cfg)
            if state.status not in ("complete", "diverged") and (
                until is None or state.epochs < until
            ):
                net = copy.deepcopy(self.model) if self.model is not None else None
                trained = None
                with contextlib.suppress(NonFiniteLossError):  # diverged: recorded as such
                    result, trained = self.train_run(
                        cfg, resume=state.status == "unfinished",
                        overwrite=state.status == "replace", data=self.source, model=net,
                        fabric=self.fabric, stop_at_epoch=until,
                    )  # fmt: skip
                    if result.get("status") != "complete":
                        trained = None
                state = self._look(cfg)
                if trained is not None:
                    self.trained[point_label(point)] = trained
        status = state.status if state.status in ("complete", "diverged") else "stopped"
        return Outcome(status, state.nll, state.val, state.history, state.epochs)


def _point_text(point: dict[str, float]) -> str:
    return ", ".join(f"{k} {point[k]:g}" for k in ("lr", "ratio") if point.get(k) is not None)


def _fmt(nll: float) -> str:
    return f"{nll:.4f}" if math.isfinite(nll) else "diverged"


def select_and_train(
    config: TrainConfig,
    source: DataSource,
    model: nn.Module | None,
    *,
    train: TrainRun,
    resume: bool = False,
    overwrite: bool = False,
    search: Search | None = None,
    on_first_step: Callable[[Search], None] | None = None,
) -> tuple[dict[str, Any], CalibratedModel | None]:
    """Choose the learning rates of ``config`` (no ``lr``, budget resolved) by validation
    cross-entropy, and return the chosen run as :func:`cogcal.train.runner.execute` does.

    ``train`` trains one point (:class:`TrainRun`: the runner's ``execute``). ``resume``
    continues an interrupted selection (finished points are reused and unfinished ones
    resumed in any case); ``overwrite`` replaces a finished run in ``config.out`` and
    points of another configuration. ``search``: another search than
    :func:`default_search` (the default path's cross-entropy side,
    :mod:`cogcal.train.choice`), its points the most it may train. ``on_first_step``: given
    to :func:`default_search` (:class:`~cogcal.train.search.Search`).
    """
    method = get_method(config.method)
    fabric = launch(config)  # once: every point trains in these processes
    out = RunDir(config.out)
    folder = selection_folder(config.out)
    max_runs = MAX_RUNS if method.is_cog else BASELINE_MAX_RUNS
    if search is not None:
        max_runs = len(search.grid.lrs) * len(search.grid.ratios or (None,))
    plan = rungs(int(config.epochs or 1), config.selection)
    config = config.replace(extra={**config.extra, SELECTED: SELECTION_RULE})
    # the points skip the OOD and shift sets; the chosen one is evaluated on them below
    points = config.replace(extra={**config.extra, DEFER_ROBUSTNESS: True})
    points = with_data_model(points, source, model)
    sel = _Selection(
        points, folder, fabric=fabric, train=train, source=source, model=model,
        overwrite=overwrite,
    )  # fmt: skip
    if search is None:
        search = default_search(
            method.is_cog, plan, schedule=config.resolved()["schedule"],
            on_first_step=on_first_step,
        )  # fmt: skip
    with contextlib.ExitStack() as held:
        sel.on_zero(
            lambda: _begin(held, out, folder, resume=resume, overwrite=overwrite, config=config)
        )
        if sel.zero:
            _say(config, describe_budget(config.resolved(), train_size(source)))
            _say(config, _plan_text(config, search.plan, max_runs, folder, search.key))
        started = time.perf_counter()
        summary = search.run(
            sel.train,
            on_point=_point_line(search, config, max_runs) if sel.zero else None,
            on_rung=_rung_line(config) if sel.zero else None,
        )
        trained = sum(o.epochs or 0 for o in search.outcomes.values())
        epochs = int(config.epochs or 1)
        summary.update(
            mode=config.selection, max_runs=max_runs, epochs=epochs, epochs_trained=trained,
            run_equivalents=round(trained / epochs, 3), seconds=time.perf_counter() - started,
            folder=str(folder),
        )  # fmt: skip
        if sel.zero:
            write_tables(folder, summary)
        if search.best is None:
            raise NonFiniteLossError(
                f"every learning rate tried in {folder} diverged "
                f"({', '.join(search.outcomes)}); pass a smaller --lr."
            )
        if not sel.zero:
            return {"status": "worker"}, None
        return _finish(sel, point_label(search.best), summary, out, config)


def default_search(
    cog: bool, plan: list[tuple[int, int]], *, schedule: str | None = None,
    on_first_step: Callable[[Search], None] | None = None,
) -> Search:  # fmt: skip
    """The search of the default path: COG methods choose λ_f on :data:`COG_LRS` at
    :data:`BASE_RATIO`, then the ratio on :data:`COG_RATIOS` at the chosen λ_f; other
    methods λ on :data:`BASELINE_LRS`; each step extended at most :data:`MAX_EXTENSIONS`
    times, the points compared and halved on the rungs ``plan``; ``on_first_step`` told
    when the first step is over."""
    if not cog:
        return Search(
            Grid(BASELINE_LRS), max_extensions=MAX_EXTENSIONS, rungs=plan, schedule=schedule,
            on_first_step=on_first_step,
        )  # fmt: skip
    return Search(
        Grid(COG_LRS, (BASE_RATIO,), fixed=("ratio",)),
        then=lambda best: Grid((best["lr"],), COG_RATIOS, fixed=("lr",)),
        max_extensions=MAX_EXTENSIONS, rungs=plan, schedule=schedule,
        on_first_step=on_first_step,
    )  # fmt: skip


def _finish(
    sel: _Selection, chosen: str, summary: dict[str, Any], out: RunDir, config: TrainConfig
) -> tuple[dict[str, Any], CalibratedModel | None]:
    """Process 0, the choice made: say it, copy the chosen run into ``out`` with the
    selection recorded, evaluate it on the OOD and shift sets and write its record last."""
    edge = (
        f" (at the edge of the grid: {', '.join(open_edges(summary))})"
        if summary["at_edge"] and summary["max_extensions"]  # (a fixed race has no edge)
        else ""
    )
    cost = f"{summary['epochs_trained']} epochs in all = {summary['run_equivalents']:.2f} runs of the budget"
    _say(
        config,
        f"chosen: {summary['best_config']}{edge}; {summary['runs']} points, {cost}, "
        f"{summary['seconds']:.0f} s",
    )
    selection = {key: summary[key] for key in _RECORDED}
    record = adopt_run(sel.folder / chosen, out, config, selection)
    trained = sel.trained.get(chosen)
    method = get_method(config.method)
    if trained is None:  # the chosen run was finished before: load it back
        trained = load_back(sel.folder / chosen, sel.model)
    elif sel.model is not None and not method.stage2:  # the caller's model gets the weights
        sel.model.load_state_dict(trained.network.state_dict())
    # (a side of the default path leaves it to the side chosen: cogcal.train.choice)
    deferred = bool(config.extra.get(DEFER_ROBUSTNESS))
    if sel.source.dataset is not None and trained is not None and not deferred:
        add_robustness(record, out, trained, sel.source.dataset, config)
    out.write_record(record)  # metrics.json last: only now is the run complete
    return record.to_dict(), trained


def _point_line(
    search: Search, config: TrainConfig, max_runs: int
) -> Callable[[dict[str, float], float], None]:
    """The progress line of each new point."""
    at = search.search_at
    after = "" if at is None else f" after {at} of {config.epochs} epochs"

    def say(point: dict[str, float], nll: float) -> None:
        _say(
            config,
            f"  {_point_text(point)}: validation NLL {_fmt(nll)}{after} "
            f"({len(search.outcomes)} of at most {max_runs})",
        )

    return say


def _rung_line(config: TrainConfig) -> Callable[[dict[str, Any], list[str], list[str]], None]:
    """The progress line of each rung of successive halving."""

    def say(rung: dict[str, Any], ranked: list[str], kept: list[str]) -> None:
        nlls = {e["run"]: e["val_nll"] for e in rung["continued"] + rung["stopped"]}
        stopped = [label for label in ranked if label not in kept]
        epochs = rung["epoch"]
        _say(
            config,
            f"  after {epochs} epoch{'s' if epochs > 1 else ''}: "
            + ", ".join(
                f"{label} {_fmt(math.inf if nlls[label] is None else nlls[label])}"
                for label in ranked
            )
            + f"; continued: {', '.join(kept) or 'none'}"
            + (f"; stopped: {', '.join(stopped)}" if stopped else ""),
        )

    return say


#: The keys of the summary recorded under ``selection`` in the chosen run's metrics.json.
_RECORDED = (
    "selection", "compared_by", "mode", "best", "best_config", "at_edge", "edges", "grid", "runs",
    "max_runs", "rungs", "epochs", "epochs_trained", "run_equivalents", "seconds", "folder",
    "table",
)  # fmt: skip


def take_out(
    held: contextlib.ExitStack, out: RunDir, *, resume: bool, overwrite: bool, config: TrainConfig
) -> None:
    """Process 0: take the run folder ``out`` (held until ``held`` closes) and check that
    the default path may write its chosen run there."""
    held.enter_context(out.lock())  # the lock before anything in the folder is read
    if resume and out.is_marked() and not out.is_complete():
        for problem in out.damaged_checkpoints():  # named, then made again (README)
            print(
                f"cogcal: warning: {problem}; {out.path} holds a copy of the chosen run "
                "of the learning-rate selection: it is copied again",
                file=sys.stderr,
            )
        out.clear()  # a copy of the chosen run that was interrupted: copied again below
    if not (resume and not out.is_complete()):
        out.prepare(config, config.resolved(), resume=False, overwrite=overwrite)


def _begin(
    held: contextlib.ExitStack,
    out: RunDir,
    folder: Path,
    *,
    resume: bool,
    overwrite: bool,
    config: TrainConfig,
) -> None:
    """Process 0: take ``out`` and the selection folder (held until the end), check them."""
    take_out(held, out, resume=resume, overwrite=overwrite, config=config)
    held.enter_context(RunDir(folder).lock())
    check_tune_folder(folder)  # a `cogcal tune` folder: the same rule
    mark_tune_folder(folder)


def _plan_text(
    config: TrainConfig, plan: list[tuple[int, int]], max_runs: int, folder: Path,
    key: str = "val_nll",
) -> str:  # fmt: skip
    head = "choosing the learning rates by validation cross-entropy" + (
        "" if key == "val_nll" else " after the best temperature"
    )
    tail = f"in {folder} (pass --lr to train one configuration)"
    if not plan:
        return f"{head}: at most {max_runs} runs of this budget, each to the end, {tail}"
    steps = [f"at most {max_runs} points trained for {plan[0][0]} of {config.epochs} epochs"]
    for i, (_, keep) in enumerate(plan):
        until = f"to epoch {plan[i + 1][0]}" if i + 1 < len(plan) else "to the end"
        steps.append(f"the best {keep if keep > 1 else 'one'} continued {until}")
    return f"{head} by successive halving: {', '.join(steps)}, {tail}"


def _halve(
    sel: Any, plan: list[tuple[int, int]], config: TrainConfig
) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`~cogcal.train.search.halve` with the default path's progress lines (on
    process 0)."""
    return halve(sel, plan, _rung_line(config) if sel.zero else None)


def adopt_run(
    point: Path, out: RunDir, config: TrainConfig, selection: dict[str, Any]
) -> RunRecord:
    """Copy the chosen point's run into ``out``, all but its ``metrics.json``, and return
    its record, with ``out`` as its folder and the selection added, for the caller to
    write last."""
    src = RunDir(point)
    record = src.read_record()
    if record is None:
        raise RunFolderError(f"{point} holds no finished run to adopt; run the command again.")
    for path in sorted(point.rglob("*")):
        rel = path.relative_to(point)
        if path.is_file() and not path.is_symlink() and rel.name not in (
            "metrics.json", "config.json", ".cogcal.lock",
        ):  # fmt: skip
            _io.link_or_copy(path, out.path / rel)
    saved = src.read_config() or {}
    saved = {k: v for k, v in saved.items() if k not in ("cogcal_run", "cogcal_version")}
    # the chosen run as the user asked for it: its own folder, progress and extra
    own = {"out": str(out.path), "progress": config.progress, "extra": config.extra}
    out.write_config({**saved, **own})
    record.config = {**record.config, **own}
    record.selection = selection
    return record


def load_back(path: Path, model: nn.Module | None) -> CalibratedModel | None:
    """The model of a finished run folder (a reused chosen point)."""
    if model is None:
        return load_run(path).model
    saved = RunDir(path).read_config() or {}
    method = get_method(str(saved["method"]))
    task = str(saved.get("task", "multiclass"))
    if method.stage2:  # the head is rebuilt by load_run only for registry backbones
        raise RunFolderError(
            f"{path} holds a finished {method.name} run of a model given in Python; load "
            "checkpoints/best.ckpt into your model yourself, or train again with overwrite=True."
        )
    stage1 = stage1_model(method, model, task)
    stage1.load_state_dict(load_checkpoint(Path(path) / "checkpoints" / "best.ckpt")["model"])
    calibrator = None
    if method.posthoc:
        calibrator = posthoc_calibrator(method.posthoc, task)
        calibrator.load_state_dict(torch.load(Path(path) / "calibrator.pt", weights_only=True))
        calibrator.requires_grad_(False)
    return final_model(method, model, stage1, task=task, calibrator=calibrator).eval()
