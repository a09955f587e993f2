"""The ``cogcal`` command line: thin; it parses, validates and calls the layers below.

The training flags of ``train`` and ``tune`` are generated from
:class:`cogcal.train.TrainConfig` (one source of configuration). Exit statuses:

* 0: success;
* 1: the environment failed (disk full, permissions, an unwritable folder), a run
  diverged, runs of a bench failed, or cogcal has a bug: then ``cogcal: internal error``
  and the traceback (please report it);
* 2: a user error (bad flag, unknown name, missing file, unusable data, a run folder that
  cannot be used or is in use), printed as one line ``cogcal: error: ...``; these are
  the errors of one class, :class:`cogcal._errors.ArgumentError`;
* 130 / 143: interrupted by SIGINT (Ctrl-C) / SIGTERM; what was saved is kept and one
  line says how to resume.

``cogcal --debug ...`` shows the traceback instead of the one-line message.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import cogcal
import cogcal.report
import cogcal.train
from cogcal._errors import ArgumentError, Interrupted, cli_message
from cogcal.data import list_datasets
from cogcal.models import list_models
from cogcal.report.schema import PROTOCOLS
from cogcal.train.checkup import findings_of
from cogcal.train.config import add_argument, add_arguments, config_from_args
from cogcal.train.methods import get_method, list_methods
from cogcal.train.rundir import RunDir, lock_folder
from cogcal.train.tuning import Grid, edge_warning

# Start-up cost: the modules behind the commands load when a command runs, so that
# `cogcal --help` does not pay their import time (python -X importtime): the training loop
# via cogcal.train.run/tune, cogcal.load_run and cogcal.report.build_any (the packages'
# lazy attributes; the report needs pandas), cogcal.bench and cogcal.train.predict below.

__all__ = ["main", "build_parser", "UserError"]


class UserError(ArgumentError):
    """An error caused by the user's input; reported as one line, without a traceback."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line ``cogcal: error: ...`` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"cogcal: error: {message} (see `{self.prog} --help`)\n")


def _methods_lines() -> str:
    width = max(map(len, list_methods()))
    return "\n".join(f"  {m:{width}s}  {get_method(m).description}" for m in list_methods())


def _names_epilog(*, describe: bool = False) -> str:
    methods = f"methods:\n{_methods_lines()}\n" if describe else (
        f"methods: {' '.join(list_methods())}\n"
    )  # fmt: skip
    return (
        methods
        + f"datasets: {' '.join(list_datasets())}, folder:PATH, csv:PATH, package.module:function\n"
        f"models: {' '.join(list_models())}\n"
        "Names are case-insensitive."
    )


SUMMARY_KEYS = ("acc", "nll", "brier", "ece_15", "rmsce_15", "mce_15")


def _summary(result: dict) -> str:
    cfg = result["config"]
    lines = [
        f"{cfg['method']} on {cfg['dataset']} ({cfg['model']}, seed {cfg['seed']}): "
        f"lr {cfg['lr']:g}"
        + (f", calibrator lr {cfg['calibrator_lr']:g}" if cfg["calibrator_lr"] else "")
        + f", schedule {cfg['schedule']}",
        f"{'split':6s}" + "".join(f"{k:>10s}" for k in SUMMARY_KEYS),
    ]
    for split in ("val", "test"):
        vals = result[split]
        lines.append(f"{split:6s}" + "".join(f"{vals[k]:10.4f}" for k in SUMMARY_KEYS))
    lines.append(f"time {result['timing']['total_seconds']:.1f} s")
    return "\n".join(lines)


def _default_out(dataset: str, method: str, seed: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(dataset).name)
    return f"runs/{safe}-{method}-seed{seed}"


# --------------------------------------------------------------------------- train


def _cmd_train(args: argparse.Namespace) -> int:
    out = args.out if args.out is not None else _default_out(args.dataset, args.method, args.seed)
    config = config_from_args(args, out=out)
    result = cogcal.train.run(config, resume=args.resume, overwrite=args.overwrite)
    if result.get("status") != "complete":
        return 0  # another process of a multi-device run: rank 0 reports
    print(_summary(result))  # --no-progress removes the bars only
    print(
        f"wrote {out}/metrics.json; `cogcal report {out}` writes the reliability diagram "
        "and a report"
    )
    _print_health(result)
    if message := edge_warning(result.get("selection")):
        print(f"cogcal: warning: {message}", file=sys.stderr)
    return 0


