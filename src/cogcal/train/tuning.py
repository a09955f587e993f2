"""Learning-rate search that cannot stop at an edge (docs/method.md §1, "protocols").

A :class:`Grid` is log-spaced on each tuned axis: the network learning rate λ_f and, for
COG methods, the ratio λ_c/λ_f. An axis is either consecutive steps of the half-decade
ladder (``..., 1e-3, 3e-3, 1e-2, ...``; ratios ``..., 0.03, 0.1, 0.3``), the default, or
values with a constant factor between neighbours (``1e-4, 1e-3``; ``2e-3, 4e-3``). Points
are chosen by the validation cross-entropy of the checkpoint each run keeps (for post-hoc
methods: of the network *before* its calibrator is fitted,
:attr:`cogcal.runs.RunRecord.selection_nll`); the test split plays no part. When
the chosen point lies on the edge of the grid on an axis, that axis is extended by one
step outward (the next half-decade value, or the axis's own factor) and the new points
are trained, until the choice is interior or ``max_extensions`` is reached; a choice
still at an edge is reported as such (``at_edge``), never as a verdict. Two edges are
bounds, not grid problems: the ratio stays below 1 (COG's calibrator is the slower one;
an extension that would reach 1 stops and is recorded as :data:`RATIO_BOUND`) and λ_f
stays at or above the 1e-8 floor where training stops (:data:`LR_FLOOR_BOUND`). A
diverged point counts as evaluated and worse than every finite one.

:class:`GridSearch` holds that logic once; :class:`cogcal.train.search.Search` drives it
for the default path of ``cogcal train``, for ``cogcal tune`` (:func:`cogcal.train.tune`) and
for ``cogcal bench`` (which trains the points on its worker pool), and every one of them
writes the same ``tune.csv`` (:data:`TUNE_COLUMNS`).

>>> search = GridSearch(Grid(lrs=(1e-3, 3e-3)), max_extensions=2)
>>> search.next_points()
[{'lr': 0.001}, {'lr': 0.003}]
>>> search.record({'lr': 0.001}, 0.50); search.record({'lr': 0.003}, 0.30)
>>> search.next_points()  # 3e-3 is the upper edge: the next half-decade step
[{'lr': 0.01}]
>>> search.record({'lr': 0.01}, 0.40)
>>> search.next_points(), search.best, search.at_edge
([], {'lr': 0.003}, [])
>>> search = GridSearch(Grid(lrs=(1e-4, 1e-3, 1e-2), ratios=(0.1, 0.3)))
>>> for p in search.next_points(): search.record(p, abs(math.log10(p["lr"]) + 3) - p["ratio"])
>>> search.next_points(), search.best, search.at_edge, search.bounds  # 0.3 -> 1: stop
([], {'lr': 0.001, 'ratio': 0.3}, [], ['ratio < 1 bound'])
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cogcal import _io
from cogcal._constraints import LR_GRID, NON_NEGATIVE, NamedError, check
from cogcal._errors import ArgumentError
from cogcal.runs import RunDir, RunFolderError, config_diff
from cogcal.train.config import LR_FLOOR, TrainConfig

__all__ = [
    "Grid",
    "GridSearch",
    "HALF_DECADE",
    "LR_FLOOR_BOUND",
    "RATIO_BOUND",
    "SELECTION_RULE",
    "TUNE_COLUMNS",
    "TUNE_MARK",
    "check_tune_folder",
    "edge_warning",
    "grid_edges",
    "mark_tune_folder",
    "open_edges",
    "point_config",
    "point_label",
    "point_status",
    "read_table",
    "with_data_model",
    "write_tables",
]

SELECTION_RULE = (
    "lowest validation NLL (cross-entropy) of the kept checkpoint; post-hoc methods: of the "
    "network before calibration; diverged points count as +inf"
)
HALF_DECADE = math.sqrt(10.0)  # the default log step: the half-decade ladder 1, 3, 10, 30, ...
_LADDER = (1.0, 3.0)  # mantissas of the half-decade ladder
#: What stops an edge choice from moving outward although the search could extend it.
RATIO_BOUND = "ratio < 1 bound"
LR_FLOOR_BOUND = "lr >= 1e-8 floor"
#: The key of ``tune.json`` that marks a folder as written by ``cogcal tune`` (its value:
#: the format); written before the first point trains, kept by :func:`write_tables`.
TUNE_MARK = "cogcal_tune"
TUNE_FORMAT = 1
_TUNE_FILES = ("tune.json", "tune.csv", ".cogcal.lock")
#: The columns of ``tune.csv`` (and of the rows of ``table`` in ``tune.json``), one per
#: trained point, whoever ran the search: the point (``ratio`` and ``calibrator_lr`` empty
#: for one-rate methods), its schedule, the validation metrics of the finished run
#: (``val_nll`` empty for a point stopped at a rung or diverged), and for a selection by
#: successive halving the epochs trained, the NLL at each rung and where it was stopped.
#: Files written before (fewer columns, in another order) are read by their header.
TUNE_COLUMNS = (
    "lr", "ratio", "calibrator_lr", "schedule", "val_nll", "val_brier", "val_acc", "status",
    "run", "epochs", "rung1_val_nll", "rung2_val_nll", "stopped_at_epoch",
)  # fmt: skip
_POINT_NAME = re.compile(r"^lr[0-9.e+-]+(_ratio[0-9.e+-]+)?$")


def _ladder_index(value: float) -> int | None:
    """The position of ``value`` on the half-decade ladder ``..., 0.1, 0.3, 1, 3, 10, ...``
    (``1e-3`` -> -6, ``3e-3`` -> -5), or None when it is not on it."""
    exponent = math.floor(math.log10(value) + 1e-9)
    for i, mantissa in enumerate(_LADDER):
        if math.isclose(value, mantissa * 10.0**exponent, rel_tol=1e-6):
            return 2 * exponent + i
    return None


def _ladder_value(index: int) -> float:
    exponent, i = divmod(index, 2)
    return _round(_LADDER[i] * 10.0**exponent)


def _on_ladder(values: tuple[float, ...]) -> bool:
    """Whether sorted ``values`` are consecutive steps of the half-decade ladder."""
    idx = [_ladder_index(v) for v in values]
    return None not in idx and all(b - a == 1 for a, b in zip(idx, idx[1:], strict=False))  # type: ignore[operator]


#: The flag of ``cogcal tune`` that gives each axis (its errors name the flag).
_FLAGS = {"lrs": "--lrs", "ratios": "--calibrator-ratios"}


def _check_axis(name: str, values: Sequence[float]) -> tuple[float, ...]:
    flag = _FLAGS.get(name, name)

    def error(problem: str) -> NamedError:
        return NamedError(lambda n: f"{n(name)} {problem}", {name: flag}.get)

    out = list(check(values, LR_GRID, name, flag=flag))  # sorted
    if name == "lrs" and out[0] < LR_FLOOR:
        raise error(
            f"value {out[0]:g} is below {LR_FLOOR:g}, where training stops at once (no update "
            "that small changes the result); use larger learning rates."
        )
    if len(out) > 2 and not _on_ladder(tuple(out)):
        steps = [math.log(b / a) for a, b in zip(out, out[1:], strict=False)]
        if max(steps) - min(steps) > 1e-2 * max(steps):  # values rounded to 3 digits pass
            raise error(
                "must be log-spaced (a constant factor between neighbours, or consecutive "
                "half-decade steps such as 0.03, 0.1, 0.3), got "
                f"{', '.join(f'{v:g}' for v in out)}."
            )
    return tuple(out)


def _factor(values: tuple[float, ...]) -> float:
    """The log step of an axis: half-decade for a single value or consecutive half-decade
    values, else the constant factor between neighbours."""
    if len(values) == 1 or _on_ladder(values):
        return HALF_DECADE
    return values[1] / values[0]


def _outward(values: tuple[float, ...], factor: float, side: str) -> float:
    """The next grid value beyond the ``side`` end: the next half-decade step when the
    axis is on that ladder, else the next value of the geometric sequence through the
    grid's values (computed from the sequence, so rounding never accumulates)."""
    if math.isclose(factor, HALF_DECADE) and _on_ladder(values):
        end = _ladder_index(values[-1] if side == "high" else values[0])
        return _ladder_value(end + 1 if side == "high" else end - 1)  # type: ignore[operator]
    anchor = values[0]
    k = round(math.log(values[-1] / anchor) / math.log(factor)) + 1 if side == "high" else -1
    return _round(anchor * factor**k)


