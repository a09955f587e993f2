"""COG-FC at its defaults, against the old defaults, a wider tuning and cross-entropy +
temperature scaling, on the same seeds (issue: "calibrated at its defaults").

    python bench/defaults.py [--datasets digits,mnist1d,wine,breast_cancer] [--seeds 1]
                             [--columns old,new,tuned,ce,ce-ts] [--out results/defaults]

Columns (every run on the test split; nothing is chosen on it):

* ``old``: the previous defaults, ``--preset paper --epochs 30`` (batch 256, λ_f 1e-3,
  λ_c = λ_f/10, rates /10 every 10 epochs);
* ``new``: no flags at all (``preset auto``): the budget from the training-set size, λ_f
  and λ_c/λ_f chosen by validation cross-entropy on the small grid of
  ``cogcal.train.select`` (at most 5 runs);
* ``tuned``: the same budget, a wider grid chosen by validation cross-entropy
  (``cogcal tune``: λ_f 3.33e-4, 1e-3, 3e-3 x λ_c/λ_f 0.1, 0.3, 0.9, grown once at an
  edge);
* ``ce`` and ``ce-ts``: cross-entropy at λ 1e-3 with the same automatic budget, then
  temperature scaling fitted on validation (``--method ts``).

It prints, per dataset, the test NLL and ECE-15 (mean over seeds), the health-check
warnings of the ``new`` runs, the runs and CPU seconds each column cost, and the
acceptance check of the issue: ``new`` within NLL <= 1.3x (digits: 1.6x) and ECE-15 <=
max(0.03, 1.5x) of ``ce-ts``, or else a health warning naming the miscalibration. Finished
runs in ``--out`` are reused, so a second call only prints. scikit-learn's wine and
breast-cancer sets are written to CSV files under ``--out`` and trained as ``csv:``
datasets. CPU seconds are process times (user + system) of this process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stamp import stamp  # noqa: E402
from cogcal.train.config import TrainConfig  # noqa: E402
from cogcal.train.rundir import RunDir  # noqa: E402
from cogcal.train.runner import run, tune  # noqa: E402
from cogcal.train.select import selection_folder  # noqa: E402
from cogcal.train.tuning import Grid, point_label  # noqa: E402

DATASETS = {
    "digits": {"dataset": "digits", "model": "cnn"},
    "mnist1d": {"dataset": "mnist1d", "model": "mlp"},
    "wine": {"csv": "load_wine"},
    "breast_cancer": {"csv": "load_breast_cancer"},
}
COLUMNS = ("old", "new", "tuned", "ce", "ce-ts")
NLL_BOUND = {"digits": 1.6}  # the bound for digits; 1.3 elsewhere


def _csv(name: str, loader: str, folder: Path) -> dict[str, str]:
    """Write a scikit-learn dataset as CSV (features and a ``label`` column)."""
    import sklearn.datasets

    path = folder / f"{name}.csv"
    if not path.is_file():
        frame = getattr(sklearn.datasets, loader)(as_frame=True).frame
        frame = frame.rename(columns={"target": "label"})
        folder.mkdir(parents=True, exist_ok=True)
        frame.to_csv(path, index=False)
    return {"dataset": f"csv:{path}", "target": "label"}


def _fields(name: str, out: Path) -> dict[str, Any]:
    spec = DATASETS[name]
    if "csv" in spec:
        return _csv(name, spec["csv"], out / "data")
    return dict(spec)


def _record(folder: Path) -> dict[str, Any]:
    record = RunDir(folder).read_record()
    assert record is not None, folder
    return record.to_dict()


def _train(fields: dict[str, Any], out: Path, data_root: str) -> tuple[dict[str, Any], float]:
    """One ``cogcal train`` (reused when finished); its record and CPU seconds."""
    if RunDir(out).is_complete():
        return _record(out), 0.0
    start = time.process_time()
    record = run(
        TrainConfig.from_dict(
            {**fields, "out": str(out), "progress": False, "data_root": data_root}
        )
    )
    return record, time.process_time() - start


def _tuned(fields: dict[str, Any], out: Path, data_root: str) -> tuple[dict[str, Any], float, int]:
    """``cogcal tune`` on the wider grid; the chosen run's record, CPU seconds and runs."""
    start = time.process_time()
    config = TrainConfig.from_dict({**fields, "progress": False, "data_root": data_root})
    grid = Grid((3.33e-4, 1e-3, 3e-3), (0.1, 0.3, 0.9))
    summary = tune(config, grid, out, max_extensions=1)
    record = _record(out / point_label(summary["best"]))
    return record, time.process_time() - start, len(summary["table"])


