"""The one learning-rate search driver: the default path of ``cogcal train``, ``cogcal
tune`` and the bench's tuning groups all run a :class:`Search` (docs/method.md §1).

A search is given

* the grid (:class:`~cogcal.train.tuning.Grid`) and, for the default path of COG methods,
  the grid of a second step built from the first step's choice (``then``: λ_f first, then
  the ratio at the chosen λ_f);
* the edge extension rule: each step is a :class:`~cogcal.train.tuning.GridSearch`,
  extended outward at most ``max_extensions`` times while its choice is at an edge;
* the selection rule: the lowest validation cross-entropy of the kept checkpoint
  (:data:`~cogcal.train.tuning.SELECTION_RULE`), every point trained to the end
  (``rungs=()``) or by successive halving (``rungs``, :func:`rungs`: the steps run on the
  NLL each point reaches after the first rung's epochs, then :func:`halve`);
* how each point is trained (or reused, or resumed): a function ``train(point, until)``
  returning an :class:`Outcome` (:meth:`Search.run`); or the caller trains the points
  itself, asynchronously, between :meth:`Search.next_points` and :meth:`Search.record`
  (the bench, on its worker pool).

It returns the summary written to ``tune.json`` (:meth:`Search.summary`), whose ``table``
is one row per point with the columns of ``tune.csv``
(:data:`~cogcal.train.tuning.TUNE_COLUMNS`). Ties between equal NLLs go to the point
visited first.

>>> from cogcal.train.tuning import Grid
>>> search = Search(Grid(lrs=(1e-3, 3e-3)), max_extensions=1)
>>> summary = search.run(lambda point, until: Outcome("complete", abs(point["lr"] - 4e-3)))
>>> [row["lr"] for row in summary["table"]], summary["best"], summary["at_edge"]
([0.001, 0.003, 0.01], {'lr': 0.003}, False)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cogcal.train.tuning import (
    SELECTION_RULE,
    TUNE_COLUMNS,
    Grid,
    GridSearch,
    grid_edges,
    point_config,
    point_label,
)

__all__ = [
    "HALVING_RUNGS",
    "Outcome",
    "Search",
    "halve",
    "rung_nll",
    "rungs",
]

#: The rungs of successive halving: (fraction of the epochs done, points continued past
#: it). The search runs at the first rung (the first decay of the automatic step
#: schedule); the points continued past the last rung are trained to the end.
HALVING_RUNGS = ((1 / 3, 2), (1 / 2, 1))


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


def rung_nll(
    history: list[dict[str, float]], epochs: int | None = None, key: str = "val_nll"
) -> float:
    """The validation NLL of the checkpoint a run keeps after ``epochs`` epochs (all of
    ``history`` when None): the first epoch with the lowest validation Brier score among
    them, as the training loop keeps it; ``inf`` when there is none. ``key``: the column
    read at that epoch (``"val_nll_ts"``: the NLL after the best temperature; ``inf`` in
    a log without it).

    >>> rows = [{"val_brier": 0.5, "val_nll": 0.9}, {"val_brier": 0.3, "val_nll": 0.7},
    ...         {"val_brier": 0.3, "val_nll": 0.6}, {"val_brier": 0.2, "val_nll": 0.8}]
    >>> rung_nll(rows, 3), rung_nll(rows)
    (0.7, 0.8)
    """
    best, nll = math.inf, math.inf
    for row in history[:epochs]:
        if row["val_brier"] < best:
            best, nll = row["val_brier"], row.get(key, math.inf)
    return float(nll) if math.isfinite(nll) else math.inf


@dataclass
class Outcome:
    """What training (or reusing) one point gave.

    Attributes
    ----------
    status : str
        ``"complete"``, ``"diverged"``, ``"stopped"`` (paused at a rung: unfinished and
        resumable), or the bench's ``"failed"`` / ``"interrupted"``.
    nll : float
        The selection NLL of the finished run (``inf`` when there is none).
    val : dict
        The validation metrics of the finished run (``brier``, ``acc``, ...).
    history : list of dict, optional
        ``val_brier`` and ``val_nll`` per epoch of stage 1 (the NLL at a rung is read
        from it, :func:`rung_nll`).
    epochs : int, optional
        Epochs of stage 1 trained (None: not counted).
    """

    status: str
    nll: float = math.inf
    val: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] | None = None
    epochs: int | None = None


#: How a point is trained: ``train(point, until)`` trains ``point`` until ``until``
#: epochs are done (None: to the end), resuming or reusing its folder, and says what it
#: holds then.
Train = Callable[[dict[str, float], int | None], Outcome]


class Points(Protocol):
    """What :func:`halve` reads and drives: the points (label -> point, in visiting
    order), each one's NLL after some epochs, and a way to train one further."""

    points: dict[str, dict[str, float]]

    def nll(self, label: str, epochs: int | None) -> float: ...

    def advance(self, point: dict[str, float], until: int | None) -> None: ...


