"""``cogcal bench``: run a suite into a bench folder, then render its report.

:func:`run_bench` is :func:`cogcal.bench.run_suite` (which runs the suite and writes the
tables) followed by the report (:func:`cogcal.report.build_report`), which is written even
when the bench was interrupted, for what had finished, before the interrupt is re-raised.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cogcal._constraints import COUNT, check
from cogcal._errors import Interrupted
from cogcal.bench import BenchSummary, Suite, list_suites, load_suite, run_suite
from cogcal.report.build import build_report
from cogcal.runs.columns import PROTOCOLS
from cogcal.runs.layout import lock_folder

__all__ = ["run", "run_bench"]


def _stderr(line: str) -> None:
    print(f"cogcal bench: {line}", file=sys.stderr, flush=True)


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
    runner: str | None = None,
    executor: str = "local",
    address: str | None = None,
    allow_plugins: bool = False,
) -> BenchSummary:
    """Run a benchmark suite into ``out`` and write the tables and the report.

    The parameters are those of :func:`cogcal.bench.run_suite`, and ``report``: build
    ``report.md`` / ``report.html`` at the end (after an interrupt too, for what finished,
    before the interrupt is re-raised).

    Returns
    -------
    BenchSummary
        The counts of the session; ``summary.failed`` is non-zero when runs failed, were
        interrupted or blocked.
    """
    out = Path(out).expanduser()
    try:
        summary = run_suite(
            suite, out=out, jobs=jobs, data_root=data_root, protocols=protocols, seeds=seeds,
            progress=progress, runner=runner, executor=executor, address=address,
            allow_plugins=allow_plugins,
        )  # fmt: skip
    except (Interrupted, KeyboardInterrupt):
        if report and (out / "results.csv").is_file():  # the tables of what finished
            try:
                _report(out, progress)
            except Exception as err:  # the interrupt is what the caller must see
                _stderr(f"the report could not be built ({type(err).__name__}: {err})")
        raise
    if report:
        _report(out, progress)
    return summary


def _report(out: Path, progress: bool) -> None:
    with lock_folder(out, what=f"bench folder {out}"):  # no bench writes it meanwhile
        html = build_report(out)
    if progress:
        _stderr(f"report: {html}")


def run(args: argparse.Namespace) -> int:
    """``cogcal bench``: ``--list`` the suites, or run one (exit 1 when runs failed)."""
    if args.list:
        for name in list_suites():
            print(f"{name:16s} {load_suite(name).description}")
        return 0
    protocols = None
    if args.protocol is not None:
        protocols = PROTOCOLS if args.protocol == "both" else (args.protocol,)
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    check(jobs, COUNT, "jobs", flag="--jobs")
    if args.seeds is not None:
        check(args.seeds, COUNT, "seeds", flag="--seeds")
    out = Path(args.out or f"results/{Path(args.suite).stem}")
    summary = run_bench(
        args.suite,
        out=out,
        jobs=jobs,
        data_root=Path(args.data_root),
        protocols=protocols,
        seeds=args.seeds,
        progress=not args.quiet,
        executor=args.executor,
        address=args.address,
        allow_plugins=args.allow_plugins,
    )
    if not args.quiet:
        print(f"wrote {out}/results.csv, {out}/report.md and {out}/report.html")
    failed = getattr(summary, "failed", 0)
    if failed:
        print(f"cogcal: error: {failed} run(s) failed; see {out}/failed.txt", file=sys.stderr)
        return 1
    return 0