def _mean(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="digits,mnist1d,wine,breast_cancer")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (default 1)")
    parser.add_argument("--columns", default=",".join(COLUMNS))
    parser.add_argument("--out", default="results/defaults", help="run folders (reused)")
    parser.add_argument("--data-root", default="data")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    names = [d.strip() for d in args.datasets.split(",") if d.strip()]
    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    for bad in [d for d in names if d not in DATASETS] + [c for c in columns if c not in COLUMNS]:
        parser.error(f"unknown dataset or column {bad!r}")
    out = Path(args.out)
    print(stamp())
    print(f"command: python bench/defaults.py {' '.join(sys.argv[1:])}")
    for name in names:
        base = {**_fields(name, out), "method": "cog-fc"}
        results: dict[str, list[dict[str, Any]]] = {c: [] for c in columns}
        cost: dict[str, list[float]] = {c: [] for c in columns}
        runs: dict[str, int] = {}
        for seed in range(args.seeds):
            here = out / name / f"seed{seed}"
            for column in columns:
                fields = {**base, "seed": seed}
                if column == "old":
                    fields.update(preset="paper", epochs=30)
                elif column in ("ce", "ce-ts"):
                    fields.update(method="ce" if column == "ce" else "ts", lr=1e-3)
                if column == "tuned":
                    record, seconds, runs[column] = _tuned(fields, here / "tuned", args.data_root)
                else:
                    record, seconds = _train(fields, here / column, args.data_root)
                    runs[column] = (record.get("selection") or {}).get("runs", 1)
                results[column].append(record)
                cost[column].append(seconds)
        print(f"\n## {name}  ({args.seeds} seed(s); test split)\n")
        print("| column | test NLL | test ECE-15 | λ_f, λ_c chosen | runs | CPU s |")
        print("|---|---|---|---|---|---|")
        for column in columns:
            recs = results[column]
            cfg = recs[0]["config"]
            rates = f"{cfg['lr']:g}" + (
                f", {cfg['calibrator_lr']:g}" if cfg.get("calibrator_lr") else ""
            )
            print(
                f"| {column} | {_mean([r['test']['nll'] for r in recs])} | "
                f"{_mean([r['test']['ece_15'] for r in recs])} | {rates} | {runs[column]} | "
                f"{sum(cost[column]):.0f} |"
            )
        if "new" in columns:
            for seed, rec in enumerate(results["new"]):
                for finding in (rec.get("health") or {}).get("findings") or []:
                    print(f"- seed {seed} warning: {finding['message']}")
            if "ce-ts" in columns:
                nll = statistics.mean(r["test"]["nll"] for r in results["new"])
                ece = statistics.mean(r["test"]["ece_15"] for r in results["new"])
                ref_nll = statistics.mean(r["test"]["nll"] for r in results["ce-ts"])
                ref_ece = statistics.mean(r["test"]["ece_15"] for r in results["ce-ts"])
                bound = NLL_BOUND.get(name, 1.3)
                ok = nll <= bound * ref_nll and ece <= max(0.03, 1.5 * ref_ece)
                warned = any(
                    f["kind"] in ("over-confident", "under-confident")
                    for r in results["new"]
                    for f in (r.get("health") or {}).get("findings") or []
                )
                verdict = "within" if ok else ("warned" if warned else "NOT within, no warning")
                print(
                    f"- acceptance: new/ce-ts NLL {nll / ref_nll:.2f}x (bound {bound}x), "
                    f"ECE-15 {ece:.3f} (bound {max(0.03, 1.5 * ref_ece):.3f}): {verdict}"
                )
            if any(selection_folder(out / name / f"seed{s}" / "new").is_dir() for s in range(1)):
                costs = [c for c in cost["new"] if c]
                one = [c for c in cost.get("ce", []) if c]
                if costs and one:
                    print(
                        f"- cost of the default path: {statistics.mean(costs):.0f} CPU s a seed, "
                        f"{statistics.mean(costs) / statistics.mean(one):.1f}x one ce run"
                    )


if __name__ == "__main__":
    main()
