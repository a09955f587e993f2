"""The ``cogcal`` command line: thin; it parses, validates and calls the layers below.

User errors (bad flags, unknown names, missing files) print one line ``cogcal: error: ...``
and exit with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import cogcal

__all__ = ["main", "build_parser", "UserError"]


class UserError(Exception):
    """An error caused by the user's input; reported as one line, without a traceback."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (no usage dump) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``train`` and ``tune`` (SPEC §1 recipe; defaults from the method)."""
    p.add_argument("--dataset", default="mnist1d", help="dataset name (default: mnist1d)")
    p.add_argument("--model", default=None, help="backbone name (default: per dataset)")
    p.add_argument("--method", default="cog-fc", help="method name (default: cog-fc)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
    p.add_argument("--epochs", type=int, default=30, help="stage-1 epochs (default: 30)")
    p.add_argument("--stage2-epochs", type=int, default=40, help="TST/V-TST stage-2 epochs")
    p.add_argument("--batch-size", type=int, default=256, help="global batch size (default: 256)")
    p.add_argument(
        "--steps-per-call", type=int, default=8, help="minibatches per Lightning training_step "
        "(amortises its per-call overhead; results do not depend on it; default: 8)"
    )  # fmt: skip
    p.add_argument(
        "--lr", type=_positive_float, default=None, help="network learning rate λ_f "
        "(default: 1e-3 for COG methods, 1e-4 for the others)"
    )  # fmt: skip
    p.add_argument(
        "--calibrator-lr", type=_positive_float, default=None,
        help="calibrator learning rate λ_c of COG methods (default: lr/10)",
    )  # fmt: skip
    p.add_argument(
        "--allow-fast-calibrator", action="store_true", help="permit --calibrator-lr >= --lr"
    )
    p.add_argument("--step-size", type=int, default=10, help="COG StepLR period in epochs")
    p.add_argument("--patience", type=int, default=None, help="early stopping patience (epochs)")
    p.add_argument("--accelerator", default="cpu", choices=("cpu", "gpu", "auto"))
    p.add_argument("--devices", type=int, default=1, help="devices per node (default: 1)")
    p.add_argument("--num-nodes", type=int, default=1, help="number of nodes (default: 1)")
    p.add_argument(
        "--strategy", default="auto", choices=("auto", "ddp"),
        help="Lightning strategy for several devices (default: auto)",
    )  # fmt: skip
    p.add_argument("--data-root", default="data", help="dataset root directory (default: data)")
    p.add_argument(
        "--precision", default="32", choices=("32", "bf16-mixed", "16-mixed"),
        help="numeric precision (bf16-mixed: autocast on GPUs; default: 32)",
    )  # fmt: skip
    p.add_argument("--channels-last", action="store_true", help="NHWC layout for image models")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or summary")


def _config_from_args(args: argparse.Namespace, out: str):
    from cogcal.train import TrainConfig

    return TrainConfig(
        dataset=args.dataset,
        model=args.model,
        method=args.method,
        seed=args.seed,
        epochs=args.epochs,
        stage2_epochs=args.stage2_epochs,
        batch_size=args.batch_size,
        steps_per_call=args.steps_per_call,
        lr=args.lr,
        calibrator_lr=args.calibrator_lr,
        allow_fast_calibrator=args.allow_fast_calibrator,
        step_size=args.step_size,
        patience=args.patience,
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=args.strategy,
        data_root=args.data_root,
        precision=args.precision,
        channels_last=args.channels_last,
        compile=args.compile,
        out=out,
        progress=not args.no_progress,
    )


SUMMARY_KEYS = ("acc", "nll", "brier", "ece_15", "rmsce_15", "mce_15")


def _summary(result: dict) -> str:
    cfg = result["config"]
    lines = [
        f"{cfg['method']} on {cfg['dataset']} ({cfg['model']}, seed {cfg['seed']}): "
        f"lr {cfg['lr']:g}"
        + (f", calibrator lr {cfg['calibrator_lr']:g}" if cfg["calibrator_lr"] else ""),
        f"{'split':6s}" + "".join(f"{k:>10s}" for k in SUMMARY_KEYS),
    ]
    for split in ("val", "test"):
        vals = result[split]
        lines.append(f"{split:6s}" + "".join(f"{vals[k]:10.4f}" for k in SUMMARY_KEYS))
    lines.append(f"time {result['timing']['total_seconds']:.1f} s")
    return "\n".join(lines)


def _cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cogcal.train import run

    out = args.out or f"runs/{args.dataset}-{args.method}-seed{args.seed}"
    config = _config_from_args(args, out)
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite contradict each other; pass one of them.")
    result = run(config, resume=args.resume, overwrite=args.overwrite)
    if result.get("status") != "complete":
        return 0  # another process of a multi-device run: rank 0 reports
    from cogcal.report.diagrams import plot_reliability

    test = Path(out) / "test_logits.npz"
    import numpy as np

    with np.load(test, allow_pickle=False) as f:
        logits, labels = f["logits"], f["labels"]
    plot_reliability(
        {config.method: (logits, labels)},
        Path(out) / "reliability.png",
        task=result["config"]["task"],
        title=f"{config.method} on {config.dataset} (test)",
    )
    if config.progress:
        print(_summary(result))
        print(f"wrote {out}/metrics.json, {out}/reliability.png")
    return 0


def _register_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train one method on one dataset and evaluate it",
        description="Train one method (with the paper's recipe) and write metrics.json, "
        "checkpoints, logits and a reliability diagram into --out.",
    )
    _add_run_arguments(p)
    p.add_argument("--out", default=None, help="run directory (default: runs/DATASET-METHOD-seedN)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument("--overwrite", action="store_true", help="delete a previous run in --out first")
    p.set_defaults(func=_cmd_train)


def _parse_grid(text: str, flag: str) -> list[float]:
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise UserError(f"{flag} expects comma-separated numbers, got {text!r}.") from None
        if not 0 < value < float("inf"):
            raise UserError(f"{flag} values must be positive, got {part!r}.")
        values.append(value)
    return values


def _cmd_tune(args: argparse.Namespace) -> int:
    from cogcal.train import get_method, tune

    method = get_method(args.method)
    lrs = _parse_grid(args.lrs, "--lrs")
    grid: list[dict] = []
    if method.cog:
        ratios = _parse_grid(args.calibrator_ratios, "--calibrator-ratios")
        for lr in lrs:
            for r in ratios:
                if r >= 1 and not args.allow_fast_calibrator:
                    raise UserError(
                        f"--calibrator-ratios {r:g} gives calibrator lr >= lr; use ratios < 1 or "
                        "pass --allow-fast-calibrator."
                    )
                grid.append({"lr": lr, "calibrator_lr": lr * r})
    else:
        grid = [{"lr": lr} for lr in lrs]
    out = args.out or f"runs/tune-{args.dataset}-{args.method}"
    config = _config_from_args(args, out)
    summary = tune(config.replace(progress=False), grid, out)
    if not args.no_progress:
        for row in summary["table"]:
            point = ", ".join(f"{k}={row[k]:g}" for k in grid[0])
            print(f"{point:40s} val_nll {row['val_nll']:.4f}  val_brier {row['val_brier']:.4f}")
        print(f"chosen by validation NLL: {summary['best']}  (wrote {out}/tune.csv)")
    return 0


def _register_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="choose learning rates by validation cross-entropy",
        description="Train on a grid of learning rates (COG: λ_f x λ_c/λ_f ratios) and choose "
        "the point with the lowest validation NLL; writes tune.csv and tune.json.",
    )
    _add_run_arguments(p)
    p.add_argument("--lrs", default="1e-3,1e-4", help="comma-separated λ_f values")
    p.add_argument(
        "--calibrator-ratios", default="0.1,0.01", help="comma-separated λ_c/λ_f (COG methods)"
    )
    p.add_argument("--out", default=None, help="tuning directory")
    p.set_defaults(func=_cmd_tune)


