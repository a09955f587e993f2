"""``cogcal bench``: run a suite of training runs and write results.csv and a report.

>>> from cogcal.bench import list_suites, load_suite
>>> "quick" in list_suites()
True
>>> load_suite("quick").methods[:3]
('ce', 'ls', 'ts')

:func:`run_bench` plans the suite (:mod:`cogcal.bench.plan`), runs it on a local process
pool (:mod:`cogcal.bench.executor`), collects ``results.csv`` (:mod:`cogcal.bench.results`)
and builds ``report.md`` and ``report.html`` (:mod:`cogcal.report.build`). Re-running with
the same ``out`` skips finished runs, so an interrupted bench resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cogcal import _io
from cogcal.bench.executor import DEFAULT_RUNNER, EXECUTORS, Job, Scheduler
from cogcal.bench.plan import TuneGroup, build_plan
from cogcal.bench.results import write_results
from cogcal.bench.suites import PROTOCOLS, Suite, list_suites, load_suite

__all__ = ["PROTOCOLS", "Suite", "check_requirements", "list_suites", "load_suite", "run_bench"]


def _stderr(line: str) -> None:
    print(f"cogcal bench: {line}", file=sys.stderr, flush=True)


def check_requirements(suite: Suite, data_root: Path, *, check_train: bool = True) -> dict:
    """Check that ``suite`` can run here, before anything starts.

    Loads every dataset once (``mnist1d`` is generated and cached under ``data_root``, so
    the workers only read the cache), checks for a GPU when the suite needs one, and
    validates every planned training configuration.

    Returns
    -------
    dict
        Per dataset: ``task``, ``num_classes``, ``input_shape``, ``model`` and
        ``feature_dim`` (used by the complexity table).

    Raises
    ------
    ValueError
        One sentence saying what is missing and how to get it.
    """
    if suite.requires_gpu:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                f"suite {suite.name!r} needs a CUDA GPU and torch.cuda.is_available() is "
                "False here; run it on a GPU machine, or run `cogcal bench --suite quick` "
                "on this CPU."
            )
    if check_train:
        try:
            import cogcal.train  # noqa: F401
        except ImportError as err:
            raise ValueError(
                f"cogcal bench needs cogcal.train, which failed to import ({err}); install "
                "the command-line extras with `pip install -e .[cli]`."
            ) from None
    from cogcal.data import load_dataset
    from cogcal.models import create_model

    try:
        from cogcal.train.config import DEFAULT_MODELS
    except ImportError:
        DEFAULT_MODELS = {}  # noqa: N806
    info: dict[str, Any] = {}
    for entry in suite.datasets:
        try:
            data = load_dataset(entry.name, root=data_root)
        except ValueError as err:
            raise ValueError(
                f"suite {suite.name!r} needs the dataset {entry.name!r} under {str(data_root)!r} "
                f"and it is not usable: {err}"
            ) from None
        model = entry.model or DEFAULT_MODELS.get(entry.name)
        feature_dim = None
        if model is not None:
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
    if check_train:
        _validate_configs(suite, data_root)
    return info


def _validate_configs(suite: Suite, data_root: Path) -> None:
    from cogcal.bench.plan import base_config, is_cog
    from cogcal.train import TrainConfig

    for protocol in suite.protocols:
        for di, entry in enumerate(suite.datasets):
            for method in suite.methods:
                base = base_config(suite, di, method, protocol)
                points: tuple[dict[str, float], ...] = ({},)
                if is_cog(method) and suite.cog_grid:
                    points = suite.cog_grid
                elif protocol == "fair" and not is_cog(method) and suite.baseline_grid:
                    points = suite.baseline_grid
                for point in points:
                    cfg = {**base, **point, "seed": 0, "data_root": str(data_root), "out": "."}
                    try:
                        TrainConfig.from_dict(cfg)
                    except ValueError as err:
                        raise ValueError(
                            f"suite {suite.name!r}: the run {protocol}/{entry.name}/{method} "
                            f"has an invalid training configuration: {err}"
                        ) from None


@contextlib.contextmanager
def _lock(out: Path) -> Iterator[None]:
    """Refuse to run two benches into the same folder at once."""
    path = out / ".bench.lock"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and _alive(pid):
                raise ValueError(
                    f"another cogcal bench (process {pid}) is writing into {str(out)!r}; wait "
                    "for it or stop it, or choose another --out."
                ) from None
            path.unlink(missing_ok=True)  # stale lock of a killed bench
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        break
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _children_cpu() -> float:
    """CPU seconds (user + system) used by finished child processes (the workers)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_bench(
    suite: str | Path | Suite = "quick",
    *,
    out: Path,
    jobs: int = 1,
    data_root: Path = Path("data"),
    protocols: tuple[str, ...] | None = None,
    seeds: int | None = None,
    progress: bool = True,
    report: bool = True,
    runner: str = DEFAULT_RUNNER,
    executor: str = "local",
    address: str | None = None,
) -> Path:
    """Run a benchmark suite into ``out`` and write ``results.csv`` and the report.

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
    report : bool
        Build ``report.md`` / ``report.html`` at the end.
    runner : str
        ``module:function`` run in the workers with each config dict (for tests).
    executor : {"local", "ray"}
        Run the jobs on a local process pool (default) or as tasks on a Ray cluster; both
        give the same results.
    address : str, optional
        Ray cluster address for ``executor="ray"`` (default: start a local Ray).

    Returns
    -------
    Path
        ``out``.

    Raises
    ------
    ValueError
        Invalid suite or arguments, missing data or GPU (before anything starts).
    """
    loaded = suite if isinstance(suite, Suite) else load_suite(suite)
    if protocols is not None:
        loaded = loaded.replace(protocols=protocols)
    if seeds is not None:
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise ValueError(f"seeds must be a positive integer, got {seeds!r}.")
        loaded = loaded.replace(seeds=seeds)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}.")
    if executor not in EXECUTORS:
        raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}.")
    if address is not None and executor != "ray":
        raise ValueError("--address applies to --executor ray only.")
    out = Path(out).expanduser()
    data_root = Path(data_root).expanduser()
    say: Callable[[str], None] | None = _stderr if progress else None

    if say:
        say(f"suite {loaded.name!r}: checking data and configuration ...")
    info = check_requirements(loaded, data_root, check_train=runner == DEFAULT_RUNNER)
    out.mkdir(parents=True, exist_ok=True)
    with _lock(out):
        return _run_locked(
            loaded, out, jobs, data_root, info, say, report, runner, executor, address
        )


