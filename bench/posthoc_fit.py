"""Post-hoc vector / matrix scaling and Dirichlet calibration with a cross-validated penalty
against scikit-learn's ``LogisticRegressionCV`` (8 Cs, 5 folds) on the same logits, timed side
by side in one run.

    python bench/posthoc_fit.py [--repeats 3] [--threads 1]

Target: ``MatrixScaling().fit`` / ``VectorScaling().fit`` / ``Dirichlet().fit``
(``l2="cv"``: 5 folds, the default grid of 9 strengths) at most 2x the time of
``LogisticRegressionCV(Cs=8, cv=5)`` (multinomial, lbfgs) for n <= 10,000 samples and
K <= 100 classes. They do comparable work: a regularised multinomial logistic regression on
the K logits (Dirichlet: on the K log-probabilities), its strength chosen by 5-fold
cross-validation; scikit-learn is fitted on the logits for all three. Both run on ``--threads`` threads (torch's, and NumPy's BLAS
and OpenMP pools through threadpoolctl for scikit-learn: with its default pools, idle BLAS
threads spinning on a 2-core machine double its CPU time and flatter the ratio). Times are
process CPU seconds (user + system) of one fit each, the median of ``--repeats``,
interleaved, so that a shared machine slows both alike; the ratio is what to read. Both are
warmed up first (imports, the first torch optimiser).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stamp import stamp  # noqa: E402
from cogcal.calibrators import Dirichlet, MatrixScaling, VectorScaling  # noqa: E402

SIZES = ((288, 10), (1000, 2), (2000, 10), (10_000, 10), (2000, 100), (10_000, 100))


def logits_of(n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Over-confident logits of a k-class problem (a network's validation outputs)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = 2.0 * rng.normal(size=(n, k))
    z[np.arange(n), y] += 3.0
    return (3.0 * z).astype(np.float32), y


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", default=None, help="e.g. 288x10,10000x100")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from sklearn.linear_model import LogisticRegressionCV
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)

    sizes = SIZES
    if args.sizes:
        sizes = tuple(tuple(int(v) for v in s.split("x")) for s in args.sizes.split(","))
    # warm up both (first calls, caches), as scikit-learn's imports are paid here
    z, y = logits_of(100, 3)
    MatrixScaling().fit(z, y)
    print(stamp())
    ours = ("ms", "vs", "dir")
    print(f"{'n x K':>12s} {'sklearn CV':>11s}" + "".join(f" {k:>8s} {'ratio':>6s}" for k in ours))
    for n, k in sizes:
        z, y = logits_of(n, k)
        times: dict[str, list[float]] = {"sk": [], **{key: [] for key in ours}}
        fits = {
            "sk": lambda z=z, y=y: LogisticRegressionCV(Cs=8, cv=5, max_iter=1000).fit(z, y),
            "ms": lambda z=z, y=y: MatrixScaling().fit(z, y),
            "vs": lambda z=z, y=y: VectorScaling().fit(z, y),
            "dir": lambda z=z, y=y: Dirichlet().fit(z, y),
        }
        for _ in range(args.repeats):
            for key, fit in fits.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    times[key].append(cpu_seconds(fit))
        sk = statistics.median(times["sk"])
        row = "".join(
            f" {statistics.median(times[key]):7.2f}s {statistics.median(times[key]) / sk:6.2f}"
            for key in ours
        )
        print(f"{f'{n} x {k}':>12s} {sk:10.2f}s" + row)


if __name__ == "__main__":
    main()
