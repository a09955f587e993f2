"""Per-step overhead of COG: a plain PyTorch training step against the same step through
``CalibratedModel`` + ``param_groups``, timed side by side (interleaved) in one run.

    python bench/overhead.py [--rounds 100] [--steps 10] [--threads 1] [--no-cnn]
    python bench/overhead.py --count-ops    # aten calls per mlp step of each variant
    python bench/overhead.py --resolution 5 --rounds 300   # 5 identical variants' spread

Targets (issue 25), on the mlp: ``fc`` <= 1.03 a plain step; and cogcal's own cost, what
``fc``, ``ts`` and ``ms`` add to the same arithmetic and Adam groups written in plain
PyTorch (their map), <= 2% of a plain step. The issue first asked for ``ts``/``ms`` <= 1.05
a plain step; the map alone costs more than that on a 2-vCPU machine (1.05-1.07 for a
temperature, 1.08-1.09 for a 10 x 10 matrix: every extra tensor operation costs 3-8 us of
dispatch on a 3-5 ms step), so those ratios are printed, not judged.

Variants, each in its own model and Adam optimiser:

- ``plain``: the network alone, one Adam group (the reference of every ratio).
- ``2 groups``: the plain step with its final layer in a second Adam group, no wrapper: what
  two learning rates cost by themselves (any two-rate method pays it).
- ``fc``: ``CalibratedModel(net, calibrator="fc")``: COG on the final layer, no extra op.
- ``ts map`` / ``ms map``: the network followed by the calibrator's arithmetic written in
  plain PyTorch (``z / exp(log T)``; ``F.linear(z, W, b)``), its parameters in a second
  Adam group, no cogcal: the floor for an appended calibrator, its forward, backward and
  optimiser update, on this machine.
- ``ts`` / ``ms``: ``CalibratedModel(net, calibrator="ts" | "ms")``.

The machine's speed drifts by tens of percent within seconds (shared virtual CPUs), so the
variants run in rounds of ``--steps`` steps each, interleaved in a new random order every
round (no variant always runs in the same position), and a ratio is the median over the
rounds of (variant / reference) within the same round: paired, so that a drift slows both
sides of a pair alike. ``vs map`` is the same against the variant's plain-PyTorch
equivalent (``2 groups`` for ``fc``). Separate model instances still differ by about 1% on
the mlp (``--resolution 5``: five identical instances of the ``ms map`` land at 0.995-1.008
of the first), which is more than cogcal's own cost, so that cost is measured where it can
be resolved: the same variants on a one-layer network (batch 8), rounds of 10x ``--steps``
steps, the median of the paired differences in microseconds, set against the plain mlp
step. It is Python (the wrapper's forward, the calibrator module, the optimiser guard), so
it does not depend on the network's size. Every target is judged on a 95% bootstrap
interval (rounds resampled): met when the interval lies below it, not met when above,
undecided when it spans it. The COG timings include the optimiser guard (the global step
pre-hook behind ``CalibratorRateWarning``); the other rows run with it removed, so the
figures count its cost.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stamp import stamp  # noqa: E402
from cogcal import CalibratedModel  # noqa: E402
from cogcal.cog import _suspend_guard  # noqa: E402

# variant -> (reference row, largest accepted paired ratio)
TARGETS = {"fc": ("plain", 1.03)}
# each COG variant's plain-PyTorch equivalent: the same arithmetic and Adam groups, no cogcal
MAPS = {"fc": "2 groups", "ts": "ts map", "ms": "ms map"}
# cogcal's own cost per step (variant minus its map), at most this share of a plain mlp step
OWN_TARGET = 0.02


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


class TemperatureMap(nn.Module):
    """Temperature scaling's arithmetic, written independently of cogcal."""

    def __init__(self) -> None:
        super().__init__()
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z / self.log_temperature.exp()


