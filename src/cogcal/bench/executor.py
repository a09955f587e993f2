"""Run training jobs as independent processes on a local pool, resumably.

Every job is one run directory. A run is *finished* iff its ``metrics.json`` exists with
``"status": "complete"`` and its recorded configuration matches the planned one;
anything else found in a run directory (an interrupted or failed attempt, or a run made
with another configuration) is cleared and redone, so a half-written run is never
trusted. ``cogcal.train.run`` writes ``metrics.json`` last and atomically.

Jobs run in ``spawn``-ed worker processes that stay warm for the whole bench (the
imports are paid once per worker). Each job's stdout and stderr (file descriptors 1 and
2, so the output of C extensions too) go to ``<run dir>/run.log``. A failed job leaves
its log and a traceback there and does not stop the others. Workers exit by themselves
when the bench process dies, so a killed bench never leaves a worker writing into a run
directory that the next bench clears.

Jobs with identical configurations (for instance a tuning run at seed 0 and the final
seed-0 run with the chosen learning rates, or a COG run that both protocols plan with the
same grid) are trained once and copied (``reuse``); the copy's ``metrics.json`` names its
source under ``"copied_from"``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import heapq
import importlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cogcal import _io

__all__ = [
    "DEFAULT_RUNNER",
    "EXECUTORS",
    "RayPool",
    "Job",
    "Scheduler",
    "clear_run_dir",
    "config_key",
    "copy_run",
    "is_finished",
]

#: ``module:function`` called in the worker with the run's config dict.
DEFAULT_RUNNER = "cogcal.bench.executor:train_run"

#: Where jobs run: a local process pool (the default) or a Ray cluster.
EXECUTORS = ("local", "ray")

#: Config keys that do not change what a run computes (ignored when comparing configs).
_IGNORED_KEYS = frozenset({"out", "progress", "data_root", "extra", "steps_per_call"})


# --------------------------------------------------------------------------- run dirs


def config_key(config: dict[str, Any]) -> str:
    """A canonical string of what a run computes (its config without paths/display)."""
    return json.dumps(
        {k: v for k, v in config.items() if k not in _IGNORED_KEYS}, sort_keys=True, default=str
    )


def _read_metrics(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "metrics.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _same(planned: Any, recorded: Any) -> bool:
    if isinstance(planned, float) or isinstance(recorded, float):
        try:
            return abs(float(planned) - float(recorded)) <= 1e-12 * max(1.0, abs(float(planned)))
        except (TypeError, ValueError):
            return False
    return planned == recorded


def is_finished(run_dir: Path, config: dict[str, Any] | None = None) -> bool:
    """Whether ``run_dir`` holds a complete run made with ``config``.

    Parameters
    ----------
    run_dir : Path
        The run directory.
    config : dict, optional
        The planned configuration; every key of it (except ``out``, ``progress``,
        ``data_root``, ``extra`` and ``steps_per_call``) must equal the value recorded in
        ``metrics.json``.

    Returns
    -------
    bool
    """
    data = _read_metrics(Path(run_dir))
    if data is None or data.get("status") != "complete":
        return False
    if config is None:
        return True
    recorded = data.get("config")
    if not isinstance(recorded, dict):
        return False
    for key, value in config.items():
        if key in _IGNORED_KEYS:
            continue
        if key not in recorded or not _same(value, recorded[key]):
            return False
    return True


def clear_run_dir(run_dir: Path) -> None:
    """Remove everything in ``run_dir`` (an unfinished attempt), keeping the folder."""
    run_dir = Path(run_dir)
    if run_dir.is_dir():
        for entry in run_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)


def copy_run(src: Path, dst: Path) -> None:
    """Copy the finished run ``src`` to ``dst`` (hard links where possible).

    ``metrics.json`` is written last and atomically, with ``"copied_from"`` naming
    ``src``, so ``dst`` counts as finished only once it is whole.
    """
    src, dst = Path(src), Path(dst)
    clear_run_dir(dst)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if rel.name == "metrics.json" and len(rel.parts) == 1:
            continue
        target = dst / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
    data = _read_metrics(src)
    if data is None:
        raise ValueError(f"cannot copy run {src}: its metrics.json is unreadable.")
    data["copied_from"] = os.path.relpath(src, dst)
    _io.write_json(dst / "metrics.json", data)


# --------------------------------------------------------------------------- worker side


def train_run(config: dict[str, Any]) -> dict[str, Any]:
    """The default runner: ``cogcal.train.run(TrainConfig.from_dict(config))``."""
    from cogcal.train import TrainConfig, run

    return run(TrainConfig.from_dict(config))


def _resolve(runner: str) -> Callable[[dict[str, Any]], Any]:
    module, _, name = runner.partition(":")
    if not module or not name:
        raise ValueError(f"a runner is 'module:function', got {runner!r}.")
    return getattr(importlib.import_module(module), name)


def _watch_parent() -> None:
    """Exit this worker as soon as the bench process is gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait() -> None:
        from multiprocessing.connection import wait as mp_wait

        mp_wait([parent.sentinel])
        os._exit(3)

    threading.Thread(target=wait, name="cogcal-parent-watch", daemon=True).start()