def _cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cogcal.bench import run_bench

    protocols = None
    if args.protocol is not None:
        protocols = ("paper", "fair") if args.protocol == "both" else (args.protocol,)
    if args.list:
        from cogcal.bench.suites import list_suites, suite_description

        for name in list_suites():
            print(f"{name:16s} {suite_description(name)}")
        return 0
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise UserError(f"--jobs must be an integer >= 1, got {jobs}.")
    if args.seeds is not None and args.seeds < 1:
        raise UserError(f"--seeds must be an integer >= 1, got {args.seeds}.")
    out = Path(args.out or f"results/{Path(args.suite).stem}")
    run_bench(
        args.suite,
        out=out,
        jobs=jobs,
        data_root=Path(args.data_root),
        protocols=protocols,
        seeds=args.seeds,
        progress=not args.quiet,
        executor=args.executor,
        address=args.address,
    )
    if not args.quiet:
        print(f"wrote {out}/results.csv, {out}/report.md and {out}/report.html")
    return 0


def _register_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="run a benchmark suite and write results.csv and a report (the main job)",
        description="Run a suite of training runs (default: the quick CPU suite), skipping "
        "runs that already finished in --out, then write results.csv, report.md, "
        "report.html and figures/.",
    )
    p.add_argument("--suite", default="quick", help="suite name or YAML path (default: quick)")
    p.add_argument("--out", default=None, help="output directory (default: results/SUITE)")
    p.add_argument(
        "--jobs", type=int, default=None, help="runs trained at once (default: the CPU count)"
    )
    p.add_argument(
        "--executor", choices=("local", "ray"), default="local",
        help="local process pool (default) or a Ray cluster",
    )  # fmt: skip
    p.add_argument("--address", default=None, help="Ray cluster address (with --executor ray)")
    p.add_argument("--list", action="store_true", help="list the shipped suites and exit")
    p.add_argument("--data-root", default="data", help="dataset root directory (default: data)")
    p.add_argument(
        "--protocol", choices=("paper", "fair", "both"), default=None,
        help="which protocol(s) to run (default: the suite's)",
    )  # fmt: skip
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default: suite's)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=_cmd_bench)


