"""Build ``report.md`` and ``report.html`` of a bench folder from its ``results.csv``.

``cogcal report DIR`` calls :func:`build_report`. Everything in the report is recomputed
from ``DIR/results.csv``; when present, ``bench.json`` (suite, dataset sizes),
``runs.csv`` (run times), ``tune/**/tune.json`` (chosen learning rates), ``failed.txt``
and the runs' ``test_logits.npz`` (reliability diagrams) add their sections, and the
report says which of them it did not find. Multi-task rows (``task`` set) add the
multi-task section (:mod:`cogcal.report.multitask`), OOD / shift rows the robustness
section (:mod:`cogcal.report.robustness`; the runs' ``metrics.json`` add the sets they
could not evaluate).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cogcal import _io
from cogcal.report import tables as T
from cogcal.report.aggregate import mean_std, pareto_front, summary_rank
from cogcal.report.multitask import multitask_section
from cogcal.report.render import Figure, Paragraph, Section, render_html, render_markdown
from cogcal.report.robustness import robustness_section
from cogcal.report.tables import Table, cog_pairs

__all__ = ["build_report", "load_results"]

_PROTOCOL_TEXT = {
    "paper": "baselines at lr 1e-4 as in the paper, COG learning rates tuned by validation "
    "cross-entropy",
    "fair": "every method's learning rate(s) tuned by validation cross-entropy on the same "
    "kind of grid",
}


def load_results(results_dir: Path) -> pd.DataFrame:
    """Read ``results.csv`` with the SPEC §6 columns (empty strings for empty cells).

    Raises
    ------
    ValueError
        When the file is missing or lacks a required column.
    """
    path = Path(results_dir) / "results.csv"
    if not path.is_file():
        raise ValueError(
            f"{str(path)!r} does not exist; run `cogcal bench --out {results_dir}` first, or "
            "pass the folder that holds results.csv."
        )
    df = pd.read_csv(
        path,
        dtype={
            "dataset": str,
            "method": str,
            "protocol": str,
            "split": str,
            "metric": str,
            "task": str,
            "condition": str,
            "severity": str,
        },
        keep_default_na=False,
        na_values={"value": ["nan", "NaN", ""]},
    )
    from cogcal.bench.results import COLUMNS

    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{str(path)!r} lacks the column(s) {missing}; expected {list(COLUMNS)} (SPEC §6)."
        )
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    df["seed"] = pd.to_numeric(df["seed"], errors="coerce").astype("Int64")
    return df


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return _io.write_bytes(path, buf.getvalue())


def _load_logits(run_dir: Path) -> tuple[np.ndarray, np.ndarray] | None:
    path = run_dir / "test_logits.npz"
    try:
        with np.load(path) as z:
            return np.asarray(z["logits"]), np.asarray(z["labels"])
    except (OSError, KeyError, ValueError):
        return None


# --------------------------------------------------------------------------- figures


def _pareto_figure(df: pd.DataFrame, dataset: str, protocol: str, path: Path) -> Path | None:
    from matplotlib.figure import Figure as MplFigure

    from cogcal.report._common import is_cog

    d = T._aggregate(df, "test")
    d = d[(d["dataset"] == dataset) & (d["protocol"] == protocol)]
    d = d[d["metric"].isin(["acc", "ece_15"])]
    if d.empty or set(d["metric"]) != {"acc", "ece_15"}:
        return None
    stats = mean_std(d, by=("method", "metric"))
    wide = stats.pivot(index="method", columns="metric", values=["mean", "std"]).dropna()
    if wide.empty:
        return None
    front = pareto_front(d, x="ece_15", y="acc", split=None)
    fig = MplFigure(figsize=(6.4, 4.6), layout="constrained")
    ax = fig.subplots()
    for method, row in wide.iterrows():
        cog = is_cog(str(method))
        ax.errorbar(
            row[("mean", "ece_15")],
            row[("mean", "acc")],
            xerr=row[("std", "ece_15")],
            yerr=row[("std", "acc")],
            fmt="o" if cog else "s",
            color="tab:red" if cog else "tab:blue",
            ms=6,
            capsize=2,
            lw=0.8,
        )
        ax.annotate(
            str(method),
            (row[("mean", "ece_15")], row[("mean", "acc")]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    if not front.empty:
        ax.plot(front["ece_15"], front["acc"], "--", color="0.4", lw=1)
        ax.scatter(
            front["ece_15"], front["acc"], s=160, facecolors="none", edgecolors="0.2",
            lw=1.2, label="Pareto front", zorder=3,
        )  # fmt: skip
    ax.plot([], [], "o", color="tab:red", label="COG")
    ax.plot([], [], "s", color="tab:blue", label="other")
    ax.set_xlabel("ECE (15 bins), test — lower is better")
    ax.set_ylabel("accuracy, test — higher is better")
    ax.set_title(f"{dataset}, {protocol} protocol: accuracy vs calibration")
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return _save_figure(fig, path)


def _reliability_figure(
    root: Path, dataset: str, protocol: str, methods: list[str], path: Path, note: str
) -> tuple[Path, int] | None:
    from cogcal.report.diagrams import plot_reliability

    seeds = []
    for m in methods:
        base = root / "runs" / protocol / dataset / m
        if not base.is_dir():
            return None
        seeds.append(
            {
                int(p.name[4:])
                for p in base.glob("seed*")
                if (p / "test_logits.npz").is_file() and p.name[4:].isdigit()
            }
        )
    common = sorted(set.intersection(*seeds)) if seeds else []
    if not common:
        return None
    seed = common[0]
    data = {}
    for m in methods:
        loaded = _load_logits(root / "runs" / protocol / dataset / m / f"seed{seed}")
        if loaded is None:
            return None
        data[m] = loaded
    if any(v[0].ndim != 2 for v in data.values()):
        return None
    # Multi-label runs store (N, T) 0/1 labels: their diagrams pool every (sample, task).
    kinds = {"multilabel" if v[1].ndim == 2 else "multiclass" for v in data.values()}
    if len(kinds) != 1:
        return None
    task = kinds.pop()
    title = f"{dataset}, {protocol}, seed {seed}: {note}"
    if task == "multilabel":
        title += " (pooled over tasks)"
    fig = plot_reliability(data, None, n_bins=15, title=title, task=task)
    return _save_figure(fig, path), seed


# --------------------------------------------------------------------------- sections


def _overview(df: pd.DataFrame, meta: Any, found: dict[str, bool]) -> Section:
    items = []
    if isinstance(meta, dict):
        suite = meta.get("suite") or {}
        items.append(f"Suite: {suite.get('name', '?')} — {suite.get('description', '')}")
        train = suite.get("train") or {}
        if train:
            items.append("Training: " + ", ".join(f"{k} {v}" for k, v in train.items()))
        sessions = meta.get("sessions") or []
        if sessions:
            wall = sum(float(s.get("wall_seconds", 0)) for s in sessions)
            last = sessions[-1]
            cpu = sum(float(s.get("worker_cpu_seconds", 0) or 0) for s in sessions)
            items.append(
                f"Wall time: {wall:.0f} s over {len(sessions)} invocation(s) of cogcal bench "
                f"(last: {last.get('wall_seconds', 0):.0f} s, {last.get('jobs', '?')} worker(s), "
                f"{meta.get('cpu_count', '?')} CPUs, {meta.get('threads_per_worker', '?')} "
                f"thread(s) per worker; counts {last.get('counts', {})})."
                + (f" Worker CPU time: {cpu:.0f} s." if cpu else "")
            )
        items.append(
            f"Software: cogcal {meta.get('cogcal', '?')}, torch {meta.get('torch', '?')}, "
            f"Python {meta.get('python', '?')}, {meta.get('platform', '?')}."
        )
    datasets = sorted(df["dataset"].unique())
    protocols = [p for p in ("paper", "fair") if p in set(df["protocol"])]
    seeds = sorted(int(s) for s in df["seed"].dropna().unique())
    items.append(
        f"Datasets: {', '.join(datasets)}; methods: {df['method'].nunique()}; seeds: {seeds}."
    )
    for p in protocols:
        items.append(f"Protocol '{p}': {_PROTOCOL_TEXT[p]}.")
    items.append(
        "All numbers are on the test split unless a table says otherwise; nothing is tuned, "
        "fitted or selected on the test split (checkpoints by validation Brier, learning "
        "rates by validation cross-entropy, post-hoc calibrators fitted on validation)."
    )
    absent = [name for name, ok in found.items() if not ok]
    if absent:
        items.append("Not found, sections skipped: " + ", ".join(absent) + ".")
    return Section("Overview", [Paragraph(items=items)], key="overview")


def _add(blocks: list, table: Table | None) -> None:
    if table is None:
        return
    if not table.rows:  # a table without rows renders badly: say it in words
        blocks.append(Paragraph(f"{table.title}: " + " ".join(table.notes)))
        return
    blocks.append(table)


def build_report(results_dir: Path) -> Path:
    """Rebuild ``report.md``, ``report.html`` and ``figures/`` of a bench folder.

    Parameters
    ----------
    results_dir : Path
        Folder holding ``results.csv`` (``cogcal bench --out``).

    Returns
    -------
    Path
        The path of ``report.html``.

    Raises
    ------
    ValueError
        When ``results.csv`` is missing or malformed.
    """
    root = Path(results_dir)
    df = load_results(root)
    meta = _read_json(root / "bench.json")
    runs = None
    if (root / "runs.csv").is_file():
        runs = pd.read_csv(root / "runs.csv", keep_default_na=False, dtype={"copied_from": str})
    tunes = [t for t in (_read_json(p) for p in sorted(root.glob("tune/*/*/*/tune.json"))) if t]
    failed_lines = []
    if (root / "failed.txt").is_file():
        failed_lines = [
            ln
            for ln in (root / "failed.txt").read_text(encoding="utf-8").splitlines()
            if ln.strip() and not ln.startswith("#")
        ]
    has_logits = any(root.glob("runs/*/*/*/seed*/test_logits.npz"))
    found = {
        "bench.json (suite, dataset sizes)": isinstance(meta, dict),
        "runs.csv (run times)": runs is not None,
        "tune/*/tune.json (selected learning rates)": bool(tunes),
        "test logits (reliability diagrams)": has_logits,
    }
    figdir = root / "figures"
    sections: list[Section] = [_overview(df, meta, found)]

    if df.empty:
        sections.append(Section("Results", [Paragraph("results.csv holds no finished run yet.")]))
    else:
        datasets = sorted(df["dataset"].unique())
        protocols = [p for p in ("paper", "fair") if p in set(df["protocol"])] + sorted(
            set(df["protocol"]) - {"paper", "fair"}
        )
        methods = list(df["method"].unique())
        if runs is not None and not runs.empty:
            methods += [m for m in runs["method"].unique() if m not in methods]
        info = (meta or {}).get("datasets") or {}
        with contextlib.suppress(ImportError):  # the registry needs cogcal.train
            sections.append(
                Section("Complexity", [T.complexity_table(methods, info)], "complexity")
            )

        comp = Section("Comparison of all methods", key="comparison")
        for p in protocols:
            for ds in datasets:
                _add(comp.blocks, T.comparison_table(df, ds, p))
        sections.append(comp)

        losses = Section("Where COG loses", key="losses")
        _add(losses.blocks, T.losses_table(df))
        sections.append(losses)

        pair = Section("Post-hoc calibration vs COG across bin counts", key="pairwise")
        for family in ("ece", "rmsce", "mce"):
            for p in protocols:
                for ds in datasets:
                    _add(pair.blocks, T.pairwise_calibration_table(df, ds, p, family))
        sections.append(pair)

        rel = Section("Reliability diagrams", key="reliability")
        for p in protocols:
            for ds in datasets:
                present = set(df[(df["dataset"] == ds) & (df["protocol"] == p)]["method"])
                for cog, base in cog_pairs().items():
                    if cog in present and base in present:
                        name = f"reliability_{p}_{ds}_{base}_vs_{cog}.png"
                        made = _reliability_figure(
                            root, ds, p, [base, cog], figdir / name, f"{base} vs {cog}"
                        )
                        if made:
                            rel.blocks.append(
                                Figure(
                                    f"figures/{name}",
                                    f"{ds}, {p}: {base} (left) vs {cog} (right), test split, "
                                    f"seed {made[1]}, 15 bins",
                                )
                            )
                ranks = summary_rank(df[(df["dataset"] == ds) & (df["protocol"] == p)])
                if not ranks.empty and "cog-fc" in present:
                    top = str(ranks.iloc[0]["method"])
                    if top != "cog-fc":
                        name = f"reliability_{p}_{ds}_top_{top}_vs_cog-fc.png"
                        made = _reliability_figure(
                            root,
                            ds,
                            p,
                            [top, "cog-fc"],
                            figdir / name,
                            f"top ranked {top} vs cog-fc",
                        )
                        if made:
                            rel.blocks.append(
                                Figure(
                                    f"figures/{name}",
                                    f"{ds}, {p}: top-ranked {top} vs cog-fc (Fig. 3 style), "
                                    f"seed {made[1]}",
                                )
                            )
        if not rel.blocks:
            rel.blocks.append(
                Paragraph("No test logits found next to results.csv: diagrams skipped.")
            )
        sections.append(rel)

        par = Section("Accuracy against calibration", key="pareto")
        for p in protocols:
            for ds in datasets:
                name = f"pareto_{p}_{ds}.png"
                if _pareto_figure(df, ds, p, figdir / name):
                    par.blocks.append(
                        Figure(
                            f"figures/{name}",
                            f"{ds}, {p}: test accuracy vs ECE-15, mean ± std over seeds; "
                            "dashed: Pareto front",
                        )
                    )
        sections.append(par)

        mtl = multitask_section(df, figdir)
        if mtl is not None:
            sections.append(mtl)

        rob = robustness_section(df, root, figdir)
        if rob is not None:
            sections.append(rob)

    tune_sec = Section("Selected learning rates", key="tuning")
    _add(tune_sec.blocks, T.tuning_table(tunes))
    if tune_sec.blocks:
        sections.append(tune_sec)
    time_sec = Section("Run times", key="runtimes")
    _add(time_sec.blocks, T.runtime_table(runs) if runs is not None else None)
    if time_sec.blocks:
        sections.append(time_sec)

    fail = Section("Failed runs", key="failures")
    if failed_lines:
        rows = []
        for ln in failed_lines:
            parts = (ln.split("\t") + ["", "", ""])[:3]
            rows.append([T.Cell(x) for x in parts])
        fail.blocks.append(
            Table(
                f"{len(rows)} failed run(s)",
                ["Run", "Error", "Log"],
                rows,
                ["Failed runs are missing from every table; re-run cogcal bench to retry them."],
                "failed",
            )
        )
    else:
        fail.blocks.append(Paragraph("None."))
    sections.append(fail)

    title = "cogcal bench report"
    if isinstance(meta, dict) and (meta.get("suite") or {}).get("name"):
        title += f": {meta['suite']['name']}"
    _io.write_text(root / "report.md", render_markdown(title, sections))
    return _io.write_text(root / "report.html", render_html(title, sections, root))


def _finite(x: float) -> bool:
    return x is not None and math.isfinite(x)
