"""``cogcal train``: train one method on one dataset, then print its metrics and warnings."""

from __future__ import annotations

import argparse
import sys

import cogcal.train
from cogcal.commands._common import default_out, on_free_cpus, print_health
from cogcal.train.config import config_from_args
from cogcal.train.tuning import edge_warning

__all__ = ["SUMMARY_KEYS", "run", "summary"]

SUMMARY_KEYS = ("acc", "nll", "brier", "ece_15", "rmsce_15", "mce_15")


def summary(result: dict) -> str:
    """The lines ``cogcal train`` prints for a finished run's record."""
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


@on_free_cpus
def run(args: argparse.Namespace) -> int:
    """``cogcal train``: train into ``--out`` (default: ``runs/DATASET-METHOD-seedN``)."""
    out = args.out if args.out is not None else default_out(args.dataset, args.method, args.seed)
    config = config_from_args(args, out=out)
    result = cogcal.train.run(config, resume=args.resume, overwrite=args.overwrite)
    if result.get("status") != "complete":
        return 0  # another process of a multi-device run: rank 0 reports
    print(summary(result))  # --no-progress removes the bars only
    print(
        f"wrote {out}/metrics.json; `cogcal report {out}` writes the reliability diagram "
        "and a report"
    )
    print_health(result)
    if message := edge_warning(result.get("selection")):
        print(f"cogcal: warning: {message}", file=sys.stderr)
    return 0