class MatrixMap(nn.Module):
    """Matrix scaling's arithmetic, written independently of cogcal."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(k))
        self.bias = nn.Parameter(torch.zeros(k))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(z, self.weight, self.bias)


def two_groups(body: nn.Module, head_params: list[nn.Parameter]) -> torch.optim.Optimizer:
    rest = [p for p in body.parameters() if all(p is not h for h in head_params)]
    return torch.optim.Adam([{"params": rest, "lr": 1e-3}, {"params": head_params, "lr": 1e-4}])


def variants(build: Callable[[], nn.Module]) -> dict[str, tuple[nn.Module, torch.optim.Optimizer]]:
    out: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {}
    net = build()
    out["plain"] = (net, torch.optim.Adam(net.parameters(), lr=1e-3))
    net = build()
    out["2 groups"] = (net, two_groups(net, list(net[-1].parameters())))
    for kind, calibrator in (("ts", TemperatureMap()), ("ms", MatrixMap(10))):
        model = nn.Sequential(build(), calibrator)
        out[f"{kind} map"] = (model, two_groups(model, list(calibrator.parameters())))
    for kind in ("fc", "ts", "ms"):
        model = CalibratedModel(build(), calibrator=kind)
        out[kind] = (model, torch.optim.Adam(model.param_groups(lr=1e-3, calibrator_lr=1e-4)))
    return out


def time_steps(model: nn.Module, opt: torch.optim.Optimizer, x, y, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) / steps


def interleave(models: dict, x: torch.Tensor, y: torch.Tensor, rounds: int, steps: int) -> dict:
    """Seconds per step of each model, ``rounds`` rounds of ``steps`` steps, shuffled order."""
    times: dict[str, list[float]] = {name: [] for name in models}
    order, shuffle = list(models), random.Random(0).shuffle
    for r in range(rounds + 1):  # round 0 warms every variant up and is dropped
        shuffle(order)  # no variant always runs first, or right after another one
        for name in order:
            model, opt = models[name]
            if isinstance(model, CalibratedModel):
                seconds = time_steps(model, opt, x, y, steps)
            else:
                with _suspend_guard():
                    seconds = time_steps(model, opt, x, y, steps)
            if r:
                times[name].append(seconds)
    return times


def run_case(build: Callable[[], nn.Module], x: torch.Tensor, rounds: int, steps: int) -> dict:
    y = torch.randint(0, 10, (x.shape[0],))
    return interleave(variants(build), x, y, rounds, steps)


def _pairs(times: dict[str, list[float]], name: str, reference: str, diff: bool) -> np.ndarray:
    a, b = np.asarray(times[name]), np.asarray(times[reference])
    return a - b if diff else a / b


def paired(times: dict[str, list[float]], name: str, reference: str, diff: bool = False) -> float:
    """Median over the rounds of (name / reference), or of (name - reference) with ``diff``."""
    return float(np.median(_pairs(times, name, reference, diff)))


def paired_interval(
    times: dict[str, list[float]], name: str, reference: str, diff: bool = False
) -> tuple[float, float]:
    """95% percentile-bootstrap interval of :func:`paired` (rounds resampled, seed 0)."""
    values = _pairs(times, name, reference, diff)
    picks = np.random.default_rng(0).integers(0, len(values), (2000, len(values)))
    lo, hi = np.percentile(np.median(values[picks], axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def verdict(value: tuple[float, float], limit: float) -> str:
    lo, hi = value
    if hi <= limit:
        return "met"
    return "NOT met" if lo > limit else "undecided (the interval spans the target)"


def count_ops(steps: int = 20) -> None:
    """Tensor operations (aten calls, torch profiler) per training step of each mlp variant."""
    from torch.profiler import ProfilerActivity, profile  # only this mode needs the profiler

    x = torch.randn(256, 40)
    y = torch.randint(0, 10, (256,))
    print(f"# bench/overhead.py --count-ops | {stamp()}")
    for name, (model, opt) in variants(mlp).items():
        time_steps(model, opt, x, y, 3)  # Adam's state exists from the first step on
        with _suspend_guard(), profile(activities=[ProfilerActivity.CPU]) as prof:
            time_steps(model, opt, x, y, steps)
        calls = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
        print(f"{name:9s} {calls / steps:6.0f} aten calls per step")


def resolution(copies: int, rounds: int, steps: int) -> None:
    """Paired medians of ``copies`` identical ``ms map`` instances against the first one."""
    x = torch.randn(256, 40)
    y = torch.randint(0, 10, (256,))
    models = {}
    for i in range(copies):
        calibrator = MatrixMap(10)
        model = nn.Sequential(mlp(), calibrator)
        models[f"ms map #{i}"] = (model, two_groups(model, list(calibrator.parameters())))
    times = interleave(models, x, y, rounds, steps)
    print(f"# bench/overhead.py --resolution {copies} | {stamp()} | {rounds} rounds")
    for name in times:
        print(f"{name:10s} {paired(times, name, 'ms map #0'):.3f} of ms map #0")


def tiny() -> nn.Module:
    """A one-layer network: its steps are short, so the timer resolves a few microseconds."""
    return nn.Sequential(nn.Linear(10, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100, help="interleaved rounds (mlp)")
    parser.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--no-cnn", action="store_true", help="time the mlp only")
    parser.add_argument(
        "--count-ops", action="store_true", help="only count aten operations per mlp step"
    )
    parser.add_argument(
        "--resolution",
        type=int,
        metavar="N",
        help="only time N identical instances of the ms map on the mlp, as above: how far "
        "apart separate instances of one variant land",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.count_ops:
        count_ops()
        return
    if args.resolution:
        resolution(args.resolution, args.rounds, args.steps)
        return
    cases = {"mlp (batch 256, 40 -> 10)": (mlp, torch.randn(256, 40), args.rounds)}
    if not args.no_cnn:  # a step is ~30x longer: fewer rounds
        cases["cnn (batch 64, 3x32x32 -> 10)"] = (cnn, torch.randn(64, 3, 32, 32), 10)
    print(f"# bench/overhead.py | {stamp()}")
    print(f"# rounds of {args.steps} steps per variant, interleaved; ratios: paired medians")
    print(f"{'model':30s} {'variant':9s} {'ms/step':>8s} {'vs plain':>9s} {'vs map':>7s}  target")
    verdicts = []
    for label, (build, x, rounds) in cases.items():
        times = run_case(build, x, max(1, rounds), args.steps)
        judged = label.startswith("mlp")
        if judged:
            mlp_times = times
        for name, values in times.items():
            ratio = "" if name == "plain" else f"{paired(times, name, 'plain'):9.3f}"
            floor = f"{paired(times, name, MAPS[name]):7.3f}" if name in MAPS else ""
            target = ""
            if judged and name in TARGETS:
                reference, limit = TARGETS[name]
                lo, hi = paired_interval(times, name, reference)
                value = paired(times, name, reference)
                met = verdict((lo, hi), limit)
                target = f"<= {limit} vs {reference}: {value:.3f} [{lo:.3f}, {hi:.3f}] {met}"
                verdicts.append(f"{name} {value:.3f} [{lo:.3f}, {hi:.3f}] of {reference}: {met}")
            median_ms = statistics.median(values) * 1e3
            print(f"{label:30s} {name:9s} {median_ms:8.3f} {ratio:>9s} {floor:>7s}  {target}")
        print(f"# {label}: {rounds} rounds")
    # cogcal's own cost: what a variant adds to its plain-PyTorch map, per step, in
    # microseconds. It is Python (the wrapper's forward, the calibrator module, the
    # optimiser guard) and does not depend on the network, so it is timed on a one-layer
    # network (batch 8), where a step is short enough to resolve a few microseconds, and
    # set against the plain mlp step.
    plain_mlp = statistics.median(mlp_times["plain"])
    own = run_case(tiny, torch.randn(8, 10), max(1, args.rounds), 10 * args.steps)
    print(
        f"# cogcal's own cost per step (variant - its map, one-layer network, batch 8, "
        f"{args.rounds} rounds of {10 * args.steps} steps); share of a plain mlp step "
        f"({plain_mlp * 1e3:.3f} ms)"
    )
    for name, reference in MAPS.items():
        us = paired(own, name, reference, diff=True) * 1e6
        lo, hi = (v * 1e6 for v in paired_interval(own, name, reference, diff=True))
        share = np.array([us, lo, hi]) / (plain_mlp * 1e6)
        met = verdict((share[1], share[2]), OWN_TARGET)
        print(
            f"{name:3s} vs {reference:9s} {us:6.1f} us [{lo:.1f}, {hi:.1f}] = "
            f"{share[0]:.2%} [{share[1]:.2%}, {share[2]:.2%}] of a plain mlp step "
            f"(<= {OWN_TARGET:.0%}): {met}"
        )
        verdicts.append(
            f"{name} adds {share[0]:.2%} [{share[1]:.2%}, {share[2]:.2%}] of a "
            f"plain mlp step to {reference} (<= {OWN_TARGET:.0%}): {met}"
        )
    print("# targets (mlp), median [95% bootstrap interval over rounds]:")
    for line in verdicts:
        print(f"#   {line}")


if __name__ == "__main__":
    main()
