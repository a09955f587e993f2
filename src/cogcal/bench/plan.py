"""Turn a :class:`~cogcal.bench.suites.Suite` into runs: tuning groups, then seed runs.

Layout of the output folder::

    runs/<protocol>/<dataset>/<method>/seed<k>/          one run each (cogcal.train.run)
    runs/effect/<dataset>/<variant>/seed<k>/             the effect comparison's runs
    tune/<protocol>/<dataset>/<group>/<point>/           one run per grid point (tune.seed)
    tune/<protocol>/<dataset>/<group>/tune.{json,csv}    every point, the choice, at_edge
    tune/effect/<dataset>/ce-no-schedule/...             the effect's own tuning group

Every planned run is a :class:`~cogcal.train.config.TrainConfig`. A tuning group trains
the points of its :class:`~cogcal.train.search.Search` on the worker pool; when they
have finished, the search's :meth:`~cogcal.train.search.Search.next_points` gives the
extension points (trained too) until it returns ``[]``; then the group writes its tables
and the seed runs of the methods using it are queued with the chosen point. Points are
chosen by :attr:`~cogcal.runs.RunRecord.selection_nll` (validation cross-entropy;
post-hoc methods: before calibration); a diverged point is a result, worse than every
finite one. A group without a finite point blocks its seed runs (reported as failures,
never trained with a guessed learning rate).

In both protocols the post-hoc methods (``ts``, ``vs``, ``ms``) use the group of the plain
network they calibrate (``ce``): their network is a cross-entropy network, its learning rate
chosen by validation cross-entropy before calibration (docs/method.md §2).

The effect comparison ("where COG's effect comes from"), per dataset, when the suite runs
the fair protocol with ``ce`` and ``cog-fc`` (and ``effect: true``):

* ``ce (no schedule)``: ``ce`` with the fair budget but no schedule, its learning rate
  tuned in a group of its own;
* ``ce (step schedule)``: the fair ``ce`` runs (the same configuration: copied);
* ``cog-fc (ratio R)``: ``cog-fc`` at each ratio R of its fair grid, at the λ_f that is best
  for that ratio (the one at the chosen ratio is the fair ``cog-fc`` run: copied).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cogcal.bench.budget import family_of
from cogcal.bench.executor import Job
from cogcal.bench.suites import DatasetEntry, Suite
from cogcal.runs import RunDir
from cogcal.runs.columns import EFFECT
from cogcal.runs.methods import get_method, list_methods
from cogcal.train.config import TrainConfig
from cogcal.train.search import Outcome, Search
from cogcal.train.tuning import GridSearch, point_config, point_label, write_tables

__all__ = [
    "EFFECT",
    "Blocked",
    "Plan",
    "TuneGroup",
    "dataset_folder",
    "effect_slug",
    "effect_variant",
    "tuning_method",
]

CE_NO_SCHEDULE = "ce (no schedule)"
CE_STEP_SCHEDULE = "ce (step schedule)"


def dataset_folder(name: str) -> str:
    """The folder name of a suite dataset under ``runs/<protocol>/`` and
    ``tune/<protocol>/``: a registered name as it is; a ``folder:``/``csv:``/plugin name
    (which holds a path or a colon) as a safe slug with a short hash of the full name, so
    two tables called ``t.csv`` in different folders never share a folder.

    >>> dataset_folder("mnist1d")
    'mnist1d'
    >>> dataset_folder("csv:/data/wine.csv")
    'csv-wine.csv-d17847fa'
    """
    if ":" not in name and "/" not in name and "\\" not in name:
        return name
    kind, _, rest = name.partition(":")
    stem = Path(rest.rstrip("/\\")).name or rest
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{kind}-{stem}")
    return f"{safe}-{hashlib.sha1(name.encode('utf-8')).hexdigest()[:8]}"


def effect_variant(ratio: float) -> str:
    """The variant name of ``cog-fc`` at ratio R (``runs.columns.EFFECT_VARIANTS``).

    >>> effect_variant(0.1)
    'cog-fc (ratio 0.1)'
    """
    return f"cog-fc (ratio {ratio:g})"


def effect_slug(variant: str) -> str:
    """Folder name of an effect variant.

    >>> effect_slug("ce (no schedule)"), effect_slug("cog-fc (ratio 0.01)")
    ('ce-no-schedule', 'cog-fc-ratio0.01')
    """
    slug = variant.replace(" (ratio ", "-ratio").replace(" (", "-").replace(")", "")
    return slug.replace(" ", "-")


def tuning_method(method: str) -> str:
    """The method trained at the grid points that choose ``method``'s learning rate: for
    a post-hoc method, the plain network it calibrates (``ts`` -> ``ce``); else itself.

    >>> tuning_method("ts"), tuning_method("cog-ts"), tuning_method("tst")
    ('ce', 'cog-ts', 'tst')
    """
    m = get_method(method)
    if m.posthoc is None:
        return method
    for name in list_methods():
        c = get_method(name)
        if c.loss == m.loss and c.cog is None and c.posthoc is None and c.stage2 is None:
            return name
    return method


@dataclass
class Blocked:
    """A planned run that cannot start because its tuning group has no finite point."""

    label: str
    protocol: str
    dataset: str
    method: str
    seed: int
    run_dir: Path
    reason: str
    variant: str | None = None


@dataclass
class TuneGroup:
    """The grid search of one (protocol, dataset, method trained at the points).

    Attributes
    ----------
    used_by : list of str
        Methods (or effect variants) whose seed runs use the chosen point.
    fields : dict
        TrainConfig fields of every point, without the learning rates, seed and out.
    search : GridSearch
        The grid and its extension rule.
    driver : Search
        The search driver over ``search`` (:mod:`cogcal.train.search`): the points to
        train next, their results, the choice and ``tune.json``.
    """

    protocol: str
    dataset: str
    method: str
    fields: dict[str, Any]
    search: GridSearch
    folder: Path
    seed: int
    used_by: list[str] = field(default_factory=list)
    listeners: list[Callable[[TuneGroup], None]] = field(default_factory=list)
    jobs: dict[str, Job] = field(default_factory=dict)
    finished: bool = False
    driver: Search = field(init=False)
    summary: dict[str, Any] | None = None
    error: str = ""

    @property
    def label(self) -> str:
        return f"{self.protocol}/{self.dataset}/{self.method}"

    @property
    def schedule(self) -> str:
        return str(self.fields.get("schedule"))

    def __post_init__(self) -> None:
        self.driver = Search(self.search, schedule=self.schedule)

    @property
    def pending(self) -> set[str]:
        """The points issued and not recorded yet."""
        return self.driver.pending

    @property
    def rows(self) -> dict[str, dict[str, Any]]:
        """The ``tune.csv`` row of each point recorded, by its folder name."""
        return {row["run"]: row for row in self.driver.table()}

    def config(self, point: dict[str, float], *, seed: int, out: Path) -> TrainConfig:
        """The TrainConfig of ``point`` at ``seed`` into ``out``."""
        return TrainConfig.from_dict(
            {**self.fields, **point_config(point), "seed": seed, "out": str(out)}
        )

    def next_jobs(self, on_done: Callable[[Job], None]) -> list[Job]:
        """Jobs for the search's next points (``[]``: the search is over)."""
        jobs = []
        for point in self.driver.next_points():
            name = point_label(point)
            cfg = self.config(point, seed=self.seed, out=self.folder / name)
            job = Job(
                cfg,
                f"tune {self.label} {name}",
                kind="point",
                protocol=self.protocol,
                dataset=self.dataset,
                method=self.method,
                seed=self.seed,
                priority=0,
                on_done=on_done,
                point=dict(point),
            )
            self.jobs[name] = job
            jobs.append(job)
        return jobs

    def record(self, job: Job) -> None:
        """Record a finished point job (complete, diverged, failed or interrupted)."""
        point = job.point or {}
        record = RunDir(job.out).read_record() if job.status == "complete" else None
        if record is None:
            self.driver.record(point, Outcome(job.status))
        else:
            self.driver.record(point, Outcome(job.status, record.selection_nll, record.val))

    def finish(self) -> None:
        """Write ``tune.json`` / ``tune.csv`` and tell the listeners."""
        self.finished = True
        summary = self.driver.summary()
        summary["table"].sort(key=lambda r: (r["lr"], r["ratio"] or 0.0))
        summary.update(
            protocol=self.protocol,
            dataset=self.dataset,
            method=self.method,
            used_by=list(self.used_by),
            schedule=self.schedule,
            seed=self.seed,
        )
        if not self.error and self.driver.best is None:
            self.error = (
                f"no finite point in tuning group {self.label} (every point diverged or "
                f"failed; see {self.folder / 'tune.csv'})"
            )
        if self.error:  # nothing is chosen: the seed runs are blocked
            summary.update(best=None, best_config=None, error=self.error)
        self.summary = summary
        write_tables(self.folder, summary)
        for listener in self.listeners:
            listener(self)

    @property
    def chosen(self) -> dict[str, float] | None:
        """The chosen point; None when no point is finite or the search failed."""
        return None if self.error else self.driver.best

    def best_per_ratio(self) -> dict[float, dict[str, float] | None]:
        """For each ratio of the final grid, the point with the lowest finite selection NLL
        at that ratio (None when every point there diverged or failed)."""
        out: dict[float, dict[str, float] | None] = {}
        for ratio in self.search.grid.ratios or ():
            finite = [
                (row["val_nll"], row["lr"])
                for row in self.rows.values()
                if row["ratio"] == ratio and row["val_nll"] is not None
            ]
            out[ratio] = (
                {"lr": min(finite)[1], "ratio": ratio} if finite and not self.error else None
            )
        return out


