"""Collect the finished runs of a bench folder into the tidy ``results.csv`` (SPEC §6).

``results.csv`` has one row per value, header first, columns :data:`COLUMNS`. The run
folder ``runs/<protocol>/<dataset>/<method>/seed<k>/`` gives the first four columns; its
``metrics.json`` gives the values:

* ``"val"`` / ``"test"``: ``{metric: value}``; multi-task runs also carry
  ``"metric/task"`` keys, so their plain keys get ``task = "mean"``;
* ``"shift"``: ``{condition: {severity: {metric: value}}}`` or ``{condition: {metric:
  value}}`` (no severity), or a list of records with ``condition``, ``severity`` and
  either ``metric``/``value`` or the metrics as keys;
* ``"ood"``: ``{ood_set: {metric: value}}`` or a list of records with ``condition``.

Non-finite values (stored as ``null``) are written as ``nan``. ``runs.csv`` holds one row
per run (status, learning rates, run times, where it came from) for the report's run-time
and hyperparameter tables.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cogcal import _io

__all__ = ["COLUMNS", "RUN_COLUMNS", "collect", "iter_run_dirs", "metrics_rows", "write_results"]

#: Columns of ``results.csv`` (SPEC §6), in order.
COLUMNS: tuple[str, ...] = (
    "dataset",
    "method",
    "protocol",
    "seed",
    "split",
    "metric",
    "value",
    "task",
    "condition",
    "severity",
)

#: Columns of ``runs.csv``.
RUN_COLUMNS: tuple[str, ...] = (
    "dataset",
    "method",
    "protocol",
    "seed",
    "status",
    "model",
    "epochs",
    "lr",
    "calibrator_lr",
    "train_seconds",
    "total_seconds",
    "copied_from",
    "run_dir",
    "log",
)

_SEED_DIR = re.compile(r"^seed(\d+)$")


def iter_run_dirs(out: Path) -> Iterator[tuple[str, str, str, int, Path]]:
    """Yield ``(protocol, dataset, method, seed, path)`` for every run folder under ``out/runs``."""
    root = Path(out) / "runs"
    if not root.is_dir():
        return
    for proto_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for ds_dir in sorted(p for p in proto_dir.iterdir() if p.is_dir()):
            for m_dir in sorted(p for p in ds_dir.iterdir() if p.is_dir()):
                seeds = []
                for s_dir in m_dir.iterdir():
                    match = _SEED_DIR.match(s_dir.name)
                    if match and s_dir.is_dir():
                        seeds.append((int(match.group(1)), s_dir))
                for seed, s_dir in sorted(seeds):
                    yield proto_dir.name, ds_dir.name, m_dir.name, seed, s_dir


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if v is None:
        return math.nan
    if isinstance(v, int | float):
        return float(v)
    return None


def _split_rows(section: Any) -> Iterator[tuple[str, float, str]]:
    """``(metric, value, task)`` of a flat val/test section."""
    if not isinstance(section, dict):
        return
    multitask = any("/" in str(k) for k in section)
    for key, value in section.items():
        v = _num(value)
        if v is None:
            continue
        metric, _, task = str(key).partition("/")
        yield metric, v, (task if task else ("mean" if multitask else ""))


def _records(section: Any, kind: str) -> Iterator[tuple[str, str, str, float, str]]:
    """``(condition, severity, metric, value, task)`` of a shift/ood section."""
    if isinstance(section, list):
        for rec in section:
            if not isinstance(rec, dict):
                continue
            cond = str(rec.get("condition", rec.get("dataset", "")))
            sev = rec.get("severity", "")
            sev = "" if sev is None or kind == "ood" else str(sev)
            if "metric" in rec and "value" in rec:
                v = _num(rec["value"])
                if v is not None:
                    metric, _, task = str(rec["metric"]).partition("/")
                    yield cond, sev, metric, v, str(rec.get("task", task) or "")
                continue
            skip = {"condition", "dataset", "severity", "task"}
            flat = {k: x for k, x in rec.items() if k not in skip}
            for metric, v, task in _split_rows(flat):
                yield cond, sev, metric, v, task
        return
    if not isinstance(section, dict):
        return
    for cond, inner in section.items():
        if not isinstance(inner, dict):
            continue
        nested = inner and all(isinstance(x, dict) for x in inner.values())
        if nested and kind == "shift":
            for sev, metrics in inner.items():
                for metric, v, task in _split_rows(metrics):
                    yield str(cond), str(sev), metric, v, task
        else:
            for metric, v, task in _split_rows(inner):
                yield str(cond), "", metric, v, task


def metrics_rows(
    metrics: dict[str, Any], dataset: str, method: str, protocol: str, seed: int
) -> list[dict[str, Any]]:
    """The tidy rows of one run's ``metrics.json`` content."""
    base = {"dataset": dataset, "method": method, "protocol": protocol, "seed": seed}
    rows = []
    for split in ("val", "test"):
        for metric, value, task in _split_rows(metrics.get(split)):
            rows.append(
                {
                    **base,
                    "split": split,
                    "metric": metric,
                    "value": value,
                    "task": task,
                    "condition": "",
                    "severity": "",
                }
            )
    for split in ("shift", "ood"):
        for cond, sev, metric, value, task in _records(metrics.get(split), split):
            rows.append(
                {
                    **base,
                    "split": split,
                    "metric": metric,
                    "value": value,
                    "task": task,
                    "condition": cond,
                    "severity": sev,
                }
            )
    return rows


