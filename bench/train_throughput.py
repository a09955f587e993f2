"""Training throughput of ``cogcal train``'s loop against a hand-written PyTorch loop.

    python bench/train_throughput.py [--epochs 5] [--repeats 5] [--steps-per-call 8]

Both train the same backbone on the same in-memory mnist1d data with the same batches
(``BatchLoader``), Adam and per-epoch validation. The cogcal side is the real runner
(`cogcal.train.run` with its defaults: Lightning, progress bar on, best and last
checkpoints every epoch, CSV log, deterministic kernels); its time is the stage-1 fit. Target: ratio >= 0.90 for ``cnn1d``; ``mlp`` (where fixed per-step costs
weigh most) is shown too. Timings are interleaved and the median is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stamp import stamp  # noqa: E402
from cogcal.data import load_dataset  # noqa: E402
from cogcal.models import create_model  # noqa: E402
from cogcal.train import TrainConfig, run  # noqa: E402


def plain_loop(model_name: str, data, epochs: int, batch_size: int, seed: int) -> float:
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
    for epoch in range(epochs):
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
    return time.perf_counter() - start


def cogcal_loop(
    model_name: str, root: str, epochs: int, batch_size: int, seed: int, steps_per_call: int
) -> float:
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            dataset="mnist1d", model=model_name, method="cog-fc", epochs=epochs,
            batch_size=batch_size, seed=seed, data_root=root, out=out, progress=True,
            steps_per_call=steps_per_call,
        )  # fmt: skip
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            result = run(cfg)
        return result["timing"]["stage1"]["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--data-root", default="data")
    parser.add_argument(
        "--steps-per-call", type=int, default=TrainConfig.steps_per_call, help="cogcal's setting"
    )
    args = parser.parse_args()
    data = load_dataset("mnist1d", root=args.data_root)
    n = len(data.train) * args.epochs
    print(f"# bench/train_throughput.py | {stamp()}")
    print(f"# mnist1d, {args.epochs} epochs x {len(data.train)} samples, batch {args.batch_size}, "
          f"{args.repeats} interleaved repeats, median; cogcal --steps-per-call "
          f"{args.steps_per_call}")  # fmt: skip
    print(f"{'model':8s} {'plain samples/s':>16s} {'cogcal samples/s':>17s} {'ratio':>7s}")
    for model_name in ("cnn1d", "mlp"):
        k = args.steps_per_call
        cogcal_loop(model_name, args.data_root, 1, args.batch_size, 0, k)  # warm-up
        plain, ours = [], []
        for r in range(args.repeats):
            plain.append(plain_loop(model_name, data, args.epochs, args.batch_size, r))
            ours.append(cogcal_loop(model_name, args.data_root, args.epochs, args.batch_size, r, k))
        p, c = n / statistics.median(plain), n / statistics.median(ours)
        target = "  (target >= 0.90)" if model_name == "cnn1d" else ""
        print(f"{model_name:8s} {p:16.0f} {c:17.0f} {c / p:7.3f}{target}")


if __name__ == "__main__":
    main()
