"""Run training jobs as independent processes on a local pool (or Ray), resumably.

Every job is one run folder, and the run-folder contract (:mod:`cogcal.runs`) is
the only rule for what is found there:

* a folder holding a finished run of the planned configuration
  (:meth:`RunDir.finished_with <cogcal.runs.RunDir.finished_with>`, a resolved
  comparison: a field left to its default is compared too) is *skipped*; so is a
  diverged outcome of the same configuration (a result: retraining would diverge again);
* an unfinished run of the same configuration with checkpoints is *resumed*;
* anything else cogcal wrote there is cleared with :meth:`RunDir.clear
  <cogcal.runs.RunDir.clear>` (files cogcal did not write are never deleted, and
  a symbolic link is never followed: such a job fails with that one-line reason) and the
  run is trained again.

Jobs run in ``spawn``-ed worker processes that stay warm for the whole bench. Each job's
stdout and stderr (file descriptors 1 and 2) go to ``<run dir>/run.log``. Any exception,
``SystemExit`` or other ``BaseException`` of a job makes it a failure (``KeyboardInterrupt``
and SIGTERM: *interrupted*), never a success: a job succeeds only when it returned normally
and its folder then holds a finished run of its configuration. A worker turns SIGTERM
into :class:`cogcal._errors.Interrupted` inside the job, so ``kill <worker pid>`` stops
that one job (recorded as interrupted) and the bench goes on. Workers exit by themselves
when the bench process dies.

Jobs with identical configurations (:func:`cogcal.runs.result_fields`, e.g. a
tuning point at seed 0 and the seed-0 run at the chosen point, or a COG run that both
protocols plan identically) are trained once and copied (``reuse``); the copy's
``metrics.json`` names its source under ``"copied_from"``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import heapq
import importlib
import itertools
import json
import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any

import torch

import cogcal.train
from cogcal import _io
from cogcal._constraints import COUNT, check
from cogcal._errors import ArgumentError, Interrupted
from cogcal.runs import RUN_DIRS, RUN_FILES, RunDir, RunFolderError
from cogcal.train.config import TrainConfig, result_fields
from cogcal.train.identity import same_config

__all__ = [
    "DEFAULT_RUNNER",
    "EXECUTORS",
    "FINAL_STATUSES",
    "Job",
    "RayPool",
    "Scheduler",
    "copy_run",
    "diverged_with",
    "check_pool",
    "check_reachable",
    "reuse_key",
]

#: ``module:function`` called in the worker as ``function(config_dict, resume=bool)``.
DEFAULT_RUNNER = "cogcal.bench.executor:train_run"

#: Where jobs run: a local process pool (the default) or a Ray cluster.
EXECUTORS = ("local", "ray")

#: Statuses a job ends with.
FINAL_STATUSES = ("complete", "diverged", "failed", "interrupted")

#: Files of a run folder that a copy writes itself instead of copying.
_NOT_COPIED = ("metrics.json", "config.json", "run.log", ".cogcal.lock")

#: Seconds a worker gets to stop after SIGTERM before it is killed.
STOP_GRACE = 20.0

#: Seconds to wait for a Ray cluster's address to accept a connection.
CONNECT_TIMEOUT = 10.0


# --------------------------------------------------------------------------- run folders


def check_pool(jobs: Any, executor: Any, address: Any) -> None:
    """Raise ``ValueError`` unless ``jobs`` workers on ``executor`` (at ``address``) is a
    pool the scheduler can start."""
    check(jobs, COUNT, "jobs")
    if executor not in EXECUTORS:
        raise ArgumentError(f"`executor` must be one of {', '.join(EXECUTORS)}, got {executor!r}.")
    if address is not None and executor != "ray":
        raise ArgumentError("`address` applies to executor 'ray' only.")


def reuse_key(config: TrainConfig) -> str:
    """What identifies "the same run" between jobs: the fields that can change results
    (:func:`cogcal.runs.result_fields` of the resolved configuration); floats to
    12 significant digits (the tolerance of :func:`cogcal.train.identity.same_config`)."""
    fields = result_fields(config.resolved())
    return json.dumps(
        {k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in fields.items()},
        sort_keys=True,
        default=str,
    )


def diverged_with(folder: RunDir, config: TrainConfig) -> bool:
    """Whether ``folder`` holds a diverged outcome (``metrics.json`` status ``diverged``)
    of the same configuration."""
    outcome = folder.read_outcome()
    if outcome is None or outcome.get("status") != "diverged":
        return False
    recorded = outcome.get("config")
    return isinstance(recorded, dict) and same_config(recorded, config)


def copy_run(src: RunDir, dst: RunDir) -> None:
    """Copy the finished (or diverged) run in ``src`` to ``dst`` (hard links where possible).

    ``dst`` is cleared first (:meth:`RunDir.clear`: never through a link, never a foreign
    file); only the files cogcal wrote in ``src`` are copied; ``metrics.json`` is written
    last, with ``"copied_from"`` naming ``src``, so ``dst`` counts as finished only once
    it is whole.

    Raises
    ------
    RunFolderError
        ``dst`` cannot be cleared, or ``src`` holds no finished run.
    """
    outcome = src.read_outcome()
    if outcome is None or outcome.get("status") not in ("complete", "diverged"):
        raise RunFolderError(f"cannot copy {src.path}: it holds no finished run.")
    with dst.lock():
        dst.clear(keep_config=True)
        foreign = set(src.foreign_entries())
        files = [src.path / name for name in RUN_FILES if name not in _NOT_COPIED]
        for name in RUN_DIRS:
            sub = src.path / name
            if sub.is_dir() and not sub.is_symlink():
                files += [
                    p
                    for p in sorted(sub.rglob("*"))
                    if p.relative_to(src.path).as_posix() not in foreign
                ]
        for path in files:
            if path.is_symlink() or not path.is_file() or _io.temp_target(path.name):
                continue
            _io.link_or_copy(path, dst.path / path.relative_to(src.path))
        source = os.path.relpath(src.path, dst.path)
        saved = src.read_config()
        if saved is not None:
            dst.write_config({**saved, "out": str(dst.path)})
        _io.write_text(dst.path / "run.log", f"cogcal bench: copied from {source}\n")
        outcome = {**outcome, "copied_from": source}
        if isinstance(outcome.get("config"), dict):
            outcome["config"] = {**outcome["config"], "out": str(dst.path)}
        dst.write_outcome(outcome)


# --------------------------------------------------------------------------- worker side


def train_run(config: dict[str, Any], resume: bool = False) -> dict[str, Any]:
    """The default runner: ``cogcal.train.run(TrainConfig.from_dict(config), resume=...)``."""
    # cogcal.train.run loads the training loop on first use (start-up cost of `bench --list`)
    return cogcal.train.run(TrainConfig.from_dict(config), resume=resume)


def _resolve(runner: str) -> Callable[..., Any]:
    module, _, name = runner.partition(":")
    if not module or not name:
        raise ArgumentError(f"a runner is 'module:function', got {runner!r}.")
    return getattr(importlib.import_module(module), name)


_IN_JOB = False  # whether this worker process is running a job (signal handlers look)


def _worker_signal(signum: int, frame: object) -> None:
    """SIGTERM / SIGINT in a worker: stop the job (Interrupted); idle: exit at once."""
    if _IN_JOB:
        raise Interrupted(signum)
    os._exit(128 + signum)


def _install_worker_signals() -> None:
    with contextlib.suppress(ValueError):  # not the main thread (some Ray workers)
        signal.signal(signal.SIGTERM, _worker_signal)
        signal.signal(signal.SIGINT, _worker_signal)


def _watch_parent() -> None:
    """Exit this worker as soon as the bench process is gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait() -> None:
        mp_wait([parent.sentinel])
        os._exit(3)

    threading.Thread(target=wait, name="cogcal-parent-watch", daemon=True).start()