def _print_health(record: dict) -> None:
    """The run's health-check findings (validation only), one warning line each."""
    for message in findings_of(record):
        print(f"cogcal: warning: {message}", file=sys.stderr)


def _train_flags(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    p.add_argument("--out", default=None, help="run folder (default: runs/DATASET-METHOD-seedN)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument(
        "--overwrite", action="store_true", help="delete the files of a previous run in --out"
    )


# --------------------------------------------------------------------------- tune


def _parse_grid(text: str, flag: str) -> list[float]:
    values: list[float] = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise UserError(
                f"{flag} expects comma-separated numbers (e.g. {flag} 1e-3,1e-2), got {text!r}."
            ) from None
        if not 0 < value < float("inf"):
            raise UserError(f"{flag} values must be positive finite numbers, got {part!r}.")
        if any(math.isclose(value, v, rel_tol=1e-9) for v in values):
            raise UserError(f"{flag} lists {value:g} twice ({text!r}); give each grid value once.")
        values.append(value)
    return values


_TUNE_DEFAULT_RATIOS = "0.01,0.1"


def _cmd_tune(args: argparse.Namespace) -> int:
    for flag, value in (("--lr", args.fixed_lr), ("--calibrator-lr", args.fixed_calibrator_lr)):
        if value is not None:
            raise UserError(
                f"{flag} is not a flag of `cogcal tune`, which chooses the learning rates: give "
                "the grid to search with --lrs (and --calibrator-ratios for COG methods), or "
                f"train one configuration with `cogcal train {flag} {value}`."
            )
    method = get_method(args.method)
    lrs = _parse_grid(args.lrs, "--lrs")
    ratios = None
    if args.calibrator_ratios is not None:
        ratios = _parse_grid(args.calibrator_ratios, "--calibrator-ratios")
        if not method.is_cog:
            raise UserError(
                f"--calibrator-ratios applies to COG methods only; method {method.name!r} "
                "trains with one learning rate (tune it with --lrs alone)."
            )
    elif method.is_cog:
        ratios = _parse_grid(_TUNE_DEFAULT_RATIOS, "--calibrator-ratios")
    grid = Grid(
        tuple(lrs),
        None if ratios is None else tuple(ratios),
        allow_fast_calibrator=args.allow_fast_calibrator,
    )
    if args.max_extensions < 0:
        raise UserError(f"--max-extensions must be >= 0, got {args.max_extensions}.")
    out = args.out or f"runs/tune-{_default_out(args.dataset, args.method, args.seed)[5:]}"
    config = config_from_args(args, out=out)
    summary = cogcal.train.tune(
        config, grid, out, max_extensions=args.max_extensions, overwrite=args.overwrite
    )
    # --no-progress removes the bars only
    for row in summary["table"]:
        point = ", ".join(f"{k}={row[k]:g}" for k in summary["axes"])
        nll = "diverged" if row["status"] == "diverged" else f"val_nll {row['val_nll']:.4f}"
        print(f"{point:32s} {nll}")
    edge = (
        f" (still at the grid edge: {', '.join(summary['edges'])})"
        if summary["at_edge"]
        else "".join(f" (at the {b})" for b in summary["bounds"])
    )
    print(f"chosen by validation NLL: {summary['best_config']}{edge}  (wrote {out}/tune.json)")
    _print_health(summary)
    return 0


def _tune_flags(p: argparse.ArgumentParser) -> None:
    # tune trains every point of its grid to the end: no lr, and no way to choose one
    add_arguments(p, exclude=("lr", "calibrator_lr", "selection"))
    p.add_argument("--lrs", default="1e-4,1e-3", help="comma-separated, log-spaced λ_f values")
    p.add_argument(
        "--calibrator-ratios", default=None,
        help=f"comma-separated λ_c/λ_f (COG methods only; default: {_TUNE_DEFAULT_RATIOS})",
    )  # fmt: skip
    # `cogcal train`'s rates: refused with a pointer to the grid flags (never taken for --lrs)
    p.add_argument("--lr", dest="fixed_lr", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--calibrator-lr", dest="fixed_calibrator_lr", default=None, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--max-extensions", type=int, default=2,
        help="times the grid may grow outward while the choice is at an edge (default: 2)",
    )  # fmt: skip
    p.add_argument("--out", default=None, help="tuning folder")
    p.add_argument(
        "--overwrite", action="store_true", help="retrain points holding another configuration"
    )


# --------------------------------------------------------------------------- bench


def _cmd_bench(args: argparse.Namespace) -> int:
    from cogcal.bench import list_suites, load_suite, run_bench  # start-up cost (see the imports)

    if args.list:
        for name in list_suites():
            print(f"{name:16s} {load_suite(name).description}")
        return 0
    protocols = None
    if args.protocol is not None:
        protocols = PROTOCOLS if args.protocol == "both" else (args.protocol,)
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise UserError(f"--jobs must be an integer >= 1, got {jobs}.")
    if args.seeds is not None and args.seeds < 1:
        raise UserError(f"--seeds must be an integer >= 1, got {args.seeds}.")
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


def _bench_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default="quick", help="suite name or YAML path (default: quick)")
    p.add_argument("--out", default=None, help="output folder (default: results/SUITE)")
    p.add_argument(
        "--jobs", type=int, default=None, help="runs trained at once (default: the CPU count)"
    )
    p.add_argument(
        "--executor", choices=("local", "ray"), default="local",
        help="local process pool (default) or a Ray cluster",
    )  # fmt: skip
    p.add_argument("--address", default=None, help="Ray cluster address (with --executor ray)")
    p.add_argument("--list", action="store_true", help="list the shipped suites and exit")
    add_argument(p, "data_root")
    p.add_argument(
        "--protocol", choices=(*PROTOCOLS, "both"), default=None,
        help="which protocol(s) to run (default: the suite's)",
    )  # fmt: skip
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default: suite's)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument(
        "--allow-plugins", action="store_true",
        help="let the suite import and call its package.module:function datasets (plugins)",
    )  # fmt: skip