def _init_worker(threads: int, runner: str, warm: tuple[str, ...]) -> None:
    """Pool initializer: parent watch, thread count, warm imports."""
    _watch_parent()
    import torch

    torch.set_num_threads(max(1, threads))
    for module in warm:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    with contextlib.suppress(ImportError, AttributeError, ValueError):
        _resolve(runner)  # errors are reported per job


def _execute(runner: str, config: dict[str, Any]) -> dict[str, Any]:
    """Run one job in a worker, with fds 1 and 2 redirected into ``<out>/run.log``."""
    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = open(out / "run.log", "ab", buffering=0)  # noqa: SIM115  (closed in finally)
    ok, error = True, ""
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        print(f"cogcal bench: run with config {json.dumps(config, sort_keys=True)}", flush=True)
        try:
            _resolve(runner)(dict(config))
        except Exception as err:  # reported, never re-raised: the other runs go on
            ok = False
            error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        log.close()
    return {"ok": ok, "error": error, "seconds": time.perf_counter() - started}


def _ray_execute(threads: int, runner: str, config: dict[str, Any]) -> dict[str, Any]:
    """A Ray task: the same job as in a local worker, with the thread count set per task."""
    import torch

    torch.set_num_threads(max(1, threads))
    return _execute(runner, config)


class RayPool:
    """The part of ``concurrent.futures.Executor`` the scheduler uses, on a Ray cluster.

    Each job becomes one Ray task reserving ``threads`` CPUs; its result comes back as a
    ``concurrent.futures.Future``. Run folders and the data root must be on a file system
    that every node of the cluster sees (the tasks write their runs there).

    Parameters
    ----------
    address : str, optional
        Ray cluster address (``"auto"``, ``"ray://host:10001"``, ...); ``None`` starts a
        local Ray instance with this machine's CPUs.
    threads : int
        CPUs (and torch threads) per job.
    """

    def __init__(self, *, address: str | None, threads: int) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError(
                "--executor ray needs Ray, which is an optional extra: "
                "pip install -e '.[ray]' (or pip install 'ray>=2.9')."
            ) from None
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            try:
                ray.init(
                    address=address,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except ConnectionError as err:
                raise ValueError(
                    f"could not connect to the Ray cluster at --address {address!r}: {err}"
                ) from None
        self.threads = threads
        self._task = ray.remote(num_cpus=threads, max_retries=0)(_ray_execute)
        self._refs: list[Any] = []

    def submit(self, fn: Callable[..., Any], runner: str, config: dict[str, Any]) -> cf.Future:
        if fn is not _execute:
            raise ValueError("RayPool runs cogcal bench jobs only.")
        ref = self._task.remote(self.threads, runner, config)
        self._refs.append(ref)
        return ref.future()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for ref in self._refs:
                with contextlib.suppress(Exception):
                    self._ray.cancel(ref, force=True)
        elif wait and self._refs:
            with contextlib.suppress(Exception):
                self._ray.wait(self._refs, num_returns=len(self._refs))
        self._refs = []
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()


# --------------------------------------------------------------------------- scheduling


@dataclass
class Job:
    """One run directory to fill.

    Attributes
    ----------
    config : dict
        TrainConfig fields, ``out`` included.
    label : str
        Short name for progress lines and failures (``paper/mnist1d/ce/seed0``).
    priority : int
        Lower runs first (tuning jobs 0, final runs 1).
    on_done : callable, optional
        Called in the bench process with the job once it is finished or failed.
    """

    config: dict[str, Any]
    label: str
    priority: int = 1
    on_done: Callable[[Job], None] | None = None
    status: str = "pending"  # pending | running | done | failed
    how: str = ""  # trained | skipped | copied
    error: str = ""
    seconds: float = 0.0
    attempts: int = 0
    waiters: list[Job] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return Path(self.config["out"])

    @property
    def key(self) -> str:
        return config_key(self.config)


class Scheduler:
    """A local process pool running :class:`Job` s, with dependencies added on the fly.

    Parameters
    ----------
    jobs : int
        Worker processes.
    runner : str
        ``module:function`` called with each job's config dict in a worker.
    reuse : bool
        Train jobs with identical configurations once and copy the result.
    progress : callable, optional
        Called with one status line whenever something changes.
    expected_total : int
        Jobs expected in all (for the progress line; grows if more are added).
    executor : {"local", "ray"}
        ``"local"``: a process pool on this machine; ``"ray"``: tasks on a Ray cluster
        (:class:`RayPool`).
    address : str, optional
        Ray cluster address (``executor="ray"`` only); ``None`` starts a local Ray.
    """

    def __init__(
        self,
        *,
        jobs: int = 1,
        runner: str = DEFAULT_RUNNER,
        reuse: bool = True,
        progress: Callable[[str], None] | None = None,
        expected_total: int = 0,
        warm: tuple[str, ...] = ("cogcal.train",),
        executor: str = "local",
        address: str | None = None,
    ) -> None:
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs must be a positive integer, got {jobs!r}.")
        if executor not in EXECUTORS:
            raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}.")
        if address is not None and executor != "ray":
            raise ValueError("--address applies to --executor ray only.")
        self.executor = executor
        self.address = address
        self.jobs = jobs
        self.runner = runner
        self.reuse = reuse
        self.progress = progress
        self.expected_total = expected_total
        self.warm = warm
        self._heap: list[tuple[int, int, Job]] = []
        self._counter = itertools.count()
        self._by_key: dict[str, Job] = {}
        self.all_jobs: list[Job] = []
        self.failures: list[Job] = []
        self._running: dict[cf.Future[dict[str, Any]], Job] = {}
        self._future_pool: dict[cf.Future[dict[str, Any]], cf.ProcessPoolExecutor] = {}
        self._pool: cf.ProcessPoolExecutor | RayPool | None = None
        self._started = time.monotonic()
        self._last_state: tuple[Any, ...] = ()
        self._last_time = 0.0

    # -- public --------------------------------------------------------------------------
    def add(self, jobs: Iterable[Job]) -> None:
        """Queue jobs; finished ones are recognised at once (and registered for reuse)."""
        for job in jobs:
            self.all_jobs.append(job)
            if is_finished(job.out, job.config):
                job.how = "skipped"
                self._finish(job, "done")
                continue
            heapq.heappush(self._heap, (job.priority, next(self._counter), job))
        self.expected_total = max(self.expected_total, len(self.all_jobs))

    def run(self) -> None:
        """Run until every queued (and newly added) job is done or failed."""
        try:
            while self._heap or self._running:
                self._submit_ready()
                if not self._running:
                    continue
                done, _ = cf.wait(self._running, timeout=1.0, return_when=cf.FIRST_COMPLETED)
                for future in done:
                    self._collect(future)
                self._report()
        except BaseException:
            self.shutdown(cancel=True)
            raise
        self.shutdown()
        self._report(force=True)

    def shutdown(self, cancel: bool = False) -> None:
        """Stop the workers (``cancel``: without waiting for running jobs)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if cancel:
            procs = list(getattr(pool, "_processes", {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs:  # only the workers this scheduler started
                if proc.is_alive():
                    proc.terminate()
        else:
            pool.shutdown(wait=True)

    @property
    def counts(self) -> dict[str, int]:
        """How many jobs were trained, skipped, copied, failed, and how many are left."""
        c = {"trained": 0, "skipped": 0, "copied": 0, "failed": 0, "running": 0}
        for job in self.all_jobs:
            if job.status == "failed":
                c["failed"] += 1
            elif job.status == "done":
                c[job.how or "trained"] += 1
            elif job.status == "running":
                c["running"] += 1
        return c

    # -- internals -----------------------------------------------------------------------
    def _ensure_pool(self) -> cf.ProcessPoolExecutor | RayPool:
        if self._pool is None:
            threads = max(1, (os.cpu_count() or 1) // self.jobs)
            if self.executor == "ray":
                self._pool = RayPool(address=self.address, threads=threads)
                return self._pool
            self._pool = cf.ProcessPoolExecutor(
                max_workers=self.jobs,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(threads, self.runner, self.warm),
            )
        return self._pool

    def _submit_ready(self) -> None:
        while self._heap and len(self._running) < self.jobs:
            _, _, job = heapq.heappop(self._heap)
            if job.status != "pending":
                continue
            if is_finished(job.out, job.config):
                job.how = "skipped"
                self._finish(job, "done")
                continue
            if self.reuse:
                twin = self._by_key.get(job.key)
                if twin is not None and twin is not job:
                    if twin.status == "done":
                        self._copy(twin, job)
                        continue
                    if twin.status == "failed":
                        job.error = f"same configuration as {twin.label}, which failed"
                        self._finish(job, "failed")
                        continue
                    twin.waiters.append(job)  # running or queued: wait for it
                    job.status = "waiting"
                    continue
                self._by_key[job.key] = job
            self._start(job)

    def _start(self, job: Job) -> None:
        clear_run_dir(job.out)
        job.status = "running"
        job.attempts += 1
        pool = self._ensure_pool()
        future = pool.submit(_execute, self.runner, job.config)
        self._running[future] = job
        self._future_pool[future] = pool

    def _collect(self, future: cf.Future[dict[str, Any]]) -> None:
        job = self._running.pop(future)
        pool = self._future_pool.pop(future, None)
        try:
            result = future.result()
        except BrokenProcessPool:
            # A worker died (killed, out of memory); every running job gets one retry.
            if pool is not None and pool is self._pool:
                self._recycle_pool()
            if job.attempts < 2:
                job.status = "pending"
                heapq.heappush(self._heap, (job.priority, next(self._counter), job))
                return
            result = {"ok": False, "error": "the worker process died (twice)", "seconds": 0.0}
        except Exception as err:  # pickling or pool errors: report, go on
            result = {"ok": False, "error": f"{type(err).__name__}: {err}", "seconds": 0.0}
        job.seconds = float(result.get("seconds", 0.0))
        if result.get("ok") and is_finished(job.out, job.config):
            job.how = "trained"
            self._finish(job, "done")
        else:
            job.error = result.get("error") or (
                "the run ended without a complete metrics.json matching its configuration"
            )
            self._finish(job, "failed")

    def _recycle_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _copy(self, src: Job, dst: Job) -> None:
        try:
            copy_run(src.out, dst.out)
        except (OSError, ValueError) as err:
            dst.error = f"copying {src.label} failed: {err}"
            self._finish(dst, "failed")
            return
        dst.how = "copied"
        self._finish(dst, "done")

    def _finish(self, job: Job, status: str) -> None:
        job.status = status
        if status == "done" and self.reuse:
            self._by_key.setdefault(job.key, job)
            if self._by_key[job.key].status != "done":
                self._by_key[job.key] = job
        if status == "failed":
            self.failures.append(job)
            if self.progress is not None:
                self.progress(f"FAILED {job.label}: {job.error} (log: {job.out / 'run.log'})")
        waiters, job.waiters = job.waiters, []
        for waiter in waiters:
            waiter.status = "pending"
            if status == "done":
                self._copy(job, waiter)
            else:
                waiter.error = f"same configuration as {job.label}, which failed"
                self._finish(waiter, "failed")
        if job.on_done is not None:
            job.on_done(job)

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        c = self.counts
        finished = c["trained"] + c["skipped"] + c["copied"] + c["failed"]
        total = max(self.expected_total, len(self.all_jobs))
        elapsed = time.monotonic() - self._started
        running = ", ".join(j.label for j in self._running.values())
        line = (
            f"[{finished}/{total}] trained {c['trained']}, skipped {c['skipped']}, "
            f"reused {c['copied']}, failed {c['failed']} | {_fmt_time(elapsed)}"
            + (f" | running: {running}" if running else "")
        )
        state = (finished, total, running)
        now = time.monotonic()
        if force or state != self._last_state or now - self._last_time >= 30:
            self._last_state, self._last_time = state, now
            self.progress(line)


def _fmt_time(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"