def _round(x: float) -> float:
    """Grid values with a short decimal form (3 significant digits), so folder names and
    repeated extensions stay stable."""
    return float(f"{x:.3g}")


@dataclass(frozen=True)
class Grid:
    """A log-spaced grid of learning rates (and COG ratios λ_c/λ_f).

    Parameters
    ----------
    lrs : sequence of float
        Network learning rates λ_f.
    ratios : sequence of float, optional
        λ_c/λ_f values of COG methods (each < 1 unless ``allow_fast_calibrator``); None
        for one-rate methods.
    allow_fast_calibrator : bool
        Allow ratios >= 1 (extension never crosses 1 otherwise).
    fixed : tuple of str
        Axes (``"lr"``, ``"ratio"``) held fixed: never an edge, never extended (a search
        along one axis at a time, as the default path of ``cogcal train`` does).
    """

    lrs: tuple[float, ...]
    ratios: tuple[float, ...] | None = None
    allow_fast_calibrator: bool = False
    factors: tuple[float, float] | None = None  # (λ_f step, ratio step); from the values
    fixed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "lrs", _check_axis("lrs", self.lrs))
        ratios = _check_axis("ratios", self.ratios) if self.ratios is not None else None
        if self.factors is None:
            ratio_step = _factor(ratios) if ratios else HALF_DECADE
            object.__setattr__(self, "factors", (_factor(self.lrs), ratio_step))
        if ratios is not None:
            if not self.allow_fast_calibrator and max(ratios) >= 1:
                raise ArgumentError(
                    f"ratio {max(ratios):g} gives a calibrator learning rate >= the network's, "
                    "which breaks COG's hierarchy; use ratios < 1 (or allow_fast_calibrator).",
                    cli_message=f"--calibrator-ratios {max(ratios):g} gives a calibrator learning "
                    "rate >= the network's; use ratios < 1 or pass --allow-fast-calibrator.",
                )
            object.__setattr__(self, "ratios", ratios)

    @property
    def axes(self) -> tuple[str, ...]:
        return ("lr",) if self.ratios is None else ("lr", "ratio")

    def points(self) -> list[dict[str, float]]:
        """Every point: ``{"lr": ...}`` or ``{"lr": ..., "ratio": ...}``."""
        if self.ratios is None:
            return [{"lr": lr} for lr in self.lrs]
        return [{"lr": lr, "ratio": r} for lr in self.lrs for r in self.ratios]

    def values(self, axis: str) -> tuple[float, ...]:
        return self.lrs if axis == "lr" else (self.ratios or ())

    def edges(self, point: dict[str, float]) -> list[str]:
        """The edges ``point`` lies on: ``"lr low"``, ``"lr high"``, ``"ratio low"``, ..."""
        out = []
        for axis in self.axes:
            if axis in self.fixed:
                continue
            values = self.values(axis)
            if math.isclose(point[axis], values[0], rel_tol=1e-9):
                out.append(f"{axis} low")
            if math.isclose(point[axis], values[-1], rel_tol=1e-9):
                out.append(f"{axis} high")
        return out

    def _next(self, edge: str) -> float:
        axis, side = edge.split()
        factor = self.factors[0] if axis == "lr" else self.factors[1]
        return _outward(self.values(axis), factor, side)

    def bound(self, edge: str) -> str | None:
        """What keeps ``edge`` from moving outward, or None when it can: the ratio stays
        below 1 (:data:`RATIO_BOUND`, unless ``allow_fast_calibrator``) and λ_f at or above
        the 1e-8 floor where training stops (:data:`LR_FLOOR_BOUND`)."""
        value = self._next(edge)
        if not 0 < value < math.inf:  # e.g. a grid given with a huge factor
            return f"{edge.split()[0]} finite bound"
        if edge == "ratio high" and not self.allow_fast_calibrator and value >= 1:
            return RATIO_BOUND
        if edge == "lr low" and value < LR_FLOOR:
            return LR_FLOOR_BOUND
        return None

    def can_extend(self, edge: str) -> bool:
        """Whether ``edge`` can move outward (see :meth:`bound`)."""
        return self.bound(edge) is None

    def extended(self, edges: Sequence[str]) -> Grid:
        """The grid with one more value outward on each of ``edges``."""
        lrs, ratios = list(self.lrs), list(self.ratios or ())
        for edge in edges:
            axis = lrs if edge.startswith("lr") else ratios
            value = self._next(edge)
            if not any(math.isclose(value, v, rel_tol=1e-9) for v in axis):  # 3-digit rounding
                axis.append(value)
        return Grid(
            tuple(lrs),
            tuple(ratios) if self.ratios is not None else None,
            self.allow_fast_calibrator,
            self.factors,
            self.fixed,
        )