def _cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cogcal.report.build import build_report

    directory = Path(args.directory)
    if not (directory / "results.csv").is_file():
        raise UserError(
            f"{directory} has no results.csv; run `cogcal bench --out {directory}` first."
        )
    html = build_report(directory)
    print(f"wrote {directory}/report.md and {html}")
    return 0


def _register_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="rebuild report.md/report.html from a results directory",
        description="Rebuild the report of a `cogcal bench` output directory from its results.csv.",
    )
    p.add_argument("directory", help="a directory written by `cogcal bench`")
    p.set_defaults(func=_cmd_report)


#: Subcommand registrars: each adds its parser and sets ``func``.
_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _register_bench,
    _register_train,
    _register_tune,
    _register_report,
]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (all subcommands)."""
    parser = _Parser(
        prog="cogcal",
        description=(
            "Calibration in One Go: train classifiers that are accurate and calibrated in one "
            "run, and compare them with the paper's baselines."
        ),
    )
    parser.add_argument("--version", action="version", version=f"cogcal {cogcal.__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show full tracebacks for errors (for bug reports)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for register in _SUBCOMMANDS:
        register(sub)
    return parser


def _one_line(err: BaseException) -> str:
    """An error message on one line (multi-line messages are joined, bullets become commas)."""
    parts = [line.strip().removeprefix("- ") for line in str(err).splitlines() if line.strip()]
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 success, 2 user error, 1 failure)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (UserError, ValueError, FileNotFoundError) as err:
        if args.debug:
            raise
        print(f"cogcal: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # a diverging run: the user's settings, not a bug
        if args.debug:
            raise
        print(f"cogcal: error: {_one_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cogcal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
