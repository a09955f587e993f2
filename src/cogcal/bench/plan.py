"""Turn a :class:`~cogcal.bench.suites.Suite` into jobs: tuning groups, then seed runs.

Layout of the output folder::

    runs/<protocol>/<dataset>/<method>/seed<k>/     one run each (cogcal.train.run)
    tune/<protocol>/<dataset>/<method>/<point>/     one run per grid point (seed tune.seed)
    tune/<protocol>/<dataset>/<method>/tune.{json,csv}   the table and the chosen point

A tuning group trains every grid point, then picks the point with the lowest validation
cross-entropy (NLL) -- never a test metric -- and only then queues the seed runs that
use it. In the ``fair`` protocol the post-hoc methods (``ts``, ``vs``, ``ms``) use the
learning rate chosen for ``ce``: their network is a plain cross-entropy network, and its
learning rate is chosen by validation cross-entropy *before* calibration (SPEC section 2).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cogcal import _io
from cogcal.bench.executor import Job, _read_metrics
from cogcal.bench.suites import POST_HOC_ON_CE, Suite

__all__ = ["TuneGroup", "build_plan", "is_cog", "point_label"]


def is_cog(method: str) -> bool:
    """Whether ``method`` is a COG variant (from the registry; by name as a fallback)."""
    try:
        from cogcal.train.methods import METHODS
    except ImportError:
        return method.startswith("cog-")
    m = METHODS.get(method)
    return bool(m.is_cog) if m is not None else method.startswith("cog-")


def point_label(point: dict[str, float]) -> str:
    """Folder name of a grid point, e.g. ``lr0.001_calibrator_lr0.0001``.

    The same names as :func:`cogcal.train.tune`, so ``cogcal tune --out`` on a bench's
    ``tune/<protocol>/<dataset>/<method>`` folder finds (and skips) the bench's runs.
    """
    return "_".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in point.items())


def base_config(suite: Suite, dataset_index: int, method: str, protocol: str) -> dict[str, Any]:
    """The TrainConfig fields of one (dataset, method, protocol), before tuning."""
    entry = suite.datasets[dataset_index]
    cfg: dict[str, Any] = {"dataset": entry.name, "method": method}
    if entry.model is not None:
        cfg["model"] = entry.model
    cfg.update(suite.train)
    cfg.update(entry.train)
    overrides = suite.method_train.get(method, {})
    if not is_cog(method):
        cfg.pop("calibrator_lr", None)  # meaningless for one-learning-rate methods
        if protocol == "paper" and "lr" not in overrides:
            cfg["lr"] = suite.paper_baseline_lr  # the paper's baselines: lr 1e-4
    cfg.update(overrides)
    cfg["progress"] = False
    return cfg


@dataclass
class TuneGroup:
    """The grid points of one (protocol, dataset, method) and the methods waiting on it."""

    protocol: str
    dataset: str
    method: str  # the method trained at the grid points
    grid: tuple[dict[str, float], ...]
    folder: Path
    points: list[Job] = field(default_factory=list)
    dependents: list[str] = field(default_factory=list)  # methods using the chosen point
    best: dict[str, float] | None = None
    error: str = ""

    def select(self) -> dict[str, float] | None:
        """Choose the point with the lowest validation NLL; write tune.json and tune.csv."""
        rows = []
        for point, job in zip(self.grid, self.points, strict=True):
            metrics = _read_metrics(job.out) if job.status == "done" else None
            val = (metrics or {}).get("val") or {}
            nll = val.get("nll")
            rows.append(
                {
                    **point,
                    "val_nll": nll,
                    "val_brier": val.get("brier"),
                    "val_acc": val.get("acc"),
                    "status": job.status,
                    "run": str(job.out.relative_to(self.folder)),
                }
            )
        finite = [
            (r, p)
            for r, p in zip(rows, self.grid, strict=True)
            if isinstance(r["val_nll"], int | float) and math.isfinite(r["val_nll"])
        ]
        if finite:
            self.best = dict(min(finite, key=lambda rp: rp[0]["val_nll"])[1])
        else:
            self.error = f"every tuning run of {self.label} failed or diverged"
        summary = {
            "protocol": self.protocol,
            "dataset": self.dataset,
            "method": self.method,
            "used_by": self.dependents,
            "selection": "lowest validation NLL (cross-entropy) at seed tune.seed",
            "best": self.best,
            "table": rows,
        }
        _io.write_json(self.folder / "tune.json", summary)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        _io.write_text(self.folder / "tune.csv", buf.getvalue())
        return self.best

    @property
    def label(self) -> str:
        return f"{self.protocol}/{self.dataset}/{self.method}"


@dataclass
class Plan:
    """Jobs ready now, tuning groups (which queue more jobs when they finish)."""

    initial: list[Job]
    groups: list[TuneGroup]
    expected_total: int
    failed_groups: list[TuneGroup] = field(default_factory=list)


def build_plan(
    suite: Suite,
    out: Path,
    data_root: Path,
    enqueue: Callable[[list[Job]], None],
    on_group_failed: Callable[[TuneGroup, list[Job]], None],
) -> Plan:
    """Plan every job of ``suite`` into ``out``.

    Parameters
    ----------
    suite : Suite
    out : Path
        The bench output folder.
    data_root : Path
        Passed to every run.
    enqueue : callable
        Called with the seed jobs of a tuning group once it has chosen its point.
    on_group_failed : callable
        Called with a group whose every point failed and the seed jobs it cannot run
        (they are reported as failed, never trained with a guessed learning rate).

    Returns
    -------
    Plan
    """
    initial: list[Job] = []
    groups: dict[tuple[str, str, str], TuneGroup] = {}
    group_of: dict[tuple[str, str, str], TuneGroup] = {}
    expected = 0

    def seed_jobs(protocol: str, di: int, method: str, extra: dict[str, float]) -> list[Job]:
        ds = suite.datasets[di].name
        jobs = []
        for seed in suite.seeds:
            cfg = base_config(suite, di, method, protocol)
            cfg.update(extra)
            run_dir = out / "runs" / protocol / ds / method / f"seed{seed}"
            cfg.update(seed=seed, data_root=str(data_root), out=str(run_dir))
            jobs.append(Job(cfg, f"{protocol}/{ds}/{method}/seed{seed}", priority=1))
        return jobs

    for protocol in suite.protocols:
        for di, entry in enumerate(suite.datasets):
            for method in suite.methods:
                expected += len(suite.seeds)
                cog = is_cog(method)
                if cog:
                    grid, tuned = suite.cog_grid, method
                elif protocol == "fair":
                    grid = suite.baseline_grid
                    tuned = "ce" if method in POST_HOC_ON_CE else method
                else:
                    grid, tuned = (), method
                if not grid:
                    initial.extend(seed_jobs(protocol, di, method, {}))
                    continue
                key = (protocol, entry.name, tuned)
                if key not in groups:
                    folder = out / "tune" / protocol / entry.name / tuned
                    group = TuneGroup(protocol, entry.name, tuned, grid, folder)
                    for point in grid:
                        cfg = base_config(suite, di, tuned, protocol)
                        cfg.update(point)
                        run_dir = folder / point_label(point)
                        cfg.update(seed=suite.tune_seed, data_root=str(data_root), out=str(run_dir))
                        group.points.append(
                            Job(cfg, f"tune {group.label} {point_label(point)}", priority=0)
                        )
                    groups[key] = group
                    expected += len(grid)
                groups[key].dependents.append(method)
                group_of[(protocol, entry.name, method)] = groups[key]

    index = {e.name: i for i, e in enumerate(suite.datasets)}

    def make_callback(group: TuneGroup) -> Callable[[Job], None]:
        def on_point_done(_: Job) -> None:
            if any(p.status not in ("done", "failed") for p in group.points):
                return
            best = group.select()
            jobs: list[Job] = []
            for method in group.dependents:
                jobs.extend(seed_jobs(group.protocol, index[group.dataset], method, best or {}))
            if best is None:
                on_group_failed(group, jobs)
            else:
                enqueue(jobs)

        return on_point_done

    for group in groups.values():
        callback = make_callback(group)
        for job in group.points:
            job.on_done = callback
    points = [job for group in groups.values() for job in group.points]
    return Plan(initial=points + initial, groups=list(groups.values()), expected_total=expected)
