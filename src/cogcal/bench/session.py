"""A bench session: check a suite's requirements, plan and run it into a bench folder, and
write its tables and ``bench.json``.

:func:`run_suite` plans the suite (:mod:`cogcal.bench.plan`), runs it on a local process
pool or Ray (:mod:`cogcal.bench.executor`), writes ``results.csv``, ``runs.csv``,
``tuning.csv`` and ``effect.csv`` (:mod:`cogcal.bench.results`, columns in
:mod:`cogcal.runs.columns`) and ``bench.json`` (the suite, its budgets, one entry per
session), and returns what it did (:class:`BenchSummary`); the ``bench`` command
(:mod:`cogcal.commands.bench`) then renders the report. Re-running with the same ``out``
skips the runs that finished with the planned configuration (the run-folder contract,
:mod:`cogcal.runs`), so an interrupted bench resumes where it stopped.

Exit status (through ``cogcal bench``): 0 when every planned run finished (complete or
diverged); 1 when runs failed, were interrupted or were blocked (their tuning group had no
finite point); 130 / 143 when the bench itself was interrupted by SIGINT / SIGTERM, after
the running jobs were stopped and recorded as interrupted and the tables were written for
what had finished.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cogcal import _io
from cogcal._constraints import COUNT, check
from cogcal._errors import ArgumentError, Interrupted
from cogcal._version import __version__
from cogcal.bench.budget import FAMILIES, family_of, floor_epoch
from cogcal.bench.executor import DEFAULT_RUNNER, Job, Scheduler, check_pool, check_reachable
from cogcal.bench.plan import Blocked, Plan, dataset_folder, tuning_method
from cogcal.bench.results import write_tables
from cogcal.bench.suites import Suite, load_suite
from cogcal.data import default_model, load_dataset
from cogcal.models import create_model
from cogcal.runs import RunDir, is_bench_folder, lock_folder, write_bench_meta
from cogcal.runs.methods import METHODS, get_method

__all__ = [
    "BenchFolderError",
    "BenchSummary",
    "SuiteError",
    "budgets",
    "check_requirements",
    "run_suite",
]


class BenchFolderError(ArgumentError):
    """``out`` cannot be used by the bench (names the folder and the fix)."""


#: The counts of a session, in the order the summary line prints them.
COUNT_KEYS = ("trained", "skipped", "copied", "diverged", "failed", "interrupted", "blocked")


@dataclass(frozen=True)
class BenchSummary:
    """What one :func:`run_bench` session did.

    Attributes
    ----------
    out : Path
        The output folder (``os.fspath(summary)`` gives it too).
    counts : dict
        Planned runs by outcome: ``trained``, ``skipped`` (finished in an earlier session),
        ``copied`` (identical to another run), ``diverged`` (of those three, the runs whose
        loss became non-finite: results, not failures), ``failed``, ``interrupted`` and
        ``blocked`` (never started: their tuning group had no finite point).
    failed : int
        ``failed + interrupted + blocked``: non-zero means the bench did not finish.
    """

    out: Path
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        c = self.counts
        return c.get("failed", 0) + c.get("interrupted", 0) + c.get("blocked", 0)

    def __fspath__(self) -> str:
        return os.fspath(self.out)


def _stderr(line: str) -> None:
    print(f"cogcal bench: {line}", file=sys.stderr, flush=True)


def check_requirements(suite: Suite, data_root: Path, *, check_train: bool = True) -> dict:
    """Check that ``suite`` can run here, before anything starts.

    Loads every dataset once (``mnist1d`` is generated and cached under ``data_root``, so
    the workers only read the cache), checks for a GPU when the suite needs one, and
    refuses methods without a multi-task form on multi-label datasets and two-class methods
    (``platt``, ``beta``) on datasets of more than two classes. (Every planned
    TrainConfig was validated when the suite was loaded.)

    Parameters
    ----------
    suite : Suite
    data_root : Path
    check_train : bool
        Also build each dataset's backbone once (its feature size goes into
        ``bench.json`` for the complexity table).

    Returns
    -------
    dict
        Per dataset: ``task``, ``num_classes``, ``input_shape``, ``model`` and
        ``feature_dim``.

    Raises
    ------
    ValueError
        One sentence saying what is missing and how to get it.
    """
    if suite.requires_gpu and not torch.cuda.is_available():
        raise ArgumentError(
            f"suite {suite.name!r} needs a CUDA GPU and torch.cuda.is_available() is "
            "False here; run it on a GPU machine, or run `cogcal bench --suite quick` "
            "on this CPU."
        )
    info: dict[str, Any] = {}
    for entry in suite.datasets:
        try:
            fields = {**suite.train, **entry.train}
            data = load_dataset(
                entry.name,
                root=data_root,
                target=fields.get("target"),
                image_size=fields.get("image_size"),
                normalization=fields.get("normalization", "auto"),
            )
        except ArgumentError as err:
            raise ArgumentError(
                f"suite {suite.name!r} needs the dataset {entry.name!r} under {str(data_root)!r} "
                f"and it is not usable: {err}"
            ) from None
        if data.task == "multilabel":
            bad = [m for m in suite.methods_of(entry) if not get_method(m).supports_multilabel]
            if bad:
                ok = [m for m, spec in METHODS.items() if spec.supports_multilabel]
                raise ArgumentError(
                    f"suite {suite.name!r}: the multi-label dataset {entry.name!r} needs methods "
                    f"with a multi-task form; {', '.join(bad)} have none. Use some of: "
                    f"{', '.join(ok)} (give the dataset its own list, datasets.{entry.name}.methods, "
                    "or move the others to a suite of single-task datasets)."
                )
        for method in suite.methods_of(entry) if data.task == "multiclass" else ():
            problem = get_method(method).classes_problem(data.num_classes, entry.name)
            if problem is not None:
                raise ArgumentError(
                    f"suite {suite.name!r}: method {method} {problem} (give the dataset its "
                    f"own list, datasets.{entry.name}.methods)."
                )
        model = entry.model or data.default_model
        feature_dim = None
        if check_train and model is not None:
            net = create_model(model, num_classes=data.num_classes, input_shape=data.input_shape)
            feature_dim = int(getattr(net, "num_features", 0)) or None
            del net
        info[entry.name] = {
            "task": data.task,
            "num_classes": int(data.num_classes),
            "input_shape": list(data.input_shape),
            "model": model,
            "feature_dim": feature_dim,
        }
    return info


def budgets(suite: Suite) -> dict[str, dict[str, dict[str, Any]]]:
    """The stated budgets, per protocol and method family (recorded in ``bench.json``).

    Each entry: ``methods`` (of the suite, in that family), ``epochs``, ``schedule``,
    ``step_size`` (None without the step schedule), ``patience`` (None: no early
    stopping), ``stage2_epochs`` (TST / V-TST head; None for COG), ``lr`` and
    ``calibrator_lr`` (fixed values, or None when tuned), ``tuned``, ``grid`` (the starting
    grid when tuned), and ``floor_epoch``: the epoch at which every learning rate has
    decayed below the 1e-8 floor so that training stops, None if that never happens
    within ``epochs``; for a tuned family it is given for ``floor_epoch_lr``, the smallest
    λ_f of the starting grid (the earliest any of its runs can stop; larger rates stop
    later).

    >>> b = budgets(load_suite("paper-vit"))
    >>> b["paper"]["cog"]["floor_epoch"] is None, b["paper"]["cog"]["step_size"]
    (True, 100)
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for protocol in suite.protocols:
        out[protocol] = {}
        for fam in FAMILIES:
            members = [m for m in suite.methods if family_of(m) == fam]
            if not members:  # a suite states (and records) only its families' budgets
                continue
            b = suite.budgets[protocol][fam]
            grid: dict[str, list[float]] | None = None
            if b.tuned:
                g = suite.tune.grid(fam, allow_fast_calibrator=suite.allow_fast_calibrator)
                grid = {"lrs": list(g.lrs)}
                if g.ratios is not None:
                    grid["ratios"] = list(g.ratios)
                lr_floor = min(g.lrs)
            else:
                lr_floor = b.lr
            out[protocol][fam] = {
                "methods": members,
                "epochs": b.epochs,
                "schedule": b.schedule,
                "step_size": b.step_size,
                "patience": b.patience,
                "stage2_epochs": b.stage2_epochs,
                "lr": b.lr,
                "calibrator_lr": (
                    b.calibrator_lr
                    if b.calibrator_lr is not None or b.lr is None or fam != "cog"
                    else b.lr / 10
                ),
                "tuned": b.tuned,
                "grid": grid,
                "floor_epoch": floor_epoch(lr_floor, b.schedule, b.step_size, b.epochs),
                "floor_epoch_lr": lr_floor,
            }
    return out


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _children_cpu() -> float:
    """CPU seconds (user + system) used by finished child processes (the workers)."""
    import resource  # here: POSIX only, and `cogcal bench --list` must work without it

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class SuiteError(ArgumentError):
    """A suite file or name that cannot be used (its message names the problem)."""