def _init_worker(threads: int, runner: str, warm: tuple[str, ...]) -> None:
    """Pool initializer: signals, parent watch, thread count, warm imports."""
    _install_worker_signals()
    _watch_parent()
    torch.set_num_threads(max(1, threads))
    for module in warm:
        importlib.import_module(module)
    with contextlib.suppress(ImportError, AttributeError, ValueError):
        _resolve(runner)  # errors are reported per job


def _execute(runner: str, config: dict[str, Any], resume: bool = False) -> dict[str, Any]:
    """Run one job in a worker, with fds 1 and 2 redirected into ``<out>/run.log``.

    Returns ``{"status": "returned" | "error" | "interrupted", "error", "seconds"}``; every
    exception and ``BaseException`` of the runner is caught here and reported.
    """
    global _IN_JOB
    out = Path(config["out"])
    started = time.perf_counter()
    status, error = "returned", ""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        out.mkdir(parents=True, exist_ok=True)
        log = open(out / "run.log", "ab", buffering=0)  # noqa: SIM115  (closed below)
    except OSError as err:
        os.close(saved[0])
        os.close(saved[1])
        return {"status": "error", "error": f"cannot open {out / 'run.log'}: {err}", "seconds": 0.0}
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        print(
            f"cogcal bench: {'resuming' if resume else 'run'} with config "
            f"{json.dumps(config, sort_keys=True)}",
            flush=True,
        )
        try:
            _IN_JOB = True
            _resolve(runner)(dict(config), resume=resume)
        except (Interrupted, KeyboardInterrupt) as err:
            status = "interrupted"
            name = err.signame if isinstance(err, Interrupted) else "SIGINT"
            error = f"interrupted ({name})"
            print(f"cogcal bench: {error}", flush=True)
        except BaseException as err:  # noqa: BLE001 - every outcome is reported, never success
            status = "error"
            text = str(err) or repr(err)
            error = f"{type(err).__name__}: {text}".splitlines()[0][:300]
            traceback.print_exc()
        finally:
            _IN_JOB = False
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        log.close()
    return {"status": status, "error": error, "seconds": time.perf_counter() - started}