def point_label(point: dict[str, float]) -> str:
    """Folder name of a grid point: ``lr0.001`` or ``lr0.001_ratio0.1``."""
    return "_".join(f"{k}{v:g}" for k, v in point.items())


def point_config(point: dict[str, float]) -> dict[str, float]:
    """The TrainConfig fields of a grid point (``lr``, and ``calibrator_lr`` = lr x ratio)."""
    out = {"lr": point["lr"]}
    if "ratio" in point:
        out["calibrator_lr"] = _round(point["lr"] * point["ratio"])
    return out


def point_status(folder: RunDir, cfg: TrainConfig, *, overwrite: bool) -> str:
    """What the folder of a grid point holds for the run ``cfg`` (explicit learning rates),
    and so what training the point takes; read it under the folder's lock:

    * ``"complete"``: a finished run of ``cfg`` whose record checks: reused;
    * ``"diverged"``: a run of ``cfg`` that diverged: a result, not trained again;
    * ``"unfinished"``: an unfinished run of ``cfg`` with checkpoints (interrupted, or
      paused at a rung of a selection by successive halving): resumed;
    * ``"new"``: nothing of a run: trained from the start;
    * ``"replace"``: a run that must be trained again from the start (another
      configuration with ``overwrite``, a record edited after the run, a run stopped
      before its first checkpoint): the folder is cleared first (``overwrite``).

    Raises
    ------
    RunFolderError
        The folder holds a run of another configuration and ``overwrite`` is false (names
        the differences).
    """
    saved = folder.read_config() if folder.is_marked() else None
    if saved is None:
        return "new"
    diff = config_diff(saved, cfg.resolved())
    if diff and not overwrite:
        raise RunFolderError(
            f"{folder.path} holds a run of another configuration ({'; '.join(diff)}); use "
            "another output folder or `overwrite=True`.",
            cli_message=f"{folder.path} holds a run of another configuration "
            f"({'; '.join(diff)}); use another --out or pass --overwrite.",
        )
    if diff:
        return "replace"
    status = (folder.read_outcome() or {}).get("status")
    if status == "complete" and folder.finished_with(cfg):
        return "complete"
    if status == "diverged":
        return "diverged"
    # a record edited after the run is never trusted: the point is trained again
    return "unfinished" if status != "complete" and folder.has_state() else "replace"


