"""Per-step overhead of COG: a plain PyTorch training step against the same step through
``CalibratedModel`` + ``param_groups``, timed side by side (interleaved) in one run.

    python bench/overhead.py [--rounds 100] [--steps 10] [--threads 1]

Targets (issue 25): ``fc`` <= 1.03, ``ts`` and ``ms`` <= 1.05 a plain step on the mlp.

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
variants run in rounds of ``--steps`` steps each, interleaved, and a ratio is the median
over the rounds of (variant / plain) within the same round: paired, so that a drift slows
both sides of a pair alike. ``vs map`` is the same paired median against the floor row. The
COG timings include the optimiser guard (the global step pre-hook behind
``CalibratorRateWarning``); the other rows run with it removed, so the ratios count its cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stamp import stamp  # noqa: E402
from cogcal import CalibratedModel  # noqa: E402
from cogcal.cog import _suspend_guard  # noqa: E402

TARGETS = {"fc": 1.03, "ts": 1.05, "ms": 1.05}


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


def run_case(build: Callable[[], nn.Module], x: torch.Tensor, rounds: int, steps: int) -> dict:
    y = torch.randint(0, 10, (x.shape[0],))
    models = variants(build)
    times: dict[str, list[float]] = {name: [] for name in models}
    for r in range(rounds + 1):  # round 0 warms every variant up and is dropped
        for name, (model, opt) in models.items():
            if isinstance(model, CalibratedModel):
                seconds = time_steps(model, opt, x, y, steps)
            else:
                with _suspend_guard():
                    seconds = time_steps(model, opt, x, y, steps)
            if r:
                times[name].append(seconds)
    return times


def paired(times: dict[str, list[float]], name: str, reference: str) -> float:
    return statistics.median(a / b for a, b in zip(times[name], times[reference], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100, help="interleaved rounds (mlp)")
    parser.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--no-cnn", action="store_true", help="time the mlp only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = {"mlp (batch 256, 40 -> 10)": (mlp, torch.randn(256, 40), args.rounds)}
    if not args.no_cnn:  # a step is ~30x longer: fewer rounds
        cases["cnn (batch 64, 3x32x32 -> 10)"] = (cnn, torch.randn(64, 3, 32, 32), 10)
    print(f"# bench/overhead.py | {stamp()}")
    print(f"# rounds of {args.steps} steps per variant, interleaved; ratios: paired medians")
    print(f"{'model':30s} {'variant':9s} {'ms/step':>8s} {'vs plain':>9s} {'vs map':>7s}  target")
    for label, (build, x, rounds) in cases.items():
        times = run_case(build, x, max(1, rounds), args.steps)
        for name, values in times.items():
            ratio = "" if name == "plain" else f"{paired(times, name, 'plain'):9.3f}"
            floor = f"{paired(times, name, f'{name} map'):7.3f}" if name in ("ts", "ms") else ""
            target = f"<= {TARGETS[name]}" if name in TARGETS and label.startswith("mlp") else ""
            median_ms = statistics.median(values) * 1e3
            print(f"{label:30s} {name:9s} {median_ms:8.3f} {ratio:>9s} {floor:>7s}  {target}")
        print(f"# {label}: {rounds} rounds")


if __name__ == "__main__":
    main()