def _ray_execute(threads: int, runner: str, config: dict[str, Any], resume: bool) -> dict:
    """A Ray task: the same job as in a local worker, with the thread count set per task."""
    _install_worker_signals()
    torch.set_num_threads(max(1, threads))
    return _execute(runner, config, resume)


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
            import ray  # optional extra, slow to import: only for --ray
        except ImportError:  # an optional extra
            raise ArgumentError(
                "--executor ray needs Ray, which is an optional extra: "
                "pip install -e '.[ray]' (or pip install 'ray>=2.9')."
            ) from None
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            check_reachable(address)
            handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
            try:
                ray.init(
                    address=address,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except ConnectionError as err:
                raise ArgumentError(
                    f"could not connect to the Ray cluster at --address {address!r}: "
                    f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                ) from None
            finally:
                # Ray's driver installs its own SIGTERM handler (sys.exit(15)): restore the
                # bench's, so that SIGTERM / SIGINT stop the bench as under the local pool
                # (the running jobs recorded, the tables and the report written, exit 143/130)
                for signum, handler in handlers.items():
                    with contextlib.suppress(ValueError, TypeError):
                        signal.signal(signum, handler)
        self.threads = threads
        self._task = ray.remote(num_cpus=threads, max_retries=0)(_ray_execute)
        self._refs: list[Any] = []

    def submit(
        self, fn: Callable[..., Any], runner: str, config: dict[str, Any], resume: bool
    ) -> cf.Future:
        if fn is not _execute:
            raise TypeError("RayPool runs cogcal bench jobs only.")
        ref = self._task.remote(self.threads, runner, config, resume)
        self._refs.append(ref)
        return ref.future()

    def stop(self) -> None:
        """Cancel every task (running ones are killed)."""
        for ref in self._refs:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self.shutdown(wait=False)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if wait and self._refs:
            with contextlib.suppress(Exception):
                self._ray.wait(self._refs, num_returns=len(self._refs))
        self._refs = []
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()


def check_reachable(address: str | None, timeout: float = CONNECT_TIMEOUT) -> None:
    """Refuse, within ``timeout`` seconds, a ``host:port`` (or ``ray://host:port``) Ray
    address where nothing accepts connections (``ray.init`` would wait for minutes)."""
    if not address or address in ("auto", "local"):
        return
    text = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return  # not host:port: let Ray interpret it
    host = host.strip("[]") or "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as err:
        reason = err.strerror or type(err).__name__
        if isinstance(err, TimeoutError | socket.timeout):
            reason = f"no answer within {timeout:g} s"
        raise ArgumentError(
            f"could not connect to the Ray cluster at `address` {address!r} ({reason}); check "
            "the address and that the cluster is running (`ray status` on its head node).",
            cli_message=f"could not connect to the Ray cluster at --address {address} "
            f"({reason}); check the address and that the cluster is running (`ray status` on "
            "its head node).",
        ) from None


# --------------------------------------------------------------------------- scheduling


@dataclass
class Job:
    """One run folder to fill.

    Attributes
    ----------
    config : TrainConfig
        The planned configuration (``out`` is the run folder).
    label : str
        Short name for progress lines and failures (``paper/mnist1d/ce/seed0``).
    kind : {"seed", "point", "effect"}
        A seed run of a method, a tuning grid point, or a run of the effect comparison.
    protocol, dataset, method : str
    seed : int
    priority : int
        Lower runs first (grid points 0, seed runs 1).
    on_done : callable, optional
        Called in the bench process with the job once it has its final status.
    point : dict, optional
        The grid point (grid-point jobs).
    variant : str, optional
        The effect variant (effect runs).
    status : str
        ``pending``, ``waiting`` (for an identical job), ``running``, then one of
        :data:`FINAL_STATUSES`.
    how : str
        For a finished job: ``trained``, ``skipped`` (finished earlier) or ``copied``.
    """

    config: TrainConfig
    label: str
    kind: str = "seed"
    protocol: str = ""
    dataset: str = ""
    method: str = ""
    seed: int = 0
    priority: int = 1
    on_done: Callable[[Job], None] | None = None
    point: dict[str, float] | None = None
    variant: str | None = None
    status: str = "pending"
    how: str = ""
    error: str = ""
    seconds: float = 0.0
    attempts: int = 0
    resumed: bool = False
    copied_from: str = ""
    waiters: list[Job] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return Path(self.config.out)

    @property
    def folder(self) -> RunDir:
        return RunDir(self.config.out)

    @property
    def key(self) -> str:
        return reuse_key(self.config)

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


class Scheduler:
    """A pool of workers running :class:`Job` s, with jobs added on the fly.

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
    executor : {"local", "ray"}
    address : str, optional
        Ray cluster address (``executor="ray"`` only).
    """

    def __init__(
        self,
        *,
        jobs: int = 1,
        runner: str = DEFAULT_RUNNER,
        reuse: bool = True,
        progress: Callable[[str], None] | None = None,
        warm: tuple[str, ...] = ("cogcal.train.runner",),
        executor: str = "local",
        address: str | None = None,
    ) -> None:
        check_pool(jobs, executor, address)
        self.executor = executor
        self.address = address
        self.jobs = jobs
        self.runner = runner
        self.reuse = reuse
        self.progress = progress
        self.expected_total: Callable[[], int] | None = None
        self.warm = warm
        self._heap: list[tuple[int, int, Job]] = []
        self._counter = itertools.count()
        self._by_key: dict[str, Job] = {}
        self.all_jobs: list[Job] = []
        self._running: dict[cf.Future[dict[str, Any]], Job] = {}
        self._future_pool: dict[cf.Future[dict[str, Any]], Any] = {}
        self._pool: cf.ProcessPoolExecutor | RayPool | None = None
        self._started = time.monotonic()
        self._last_state: tuple[Any, ...] = ()
        self._last_time = 0.0

    # -- public --------------------------------------------------------------------------
    def add(self, jobs: Iterable[Job]) -> None:
        """Queue jobs; finished ones are recognised at once (through the run contract)."""
        for job in jobs:
            self.all_jobs.append(job)
            if not self._settle_from_disk(job):
                heapq.heappush(self._heap, (job.priority, next(self._counter), job))

    def run(self) -> None:
        """Run until every queued (and newly added) job has its final status.

        On any exception or interrupt (SIGTERM as :class:`Interrupted`, SIGINT as
        ``KeyboardInterrupt``), the workers are stopped (and waited for), the running jobs
        are marked ``interrupted``, and the exception is re-raised.
        """
        try:
            while self._heap or self._running:
                self._submit_ready()
                if not self._running:
                    continue
                done, _ = cf.wait(self._running, timeout=1.0, return_when=cf.FIRST_COMPLETED)
                for future in done:
                    self._collect(future)
                self._report()
        except BaseException as err:
            name = err.signame if isinstance(err, Interrupted) else type(err).__name__
            if isinstance(err, KeyboardInterrupt):
                name = "SIGINT"
            self.stop(f"interrupted: the bench stopped ({name})")
            raise
        self.shutdown()
        self._report(force=True)

    def stop(self, reason: str) -> None:
        """Stop the workers now (SIGTERM, then SIGKILL after :data:`STOP_GRACE` s) and mark
        the running jobs (and the jobs waiting for them) ``interrupted``."""
        pool, self._pool = self._pool, None
        if isinstance(pool, RayPool):
            pool.stop()
        elif pool is not None:
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs:  # only the workers this scheduler started
                if proc.is_alive():
                    with contextlib.suppress(OSError):
                        proc.terminate()
            deadline = time.monotonic() + STOP_GRACE
            for proc in procs:
                proc.join(max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    with contextlib.suppress(OSError):
                        proc.kill()
                    proc.join(5)
        running, self._running = list(self._running.values()), {}
        self._future_pool.clear()
        for job in running:
            job.error = reason
            self._finish(job, "interrupted", notify=False)

    def shutdown(self) -> None:
        """Stop the workers after the running jobs (none are running at the end of run)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    @property
    def counts(self) -> dict[str, int]:
        """Jobs by outcome: ``trained``, ``skipped``, ``copied`` (finished, complete or
        diverged), ``diverged`` (of those), ``failed``, ``interrupted``, and ``running``."""
        c = dict.fromkeys(
            ("trained", "skipped", "copied", "diverged", "failed", "interrupted", "running"), 0
        )
        for job in self.all_jobs:
            if job.status in ("complete", "diverged"):
                c[job.how or "trained"] += 1
                c["diverged"] += job.status == "diverged"
            elif job.status in ("failed", "interrupted"):
                c[job.status] += 1
            elif job.status == "running":
                c["running"] += 1
        return c

    # -- internals -----------------------------------------------------------------------
    def _settle_from_disk(self, job: Job) -> bool:
        """Give ``job`` its final status from its folder when the contract allows it."""
        folder = job.folder
        if folder.path.is_symlink():
            job.error = (
                f"run folder {folder.path} is a symbolic link; cogcal never writes or deletes "
                "through links: remove the link or use another --out"
            )
            self._finish(job, "failed")
            return True
        if folder.finished_with(job.config):
            job.how = "skipped"
            self._finish(job, "complete")
            return True
        if diverged_with(folder, job.config):
            job.how = "skipped"
            self._finish(job, "diverged")
            return True
        return False

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
            if self._settle_from_disk(job):  # e.g. finished by a twin's copy meanwhile
                continue
            if self.reuse:
                twin = self._by_key.get(job.key)
                if twin is not None and twin is not job and same_config(twin.config, job.config):
                    if twin.status in ("complete", "diverged"):
                        self._copy(twin, job)
                        continue
                    if twin.final:
                        job.error = f"same configuration as {twin.label}, which {twin.status}"
                        self._finish(job, "failed")
                        continue
                    twin.waiters.append(job)  # queued or running: wait for it
                    job.status = "waiting"
                    continue
                self._by_key[job.key] = job
            self._start(job)

    def _start(self, job: Job, *, fresh: bool = False) -> None:
        folder = job.folder
        resume = False
        if not fresh:
            try:
                saved = folder.read_config() if folder.is_marked() else None
            except RunFolderError:
                saved = None
            resume = saved is not None and same_config(saved, job.config) and folder.has_state()
            resume = resume and not folder.is_complete()  # an edited record: trained again
        if not resume:
            try:  # under its lock; everything is checked before anything is deleted, and
                # the mark stays, so that the run may be written again beside user files
                with folder.lock():
                    folder.clear(keep_config=True)
            except (RunFolderError, OSError, ValueError) as err:
                job.error = str(err)
                self._finish(job, "failed")
                return
        job.status = "running"
        job.attempts += 1
        job.resumed = resume
        pool = self._ensure_pool()
        future = pool.submit(_execute, self.runner, job.config.to_dict(), resume)
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
            result = {"status": "error", "error": "the worker process died (twice)"}
        except BaseException as err:  # noqa: BLE001 - pool, pickling or Ray errors: a failure
            if isinstance(err, KeyboardInterrupt | Interrupted):
                raise
            result = {"status": "error", "error": f"{type(err).__name__}: {err}"}
        job.seconds = float(result.get("seconds", 0.0))
        folder = job.folder
        if result.get("status") == "interrupted":
            job.error = result.get("error") or "interrupted"
            self._finish(job, "interrupted")
        elif result.get("status") == "returned" and folder.finished_with(job.config):
            job.how = "trained"
            self._finish(job, "complete")
        elif diverged_with(folder, job.config):
            job.how = "trained"
            job.error = result.get("error", "")
            self._finish(job, "diverged")
        elif job.resumed and result.get("status") == "error" and job.attempts < 2:
            # the checkpoint it resumed from may be the problem: start over once
            self._start(job, fresh=True)
        else:
            job.error = result.get("error") or (
                "the run returned without a finished metrics.json of its configuration"
            )
            self._finish(job, "failed")

    def _recycle_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _copy(self, src: Job, dst: Job) -> None:
        try:
            copy_run(src.folder, dst.folder)
        except (OSError, ValueError) as err:
            dst.error = f"copying {src.label} failed: {err}"
            self._finish(dst, "failed")
            return
        dst.how = "copied"
        dst.copied_from = src.label
        self._finish(dst, src.status)

    def _finish(self, job: Job, status: str, *, notify: bool = True) -> None:
        job.status = status
        if status in ("complete", "diverged") and self.reuse:
            known = self._by_key.get(job.key)
            if known is None or known.status not in ("complete", "diverged"):
                self._by_key[job.key] = job
        if status in ("failed", "interrupted") and self.progress is not None and notify:
            self.progress(f"{status.upper()} {job.label}: {job.error} (log: {job.out / 'run.log'})")
        waiters, job.waiters = job.waiters, []
        for waiter in waiters:
            waiter.status = "pending"
            if status in ("complete", "diverged"):
                self._copy(job, waiter)
            else:
                waiter.error = f"same configuration as {job.label}, which {status}"
                self._finish(waiter, status if status == "interrupted" else "failed", notify=notify)
        if notify and job.on_done is not None:
            job.on_done(job)

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        c = self.counts
        finished = sum(c[k] for k in ("trained", "skipped", "copied", "failed", "interrupted"))
        total = max(self.expected_total() if self.expected_total else 0, len(self.all_jobs))
        elapsed = time.monotonic() - self._started
        running = ", ".join(j.label for j in self._running.values())
        line = (
            f"[{finished}/{total}] trained {c['trained']}, skipped {c['skipped']}, "
            f"reused {c['copied']}, failed {c['failed'] + c['interrupted']} | "
            f"{_fmt_time(elapsed)}" + (f" | running: {running}" if running else "")
        )
        state = (finished, total, running)
        now = time.monotonic()
        if force or state != self._last_state or now - self._last_time >= 30:
            self._last_state, self._last_time = state, now
            self.progress(line)


def _fmt_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"