def _load_suite(suite: str | Path, *, allow_plugins: bool = False) -> Suite:
    """:func:`load_suite`, its ``ValueError`` s (a suite that cannot be used: the user's
    input) raised as :class:`SuiteError`."""
    try:
        return load_suite(suite, allow_plugins=allow_plugins)
    except ArgumentError:
        raise
    except ValueError as err:
        raise SuiteError(str(err)) from err


def run_suite(
    suite: str | Path | Suite = "quick",
    *,
    out: Path,
    jobs: int = 1,
    data_root: Path = Path("data"),
    protocols: tuple[str, ...] | None = None,
    seeds: int | None = None,
    progress: bool = True,
    runner: str | None = None,
    executor: str = "local",
    address: str | None = None,
    allow_plugins: bool = False,
) -> BenchSummary:
    """Run a benchmark suite into ``out`` and write its tables and ``bench.json``.

    Parameters
    ----------
    suite : str, Path or Suite
        A shipped suite name (:func:`list_suites`), a YAML path, or a loaded suite.
    out : Path
        Output folder; re-running into the same folder skips finished runs.
    jobs : int
        Runs trained at once (worker processes, each with ``cpu_count // jobs`` threads).
    data_root : Path
        Data root of the datasets (``mnist1d`` is cached there).
    protocols : tuple of str, optional
        Restrict to some of ``("paper", "fair")``; default: the suite's.
    seeds : int, optional
        Number of seeds (``0 .. seeds-1``); default: the suite's.
    progress : bool
        Print progress lines to stderr.
    runner : str, optional
        ``module:function`` run in the workers as ``function(config_dict, resume=bool)``
        (default: :data:`cogcal.bench.executor.DEFAULT_RUNNER`, which trains).
    executor : {"local", "ray"}
        Run the jobs on a local process pool (default) or as tasks on a Ray cluster.
    address : str, optional
        Ray cluster address for ``executor="ray"`` (default: start a local Ray).
    allow_plugins : bool, default False
        Let a suite given by name or path use ``package.module:function`` datasets
        (plugins: code the bench imports and calls); without it such a suite is refused
        before anything is imported (``cogcal bench --allow-plugins``).

    Returns
    -------
    BenchSummary
        The counts of the session; ``summary.failed`` is non-zero when runs failed, were
        interrupted or blocked.

    Raises
    ------
    ValueError
        Invalid suite or arguments, missing data or GPU, another bench writing into ``out``
        (before anything starts).
    Interrupted, KeyboardInterrupt
        SIGTERM / SIGINT: re-raised after the workers were stopped, the running jobs
        recorded as interrupted, and the tables written.
    """
    loaded = suite if isinstance(suite, Suite) else _load_suite(suite, allow_plugins=allow_plugins)
    if protocols is not None:
        loaded = loaded.replace(protocols=protocols)
    if seeds is not None:
        loaded = loaded.replace(seeds=check(seeds, COUNT, "seeds"))
    check_pool(jobs, executor, address)
    if executor == "ray":  # before anything is loaded or written: a wrong address fails fast
        check_reachable(address)
    runner = runner or DEFAULT_RUNNER
    out = Path(out).expanduser()
    data_root = Path(data_root).expanduser()
    say: Callable[[str], None] | None = _stderr if progress else None

    if say:
        say(f"suite {loaded.name!r}: checking data and configuration ...")
    info = check_requirements(loaded, data_root)
    loaded = _with_plugin_models(loaded, info)
    RunDir(out).check_path()
    with lock_folder(out, what=f"bench folder {out}"):  # before anything in out is read
        entries = RunDir(out).entries()
        if entries and not is_bench_folder(out):
            shown = ", ".join(entries[:5])
            raise BenchFolderError(
                f"`out` {out} is not empty ({shown}) and was not written by cogcal bench (no "
                "bench.json with its mark); cogcal never replaces files it did not write: "
                "choose a new or empty folder.",
                cli_message=f"--out {out} is not empty ({shown}) and was not written by "
                "cogcal bench (no bench.json with its mark); cogcal never replaces files it "
                "did not write: choose a new or empty --out.",
            )
        return _run_locked(loaded, out, jobs, data_root, info, say, runner, executor, address)


