"""The default path of ``cogcal train`` and :func:`cogcal.fit` when no learning rate is
given: choose it by validation cross-entropy, as the paper does (docs/method.md §1,
"defaults").

COG methods choose λ_f and the ratio λ_c/λ_f one axis at a time on small log grids that
grow while the choice is at an edge (:class:`~cogcal.train.tuning.GridSearch`):

1. λ_f on :data:`COG_LRS` at the ratio :data:`BASE_RATIO` (one extension at most);
2. the ratio on :data:`COG_RATIOS` at the chosen λ_f (the point of step 1 is reused; one
   extension at most, never to 1).

Other methods choose λ on :data:`BASELINE_LRS` (one extension at most). So at most
:data:`MAX_RUNS` points are tried (3 for one-rate methods), each one exactly the run
``lr=`` would train.

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
from cogcal.train.assemble import (
    final_model,
    load_run,
    posthoc_calibrator,
    stage1_model,
)
from cogcal.train.checkpoints import load_checkpoint
from cogcal.train.checkup import SELECTED
from cogcal.train.config import TrainConfig
from cogcal.train.devices import launch
from cogcal.train.loop import NonFiniteLossError
from cogcal.train.methods import get_method
from cogcal.train.robustness import DEFER_ROBUSTNESS, add_robustness
from cogcal.train.rundir import RunDir, RunFolderError, RunRecord
from cogcal.train.sources import DataSource
from cogcal.train.tuning import (
    SELECTION_RULE,
    Grid,
    GridSearch,
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
    "MAX_RUNS",
    "TrainRun",
    "describe_budget",
    "rung_nll",
    "rungs",
    "select_and_train",
    "selection_folder",
    "train_size",
]

COG_LRS = (1e-3, 3e-3)  # λ_f, step 1 (one extension, half-decade: 3e-4 or 1e-2)
BASE_RATIO = 0.1  # λ_c/λ_f during step 1: the paper's default
COG_RATIOS = (0.1, 0.3)  # step 2 (one extension: 0.03; 1 is the bound)
BASELINE_LRS = (3e-4, 1e-3)  # λ of one-rate methods (one extension: 1e-4 or 3e-3)
MAX_EXTENSIONS = 1
MAX_RUNS = 5  # COG: 2 + 1 (λ_f) + 1 + 1 (ratio); one-rate methods: 3
#: The rungs of successive halving: (fraction of the epochs done, points continued past
#: it). The search runs at the first rung (the first decay of the automatic step
#: schedule); the points continued past the last rung are trained to the end.
HALVING_RUNGS = ((1 / 3, 2), (1 / 2, 1))


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


def rungs(epochs: int, selection: str = "halving") -> list[tuple[int, int]]:
    """The rungs of a selection among runs of ``epochs`` epochs: ``(epochs done, points
    continued past it)`` for each rung of :data:`HALVING_RUNGS` that falls strictly
    between the previous one and the end (none for ``selection="full"``, nor when the runs
    are too short to pause).

    >>> rungs(42), rungs(188), rungs(3), rungs(1), rungs(42, "full")
    ([(14, 2), (21, 1)], [(63, 2), (94, 1)], [(1, 2), (2, 1)], [], [])
    """
    if selection == "full":
        return []
    out: list[tuple[int, int]] = []
    last = 0
    for fraction, keep in HALVING_RUNGS:
        epoch = math.ceil(fraction * epochs - 1e-9)
        if last < epoch < epochs:
            out.append((epoch, keep))
            last = epoch
    return out


def rung_nll(history: list[dict[str, float]], epochs: int | None = None) -> float:
    """The validation NLL of the checkpoint a run keeps after ``epochs`` epochs (all of
    ``history`` when None): the first epoch with the lowest validation Brier score among
    them, as the training loop keeps it; ``inf`` when there is none.

    >>> rows = [{"val_brier": 0.5, "val_nll": 0.9}, {"val_brier": 0.3, "val_nll": 0.7},
    ...         {"val_brier": 0.3, "val_nll": 0.6}, {"val_brier": 0.2, "val_nll": 0.8}]
    >>> rung_nll(rows, 3), rung_nll(rows)
    (0.7, 0.8)
    """
    best, nll = math.inf, math.inf
    for row in history[:epochs]:
        if row["val_brier"] < best:
            best, nll = row["val_brier"], row["val_nll"]
    return float(nll) if math.isfinite(nll) else math.inf


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
    """The points of one selection: trains each one as far as asked (on every process)."""

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
        self.config, self.folder, self.fabric, self.train = config, folder, fabric, train
        self.source, self.model, self.overwrite = source, model, overwrite
        self.two_stage = get_method(config.method).stage2 is not None
        self.points: dict[str, dict[str, float]] = {}  # label -> point, in visiting order
        self.state: dict[str, _Point] = {}
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

    def config_of(self, label: str) -> TrainConfig:
        point = self.points[label]
        out = self.folder / label
        return self.config.replace(**point_config(point), out=str(out), progress=False)

    def _look(self, label: str) -> _Point:
        """What the point's folder holds (read by process 0)."""
        cfg = self.config_of(label)

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

    def advance(self, point: dict[str, float], until: int | None) -> None:
        """Train ``point`` until ``until`` epochs are done (None: to the end), unless it is
        there already, finished or diverged; a point trained before is reused as it is."""
        label = point_label(point)
        self.points.setdefault(label, point)
        state = self.state.get(label)
        if state is not None and (
            state.status in ("complete", "diverged")
            or (until is not None and state.epochs >= until)
        ):
            return
        cfg = self.config_of(label)
        with contextlib.ExitStack() as held:
            # process 0 holds the point's folder from the first read to the record

            def hold() -> None:
                held.enter_context(RunDir(cfg.out).lock())

            self.on_zero(hold)
            state = self._look(label)
            busy = state.status not in ("complete", "diverged") and (
                until is None or state.epochs < until
            )
            if busy:
                net = copy.deepcopy(self.model) if self.model is not None else None
                trained = None
                with contextlib.suppress(NonFiniteLossError):  # diverged: recorded as such
                    result, trained = self.train(
                        cfg, resume=state.status == "unfinished",
                        overwrite=state.status == "replace", data=self.source, model=net,
                        fabric=self.fabric, stop_at_epoch=until,
                    )  # fmt: skip
                    if result.get("status") != "complete":
                        trained = None
                state = self._look(label)
                if trained is not None:
                    self.trained[label] = trained
        self.state[label] = state

    def nll(self, label: str, epochs: int | None) -> float:
        """The point's validation NLL after ``epochs`` epochs (None: of the finished run);
        ``inf`` for a diverged point."""
        state = self.state[label]
        if state.status == "diverged":
            return math.inf
        if epochs is None:
            return state.nll if state.status == "complete" else math.inf
        return rung_nll(state.history, epochs)

    def epochs_trained(self) -> int:
        return sum(s.epochs for s in self.state.values())


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
) -> tuple[dict[str, Any], CalibratedModel | None]:
    """Choose the learning rates of ``config`` (no ``lr``, budget resolved) by validation
    cross-entropy, and return the chosen run as :func:`cogcal.train.runner.execute` does.

    ``train`` trains one point (:class:`TrainRun`: the runner's ``execute``). ``resume``
    continues an interrupted selection (finished points are reused and unfinished ones
    resumed in any case); ``overwrite`` replaces a finished run in ``config.out`` and
    points of another configuration.
    """
    method = get_method(config.method)
    fabric = launch(config)  # once: every point trains in these processes
    out = RunDir(config.out)
    folder = selection_folder(config.out)
    max_runs = MAX_RUNS if method.is_cog else 3
    plan = rungs(int(config.epochs or 1), config.selection)
    config = config.replace(extra={**config.extra, SELECTED: SELECTION_RULE})
    # the points skip the OOD and shift sets; the chosen one is evaluated on them below
    points = config.replace(extra={**config.extra, DEFER_ROBUSTNESS: True})
    points = with_data_model(points, source, model)
    sel = _Selection(
        points, folder, fabric=fabric, train=train, source=source, model=model,
        overwrite=overwrite,
    )  # fmt: skip
    with contextlib.ExitStack() as held:
        sel.on_zero(
            lambda: _begin(held, out, folder, resume=resume, overwrite=overwrite, config=config)
        )
        if sel.zero:
            _say(config, describe_budget(config.resolved(), train_size(source)))
            _say(config, _plan_text(config, plan, max_runs, folder))
        started = time.perf_counter()
        search_at = plan[0][0] if plan else None

        def evaluate(search: GridSearch) -> None:
            while batch := search.next_points():
                for point in batch:
                    known = point_label(point) in sel.points  # step 1's point, in step 2
                    sel.advance(point, search_at)
                    nll = sel.nll(point_label(point), search_at)
                    search.record(point, nll, "complete" if nll < math.inf else "diverged")
                    if sel.zero and not known:
                        after = (
                            ""
                            if search_at is None
                            else f" after {search_at} of {config.epochs} epochs"
                        )
                        _say(
                            config,
                            f"  {_point_text(point)}: validation NLL {_fmt(nll)}{after} "
                            f"({len(sel.points)} of at most {max_runs})",
                        )

        if method.is_cog:
            first = GridSearch(
                Grid(COG_LRS, (BASE_RATIO,), fixed=("ratio",)), max_extensions=MAX_EXTENSIONS
            )
            evaluate(first)
            searches = [first]
            if first.best is not None:
                second = GridSearch(
                    Grid((first.best["lr"],), COG_RATIOS, fixed=("lr",)),
                    max_extensions=MAX_EXTENSIONS,
                )
                evaluate(second)
                searches.append(second)
        else:
            only = GridSearch(Grid(BASELINE_LRS), max_extensions=MAX_EXTENSIONS)
            evaluate(only)
            searches = [only]

        halving, alive = _halve(sel, plan, config) if plan else ([], list(sel.points))
        order = {label: i for i, label in enumerate(sel.points)}
        finite = [
            (sel.nll(lb, None), order[lb], lb) for lb in alive if sel.nll(lb, None) < math.inf
        ]
        chosen = min(finite)[2] if finite else None
        summary = _summary(sel, searches, chosen, halving, plan, max_runs, config)
        summary["seconds"] = time.perf_counter() - started
        summary["folder"] = str(folder)
        if sel.zero:
            write_tables(folder, summary)
        if chosen is None:
            raise NonFiniteLossError(
                f"every learning rate tried in {folder} diverged "
                f"({', '.join(sel.points)}); pass a smaller --lr."
            )
        if not sel.zero:
            return {"status": "worker"}, None
        edge = (
            f" (at the edge of the grid: {', '.join(open_edges(summary))})"
            if summary["at_edge"]
            else ""
        )
        cost = f"{summary['epochs_trained']} epochs in all = {summary['run_equivalents']:.2f} runs of the budget"
        _say(
            config,
            f"chosen: {summary['best_config']}{edge}; {len(sel.points)} points, {cost}, "
            f"{summary['seconds']:.0f} s",
        )
        selection = {key: summary[key] for key in _RECORDED}
        record = _adopt(folder / chosen, out, config, selection)
        trained = sel.trained.get(chosen)
        if trained is None:  # the chosen run was finished before: load it back
            trained = _load_back(folder / chosen, model)
        elif model is not None and not method.stage2:  # the caller's model gets the weights
            model.load_state_dict(trained.network.state_dict())
        if source.dataset is not None and trained is not None:
            add_robustness(record, out, trained, source.dataset, config)
        out.write_record(record)  # metrics.json last: only now is the run complete
    return record.to_dict(), trained


