"""Which post-hoc calibrator is strongest on the ``quick`` suite's networks.

    python bench/strongest_posthoc.py [--seeds 3] [--out /tmp/strongest] [--data-root data]

Trains cross-entropy as the ``quick`` suite does (its fair budget: at most 40 epochs, the
step schedule every 10, patience 10 on validation Brier, batch 256) on its two datasets,
mnist1d + ``mlp`` at λ_f 1e-2 and ``blobs-100`` + ``mlp`` at 3e-3 (the learning rates
``quick``'s tuning chose, docs/bench.md), one run per seed (reused when already in
``--out``). Each post-hoc calibrator of ``--methods`` is then fitted on the run's validation
logits exactly as the training method of the same name fits it
(:func:`cogcal.calibrators.make_calibrator`, default hyperparameters) and scored on its
test logits by :func:`cogcal.metrics.evaluate`. Prints, per dataset, the mean ± sample std
over seeds of test accuracy, NLL, Brier and ECE-15, the fit's wall seconds (one thread),
and how many seeds each method had the lowest NLL.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from cogcal.calibrators import make_calibrator
from cogcal.metrics import evaluate
from cogcal.train import TrainConfig, run

#: dataset -> learning rate quick's tuning chose for ``ce`` (docs/bench.md)
DATASETS = {"mnist1d": 1e-2, "blobs-100": 3e-3}
METHODS = ("ts", "ms", "dirichlet", "isotonic", "histogram", "ts-laplace", "svs", "sms")
METRICS = ("acc", "nll", "brier", "ece_15")


def _ce_run(dataset: str, lr: float, seed: int, out: Path, data_root: Path) -> Path:
    folder = out / dataset / f"seed{seed}"
    if not (folder / "metrics.json").is_file():
        config = TrainConfig(
            dataset=dataset, model="mlp", method="ce", lr=lr, seed=seed, epochs=40,
            schedule="step", step_size=10, patience=10, batch_size=256,
            data_root=str(data_root), out=str(folder), progress=False,
        )  # fmt: skip
        run(config, overwrite=True)
    return folder


def _logits(folder: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    with np.load(folder / f"{split}_logits.npz") as f:
        return torch.from_numpy(f["logits"]).double(), torch.from_numpy(f["labels"]).long()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/strongest-posthoc"))
    parser.add_argument("--data-root", type=Path, default=Path("data"))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--datasets", default=",".join(DATASETS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    methods = ("ce", *args.methods.split(","))
    for dataset in args.datasets.split(","):
        scores: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
        for seed in range(args.seeds):
            folder = _ce_run(dataset, DATASETS[dataset], seed, args.out, args.data_root)
            val, test = _logits(folder, "val"), _logits(folder, "test")
            scores["ce"].append({**evaluate(*test), "seconds": 0.0})
            for method in methods[1:]:
                start = time.perf_counter()
                calibrator = make_calibrator(method).fit(*val)
                seconds = time.perf_counter() - start
                with torch.no_grad():
                    calibrated = calibrator(test[0])
                scores[method].append({**evaluate(calibrated, test[1]), "seconds": seconds})
                print(f"{dataset} seed {seed} {method}: nll {scores[method][-1]['nll']:.4f}")
        best = [min(methods, key=lambda m: scores[m][s]["nll"]) for s in range(args.seeds)]
        print(f"\n{dataset} (test, mean ± std over {args.seeds} seeds)\n")
        print("| method | " + " | ".join(METRICS) + " | fit s | lowest NLL |")
        print("|---" * (len(METRICS) + 3) + "|")
        for m in methods:
            cells = []
            for key in (*METRICS, "seconds"):
                values = [s[key] for s in scores[m]]
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"{statistics.mean(values):.3f} ± {sd:.3f}")
            print(f"| `{m}` | " + " | ".join(cells) + f" | {best.count(m)} |")
        print()


if __name__ == "__main__":
    main()