# --------------------------------------------------------------------------- predict


def _cmd_predict(args: argparse.Namespace) -> int:
    from cogcal.train.predict import predict  # start-up cost (see the imports)

    out = Path(args.out) if args.out is not None else None
    if out is not None and out.exists() and not args.overwrite:
        raise UserError(f"--out {out} exists; choose another file or pass --overwrite.")
    if out is not None and out.exists() and out.resolve() == Path(args.input).resolve():
        raise UserError(f"--out {out} is the --input file; choose another file.")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be an integer >= 1, got {args.batch_size}.")
    run = cogcal.load_run(args.run, which=args.which)
    result = predict(run, args.input, batch_size=args.batch_size, progress=args.progress)
    result.write_csv(out)
    for note in result.notes:
        print(f"cogcal: {note}", file=sys.stderr)
    if out is not None:
        print(f"wrote {len(result.probabilities)} predictions to {out}", file=sys.stderr)
    return 0


def _predict_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a finished run folder (cogcal train, or cogcal.fit with out=)")
    p.add_argument(
        "--input", required=True, metavar="PATH",
        help="a CSV with the run's feature columns, an image file, a folder of images, or an "
        ".npy array of raw inputs (N, ...)",
    )  # fmt: skip
    p.add_argument("--out", default=None, metavar="FILE", help="output CSV (default: stdout)")
    p.add_argument(
        "--which", choices=("best", "last"), default="best",
        help="checkpoint: best validation Brier (default) or last",
    )  # fmt: skip
    p.add_argument("--batch-size", type=int, default=1024, help="inputs per forward pass")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--no-progress", dest="progress", action="store_false",
        help="no progress bar (shown on stderr for large inputs)",
    )  # fmt: skip


# --------------------------------------------------------------------------- calibrate


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from cogcal.train.calibration import calibrate_files  # start-up cost (see the imports)

    if args.cv < 2:
        raise UserError(f"--cv must be an integer >= 2 (folds), got {args.cv}.")
    metrics = calibrate_files(
        args.val, args.test, method=args.method.lower(), out=args.out, cv=args.cv,
        kind=args.scores, label_column=args.label_column, overwrite=args.overwrite,
        log=lambda line: print(f"cogcal: {line}", file=sys.stderr),
    )  # fmt: skip
    keys = ("acc", "nll", "brier", "ece_15")
    print(f"{'split':22s}" + "".join(f"{k:>10s}" for k in keys))
    names = {"val_before": "val, as given", "val": "val, calibrated (fit)",
             "test_before": "test, as given", "test": "test, calibrated"}  # fmt: skip
    for split, name in names.items():
        if split in metrics:
            print(f"{name:22s}" + "".join(f"{metrics[split][k]:10.4f}" for k in keys))
    print(f"wrote {args.out}/calibrator.pt (cogcal.load_calibrator({str(args.out)!r})), "
          f"metrics.json and report.html")  # fmt: skip
    return 0


