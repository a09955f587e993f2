"""Write the tables of a bench folder from its planned runs (schemas: :mod:`cogcal.runs.columns`).

* ``results.csv`` (docs/method.md §6): one row per value of every finished seed run of the
  ``paper`` and ``fair`` protocols, columns :data:`~cogcal.runs.columns.RESULT_COLUMNS`.
  Values come from each run's record (:meth:`RunDir.read_record
  <cogcal.runs.RunDir.read_record>`): ``"val"`` / ``"test"`` give ``{metric: value}``
  (multi-task runs also ``"metric/task"`` keys, so their plain keys get ``task = "mean"``);
  ``"shift"`` gives ``{condition: {severity: {metric: value}}}`` (or ``{condition:
  {metric: value}}``); ``"ood"`` gives ``{ood_set: {metric: value}}``. Non-finite values
  (stored as ``null``) are written as ``nan``. Method names are never decorated.
* ``runs.csv``: one row per planned seed run (:data:`~cogcal.runs.columns.RUN_COLUMNS`),
  also those not started yet (status ``not started``: an interrupted bench).
* ``tuning.csv``: one row per trained grid point of every tuning group
  (:data:`~cogcal.runs.columns.TUNING_COLUMNS`); the effect's own group has protocol
  ``effect``.
* ``effect.csv``: the runs of the "where COG's effect comes from" comparison
  (:data:`~cogcal.runs.columns.EFFECT_COLUMNS`), val and test values.

Only the runs of the current plan are collected: a run folder left by another suite or
another selection of protocols and seeds never enters the tables.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cogcal import _io
from cogcal.runs import RunDir, RunRecord
from cogcal.runs.bench import NOT_STARTED
from cogcal.runs.columns import EFFECT_COLUMNS, RESULT_COLUMNS, RUN_COLUMNS, TUNING_COLUMNS

__all__ = [
    "effect_rows",
    "metrics_rows",
    "run_rows",
    "tuning_rows",
    "write_csv",
    "write_tables",
]


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
    metrics: dict[str, Any],
    dataset: str,
    method: str,
    protocol: str,
    seed: int,
    splits: tuple[str, ...] = ("val", "test", "shift", "ood"),
) -> list[dict[str, Any]]:
    """The tidy ``results.csv`` rows of one run record (``metrics.json`` content)."""
    base = {"dataset": dataset, "method": method, "protocol": protocol, "seed": seed}
    rows = []
    for split in ("val", "test"):
        if split not in splits:
            continue
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
        if split not in splits:
            continue
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
    """(training seconds: the stages and the post-hoc fit, total seconds) of a record."""
    if not isinstance(timing, dict):
        return None, None
    total = _num(timing.get("total_seconds"))
    parts = [
        _num(v.get("seconds")) for v in timing.values() if isinstance(v, dict) and "seconds" in v
    ]
    parts.append(_num(timing.get("posthoc_seconds", 0.0)))
    parts = [p for p in parts if p is not None and math.isfinite(p)]
    return (sum(parts) if parts else None), total


def _fmt(v: Any) -> Any:
    return "" if v is None else v


def _record(job: Any) -> RunRecord | None:
    return RunDir(job.out).read_record() if job.status == "complete" else None


def run_rows(
    jobs: Iterable[Any],
    blocked: Iterable[Any],
    out: Path,
    planned: Iterable[tuple[str, str, str, int, Path]] = (),
) -> list[dict[str, Any]]:
    """``runs.csv`` rows: every seed run that has a final status, the blocked ones, then every
    other ``planned`` run ``(protocol, dataset, method, seed, run_dir)``, with the status
    :data:`NOT_STARTED` (an interrupted bench lists what it has not run yet)."""
    rows = _final_rows(jobs, blocked, out)
    seen = {(r["protocol"], r["dataset"], r["method"], int(r["seed"])) for r in rows}
    for protocol, dataset, method, seed, run_dir in planned:
        if (protocol, dataset, method, int(seed)) in seen:
            continue
        seen.add((protocol, dataset, method, int(seed)))
        row = dict.fromkeys(RUN_COLUMNS, "")
        row.update(dataset=dataset, method=method, protocol=protocol, seed=seed,
                   status=NOT_STARTED, run_dir=_rel(run_dir, out))  # fmt: skip
        rows.append(row)
    return rows


def _final_rows(jobs: Iterable[Any], blocked: Iterable[Any], out: Path) -> list[dict[str, Any]]:
    rows = []
    for job in jobs:
        if job.kind != "seed" or not job.final:
            continue
        record = _record(job)
        resolved = job.config.resolved()
        train_s, total_s = _seconds(record.timing) if record is not None else (None, None)
        rows.append(
            {
                "dataset": job.dataset,
                "method": job.method,
                "protocol": job.protocol,
                "seed": job.seed,
                "status": job.status,
                "model": _fmt(resolved.get("model")),
                "epochs": resolved["epochs"],
                "schedule": resolved["schedule"],
                "lr": resolved["lr"],
                "calibrator_lr": _fmt(resolved["calibrator_lr"]),
                "train_seconds": "" if train_s is None else round(train_s, 3),
                "total_seconds": "" if total_s is None else round(total_s, 3),
                "copied_from": _fmt(record.copied_from if record is not None else None),
                "run_dir": _rel(job.out, out),
                "log": _rel(job.out / "run.log", out),
            }
        )
    for b in blocked:
        if b.variant is not None:
            continue
        rows.append(
            {
                "dataset": b.dataset,
                "method": b.method,
                "protocol": b.protocol,
                "seed": b.seed,
                "status": "failed",
                "model": "",
                "epochs": "",
                "schedule": "",
                "lr": "",
                "calibrator_lr": "",
                "train_seconds": "",
                "total_seconds": "",
                "copied_from": "",
                "run_dir": _rel(b.run_dir, out),
                "log": "",
            }
        )
    return rows


def _rel(path: Path, out: Path) -> str:
    try:
        return Path(path).relative_to(out).as_posix()
    except ValueError:
        return str(path)


def tuning_rows(groups: Iterable[Any]) -> list[dict[str, Any]]:
    """``tuning.csv`` rows: every trained point of every finished tuning group."""
    rows = []
    for group in groups:
        summary = group.summary
        if summary is None:
            continue
        best = summary["best"]
        for row in summary["table"]:
            chosen = (
                best is not None
                and row["lr"] == best["lr"]
                and (row["ratio"] is None or row["ratio"] == best.get("ratio"))
            )
            rows.append(
                {
                    "protocol": group.protocol,
                    "dataset": group.dataset,
                    "group": group.method,
                    "used_by": " ".join(group.used_by),
                    "lr": row["lr"],
                    "ratio": _fmt(row["ratio"]),
                    "calibrator_lr": _fmt(row["calibrator_lr"]),
                    "schedule": row["schedule"],
                    "val_nll": _fmt(row["val_nll"]),
                    "val_brier": _fmt(row["val_brier"]),
                    "val_acc": _fmt(row["val_acc"]),
                    "status": row["status"],
                    "chosen": chosen,
                    "at_edge": summary["at_edge"],
                    "edges": "; ".join(summary["edges"]),
                    "extensions": summary["extensions"],
                    "cap_reached": summary["cap_reached"],
                }
            )
    return rows


def effect_rows(jobs: Iterable[Any]) -> list[dict[str, Any]]:
    """``effect.csv`` rows: the val and test values of every finished effect run."""
    rows = []
    for job in jobs:
        if job.kind != "effect":
            continue
        record = _record(job)
        if record is None:
            continue
        resolved = job.config.resolved()
        base = {
            "dataset": job.dataset,
            "variant": job.variant,
            "schedule": resolved["schedule"],
            "lr": resolved["lr"],
            "calibrator_lr": _fmt(resolved["calibrator_lr"]),
            "seed": job.seed,
        }
        for split in ("val", "test"):
            for metric, value, task in _split_rows(getattr(record, split)):
                if task not in ("", "mean"):
                    continue
                rows.append({**base, "split": split, "metric": metric, "value": value})
    return rows


def result_rows(jobs: Iterable[Any]) -> list[dict[str, Any]]:
    """``results.csv`` rows: every complete seed run of the paper and fair protocols."""
    rows = []
    for job in jobs:
        if job.kind != "seed":
            continue
        record = _record(job)
        if record is not None:
            rows.extend(
                metrics_rows(record.to_dict(), job.dataset, job.method, job.protocol, job.seed)
            )
    return rows


def _csv_text(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        r = dict(row)
        for key, v in r.items():
            if isinstance(v, float):
                r[key] = "nan" if math.isnan(v) else repr(v)
        writer.writerow(r)
    return buf.getvalue()


def write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Path:
    """Write ``rows`` under ``columns`` (header first) atomically."""
    return _io.write_text(path, _csv_text(rows, columns))


def write_tables(
    out: Path,
    jobs: list[Any],
    groups: list[Any],
    blocked: list[Any],
    planned: Iterable[tuple[str, str, str, int, Path]] = (),
) -> Path:
    """Write ``results.csv``, ``runs.csv``, ``tuning.csv`` and ``effect.csv`` into ``out``
    (``planned``: every seed run of the suite, listed in ``runs.csv`` even if not started).

    Returns
    -------
    Path
        The path of ``results.csv``.
    """
    out = Path(out)
    write_csv(out / "runs.csv", run_rows(jobs, blocked, out, planned), RUN_COLUMNS)
    write_csv(out / "tuning.csv", tuning_rows(groups), TUNING_COLUMNS)
    write_csv(out / "effect.csv", effect_rows(jobs), EFFECT_COLUMNS)
    return write_csv(out / "results.csv", result_rows(jobs), RESULT_COLUMNS)
