"""Training throughput of cogcal's loop against a hand-written PyTorch loop.

    python bench/train_throughput.py [--epochs 5] [--repeats 5] [--data-root data]

All sides train the same backbone on the same in-memory mnist1d data with the same batches
(``BatchLoader``), Adam (network on 1e-3, final layer on 1e-4) and a validation pass per
epoch:

* ``plain``: the hand-written loop (forward, backward, step; validation Brier per epoch);
* ``train``: ``cogcal.train.run`` with its defaults (one CPU process, progress bar on,
  streaming validation metrics, ``last.ckpt`` at most every ``--checkpoint-seconds`` and
  after the stage's last epoch, ``best.ckpt`` brought up to date with each write, both
  fsynced, CSV log); its time is the stage-1 loop (``timing.stage1.seconds``);
* ``fit``: ``cogcal.fit`` on the same tensors, timed the same way.

Target: ratio >= 0.95 for both ``mlp`` and ``cnn1d`` (``docs/performance.md``). The three
sides run one after the other in each repeat, so each repeat gives a paired ratio
(``plain`` time / ``train`` time, measured a second apart); ``ratio`` is the median of those
paired ratios, printed with their range, and the samples/s columns are the medians of each
side's repeats. On a shared machine whose speed moves by tens of percent within seconds
(docs/performance.md), the median paired ratio over many short repeats is the stable figure.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cogcal  # noqa: E402
from _stamp import stamp  # noqa: E402
from cogcal.data import load_dataset  # noqa: E402
from cogcal.models import create_model  # noqa: E402
from cogcal.train import TrainConfig, run  # noqa: E402

#: (stage seconds, seconds of each epoch)
Timed = tuple[float, list[float]]


def plain_loop(model_name: str, data, epochs: int, batch_size: int, seed: int, **_) -> Timed:
    """The hand-written baseline: seconds for `epochs` of training plus validation."""
    torch.manual_seed(seed)
    model = create_model(model_name, num_classes=data.num_classes, input_shape=data.input_shape)
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not n.startswith("head.")],
            "lr": 1e-3,
        },
        {"params": list(model.head.parameters()), "lr": 1e-4},
    ]
    opt = torch.optim.Adam(groups)
    train = data.loader("train", batch_size, seed=seed)
    val = data.loader("val", 1024)
    start = time.perf_counter()
    per_epoch = []
    for epoch in range(epochs):
        epoch_start = time.perf_counter()
        model.train()
        train.set_epoch(epoch)
        for x, y in train:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            brier = sum(
                ((F.softmax(model(x), 1) - F.one_hot(y, data.num_classes)) ** 2).sum()
                for x, y in val
            )
        _ = float(brier)
        per_epoch.append(time.perf_counter() - epoch_start)
    return time.perf_counter() - start, per_epoch


def train_loop(
    model_name: str, data, epochs: int, batch_size: int, seed: int, *, root: str, **options
) -> Timed:
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            dataset="mnist1d", model=model_name, method="cog-fc", epochs=epochs, lr=1e-3,
            batch_size=batch_size, seed=seed, data_root=root, out=out, progress=True, **options,
        )  # fmt: skip
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            result = run(cfg)
        with open(Path(out) / "logs" / "stage1.csv", newline="") as f:
            per_epoch = [float(row["seconds"]) for row in csv.DictReader(f)]
        return result["timing"]["stage1"]["seconds"], per_epoch


def fit_loop(model_name: str, data, epochs: int, batch_size: int, seed: int, **options) -> Timed:
    torch.manual_seed(seed)
    model = create_model(model_name, num_classes=data.num_classes, input_shape=data.input_shape)
    train = (data.transform(data.train.x), data.train.y)
    val = (data.transform(data.val.x), data.val.y)
    with contextlib.redirect_stderr(io.StringIO()):
        result = cogcal.fit(
            model, train, val, method="cog-fc", epochs=epochs, batch_size=batch_size, seed=seed,
            lr=1e-3, **{k: v for k, v in options.items() if k != "root"},
        )  # fmt: skip
    return result.timing["stage1"]["seconds"], [row["seconds"] for row in result.history]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--models", default="mlp,cnn1d")
    parser.add_argument(
        "--checkpoint-seconds", type=float, default=None,
        help="passed to train and fit (default: TrainConfig's, 30; 0: a checkpoint every epoch)",
    )  # fmt: skip
    args = parser.parse_args()
    options: dict = {"root": args.data_root}
    if args.checkpoint_seconds is not None:
        options["checkpoint_seconds"] = args.checkpoint_seconds
    data = load_dataset("mnist1d", root=args.data_root)
    n = len(data.train) * args.epochs
    print(f"# bench/train_throughput.py | {stamp()}")
    print(
        f"# mnist1d, {args.epochs} epochs x {len(data.train)} samples, batch {args.batch_size}, "
        f"{args.repeats} interleaved repeats; samples/s: median of each side; ratio: median "
        "[min-max] of the per-repeat paired ratios; target ratio >= 0.95"
    )
    print(
        f"{'model':8s} {'plain/s':>9s} {'train/s':>9s} {'ratio':>6s} {'[range]':>13s} "
        f"{'fit/s':>9s} {'ratio':>6s} {'[range]':>13s}"
    )
    loops = (plain_loop, train_loop, fit_loop)
    breakdown = []
    for model_name in args.models.split(","):
        for loop in loops[1:]:  # warm-up
            loop(model_name, data, 1, args.batch_size, 0, **options)
        timed: list[list[Timed]] = [[], [], []]
        for r in range(args.repeats):
            for side, loop in zip(timed, loops, strict=True):
                side.append(loop(model_name, data, args.epochs, args.batch_size, r, **options))
        plain, ours, fits = ([t for t, _ in side] for side in timed)
        cols = []
        for side in (ours, fits):
            paired = [a / b for a, b in zip(plain, side, strict=True)]
            cols.append(
                f"{n / statistics.median(side):9.0f} {statistics.median(paired):6.3f} "
                f"[{min(paired):.3f}-{max(paired):.3f}]"
            )
        print(f"{model_name:8s} {n / statistics.median(plain):9.0f} {' '.join(cols)}")
        epoch_ms = [1e3 * statistics.median([e for _, es in side for e in es]) for side in timed]
        beyond = [1e3 * statistics.median([t - sum(es) for t, es in side]) for side in timed[1:]]
        breakdown.append(
            f"#   {model_name}: median epoch {epoch_ms[0]:.2f} / {epoch_ms[1]:.2f} / "
            f"{epoch_ms[2]:.2f} ms (plain / train / fit); a stage beyond its epochs' own time "
            f"(the per-epoch bookkeeping after each epoch's clock, the end): train "
            f"{beyond[0]:.1f} ms, fit {beyond[1]:.1f} ms"
        )
    print("# inside the loops (history[*].seconds):")
    print("\n".join(breakdown))


if __name__ == "__main__":
    main()