def _calibrate_flags(p: argparse.ArgumentParser) -> None:
    from cogcal.posthoc import AUTO, POSTHOC_METHODS

    p.add_argument(
        "--val", required=True, metavar="PATH",
        help="validation scores: an .npz with `labels` and `logits` (or `probs`), or a CSV "
        "with a label column and one score column per class; the calibrator is fitted here",
    )  # fmt: skip
    p.add_argument(
        "--test", default=None, metavar="PATH",
        help="test scores in the same form: only evaluated (before and after), never fitted on",
    )  # fmt: skip
    p.add_argument(
        "--method", default=AUTO, type=str.lower, choices=(AUTO, *POSTHOC_METHODS),
        help="the calibrator; auto (default) chooses by cross-validated NLL on --val",
    )  # fmt: skip
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    p.add_argument("--cv", type=int, default=5, help="cross-validation folds of --method auto")
    p.add_argument(
        "--scores", choices=("logits", "probs"), default="logits",
        help="what a CSV's class columns hold (an .npz says it by its key); probabilities "
        "are calibrated as log(p)",
    )  # fmt: skip
    p.add_argument("--label-column", default="label", metavar="NAME",
                   help="the label column of a CSV (class indices or class column names)")  # fmt: skip
    p.add_argument("--overwrite", action="store_true",
                   help="replace a calibration already in --out (only its own files)")  # fmt: skip


# --------------------------------------------------------------------------- report


