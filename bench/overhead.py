"""Per-step overhead of COG: a plain PyTorch training step against the same step through
``CalibratedModel`` + ``param_groups``, timed side by side (interleaved) in one run.

    python bench/overhead.py [--steps 300] [--repeats 7]

Target: ratio <= 1.02 for ``calibrator="fc"`` (COG adds no pass; the ideal is 1.00).
The "2 groups" row times the plain step with its final layer in a second Adam group and
no wrapper: the part of the overhead that two learning rates cost by themselves.
The appended calibrators (``ts``, ``ms``) add one small op after the logits and are shown
for information. The COG timings include the optimiser guard (the global step pre-hook
behind ``CalibratorRateWarning``); the plain and "2 groups" timings run with it removed,
so the ratio counts its cost.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stamp import stamp  # noqa: E402
from cogcal import CalibratedModel  # noqa: E402
from cogcal.cog import _suspend_guard  # noqa: E402


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(40, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip


def time_steps(model: nn.Module, opt: torch.optim.Optimizer, x, y, steps: int) -> float:
    loss_fn = nn.functional.cross_entropy
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per timing")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timings per variant")
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = {
        "mlp (batch 256, 40 -> 10)": (mlp, torch.randn(256, 40)),
        "cnn (batch 64, 3x32x32 -> 10)": (cnn, torch.randn(64, 3, 32, 32)),
    }
    print(f"# bench/overhead.py | {stamp()}")
    print(f"# {args.repeats} interleaved repeats x {args.steps} steps, median time per step")
    print(f"{'model':32s} {'variant':10s} {'plain ms':>9s} {'cog ms':>9s} {'ratio':>7s}")
    for label, (build, x) in cases.items():
        y = torch.randint(0, 10, (x.shape[0],))
        # Reference: the plain step with its final layer in a second Adam group, the cost
        # of two learning rates by themselves (any two-rate method pays it).
        plain_model, split_model = build(), build()
        head = list(split_model[-1].parameters())
        body = [p for p in split_model.parameters() if all(p is not h for h in head)]
        plain_opt = torch.optim.Adam(plain_model.parameters(), lr=1e-3)
        split_opt = torch.optim.Adam([{"params": body, "lr": 1e-3}, {"params": head, "lr": 1e-4}])
        with _suspend_guard():  # no CalibratedModel here: time without the guard
            time_steps(plain_model, plain_opt, x, y, 20)
            time_steps(split_model, split_opt, x, y, 20)
            plain, split = [], []
            for _ in range(args.repeats):
                plain.append(time_steps(plain_model, plain_opt, x, y, args.steps) / args.steps)
                split.append(time_steps(split_model, split_opt, x, y, args.steps) / args.steps)
        p, c = statistics.median(plain), statistics.median(split)
        print(
            f"{label:32s} {'2 groups':10s} {p * 1e3:9.3f} {c * 1e3:9.3f} {c / p:7.3f}  (no wrapper)"
        )
        for kind in ("fc", "ts", "ms"):
            plain_model = build()
            cog_model = CalibratedModel(copy.deepcopy(plain_model), calibrator=kind)
            plain_opt = torch.optim.Adam(plain_model.parameters(), lr=1e-3)
            cog_opt = torch.optim.Adam(cog_model.param_groups(lr=1e-3, calibrator_lr=1e-4))
            with _suspend_guard():
                time_steps(plain_model, plain_opt, x, y, 20)  # warm-up
            time_steps(cog_model, cog_opt, x, y, 20)
            plain, cog = [], []
            for _ in range(args.repeats):
                with _suspend_guard():  # the plain step runs without the guard
                    plain.append(time_steps(plain_model, plain_opt, x, y, args.steps) / args.steps)
                cog.append(time_steps(cog_model, cog_opt, x, y, args.steps) / args.steps)
            p, c = statistics.median(plain), statistics.median(cog)
            target = "  (target <= 1.02)" if kind == "fc" else ""
            print(f"{label:32s} {kind:10s} {p * 1e3:9.3f} {c * 1e3:9.3f} {c / p:7.3f}{target}")


if __name__ == "__main__":
    main()