#: The keys of the summary recorded under ``selection`` in the chosen run's metrics.json.
_RECORDED = (
    "selection", "mode", "best", "best_config", "at_edge", "edges", "grid", "runs",
    "max_runs", "rungs", "epochs", "epochs_trained", "run_equivalents", "seconds", "folder",
    "table",
)  # fmt: skip


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
    held.enter_context(out.lock())  # the lock before anything in the folder is read
    if resume and out.is_marked() and not out.is_complete():
        for problem in out.damaged_checkpoints():  # named, then made again (README)
            print(
                f"cogcal: warning: {problem}; {out.path} holds a copy of the chosen run "
                f"of the learning-rate selection in {folder}: it is copied again",
                file=sys.stderr,
            )
        out.clear()  # a copy of the chosen run that was interrupted: copied again below
    if not (resume and not out.is_complete()):
        out.prepare(config, config.resolved(), resume=False, overwrite=overwrite)
    held.enter_context(RunDir(folder).lock())
    check_tune_folder(folder)  # a `cogcal tune` folder: the same rule
    mark_tune_folder(folder)


def _plan_text(
    config: TrainConfig, plan: list[tuple[int, int]], max_runs: int, folder: Path
) -> str:
    head = "choosing the learning rates by validation cross-entropy"
    tail = f"in {folder} (pass --lr to train one configuration)"
    if not plan:
        return f"{head}: at most {max_runs} runs of this budget, each to the end, {tail}"
    steps = [f"at most {max_runs} points trained for {plan[0][0]} of {config.epochs} epochs"]
    for i, (_, keep) in enumerate(plan):
        until = f"to epoch {plan[i + 1][0]}" if i + 1 < len(plan) else "to the end"
        steps.append(f"the best {keep if keep > 1 else 'one'} continued {until}")
    return f"{head} by successive halving: {', '.join(steps)}, {tail}"