def _cmd_report(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    with lock_folder(directory, what=f"folder {directory}", create=False):  # before reading
        try:
            html = cogcal.report.build_any(directory)
        except ArgumentError:
            raise
        except ValueError as err:  # build_any's documented refusal of the folder: user input
            raise UserError(str(err)) from err
    print(f"wrote {directory}/report.md and {html}")
    return 0


def _report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", help="a folder written by `cogcal bench` or `cogcal train`")


# --------------------------------------------------------------------------- parser


@dataclass(frozen=True)
class _Command:
    """One subcommand: its name, what it runs, its flags and its help texts."""

    name: str
    run: Callable[[argparse.Namespace], int]
    flags: Callable[[argparse.ArgumentParser], None]
    help: str
    description: str
    resume_hint: str = ""
    list_names: bool = False  # an epilog listing methods, datasets and models


_COMMANDS: tuple[_Command, ...] = (
    _Command(
        "bench",
        _cmd_bench,
        _bench_flags,
        help="run a benchmark suite and write results.csv and a report (the main job)",
        description="Run a suite of training runs (default: the quick CPU suite), skipping "
        "runs that already finished in --out with the same configuration, then write "
        "results.csv, report.md, report.html and figures/.",
        resume_hint="run the same command again to resume",
    ),
    _Command(
        "train",
        _cmd_train,
        _train_flags,
        help="train one method on one dataset and evaluate it",
        description="Train one method with the paper's recipe and write metrics.json, "
        "checkpoints, logits and logs into --out (`cogcal report OUT` then writes the "
        "reliability diagram and a report).",
        resume_hint="resume with --resume",
        list_names=True,
    ),
    _Command(
        "tune",
        _cmd_tune,
        _tune_flags,
        help="choose learning rates by validation cross-entropy",
        description="Train on a log-spaced grid of learning rates (COG: λ_f x λ_c/λ_f "
        "ratios), extend it outward while the best point is at an edge, and choose the point "
        "with the lowest validation NLL (post-hoc methods: before calibration); writes "
        "tune.csv and tune.json.",
        resume_hint="run the same command again to continue",
        list_names=True,
    ),
    _Command(
        "predict",
        _cmd_predict,
        _predict_flags,
        help="predict class probabilities of a finished run on new inputs",
        description="Run a finished run's calibrated model (its recorded preprocessing "
        "inside) on a CSV table, an image, a folder of images or an .npy array, and write one "
        "row per input: `prediction` (the class name), then one probability column per "
        "class, named by the class (to --out, or stdout).",
    ),
    _Command(
        "calibrate",
        _cmd_calibrate,
        _calibrate_flags,
        help="calibrate a model trained elsewhere from its saved validation logits",
        description="Fit a post-hoc calibrator (temperature, vector or matrix scaling, "
        "Dirichlet, isotonic, histogram binning; `auto` chooses by cross-validated NLL) on "
        "saved validation scores, evaluate it on the test scores, and write calibrator.pt, "
        "metrics.json, reliability.png and a report into --out.",
    ),
    _Command(
        "report",
        _cmd_report,
        _report_flags,
        help="write report.md/report.html for a bench folder or a training run",
        description="Rebuild the report of a `cogcal bench` folder from its results.csv, or "
        "write a one-run report (metrics, reliability diagram, OOD and shift) into the folder "
        "of a finished `cogcal train` run.",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (all subcommands)."""
    parser = _Parser(
        prog="cogcal",
        description=(
            "Calibration in One Go: train classifiers that are accurate and calibrated in one "
            "run, and compare them with the paper's baselines."
        ),
        epilog=_names_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cogcal {cogcal.__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show full tracebacks for errors (for bug reports)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in _COMMANDS:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            **(
                {
                    "epilog": _names_epilog(describe=command.name == "train"),
                    "formatter_class": argparse.RawDescriptionHelpFormatter,
                }
                if command.list_names
                else {}
            ),
        )
        command.flags(p)
        p.set_defaults(func=command.run, resume_hint=command.resume_hint)
    return parser


# --------------------------------------------------------------------------- running


def _one_line(text: str) -> str:
    """A message on one line (multi-line messages are joined, bullets become commas)."""
    parts = [line.strip().removeprefix("- ") for line in text.splitlines() if line.strip()]
    return " ".join(parts)


def _os_error(err: OSError) -> str:
    where = f"{err.filename}: " if err.filename else ""
    reason = err.strerror or str(err)
    fix = {
        errno.ENOSPC: "free some disk space (or choose another output folder) and resume",
        errno.EACCES: "check the permissions or choose another folder",
        errno.EPERM: "check the permissions or choose another folder",
        errno.EROFS: "choose a writable folder",
        errno.EDQUOT: "free some space within your quota and resume",
    }.get(err.errno or 0, "check the path and the disk")
    return f"{where}{reason}; {fix}."


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While a command runs, SIGTERM raises :class:`Interrupted` (SIGINT already raises
    KeyboardInterrupt), so ``finally`` blocks run and what was saved is kept."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    hint = getattr(args, "resume_hint", "")
    try:
        with _signals_raise():
            return int(args.func(args) or 0)
    except (ArgumentError, FileNotFoundError) as err:  # ConfigError, RunFolderError, ...
        if args.debug:
            raise
        print(f"cogcal: error: {_one_line(cli_message(err))}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # a diverging run: the user's settings, not a bug
        if args.debug:
            raise
        print(f"cogcal: error: {_one_line(str(err))}", file=sys.stderr)
        return 1
    except OSError as err:  # the environment: disk full, permissions
        if args.debug:
            raise
        print(f"cogcal: error: {_one_line(_os_error(err))}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted) as err:
        signum = err.signum if isinstance(err, Interrupted) else int(signal.SIGINT)
        name = signal.Signals(signum).name
        if not _started(args):
            hint = ""  # nothing was started: there is nothing to resume
        print(f"cogcal: interrupted ({name})" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return 128 + signum
    except (Exception, SystemExit) as err:  # a bug (or a library's sys.exit): never success
        if args.debug:
            raise
        traceback.print_exc()
        what = f"{type(err).__name__}: {_one_line(str(err))}".rstrip(": ")
        print(
            f"cogcal: internal error ({what}); this is a bug in cogcal, not a mistake in "
            "your input: please report it with the traceback above.",
            file=sys.stderr,
        )
        return 1


def _started(args: argparse.Namespace) -> bool:
    """Whether the interrupted command had started something that can be resumed (a run
    folder with a checkpoint or a config.json of cogcal's)."""
    if args.command not in ("train", "tune"):
        return True
    default = _default_out(args.dataset, args.method, args.seed)
    folder = Path(args.out or (default if args.command == "train" else f"runs/tune-{default[5:]}"))
    if args.command == "train":
        return RunDir(folder).has_state() or RunDir(folder).is_marked()
    return folder.is_dir() and any(p.is_dir() for p in folder.iterdir())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