def _with_plugin_models(suite: Suite, info: dict[str, Any]) -> Suite:
    """``suite`` with the backbone of each plugin dataset that states none set to the
    plugin's default (known only once it is loaded, as :func:`check_requirements` did), so
    that every planned configuration names the model its run records and a finished run
    is recognised as such (as ``cogcal train`` resolves it from the loaded data)."""
    entries = tuple(
        dataclasses.replace(entry, model=info[entry.name]["model"])
        if entry.model is None and default_model(entry.name) is None and entry.name in info
        else entry
        for entry in suite.datasets
    )
    return dataclasses.replace(suite, datasets=entries)


def _run_locked(
    suite: Suite,
    out: Path,
    jobs: int,
    data_root: Path,
    info: dict[str, Any],
    say: Callable[[str], None] | None,
    runner: str,
    executor: str,
    address: str | None,
) -> BenchSummary:
    started_at, t0 = _now(), time.monotonic()
    cpu0 = _children_cpu()
    meta_path = out / "bench.json"
    try:
        previous = _io.read_json(meta_path)
        sessions = list(previous.get("sessions", [])) if isinstance(previous, dict) else []
    except (OSError, ValueError):
        sessions = []
    write_bench_meta(out, _meta(suite, jobs, data_root, info, sessions))

    scheduler = Scheduler(
        jobs=jobs,
        runner=runner,
        reuse=suite.reuse,
        progress=say,
        warm=("cogcal.train.runner",) if runner == DEFAULT_RUNNER else (),
        executor=executor,
        address=address,
    )
    plan = Plan(suite, out, data_root, scheduler.add)
    scheduler.expected_total = lambda: plan.expected_total
    if say:
        say(
            f"{plan.expected_total} runs planned ({len(plan.groups)} tuning groups), "
            f"{jobs} worker(s), output {out}"
        )
    interrupted: BaseException | None = None
    try:
        scheduler.add(plan.initial_jobs())
        scheduler.run()
    except (Interrupted, KeyboardInterrupt) as err:
        interrupted = err
    signame = None
    if interrupted is not None:
        signame = interrupted.signame if isinstance(interrupted, Interrupted) else "SIGINT"
        if say:
            say(f"interrupted ({signame}): writing the tables and the report for what finished")

    counts = {k: scheduler.counts.get(k, 0) for k in COUNT_KEYS}
    counts["blocked"] = len(plan.blocked)
    failed_path = _write_failures(out, scheduler.all_jobs, plan.blocked)
    write_tables(out, scheduler.all_jobs, plan.groups, plan.blocked, planned_runs(suite, out))
    sessions.append(
        {
            "started": started_at,
            "finished": _now(),
            "wall_seconds": round(time.monotonic() - t0, 2),
            "worker_cpu_seconds": round(_children_cpu() - cpu0, 2),
            "jobs": jobs,
            "executor": executor,
            "protocols": list(suite.protocols),
            "seeds": list(suite.seeds),
            "planned": plan.expected_total,
            "not_started": sum(1 for j in scheduler.all_jobs if not j.final),
            "counts": counts,
            "interrupted": signame,
        }
    )
    write_bench_meta(out, _meta(suite, jobs, data_root, info, sessions))
    summary = BenchSummary(out=out, counts=counts)
    if say:
        c = counts
        say(
            f"done in {sessions[-1]['wall_seconds']:.0f}s: trained {c['trained']}, skipped "
            f"{c['skipped']}, reused {c['copied']} ({c['diverged']} diverged), failed "
            f"{c['failed']}, interrupted {c['interrupted']}, blocked {c['blocked']}"
            + (f" (see {failed_path})" if summary.failed else "")
        )
    if interrupted is not None:
        raise interrupted
    return summary