def _seconds(timing: Any) -> tuple[float | None, float | None]:
    if not isinstance(timing, dict):
        return None, None
    total = _num(timing.get("total_seconds"))
    if "fit_seconds" in timing:
        train = _num(timing["fit_seconds"])
    else:
        parts = [
            _num(v.get("seconds"))
            for v in timing.values()
            if isinstance(v, dict) and "seconds" in v
        ]
        parts.append(_num(timing.get("posthoc_seconds", 0.0)))
        parts = [p for p in parts if p is not None and math.isfinite(p)]
        train = sum(parts) if parts else None
    return train, total


def collect(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read every run folder of ``out``.

    Returns
    -------
    (results, runs) : tuple of lists of dict
        The tidy rows of the finished runs, and one row per run folder (finished or not).
    """
    out = Path(out)
    results: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for protocol, dataset, method, seed, path in iter_run_dirs(out):
        try:
            metrics = json.loads((path / "metrics.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            metrics = None
        complete = isinstance(metrics, dict) and metrics.get("status") == "complete"
        config = (metrics or {}).get("config") if complete else None
        config = config if isinstance(config, dict) else {}
        train_s, total_s = _seconds((metrics or {}).get("timing")) if complete else (None, None)
        runs.append(
            {
                "dataset": dataset,
                "method": method,
                "protocol": protocol,
                "seed": seed,
                "status": "complete" if complete else "failed",
                "model": config.get("model", ""),
                "epochs": config.get("epochs", ""),
                "lr": config.get("lr", ""),
                "calibrator_lr": config.get("calibrator_lr", "") or "",
                "train_seconds": "" if train_s is None else round(train_s, 3),
                "total_seconds": "" if total_s is None else round(total_s, 3),
                "copied_from": (metrics or {}).get("copied_from", "") if complete else "",
                "run_dir": str(path.relative_to(out)),
                "log": str((path / "run.log").relative_to(out)),
            }
        )
        if complete:
            results.extend(metrics_rows(metrics, dataset, method, protocol, seed))
    return results, runs


def _csv_text(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        r = dict(row)
        v = r.get("value")
        if isinstance(v, float):
            r["value"] = "nan" if math.isnan(v) else repr(v)
        writer.writerow(r)
    return buf.getvalue()


def write_results(out: Path) -> Path:
    """Write ``out/results.csv`` and ``out/runs.csv`` atomically from the run folders.

    Returns
    -------
    Path
        The path of ``results.csv``.
    """
    out = Path(out)
    results, runs = collect(out)
    _io.write_text(out / "runs.csv", _csv_text(runs, RUN_COLUMNS))
    return _io.write_text(out / "results.csv", _csv_text(results, COLUMNS))
