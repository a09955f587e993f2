"""``cogcal tune``: choose the learning rates on a grid by validation cross-entropy."""

from __future__ import annotations

import argparse

import cogcal.train
from cogcal._constraints import LR_GRID, NON_NEGATIVE, check, parse_numbers
from cogcal.commands._common import UserError, default_out, on_free_cpus, print_health
from cogcal.runs.methods import get_method
from cogcal.train.config import config_from_args
from cogcal.train.tuning import Grid

__all__ = ["DEFAULT_RATIOS", "parse_grid", "run"]

#: ``--calibrator-ratios`` of COG methods when not given.
DEFAULT_RATIOS = "0.01,0.1"


def parse_grid(text: str, flag: str) -> list[float]:
    """Comma-separated grid values: positive, finite, each once (:data:`LR_GRID`), sorted.

    >>> parse_grid("1e-3,1e-2", "--lrs")
    [0.001, 0.01]
    """
    name = {"--lrs": "lrs", "--calibrator-ratios": "ratios"}.get(flag, flag.lstrip("-"))
    return list(check(parse_numbers(text, flag), LR_GRID, name, flag=flag))


def tune_out(args: argparse.Namespace) -> str:
    """The tuning folder (default: ``runs/tune-DATASET-METHOD-seedN``)."""
    return args.out or f"runs/tune-{default_out(args.dataset, args.method, args.seed)[5:]}"


def _grid(args: argparse.Namespace) -> Grid:
    for flag, value in (("--lr", args.fixed_lr), ("--calibrator-lr", args.fixed_calibrator_lr)):
        if value is not None:
            raise UserError(
                f"{flag} is not a flag of `cogcal tune`, which chooses the learning rates: give "
                "the grid to search with --lrs (and --calibrator-ratios for COG methods), or "
                f"train one configuration with `cogcal train {flag} {value}`."
            )
    method = get_method(args.method)
    lrs = parse_grid(args.lrs, "--lrs")
    ratios = None
    if args.calibrator_ratios is not None:
        ratios = parse_grid(args.calibrator_ratios, "--calibrator-ratios")
        if not method.is_cog:
            raise UserError(
                f"--calibrator-ratios applies to COG methods only; method {method.name!r} "
                "trains with one learning rate (tune it with --lrs alone)."
            )
    elif method.is_cog:
        ratios = parse_grid(DEFAULT_RATIOS, "--calibrator-ratios")
    return Grid(
        tuple(lrs),
        None if ratios is None else tuple(ratios),
        allow_fast_calibrator=args.allow_fast_calibrator,
    )


@on_free_cpus
def run(args: argparse.Namespace) -> int:
    """``cogcal tune``: train the grid, print one line per point and the choice."""
    grid = _grid(args)
    check(args.max_extensions, NON_NEGATIVE, "max_extensions", flag="--max-extensions")
    out = tune_out(args)
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
    print_health(summary)
    return 0