def planned_runs(suite: Suite, out: Path) -> list[tuple[str, str, str, int, Path]]:
    """Every seed run of ``suite`` as ``(protocol, dataset, method, seed, run folder)``, in
    the order :class:`~cogcal.bench.plan.Plan` plans them (``runs.csv`` lists them all)."""
    return [
        (protocol, entry.name, method, seed,
         out / "runs" / protocol / dataset_folder(entry.name) / method / f"seed{seed}")
        for protocol in suite.protocols
        for entry in suite.datasets
        for method in suite.methods_of(entry)
        for seed in suite.seeds
    ]  # fmt: skip


def _write_failures(out: Path, jobs: list[Job], blocked: list[Blocked]) -> Path:
    """``failed.txt``: one line per failed, interrupted or blocked run (removed if none)."""
    lines = []
    for job in jobs:
        if job.status in ("failed", "interrupted"):
            lines.append(f"{job.label}\t{job.status}\t{job.error}\t{job.out / 'run.log'}")
    for b in blocked:
        lines.append(f"{b.label}\tblocked\t{b.reason}\t{b.run_dir}")
    path = out / "failed.txt"
    if lines:
        _io.write_text(path, "# run\tstatus\terror\tlog\n" + "\n".join(lines) + "\n")
    else:
        path.unlink(missing_ok=True)
    return path


def _meta(
    suite: Suite, jobs: int, data_root: Path, info: dict[str, Any], sessions: list[dict]
) -> dict[str, Any]:
    return {
        "suite": suite.to_dict(),
        "budgets": budgets(suite),
        "tuning_groups": {m: tuning_method(m) for m in suite.methods if tuning_method(m) != m},
        "datasets": info,
        "data_root": str(data_root),
        "jobs": jobs,
        "cpu_count": os.cpu_count(),
        "threads_per_worker": max(1, (os.cpu_count() or 1) // jobs),
        "cogcal": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sessions": sessions,
    }