def _run_locked(
    suite: Suite,
    out: Path,
    jobs: int,
    data_root: Path,
    info: dict[str, Any],
    say: Callable[[str], None] | None,
    report: bool,
    runner: str,
    executor: str = "local",
    address: str | None = None,
) -> Path:
    started_at, t0 = _now(), time.monotonic()
    cpu0 = _children_cpu()
    meta_path = out / "bench.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        sessions = list(meta.get("sessions", [])) if isinstance(meta, dict) else []
    except (OSError, ValueError):
        sessions = []
    meta = _meta(suite, jobs, data_root, info, sessions)
    _io.write_json(meta_path, meta)

    scheduler = Scheduler(
        jobs=jobs,
        runner=runner,
        reuse=suite.reuse,
        progress=say,
        warm=("cogcal.train",) if runner == DEFAULT_RUNNER else (),
        executor=executor,
        address=address,
    )
    blocked: list[tuple[TuneGroup, list[Job]]] = []

    def on_group_failed(group: TuneGroup, dependents: list[Job]) -> None:
        blocked.append((group, dependents))
        if say:
            say(f"FAILED tuning {group.label}: {group.error}; its {len(dependents)} runs skipped")

    plan = build_plan(suite, out, data_root, scheduler.add, on_group_failed)
    scheduler.expected_total = plan.expected_total
    if say:
        say(
            f"{plan.expected_total} runs planned ({len(plan.groups)} tuning groups), "
            f"{jobs} worker(s), output {out}"
        )
    scheduler.add(plan.initial)
    scheduler.run()

    failures = [f"{job.label}\t{job.error}\t{job.out / 'run.log'}" for job in scheduler.failures]
    for group, dependents in blocked:
        for job in dependents:
            failures.append(f"{job.label}\t{group.error}\t{group.folder / 'tune.json'}")
    failed_path = out / "failed.txt"
    if failures:
        header = "# run\terror\tlog\n"
        _io.write_text(failed_path, header + "\n".join(failures) + "\n")
    else:
        failed_path.unlink(missing_ok=True)

    write_results(out)
    counts = scheduler.counts
    counts["blocked"] = sum(len(d) for _, d in blocked)
    sessions.append(
        {
            "started": started_at,
            "finished": _now(),
            "wall_seconds": round(time.monotonic() - t0, 2),
            "worker_cpu_seconds": round(_children_cpu() - cpu0, 2),
            "jobs": jobs,
            "counts": counts,
        }
    )
    meta = _meta(suite, jobs, data_root, info, sessions)
    _io.write_json(meta_path, meta)
    if report:
        from cogcal.report.build import build_report

        html = build_report(out)
        if say:
            say(f"report: {html}")
    if say:
        c = counts
        say(
            f"done in {sessions[-1]['wall_seconds']:.0f}s: trained {c['trained']}, skipped "
            f"{c['skipped']}, reused {c['copied']}, failed {c['failed'] + c['blocked']}"
            + (f" (see {failed_path})" if failures else "")
        )
    return out


def _meta(
    suite: Suite, jobs: int, data_root: Path, info: dict[str, Any], sessions: list[dict]
) -> dict[str, Any]:
    import torch

    import cogcal

    return {
        "suite": suite.to_dict(),
        "datasets": info,
        "data_root": str(data_root),
        "jobs": jobs,
        "cpu_count": os.cpu_count(),
        "threads_per_worker": max(1, (os.cpu_count() or 1) // jobs),
        "cogcal": cogcal.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sessions": sessions,
    }
