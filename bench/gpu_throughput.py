"""GPU training throughput of the image fast path against the machine's bf16 ceiling.

    python bench/gpu_throughput.py [--models resnet18,resnet101] [--steps 50] [--compile]

For CIFAR ResNet-18 and ResNet-101 (32x32, 10 classes) it trains COG-FC steps
(``CalibratedModel`` + ``param_groups`` + Adam, batch 256) on a synthetic CIFAR-sized
``uint8`` training set held on the GPU, with the random crop + flip augmentation done
there in batches (``BatchLoader(device="cuda")``), channels-last and bf16 autocast, and
reports images/s and the achieved TFLOP/s (FLOPs counted with
``torch.utils.flop_counter``) as a fraction of the bf16 matrix-multiply ceiling measured
on the same GPU in the same run. Exits 0 with a message when no CUDA GPU is present.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stamp import stamp  # noqa: E402
from cogcal import CalibratedModel  # noqa: E402
from cogcal.data import BatchLoader  # noqa: E402
from cogcal.data.transforms import augment_crop_flip, normalize  # noqa: E402
from cogcal.models import create_model  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)


def matmul_ceiling(n: int = 8192, iters: int = 20) -> float:
    """Measured bf16 matrix-multiply TFLOP/s (the practical ceiling of this GPU)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e12


def transform(x: torch.Tensor, *, train: bool, generator: torch.Generator | None) -> torch.Tensor:
    if train:
        x = augment_crop_flip(x, padding=4, generator=generator)
    return normalize(x, MEAN, STD)


def step_flops(model: torch.nn.Module, batch: int) -> float:
    """FLOPs of one training step (forward + backward) at ``batch`` images."""
    x = torch.randn(batch, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device="cuda")
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast("cuda", dtype=torch.bfloat16):
        F.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def measure(name: str, steps: int, batch: int, compile_model: bool) -> tuple[float, float]:
    torch.manual_seed(0)
    net = create_model(name, num_classes=10, input_shape=(3, 32, 32)).cuda()
    net = net.to(memory_format=torch.channels_last)
    model = CalibratedModel(net, calibrator="fc")
    flops = step_flops(model, batch)
    if compile_model:
        net.compile()
    opt = torch.optim.Adam(model.param_groups(lr=1e-3, calibrator_lr=1e-4), fused=True)
    images = torch.randint(0, 256, (50_000, 3, 32, 32), dtype=torch.uint8)
    labels = torch.randint(0, 10, (50_000,))
    loader = BatchLoader(
        images, labels, batch_size=batch, shuffle=True, transform=transform, train=True,
        device="cuda", drop_last=True,
    )  # fmt: skip

    def run(n: int) -> None:
        done = 0
        while done < n:
            for x, y in loader:
                x = x.contiguous(memory_format=torch.channels_last)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                done += 1
                if done == n:
                    return

    run(10)  # warm-up (and compilation)
    torch.cuda.synchronize()
    start = time.perf_counter()
    run(steps)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return steps * batch / seconds, flops * steps / seconds / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,resnet101")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--compile", action="store_true", help="also torch.compile the model")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_throughput.py: no CUDA GPU on this machine; skipped.")
        return
    torch.backends.cudnn.benchmark = True
    print(f"# bench/gpu_throughput.py | {stamp()}")
    ceiling = matmul_ceiling()
    print(f"# bf16 matmul ceiling (8192^3, measured): {ceiling:.0f} TFLOP/s")
    print(f"# batch {args.batch_size}, {args.steps} timed steps after 10 warm-up, bf16 autocast, "
          f"channels-last, data + augmentation on the GPU, compile={args.compile}")  # fmt: skip
    print(f"{'model':10s} {'images/s':>10s} {'TFLOP/s':>9s} {'of ceiling':>11s}")
    for name in args.models.split(","):
        ips, tflops = measure(name, args.steps, args.batch_size, args.compile)
        print(f"{name:10s} {ips:10.0f} {tflops:9.1f} {tflops / ceiling:11.1%}")


if __name__ == "__main__":
    main()