def with_data_model(config: TrainConfig, data: Any, model: Any) -> TrainConfig:
    """``config`` naming the backbone its runs record: a plugin dataset's default is known
    only once loaded (``data``, a :class:`~cogcal.train.sources.DataSource`), so grid
    points are compared with their folders (reused, resumed) under the name ``cogcal
    train`` records. Unchanged with a model given in Python (``model``) or a name already
    known."""
    dataset = getattr(data, "dataset", None)
    if model is not None or config.model_name is not None or dataset is None:
        return config
    return config.replace(model=dataset.default_model) if dataset.default_model else config


@dataclass
class GridSearch:
    """The search over a :class:`Grid`, extended outward while the choice is at an edge.

    Call :meth:`next_points`, train them, :meth:`record` each result, repeat until
    :meth:`next_points` returns ``[]``; then :attr:`best`, :attr:`at_edge` and
    :meth:`summary` describe the outcome.
    """

    grid: Grid
    max_extensions: int = 2
    results: dict[tuple[tuple[str, float], ...], float] = field(default_factory=dict)
    statuses: dict[tuple[tuple[str, float], ...], str] = field(default_factory=dict)
    extensions: int = 0
    _issued: set[tuple[tuple[str, float], ...]] = field(default_factory=set)

    def __post_init__(self) -> None:
        check(self.max_extensions, NON_NEGATIVE, "max_extensions", flag="--max-extensions")

    @staticmethod
    def _key(point: dict[str, float]) -> tuple[tuple[str, float], ...]:
        return tuple(sorted(point.items()))

    def record(self, point: dict[str, float], nll: float, status: str = "complete") -> None:
        """The selection NLL of a trained point (``inf`` or NaN: diverged)."""
        value = float(nll) if nll is not None and math.isfinite(nll) else math.inf
        self.results[self._key(point)] = value
        self.statuses[self._key(point)] = (
            status if math.isfinite(value) else (status if status != "complete" else "diverged")
        )

    def _pending(self) -> list[dict[str, float]]:
        return [p for p in self.grid.points() if self._key(p) not in self.results]

    def next_points(self) -> list[dict[str, float]]:
        """Points to train next; ``[]`` when the search is over."""
        pending = self._pending()
        if pending:
            fresh = [p for p in pending if self._key(p) not in self._issued]
            self._issued.update(self._key(p) for p in fresh)
            return fresh
        best = self.best
        if best is None or self.extensions >= self.max_extensions:
            return []
        edges = self.extendable_edges
        if not edges:
            return []
        self.grid = self.grid.extended(edges)
        self.extensions += 1
        return self.next_points()

    @property
    def finished(self) -> bool:
        return not self._pending() and (
            self.best is None or self.extensions >= self.max_extensions or not self.extendable_edges
        )

    @property
    def best(self) -> dict[str, float] | None:
        """The point with the lowest finite selection NLL (ties: the first in grid order)."""
        finite = [
            (self.results[self._key(p)], i, p)
            for i, p in enumerate(self.grid.points())
            if self._key(p) in self.results and math.isfinite(self.results[self._key(p)])
        ]
        return min(finite, key=lambda t: (t[0], t[1]))[2] if finite else None

    @property
    def at_edge(self) -> list[str]:
        """The grid edges the final choice lies on that a bound does not explain (empty:
        interior on every axis, or only at a bound such as :data:`RATIO_BOUND`)."""
        best = self.best
        if best is None:
            return []
        return [e for e in self.grid.edges(best) if self.grid.can_extend(e)]

    @property
    def bounds(self) -> list[str]:
        """The bounds the final choice sits at (:data:`RATIO_BOUND`,
        :data:`LR_FLOOR_BOUND`): edges no extension may cross, so not a grid problem."""
        best = self.best
        if best is None:
            return []
        return [b for e in self.grid.edges(best) if (b := self.grid.bound(e)) is not None]

    @property
    def extendable_edges(self) -> list[str]:
        """The edges of the choice the grid could still grow past."""
        return self.at_edge

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """``tune.json``: every point, the selection rule, the choice and whether it is at
        an edge. ``edges`` names every edge of the choice, a bound by its name (``"ratio < 1
        bound"``); ``at_edge`` is true only for an edge the search could have moved past
        (``cap_reached``: the extension cap stopped it), not for a bound alone."""
        at, bounds = grid_edges([self.grid], self.best)
        return {
            "selection": SELECTION_RULE,
            "axes": list(self.grid.axes),
            "grid": {axis: list(self.grid.values(axis)) for axis in self.grid.axes},
            "best": self.best,
            "best_config": None if self.best is None else point_config(self.best),
            "at_edge": bool(at),
            "edges": at + bounds,
            "bounds": bounds,
            "extensions": self.extensions,
            "max_extensions": self.max_extensions,
            "cap_reached": bool(at) and self.extensions >= self.max_extensions,
            "table": rows,
        }


