"""Benchmark of cogcal.metrics.evaluate on 1,000,000 x 100 float32 logits.

Side by side, in one run:

* ours: acc, NLL, Brier and ECE / RMSCE / MCE at the six default bin counts in one pass
  over the logits (``StreamingMetrics`` with one ``update``: ``evaluate``'s binned stage);
* ours, all of ``evaluate(logits, labels)``: the sweep plus the metrics that need every
  sample or every class (``cwece_15``, ``adaece_15``, ``smece``, ``aurc``); reported
  alongside, without a target;
* torchmetrics: ``multiclass_calibration_error`` called once per (norm, bin count),
  3 x 6 = 18 calls, which yields the calibration errors only;
* bare: a single 15-bin ECE written directly in torch (softmax, max, bucketize, bincount).

Targets: ours <= 1/5 of the torchmetrics total, and ours <= 2x the bare single ECE.
Prints both ratios, peak memory, the hardware, torch version and repeat count.

Run: ``PYTHONPATH=src python bench/metrics.py [--n 1000000] [--k 100] [--repeats 3]``.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
import tracemalloc

import torch

from cogcal.metrics import DEFAULT_N_BINS, StreamingMetrics, evaluate


def bare_ece15(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The simplest correct single 15-bin ECE in torch (the speed floor for one pass)."""
    conf, pred = torch.softmax(logits, dim=1).max(1)
    correct = (pred == labels).to(conf.dtype)
    idx = (conf * 15).long().clamp_(max=14)
    n = torch.bincount(idx, minlength=15).to(conf.dtype)
    s_conf = torch.bincount(idx, weights=conf, minlength=15)
    s_acc = torch.bincount(idx, weights=correct, minlength=15)
    return float(((s_acc - s_conf).abs()).sum() / n.sum())


def torchmetrics_sweep(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    from torchmetrics.functional.classification import multiclass_calibration_error

    out = {}
    k = logits.shape[1]
    for norm, key in (("l1", "ece"), ("l2", "rmsce"), ("max", "mce")):
        for b in DEFAULT_N_BINS:
            out[f"{key}_{b}"] = float(
                multiclass_calibration_error(
                    logits, labels, num_classes=k, n_bins=b, norm=norm, validate_args=False
                )
            )
    return out


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times), result


def peak_extra_mb(fn) -> float:
    """Peak resident memory above the current level while running ``fn`` (Linux, MiB).

    Sampled every 2 ms from /proc/self/statm, so allocations shorter than that may be
    missed; a chunked computation shows (near) zero growth.
    """
    # torch allocations bypass tracemalloc; sample RSS from /proc with a background thread
    import threading

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    base, peak, stop = rss(), [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    try:
        fn()
    finally:
        stop.set()
        th.join()
    return (max(peak[0], rss()) - base) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--tm-repeats", type=int, default=1, help="repeats of the slow torchmetrics sweep"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(args.n, args.k, generator=g) * 3.0
    labels = torch.randint(0, args.k, (args.n,), generator=g)
    tracemalloc.stop()

    print("# cogcal.metrics benchmark")
    print(
        f"hardware: {platform.machine()} {platform.processor() or ''}".rstrip()
        + f", {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}"
    )
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?"
            )
        print(f"cpu: {model}")
    except OSError:
        pass
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, device cpu")
    print(f"input: {args.n:,} x {args.k} float32 logits ({logits.numel() * 4 / 2**20:.0f} MiB)")
    print(
        f"repeats: ours / bare {args.repeats}, interleaved (ratios use the min), "
        f"torchmetrics {args.tm_repeats}; load average at start {os.getloadavg()[0]:.2f}"
    )

    def sweep(z: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        metric = StreamingMetrics(n_bins=DEFAULT_N_BINS)
        metric.update(z, y)
        return metric.compute()

    evaluate(logits[:1000], labels[:1000])  # warm-up
    sweep(logits[:1000], labels[:1000])
    bare_ece15(logits[:1000], labels[:1000])

    # interleaved, so that load from other processes hits both sides alike
    t_ours, t_bare = [], []
    for _ in range(args.repeats):
        o_min, _, ours = timed(lambda: sweep(logits, labels), 1)
        b_min, _, bare = timed(lambda: bare_ece15(logits, labels), 1)
        t_ours.append(o_min)
        t_bare.append(b_min)
    ours_min, ours_med = min(t_ours), statistics.median(t_ours)
    bare_min, bare_med = min(t_bare), statistics.median(t_bare)
    tm_min, tm_med, tm = timed(lambda: torchmetrics_sweep(logits, labels), args.tm_repeats)
    full_min, full_med, _ = timed(lambda: evaluate(logits, labels), 1)

    mem_ours = peak_extra_mb(lambda: sweep(logits, labels))
    mem_full = peak_extra_mb(lambda: evaluate(logits, labels))
    mem_bare = peak_extra_mb(lambda: bare_ece15(logits, labels))

    worst = max(abs(ours[k] - tm[k]) for k in tm)
    print()
    print(f"{'':34s}{'min s':>9s}{'median s':>10s}{'peak extra MiB':>16s}")
    print(f"{'ours: full sweep (21 metrics)':34s}{ours_min:9.3f}{ours_med:10.3f}{mem_ours:16.1f}")
    print(f"{'ours: all of evaluate':34s}{full_min:9.3f}{full_med:10.3f}{mem_full:16.1f}")
    print(f"{'torchmetrics: 18 calls':34s}{tm_min:9.3f}{tm_med:10.3f}{'':>16s}")
    print(f"{'bare single 15-bin ECE':34s}{bare_min:9.3f}{bare_med:10.3f}{mem_bare:16.1f}")
    print()
    r_tm, r_bare = ours_min / tm_min, ours_min / bare_min
    print(
        f"ours / torchmetrics total = {r_tm:.3f}  (target <= 0.200: {'OK' if r_tm <= 0.2 else 'MISSED'})"
    )
    print(
        f"ours / bare single ECE    = {r_bare:.3f}  (target <= 2.000: {'OK' if r_bare <= 2 else 'MISSED'})"
    )
    print(f"max |ours - torchmetrics| over the 18 calibration errors = {worst:.2e}")
    print(f"ece_15: ours {ours['ece_15']:.6f}, torchmetrics {tm['ece_15']:.6f}, bare {bare:.6f}")
    print(f"process peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