def _finite(x: float) -> bool:
    return math.isfinite(x)


def halve(
    sel: Points,
    plan: Sequence[tuple[int, int]],
    on_rung: Callable[[dict[str, Any], list[str], list[str]], None] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rungs after the search: at each, the points are ranked by their validation NLL
    so far (ties: the one visited first) and the best ``keep`` continue (a point that
    diverges on the way gives its place to the next one); returns each rung's record and
    the points trained to the end. ``on_rung(record, ranked, kept)`` after each rung."""
    order = {label: i for i, label in enumerate(sel.points)}
    alive = list(sel.points)
    record = []
    for i, (epochs, keep) in enumerate(plan):
        ranked = sorted(alive, key=lambda label: (sel.nll(label, epochs), order[label]))
        after = plan[i + 1][0] if i + 1 < len(plan) else None
        kept: list[str] = []
        for label in ranked:
            if not _finite(sel.nll(label, epochs)):
                break
            if sum(_finite(sel.nll(k, after)) for k in kept) >= keep:
                break
            sel.advance(sel.points[label], after)
            kept.append(label)

        def entry(label: str, epochs: int = epochs) -> dict[str, Any]:
            nll = sel.nll(label, epochs)
            return {"run": label, "val_nll": nll if _finite(nll) else None}

        rung = {
            "rung": i + 1,
            "epoch": epochs,
            "keep": keep,
            "continued": [entry(label) for label in kept],
            "stopped": [entry(label) for label in ranked if label not in kept],
        }
        record.append(rung)
        if on_rung is not None:
            on_rung(rung, ranked, kept)
        alive = kept
    return record, alive


class Search:
    """One learning-rate search (see the module docstring).

    Parameters
    ----------
    grid : Grid or GridSearch
        The grid of the first step (or its search, whose ``max_extensions`` then holds).
    then : callable, optional
        ``then(best)``: the grid of a second step, from the first step's choice (not run
        when every point of the first step diverged).
    max_extensions : int
        Extensions of each step's grid at most.
    rungs : sequence of (int, int)
        Successive halving (:func:`rungs`); empty: every point trained to the end.
    schedule : str, optional
        The learning-rate schedule of the points (the ``schedule`` column).
    key : str
        The column of the training log the points are compared by (:func:`rung_nll`):
        ``"val_nll"`` (validation cross-entropy, the default path's rule) or
        ``"val_nll_ts"`` (after the best temperature: the cross-entropy side of the default
        path, :mod:`cogcal.train.choice`); also at the end of the runs.
    on_first_step : callable, optional
        ``on_first_step(search)``, once, when the first step is over (every point of it
        recorded, before the second step's grid is built): the default path starts its
        cross-entropy side from it (:mod:`cogcal.train.choice`).

    Attributes
    ----------
    searches : list of GridSearch
        The steps run so far.
    points : dict
        Every point issued, by label, in visiting order.
    outcomes : dict
        What each point trained so far holds, by label.
    halving : list of dict
        Each rung's record (after :meth:`run` with rungs).
    """

    def __init__(
        self,
        grid: Grid | GridSearch,
        *,
        then: Callable[[dict[str, float]], Grid] | None = None,
        max_extensions: int = 2,
        rungs: Sequence[tuple[int, int]] = (),
        schedule: str | None = None,
        key: str = "val_nll",
        on_first_step: Callable[[Search], None] | None = None,
    ) -> None:
        if not isinstance(grid, GridSearch):
            grid = GridSearch(grid, max_extensions=max_extensions)
        self.searches = [grid]
        self.then, self.max_extensions = then, grid.max_extensions
        self.plan, self.schedule, self.key = list(rungs), schedule, key
        self.points: dict[str, dict[str, float]] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.pending: set[str] = set()
        self.halving: list[dict[str, Any]] = []
        self._alive: list[str] | None = None
        self._train: Train | None = None
        self.on_first_step = on_first_step

    @property
    def grid(self) -> Grid:
        """The grid of the current step."""
        return self.searches[-1].grid

    @property
    def search_at(self) -> int | None:
        """The epochs at which the steps compare the points (None: the finished runs)."""
        return self.plan[0][0] if self.plan else None

    # -- the steps -------------------------------------------------------------------------
    def next_points(self) -> list[dict[str, float]]:
        """The points to train next, each issued once; ``[]`` while issued points are not
        recorded yet, and when the search is over. A point trained in the first step is
        not issued again by the second: its result is reused."""
        if self.pending:
            return []
        while True:
            batch = self.searches[-1].next_points()
            fresh = [p for p in batch if point_label(p) not in self.outcomes]
            for point in batch:
                if point_label(point) in self.outcomes:
                    self._to_search(point)
            if fresh:
                for point in fresh:
                    self.points.setdefault(point_label(point), point)
                    self.pending.add(point_label(point))
                return fresh
            if not batch and not self._next_step():
                return []

    def _next_step(self) -> bool:
        first = self.searches[0]
        if len(self.searches) == 1 and self.on_first_step is not None:
            told, self.on_first_step = self.on_first_step, None  # once
            told(self)
        if self.then is None or len(self.searches) > 1 or first.best is None:
            return False
        grid = self.then(first.best)
        self.searches.append(GridSearch(grid, max_extensions=self.max_extensions))
        return True

    def record(self, point: dict[str, float], outcome: Outcome) -> None:
        """What training ``point`` gave (it counts in the current step)."""
        label = point_label(point)
        self.points.setdefault(label, point)
        self.pending.discard(label)
        self.outcomes[label] = outcome
        self._to_search(point)

    def _to_search(self, point: dict[str, float]) -> None:
        status = self.outcomes[point_label(point)].status
        nll = self.nll(point_label(point), self.search_at)
        if status in ("complete", "stopped"):
            status = "complete" if _finite(nll) else "diverged"
        self.searches[-1].record(point, nll, status)

    def nll(self, label: str, epochs: int | None) -> float:
        """The point's validation NLL (its ``key`` column) after ``epochs`` epochs (None:
        of the finished run); ``inf`` for a point diverged, failed or not finished."""
        outcome = self.outcomes[label]
        if outcome.status == "diverged":
            return math.inf
        if epochs is None:
            if outcome.status != "complete":
                return math.inf
            if self.key == "val_nll":
                return outcome.nll
        return rung_nll(outcome.history or [], epochs, key=self.key)

    # -- running ---------------------------------------------------------------------------
    def advance(self, point: dict[str, float], until: int | None) -> None:
        """Train ``point`` until ``until`` epochs are done (None: to the end) with the
        function given to :meth:`run`, unless it is there already, finished or diverged."""
        held = self.outcomes.get(point_label(point))
        if held is not None and (
            held.status in ("complete", "diverged")
            or (until is not None and (held.epochs or 0) >= until)
        ):
            return
        assert self._train is not None, "advance() trains with the function given to run()"
        self.record(point, self._train(point, until))

    def run(
        self,
        train: Train,
        *,
        on_point: Callable[[dict[str, float], float], None] | None = None,
        on_rung: Callable[[dict[str, Any], list[str], list[str]], None] | None = None,
    ) -> dict[str, Any]:
        """Train every point with ``train`` until the search is over (the steps, then the
        rungs); returns :meth:`summary`. ``on_point(point, nll)`` after each new point,
        ``on_rung`` after each rung (:func:`halve`)."""
        self._train = train
        while batch := self.next_points():
            for point in batch:
                self.advance(point, self.search_at)
                if on_point is not None:
                    on_point(point, self.nll(point_label(point), self.search_at))
        if self.plan:
            self.halving, self._alive = halve(self, self.plan, on_rung)
        return self.summary()

    # -- the result ------------------------------------------------------------------------
    @property
    def best(self) -> dict[str, float] | None:
        """The chosen point: the lowest final NLL among the points trained to the end
        (ties: the one visited first); None when none is finite."""
        order = {label: i for i, label in enumerate(self.points)}
        alive = self._alive if self._alive is not None else list(self.outcomes)
        finite = [(self.nll(lb, None), order[lb], lb) for lb in alive]
        finite = [t for t in finite if _finite(t[0])]
        return self.points[min(finite)[2]] if finite else None

    def _edges(self, best: dict[str, float] | None) -> tuple[list[str], list[str]]:
        """The edges of the grids tried that the choice lies on: ``(open, bounds)``. In
        two steps: λ_f along the values tried at the first step's ratio, the ratio along
        the values tried at the choice's λ_f (only that ratio when the choice is a point of
        the first step at another λ_f)."""
        if best is None:
            return [], []
        grids = [self.searches[0].grid]
        if self.then is not None and "ratio" in best:
            second = self.searches[1].grid if len(self.searches) > 1 else None
            if second is not None and math.isclose(best["lr"], second.lrs[0]):
                grids.append(second)
            else:
                grids.append(Grid((best["lr"],), (best["ratio"],), fixed=("lr",)))
        return grid_edges(grids, best)

    def table(self) -> list[dict[str, Any]]:
        """One row per point trained, in visiting order, with the columns of ``tune.csv``
        (:data:`~cogcal.train.tuning.TUNE_COLUMNS`; None where a column does not apply)."""
        stopped_at = {s["run"]: r["epoch"] for r in self.halving for s in r["stopped"]}
        rows = []
        for label, outcome in self.outcomes.items():
            point, final = self.points[label], self.nll(label, None)
            status = outcome.status
            if status == "complete" and not _finite(final):
                status = "diverged"
            row: dict[str, Any] = dict.fromkeys(TUNE_COLUMNS)
            row.update(
                lr=point["lr"], ratio=point.get("ratio"), schedule=self.schedule,
                calibrator_lr=point_config(point).get("calibrator_lr"),
                val_nll=final if _finite(final) else None, val_brier=outcome.val.get("brier"),
                val_acc=outcome.val.get("acc"), status=status, run=label, epochs=outcome.epochs,
                stopped_at_epoch=stopped_at.get(label) if status != "diverged" else None,
            )  # fmt: skip
            for rung in self.halving:
                if any(e["run"] == label for e in rung["continued"] + rung["stopped"]):
                    nll = self.nll(label, rung["epoch"])
                    row[f"rung{rung['rung']}_val_nll"] = nll if _finite(nll) else None
            rows.append(row)
        return rows

    def summary(self) -> dict[str, Any]:
        """``tune.json``: the selection rule, the grid tried, the choice, whether it is at
        an edge, the rungs and the table. ``edges`` names every edge of the choice, a bound
        by its name (``"ratio < 1 bound"``); ``at_edge`` is true only for an edge the
        search could have moved past (``cap_reached``: the extension cap stopped it);
        ``compared_by``: the log column the points were compared by (the table's NLL
        columns hold it)."""
        best = self.best
        opened, bounds = self._edges(best)
        axes = [a for a in ("lr", "ratio") if any(a in s.grid.axes for s in self.searches)]
        values = {a: {v for s in self.searches for v in s.grid.values(a)} for a in axes}
        capped = any(s.extensions >= s.max_extensions for s in self.searches)
        return {
            "selection": SELECTION_RULE,
            "compared_by": self.key,
            "axes": axes,
            "grid": {axis: sorted(values[axis]) for axis in axes},
            "best": best,
            "best_config": None if best is None else point_config(best),
            "at_edge": bool(opened),
            "edges": opened + bounds,
            "bounds": bounds,
            "extensions": sum(s.extensions for s in self.searches),
            "max_extensions": self.max_extensions,
            "cap_reached": bool(opened) and capped,
            "runs": len(self.outcomes),
            "rungs": self.halving,
            "table": self.table(),
        }