def grid_edges(grids: Sequence[Grid], best: dict[str, float] | None) -> tuple[list[str], list[str]]:
    """The edges of ``grids`` that the choice ``best`` lies on: ``(open, bounds)``, the
    edges a search could move past (``"lr high"``) and the bounds that stop the others
    (:data:`RATIO_BOUND`, :data:`LR_FLOOR_BOUND`).

    >>> grid_edges([Grid(lrs=(1e-3, 3e-3), ratios=(0.1, 0.3))], {"lr": 3e-3, "ratio": 0.3})
    (['lr high'], ['ratio < 1 bound'])
    """
    opened: list[str] = []
    bounds: list[str] = []
    for grid in grids if best is not None else ():
        for edge in grid.edges(best):  # type: ignore[arg-type]
            bound = grid.bound(edge)
            (opened if bound is None else bounds).append(edge if bound is None else bound)
    return opened, bounds


def _is_marked(folder: Path) -> bool:
    try:
        data = json.loads((folder / "tune.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get(TUNE_MARK) == TUNE_FORMAT


def _is_point_run(entry: Path) -> bool:
    """A grid-point run folder of an earlier ``cogcal tune`` (before the mark): a folder
    named like a point, not a link, whose ``config.json`` carries the run mark."""
    if not _POINT_NAME.match(entry.name) or entry.is_symlink() or not entry.is_dir():
        return False
    try:
        config = json.loads((entry / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "cogcal_run" in config


def check_tune_folder(folder: str | Path) -> None:
    """Refuse to tune into ``folder`` unless it is new, empty (a lock file aside) or was
    written by ``cogcal tune``: its ``tune.json`` carries :data:`TUNE_MARK` (or, written
    before the mark, it holds only grid-point run folders and tune's tables). The rule
    of ``cogcal train`` and ``cogcal bench --out``: cogcal never mixes its runs with files
    it did not write, nor one kind of run folder with another. Take the folder's lock
    first.

    Raises
    ------
    ArgumentError
        The folder holds anything else: a ``cogcal train`` run, a bench folder, the user's
        files (names what it found).
    """
    folder = Path(folder)
    if not folder.is_dir() or _is_marked(folder):
        return
    entries = sorted(
        e for e in folder.iterdir()
        if e.name != ".cogcal.lock" and _io.temp_target(e.name) not in _TUNE_FILES
    )  # fmt: skip
    if not entries or all(e.name in _TUNE_FILES or _is_point_run(e) for e in entries):
        return
    names = [e.name + ("/" if e.is_dir() else "") for e in entries]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if (folder / "config.json").is_file() and "config.json" in names:
        what = "a `cogcal train` run folder (config.json)"
    elif (folder / "bench.json").is_file():
        what = "a `cogcal bench` folder (bench.json)"
    else:
        what = "not empty"
    why = (
        f"{folder} is {what} and was not written by cogcal tune (no tune.json with its mark; "
        f"it holds {shown}); cogcal never writes a grid into a folder it did not write"
    )
    raise ArgumentError(
        f"`out` {why}: choose a new or empty `out`.",
        cli_message=f"--out {why}: choose a new or empty --out.",
    )


def mark_tune_folder(folder: str | Path) -> None:
    """Mark ``folder`` as written by ``cogcal tune`` (a ``tune.json`` holding
    :data:`TUNE_MARK`) before its first point trains, unless it is marked already;
    :func:`write_tables` replaces it with the full summary, mark included."""
    folder = Path(folder)
    if not _is_marked(folder):
        _io.write_json(folder / "tune.json", {TUNE_MARK: TUNE_FORMAT, "status": "running"})


def write_tables(folder: Path, summary: dict[str, Any]) -> None:
    """Write ``tune.json`` (with :data:`TUNE_MARK`) and ``tune.csv`` (one row per trained
    point, the columns :data:`TUNE_COLUMNS`)."""
    _io.write_json(folder / "tune.json", {TUNE_MARK: TUNE_FORMAT, **summary})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=TUNE_COLUMNS, restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(summary["table"])
    _io.write_text(folder / "tune.csv", buf.getvalue())


def read_table(path: str | Path) -> list[dict[str, str]]:
    """The rows of a ``tune.csv`` with every column of :data:`TUNE_COLUMNS` (empty where
    the file, written by an earlier version, has no such column).

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "tune.csv"
    >>> _ = path.write_text("lr,val_nll,status,run\\n0.001,0.5,complete,lr0.001\\n")
    >>> row = read_table(path)[0]
    >>> row["lr"], row["ratio"], row["status"], list(row)[:3]
    ('0.001', '', 'complete', ['lr', 'ratio', 'calibrator_lr'])
    """
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [
        {
            **{c: row.get(c) or "" for c in TUNE_COLUMNS},
            **{k: v for k, v in row.items() if k not in TUNE_COLUMNS},
        }
        for row in rows
    ]


def open_edges(selection: dict[str, Any]) -> list[str]:
    """The edges of the choice the search could have moved past (``"lr high"``, ...), not
    the bounds (``"ratio < 1 bound"``)."""
    return [e for e in selection.get("edges") or [] if e.split()[-1] in ("low", "high")]


def edge_warning(selection: dict[str, Any] | None, *, python: bool = False) -> str | None:
    """What ``cogcal train`` and :func:`cogcal.fit` warn with when the learning rates chosen
    by validation cross-entropy sit at an edge of the grid that the run cap
    (``max_runs``) kept the search from moving past: a better point may lie beyond it.
    None when the choice is interior (or at a bound only). When the default path delivered
    cross-entropy + post hoc (``selection["choice"]``), the search is COG-FC's side's and
    the message says so. ``python``: name arguments (``lr=``), not flags."""
    if not selection or not selection.get("at_edge"):
        return None
    edges = open_edges(selection)
    if not edges:
        return None
    tried = selection.get("grid") or {}
    config = selection.get("best_config") or {}
    lr, cal_lr = config["lr"], config.get("calibrator_lr")
    ratios = tried.get("ratio")
    grid = Grid(tuple(tried.get("lr") or (lr,)), tuple(ratios) if ratios else None)

    def setting(net: float, cal: float | None) -> str:
        if python:
            return f"`lr={net:.3g}`" + (f", `calibrator_lr={cal:.3g}`" if cal else "")
        return f"--lr {net:.3g}" + (f" --calibrator-lr {cal:.3g}" if cal else "")

    tries = []
    for edge in edges:  # one step beyond each edge, the other rate's axis as chosen
        value = grid._next(edge)
        if edge.startswith("lr"):
            tries.append(setting(value, cal_lr and cal_lr * value / lr))
        else:
            tries.append(setting(lr, value * lr))
    chosen = f"lr {lr:g}" + (f", calibrator lr {cal_lr:g}" if cal_lr else "")
    search = "cogcal.train.tune" if python else "`cogcal tune`"
    cap = (
        f" (the default path trains at most {selection['max_runs']} runs)"
        if "max_runs" in selection
        else ""
    )
    choice = selection.get("choice") or {}
    subject = "the learning rates chosen by validation cross-entropy"
    if choice.get("side") == "posthoc":  # the default path delivered the other side
        subject = (
            f"COG-FC's side of the default path (the model delivered is cross-entropy + "
            f"{choice.get('chosen')}, which beat it): its learning rates chosen by validation "
            "cross-entropy"
        )
    return (
        f"{subject} ({chosen}) sit at the "
        f"{' and '.join(edges)} edge{'s' if len(edges) > 1 else ''} of the grid tried{cap}, "
        f"so a better point may lie beyond: train with {' or with '.join(tries)} and compare "
        f"the validation NLL, or search further with {search}."
    )