def _halve(
    sel: _Selection, plan: list[tuple[int, int]], config: TrainConfig
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rungs after the search: at each, the points are ranked by their validation NLL
    so far and the best ``keep`` continue (a point that diverges on the way gives its
    place to the next one); returns each rung's record and the points trained to the end."""
    order = {label: i for i, label in enumerate(sel.points)}
    alive = list(sel.points)
    record = []
    for i, (epochs, keep) in enumerate(plan):
        ranked = sorted(alive, key=lambda label: (sel.nll(label, epochs), order[label]))
        after = plan[i + 1][0] if i + 1 < len(plan) else None
        kept: list[str] = []
        for label in ranked:
            if not math.isfinite(sel.nll(label, epochs)):
                break
            if sum(math.isfinite(sel.nll(k, after)) for k in kept) >= keep:
                break
            sel.advance(sel.points[label], after)
            kept.append(label)

        def entry(label: str, epochs: int = epochs) -> dict[str, Any]:
            nll = sel.nll(label, epochs)
            return {"run": label, "val_nll": nll if math.isfinite(nll) else None}

        record.append(
            {
                "rung": i + 1,
                "epoch": epochs,
                "keep": keep,
                "continued": [entry(label) for label in kept],
                "stopped": [entry(label) for label in ranked if label not in kept],
            }
        )
        if sel.zero:
            stopped = [label for label in ranked if label not in kept]
            _say(
                config,
                f"  after {epochs} epoch{'s' if epochs > 1 else ''}: "
                + ", ".join(f"{label} {_fmt(sel.nll(label, epochs))}" for label in ranked)
                + f"; continued: {', '.join(kept) or 'none'}"
                + (f"; stopped: {', '.join(stopped)}" if stopped else ""),
            )
        alive = kept
    return record, alive


def _edges(
    sel: _Selection, searches: list[GridSearch], best: dict[str, float] | None
) -> tuple[list[str], list[str]]:
    """The edges of the grid tried that the choice lies on: ``(open, bounds)``; λ_f along
    the values tried at the base ratio, the ratio along the values tried at the choice's
    λ_f (only the base ratio when the choice is a point of step 1 at another λ_f)."""
    if best is None:
        return [], []
    grids = [searches[0].grid]
    if "ratio" in best:
        if len(searches) > 1 and math.isclose(best["lr"], searches[1].grid.lrs[0]):
            grids.append(searches[1].grid)
        else:
            grids.append(Grid((best["lr"],), (best["ratio"],), fixed=("lr",)))
    opened, bounds = [], []
    for grid in grids:
        for edge in grid.edges(best):
            bound = grid.bound(edge)
            (opened if bound is None else bounds).append(edge if bound is None else bound)
    return opened, bounds


def _summary(
    sel: _Selection,
    searches: list[GridSearch],
    chosen: str | None,
    halving: list[dict[str, Any]],
    plan: list[tuple[int, int]],
    max_runs: int,
    config: TrainConfig,
) -> dict[str, Any]:
    """``tune.json`` of the selection (and, in part, ``selection`` in metrics.json)."""
    stopped_at = {s["run"]: r["epoch"] for r in halving for s in r["stopped"]}
    rows = []
    for label, point in sel.points.items():
        state = sel.state[label]
        final = sel.nll(label, None)
        status = state.status if state.status in ("complete", "diverged") else "stopped"
        row: dict[str, Any] = {
            **point,
            **point_config(point),
            "val_nll": final if math.isfinite(final) else None,
            "val_brier": state.val.get("brier"),
            "val_acc": state.val.get("acc"),
            "status": status,
            "run": label,
            "epochs": state.epochs,
        }
        for rung in halving:
            if any(e["run"] == label for e in rung["continued"] + rung["stopped"]):
                nll = sel.nll(label, rung["epoch"])
                row[f"rung{rung['rung']}_val_nll"] = nll if math.isfinite(nll) else None
        row["stopped_at_epoch"] = stopped_at.get(label) if status != "diverged" else None
        rows.append(row)
    best = sel.points[chosen] if chosen is not None else None
    opened, bounds = _edges(sel, searches, best)
    axes = ["lr", "ratio"] if any("ratio" in p for p in sel.points.values()) else ["lr"]
    epochs = int(config.epochs or 1)
    trained = sel.epochs_trained()
    return {
        "selection": SELECTION_RULE,
        "mode": config.selection,
        "axes": axes,
        "grid": {axis: sorted({p[axis] for p in sel.points.values()}) for axis in axes},
        "best": best,
        "best_config": None if best is None else point_config(best),
        # an edge the run cap kept the search from moving past; a bound alone (the
        # ratio's 1) is not one (as in `cogcal tune`)
        "at_edge": bool(opened),
        "edges": opened + bounds,
        "bounds": bounds,
        "extensions": sum(s.extensions for s in searches),
        "max_extensions": MAX_EXTENSIONS,
        "runs": len(sel.points),
        "max_runs": max_runs,
        "rungs": halving,
        "epochs": epochs,
        "epochs_trained": trained,
        "run_equivalents": round(trained / epochs, 3),
        "table": rows,
    }


def _adopt(point: Path, out: RunDir, config: TrainConfig, selection: dict[str, Any]) -> RunRecord:
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


def _load_back(path: Path, model: nn.Module | None) -> CalibratedModel | None:
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
