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
import importlib
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from cogcal._errors import QUIET_EXIT, ArgumentError, Interrupted, cli_message, other_rank
from cogcal._version import __version__
from cogcal.commands import tune
from cogcal.commands._common import UserError, default_out
from cogcal.conformal import DEFAULT_METHOD as CONFORMAL_DEFAULT
from cogcal.conformal import METHODS as CONFORMAL_METHODS
from cogcal.data import list_datasets
from cogcal.models import list_models
from cogcal.posthoc import AUTO, POSTHOC_METHODS
from cogcal.runs import RunDir
from cogcal.runs.columns import PROTOCOLS
from cogcal.runs.methods import get_method, list_methods
from cogcal.train.config import add_argument, add_arguments

# Start-up cost: a command's module (cogcal.commands.NAME) is imported when the command
# runs, so that `cogcal --help` does not pay for the bench, the report or the predictor.

__all__ = ["main", "build_parser", "UserError"]


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


# --------------------------------------------------------------------------- train


def _train_flags(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    p.add_argument("--out", default=None, help="run folder (default: runs/DATASET-METHOD-seedN)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument(
        "--overwrite", action="store_true", help="delete the files of a previous run in --out"
    )


# --------------------------------------------------------------------------- tune


def _tune_flags(p: argparse.ArgumentParser) -> None:
    # tune trains every point of its grid to the end: no lr, and no way to choose one
    add_arguments(p, exclude=("lr", "calibrator_lr", "selection"))
    p.add_argument("--lrs", default="1e-4,1e-3", help="comma-separated, log-spaced λ_f values")
    p.add_argument(
        "--calibrator-ratios", default=None,
        help=f"comma-separated λ_c/λ_f (COG methods only; default: {tune.DEFAULT_RATIOS})",
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
    p.add_argument(
        "--sets", type=float, default=None, metavar="ALPHA",
        help="also write each input's conformal prediction set of level 1 - ALPHA (e.g. "
        "0.1), its threshold fitted on the run's validation split: columns set_size, set",
    )  # fmt: skip
    _conformal_method_flag(p, "--sets-method", "the sets' conformity score")


# --------------------------------------------------------------------------- calibrate


def _calibrate_flags(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--conformal", type=float, default=None, metavar="ALPHA",
        help="also fit conformal prediction sets of level 1 - ALPHA (e.g. 0.1): the "
        "calibrator is fitted on a stratified half of --val, the sets' threshold on the other",
    )  # fmt: skip
    _conformal_method_flag(p, "--conformal-method", "the conformity score of --conformal")


def _conformal_method_flag(p: argparse.ArgumentParser, flag: str, what: str) -> None:
    """The flag naming a conformity score of :data:`cogcal.conformal.METHODS`."""
    p.add_argument(
        flag, default=CONFORMAL_DEFAULT, type=str.lower, choices=CONFORMAL_METHODS,
        help=f"{what} (default {CONFORMAL_DEFAULT}: the smallest sets)",
    )  # fmt: skip


# --------------------------------------------------------------------------- report


def _report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", help="a folder written by `cogcal bench` or `cogcal train`")


# --------------------------------------------------------------------------- parser


@dataclass(frozen=True)
class _Command:
    """One subcommand: its name, the module that runs it, its flags and its help texts."""

    name: str
    module: str  # its `run(args) -> int` is imported when the command runs
    flags: Callable[[argparse.ArgumentParser], None]
    help: str
    description: str
    resume_hint: str = ""
    list_names: bool = False  # an epilog listing methods, datasets and models

    def run(self, args: argparse.Namespace) -> int:
        """Run the command (``cogcal.commands.NAME.run``); returns the exit status."""
        return int(importlib.import_module(self.module).run(args) or 0)


_COMMANDS: tuple[_Command, ...] = (
    _Command(
        "bench",
        "cogcal.commands.bench",
        _bench_flags,
        help="run a benchmark suite and write results.csv and a report (the main job)",
        description="Run a suite of training runs (default: the quick CPU suite), skipping "
        "runs that already finished in --out with the same configuration, then write "
        "results.csv, report.md, report.html and figures/.",
        resume_hint="run the same command again to resume",
    ),
    _Command(
        "train",
        "cogcal.commands.train",
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
        "cogcal.commands.tune",
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
        "cogcal.commands.predict",
        _predict_flags,
        help="predict class probabilities of a finished run on new inputs",
        description="Run a finished run's calibrated model (its recorded preprocessing "
        "inside) on a CSV table, an image, a folder of images or an .npy array, and write one "
        "row per input: `prediction` (the class name), then one probability column per "
        "class, named by the class (to --out, or stdout).",
    ),
    _Command(
        "calibrate",
        "cogcal.commands.calibrate",
        _calibrate_flags,
        help="calibrate a model trained elsewhere from its saved validation logits",
        description="Fit a post-hoc calibrator (temperature scaling, with or without Laplace "
        "smoothing; vector and matrix scaling and their structured forms; Dirichlet; "
        "isotonic, histogram binning, BBQ; for two classes Platt and Beta calibration; "
        "`auto` chooses by cross-validated NLL) on "
        "saved validation scores, evaluate it on the test scores, and write calibrator.pt, "
        "metrics.json, reliability.png and a report into --out.",
    ),
    _Command(
        "report",
        "cogcal.commands.report",
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
    parser.add_argument("--version", action="version", version=f"cogcal {__version__}")
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
        if other_rank():  # a process of a multi-process run, interrupted before it was
            return QUIET_EXIT + signum  # made quiet (still loading its data): rank 0 prints
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
    default = default_out(args.dataset, args.method, args.seed)
    folder = Path(args.out or default) if args.command == "train" else Path(tune.tune_out(args))
    if args.command == "train":
        return RunDir(folder).has_state() or RunDir(folder).is_marked()
    return folder.is_dir() and any(p.is_dir() for p in folder.iterdir())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