class Plan:
    """Every run of a suite, queued through ``enqueue`` as soon as it can start.

    Parameters
    ----------
    suite : Suite
    out : Path
        The bench output folder.
    data_root : Path
    enqueue : callable
        Called with jobs ready to run (the scheduler's ``add``).

    Attributes
    ----------
    groups : list of TuneGroup
    runs : list of Job
        Every seed run (``kind`` "seed") and effect run (``kind`` "effect") queued so far.
    blocked : list of Blocked
    expected_total : int
        Runs expected in all (grows when a grid is extended).
    """

    def __init__(
        self, suite: Suite, out: Path, data_root: Path, enqueue: Callable[[list[Job]], None]
    ) -> None:
        self.suite = suite
        self.out = Path(out)
        self.data_root = Path(data_root)
        self.enqueue = enqueue
        self.groups: list[TuneGroup] = []
        self.runs: list[Job] = []
        self.blocked: list[Blocked] = []
        self.expected_total = 0
        self._groups: dict[tuple[str, str, str], TuneGroup] = {}
        self._fixed: list[Job] = []
        self._build()

    # -- building ------------------------------------------------------------------------
    def fields(self, protocol: str, entry: DatasetEntry, method: str) -> dict[str, Any]:
        """TrainConfig fields of ``method`` on ``entry`` in ``protocol``, without seed/out
        (and without the learning rates when they are tuned): :meth:`Suite.run_fields`."""
        fields = self.suite.run_fields(protocol, entry, method)
        return {**fields, "data_root": str(self.data_root), "progress": False}

    def _group(
        self,
        protocol: str,
        entry: DatasetEntry,
        method: str,
        fields: dict[str, Any],
        folder_name: str | None = None,
    ) -> TuneGroup:
        key = (protocol, entry.name, folder_name or method)
        if key not in self._groups:
            suite = self.suite
            group = TuneGroup(
                protocol=protocol,
                dataset=entry.name,
                method=method,
                fields=fields,
                search=suite.tune.search(
                    family_of(method), allow_fast_calibrator=suite.allow_fast_calibrator
                ),
                folder=self.out
                / "tune"
                / protocol
                / dataset_folder(entry.name)
                / (folder_name or method),
                seed=suite.tune.seed,
            )
            self._groups[key] = group
            self.groups.append(group)
            self.expected_total += len(group.search.grid.points())
        return self._groups[key]

    def _seed_dir(self, protocol: str, dataset: str, name: str, seed: int) -> Path:
        return self.out / "runs" / protocol / dataset_folder(dataset) / name / f"seed{seed}"

    def _build(self) -> None:
        suite = self.suite
        seeds = suite.seeds
        for protocol in suite.protocols:
            for entry in suite.datasets:
                for method in suite.methods_of(entry):
                    budget = suite.budget(protocol, method)
                    self.expected_total += len(seeds)
                    if not budget.tuned:
                        for seed in seeds:
                            cfg = TrainConfig.from_dict(
                                {
                                    **self.fields(protocol, entry, method),
                                    "seed": seed,
                                    "out": str(self._seed_dir(protocol, entry.name, method, seed)),
                                }
                            )
                            self._fixed.append(self._run_job(cfg, protocol, entry.name, method))
                        continue
                    tuned = tuning_method(method)
                    group = self._group(protocol, entry, tuned, self.fields(protocol, entry, tuned))
                    group.used_by.append(method)
                    group.listeners.append(self._seed_listener(method))
            if protocol == "fair" and suite.effect:
                for entry in suite.datasets:
                    if {"ce", "cog-fc"} <= set(suite.methods_of(entry)):
                        self._plan_effect(entry)

    def _run_job(
        self,
        cfg: TrainConfig,
        protocol: str,
        dataset: str,
        method: str,
        variant: str | None = None,
    ) -> Job:
        kind = "effect" if variant is not None else "seed"
        name = variant if variant is not None else method
        return Job(
            cfg,
            f"{protocol}/{dataset}/{name}/seed{cfg.seed}",
            kind=kind,
            protocol=protocol,
            dataset=dataset,
            method=method,
            seed=cfg.seed,
            priority=1,
            variant=variant,
        )

    def _plan_effect(self, entry: DatasetEntry) -> None:
        seeds = self.suite.seeds
        ce = self._groups[("fair", entry.name, "ce")]
        cog = self._groups[("fair", entry.name, "cog-fc")]
        no_schedule = {**self.fields("fair", entry, "ce"), "schedule": "none"}
        no_schedule.pop("step_size", None)
        group = self._group(EFFECT, entry, "ce", no_schedule, folder_name="ce-no-schedule")
        group.used_by.append(CE_NO_SCHEDULE)
        group.listeners.append(self._effect_listener(CE_NO_SCHEDULE))
        ce.listeners.append(self._effect_listener(CE_STEP_SCHEDULE))
        cog.listeners.append(self._ratio_listener())
        self.expected_total += len(seeds) * (2 + len(cog.search.grid.ratios or ()))

    # -- listeners: queue seed runs once a group has chosen ------------------------------
    def _queue(
        self,
        group: TuneGroup,
        point: dict[str, float] | None,
        method: str,
        name: str,
        protocol: str,
        variant: str | None,
        reason: str = "",
    ) -> None:
        jobs = []
        for seed in self.suite.seeds:
            run_dir = self._seed_dir(protocol, group.dataset, name, seed)
            label = f"{protocol}/{group.dataset}/{variant or method}/seed{seed}"
            if point is None:
                self.blocked.append(
                    Blocked(
                        label,
                        protocol,
                        group.dataset,
                        method,
                        seed,
                        run_dir,
                        reason or group.error,
                        variant,
                    )
                )
                continue
            fields = {**group.fields, "method": method}
            if method != group.method:  # post-hoc methods on ce's choice: their own budget
                entry = next(e for e in self.suite.datasets if e.name == group.dataset)
                fields = self.fields(group.protocol, entry, method)
            cfg = TrainConfig.from_dict(
                {**fields, **point_config(point), "seed": seed, "out": str(run_dir)}
            )
            job = self._run_job(cfg, protocol, group.dataset, method, variant)
            self.runs.append(job)
            jobs.append(job)
        if jobs:
            self.enqueue(jobs)

    def _seed_listener(self, method: str) -> Callable[[TuneGroup], None]:
        def listener(group: TuneGroup) -> None:
            self._queue(group, group.chosen, method, method, group.protocol, None)

        return listener

    def _effect_listener(self, variant: str) -> Callable[[TuneGroup], None]:
        def listener(group: TuneGroup) -> None:
            self._queue(group, group.chosen, "ce", effect_slug(variant), EFFECT, variant)

        return listener

    def _ratio_listener(self) -> Callable[[TuneGroup], None]:
        def listener(group: TuneGroup) -> None:
            initial = len(self.suite.tune.ratios)
            self.expected_total += len(self.suite.seeds) * (len(group.search.grid.ratios) - initial)
            for ratio, point in group.best_per_ratio().items():
                variant = effect_variant(ratio)
                reason = (
                    ""
                    if point is not None or group.error
                    else (
                        f"every cog-fc point at ratio {ratio:g} diverged or failed (see "
                        f"{group.folder / 'tune.csv'})"
                    )
                )
                self._queue(group, point, "cog-fc", effect_slug(variant), EFFECT, variant, reason)

        return listener

    # -- running -------------------------------------------------------------------------
    def initial_jobs(self) -> list[Job]:
        """The jobs that can start now: every group's first points, then the fixed runs."""
        jobs: list[Job] = []
        for group in self.groups:
            jobs.extend(group.next_jobs(self._point_done(group)))
        self.runs.extend(self._fixed)
        return jobs + self._fixed

    def _point_done(self, group: TuneGroup) -> Callable[[Job], None]:
        def on_done(job: Job) -> None:
            group.record(job)
            if group.pending or group.finished:
                return
            try:
                more = group.next_jobs(on_done)
            except Exception as err:  # noqa: BLE001 - the group stops; its runs are blocked
                group.error = f"the grid search of {group.label} failed: {err}"
                more = []
            if more:
                self.expected_total += len(more)
                self.enqueue(more)
            else:
                group.finish()

        return on_done
