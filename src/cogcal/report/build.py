"""Build ``report.md`` and ``report.html`` of a bench folder, or of one run folder.

``cogcal report DIR`` calls :func:`build_any` (:func:`report_kind` tells which report a folder
gets). A bench report (:func:`build_report`) is recomputed from the folder's files
(:mod:`cogcal.report.schema`): ``results.csv`` (required; read once, checked and
normalised by :func:`cogcal.report.frame.load_results`), and, when present, ``runs.csv``
(planned runs, failures, run times, the run folders whose saved test logits give the
reliability diagrams), ``tuning.csv`` (chosen learning rates and grid edges),
``effect.csv`` (where COG's effect comes from) and ``bench.json`` (suite, budgets,
sessions, dataset facts). The report says which of them it did not find.

The report is a list of section builders (:data:`SECTIONS`), each ``(context) -> Section
or None``, run in order on one :class:`BenchContext`; the first is the verdict. A run
folder is read only through :class:`cogcal.train.rundir.RunDir`.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cogcal import _io
from cogcal.report import tables as T
from cogcal.report._common import is_cog, slug
from cogcal.report.blocks import Figure, Link, Paragraph, Section, Table, Text
from cogcal.report.claims import (
    Checkpoints,
    claims_section,
    families,
    judge_claims,
    verdict_section,
)
from cogcal.report.effect import effect_section
from cogcal.report.frame import (
    SeedPlan,
    aggregate,
    load_effect,
    load_results,
    load_runs,
    load_tuning,
    protocol_order,
    read_bench_json,
    rows,
)
from cogcal.report.multitask import multitask_section
from cogcal.report.overview import (
    FAILED_STATUSES,
    coverage_rows,
    failures_section,
    overview_section,
)
from cogcal.report.render import render_html, render_markdown
from cogcal.report.robustness import robustness_section, unavailable_sets
from cogcal.report.run_report import build_run_report, report_kind
from cogcal.report.stats import mean_std, pareto_front, summary_rank
from cogcal.report.tuning import edge_choices, edge_notes, tuning_section

__all__ = ["SECTIONS", "BenchContext", "build_any", "build_report", "load_context", "load_results"]


# --------------------------------------------------------------------------- context


@dataclass
class BenchContext:
    """Everything the section builders read, loaded once.

    Attributes
    ----------
    root : Path
        The bench folder.
    results : DataFrame
        ``results.csv``, checked and normalised.
    runs, tuning, effect : DataFrame or None
        ``runs.csv``, ``tuning.csv``, ``effect.csv`` when present.
    meta : dict or None
        ``bench.json``.
    plan : SeedPlan
        Planned seeds per (dataset, protocol, method).
    """

    root: Path
    results: pd.DataFrame
    runs: pd.DataFrame | None = None
    tuning: pd.DataFrame | None = None
    effect: pd.DataFrame | None = None
    meta: dict[str, Any] | None = None
    plan: SeedPlan = field(default_factory=lambda: SeedPlan({}))

    @property
    def figdir(self) -> Path:
        return self.root / "figures"

    @cached_property
    def datasets(self) -> list[str]:
        return sorted(set(self.results["dataset"]))

    @cached_property
    def protocols(self) -> list[str]:
        return protocol_order(set(self.results["protocol"]))

    @cached_property
    def coverage(self) -> list[tuple[str, str, str, list[int], int]]:
        return coverage_rows(self.results, self.plan)

    @property
    def failed_runs(self) -> int:
        if self.runs is None:
            return 0
        return int(self.runs["status"].isin(FAILED_STATUSES).sum())

    @property
    def found(self) -> dict[str, bool]:
        return {
            "bench.json (suite, budgets, sessions)": self.meta is not None,
            "runs.csv (planned runs, failures, run times, reliability diagrams)": self.runs
            is not None,
            "tuning.csv (selected learning rates, grid edges)": self.tuning is not None,
            "effect.csv (where COG's effect comes from)": self.effect is not None,
        }

    @cached_property
    def checkpoints(self) -> Checkpoints:
        """The checkpoint epoch of every finished run (from its record)."""
        if self.runs is None:
            return Checkpoints()
        r = self.runs[(self.runs["status"] == "complete") & (self.runs["run_dir"] != "")]
        keys = zip(r["dataset"], r["protocol"], r["method"], r["seed"], r["run_dir"], strict=True)
        return Checkpoints.read([(d, p, m, int(s), self._path(f)) for d, p, m, s, f in keys])

    @cached_property
    def families(self) -> dict[str, dict[str, Any]]:
        """The paired comparison families per protocol (:func:`~cogcal.report.claims.families`)."""
        return {p: families(self.results, p, self.checkpoints) for p in self.protocols}

    @cached_property
    def claims(self) -> dict[str, Any]:
        """The judged claims per protocol."""
        info = (self.meta or {}).get("datasets")
        info = info if isinstance(info, dict) else {}
        classes = {
            str(k): int(v.get("num_classes") or 0) for k, v in info.items() if isinstance(v, dict)
        }
        return {p: judge_claims(self.results, p, self.families[p], classes) for p in self.protocols}

    def _path(self, run_dir: str) -> Path:
        path = Path(run_dir)
        return path if path.is_absolute() else self.root / path

    def run_dirs(self, **where: Any) -> list[tuple[int, Path]]:
        """``(seed, folder)`` of the complete runs of ``runs.csv`` matching ``where``
        (``dataset=``, ``protocol=``, ``method=``), sorted by seed."""
        if self.runs is None:
            return []
        r = self.runs[(self.runs["status"] == "complete") & (self.runs["run_dir"] != "")]
        for col, value in where.items():
            r = r[r[col] == value]
        return sorted((int(s), self._path(d)) for s, d in zip(r["seed"], r["run_dir"], strict=True))


def load_context(results_dir: str | Path) -> BenchContext:
    """Load and check every file of a bench folder (see the module docstring).

    Raises
    ------
    ValueError
        ``results.csv`` is missing, or a file is malformed (the message names the line).
    """
    root = Path(results_dir)
    results = load_results(root)
    runs = load_runs(root)
    meta = read_bench_json(root)
    return BenchContext(
        root=root,
        results=results,
        runs=runs,
        tuning=load_tuning(root),
        effect=load_effect(root),
        meta=meta,
        plan=SeedPlan.from_bench(runs, meta),
    )


# --------------------------------------------------------------------------- figures


def _save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return _io.write_bytes(path, buf.getvalue())


def _pareto_figure(df: pd.DataFrame, dataset: str, protocol: str, path: Path) -> Path | None:
    from matplotlib.figure import Figure as MplFigure

    d = aggregate(df, split="test", dataset=dataset, protocol=protocol, metric=["acc", "ece_15"])
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
            row[("mean", "ece_15")], row[("mean", "acc")], xerr=row[("std", "ece_15")],
            yerr=row[("std", "acc")], fmt="o" if cog else "s",
            color="tab:red" if cog else "tab:blue", ms=6, capsize=2, lw=0.8,
        )  # fmt: skip
        ax.annotate(
            str(method), (row[("mean", "ece_15")], row[("mean", "acc")]),
            textcoords="offset points", xytext=(4, 4), fontsize=8,
        )  # fmt: skip
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
    ctx: BenchContext, dataset: str, protocol: str, methods: list[str], path: Path, note: str
) -> list[int]:
    """Side-by-side diagrams of ``methods``, each pooling the saved test logits (read
    through RunDir) of every seed all of them have; the seeds pooled (empty: no figure)."""
    from cogcal.report.diagrams import plot_reliability
    from cogcal.train.rundir import RunDir, RunFolderError

    found = [dict(ctx.run_dirs(dataset=dataset, protocol=protocol, method=m)) for m in methods]
    data: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {m: [] for m in methods}
    seeds = []
    for seed in sorted(set.intersection(*(set(f) for f in found))) if found else []:
        try:
            got = {
                m: RunDir(runs[seed]).read_logits("test")
                for m, runs in zip(methods, found, strict=True)
            }
        except RunFolderError:
            continue
        seeds.append(seed)
        for m, (z, y) in got.items():
            data[m].append((np.asarray(z), np.asarray(y)))
    if not seeds or any(z.ndim != 2 for v in data.values() for z, _ in v):
        return []
    # Multi-label runs store (N, T) 0/1 labels: their diagrams pool every (sample, task).
    kinds = {y.ndim for v in data.values() for _, y in v}
    if len(kinds) != 1:
        return []
    task = "multilabel" if kinds.pop() == 2 else "multiclass"
    pooled = {
        m: (np.concatenate([z for z, _ in v]), np.concatenate([y for _, y in v]))
        for m, v in data.items()
    }
    title = f"{dataset}, {protocol}, {len(seeds)} seed(s) pooled: {note}"
    title += " (pooled over tasks)" if task == "multilabel" else ""
    _save_figure(plot_reliability(pooled, None, n_bins=15, title=title, task=task), path)
    return seeds


# --------------------------------------------------------------------------- sections


def _add(blocks: list, table: Table | None) -> None:
    if table is None:
        return
    if not table.rows:  # a table without rows renders badly: say it in words
        blocks.append(Paragraph(f"{table.title}: " + " ".join(map(str, table.notes))))
        return
    blocks.append(table)


def section_verdict(ctx: BenchContext) -> Section:
    """The verdict (:mod:`cogcal.report.claims`): per dataset whether COG helps, the
    claims, then best methods, grid edges and coverage."""
    details: list[Text] = []
    edges = edge_choices(ctx.tuning)
    if ctx.tuning is None:
        details.append("No tuning.csv: whether a tuned choice sits at a grid edge is unknown.")
    elif edges:
        details.append(
            [
                f"{len(edges)} tuned choice(s) still sit at a grid edge (",
                Link("listed", "tuning-edges"),
                ").",
            ]
        )
    else:
        details.append(
            ["Every tuned choice is interior to its grid (", Link("tuning", "tuning"), ")."]
        )
    short, failed = len(ctx.coverage), ctx.failed_runs
    if short or failed:
        details.append(
            [f"{short} result cell(s) hold fewer seeds than planned, {failed} run(s) failed, "
             "diverged or were interrupted (", Link("failures", "failures"), ")."]
        )  # fmt: skip
    return verdict_section(ctx.results, ctx.families, ctx.claims, ctx.datasets, details)


def section_claims(ctx: BenchContext) -> Section | None:
    """The paper's claims, the paired comparisons behind them, the checkpoint epochs."""
    if ctx.results.empty:
        return None
    return claims_section(ctx.families, ctx.claims, ctx.checkpoints)


def section_overview(ctx: BenchContext) -> Section:
    """Suite, budgets, run counts, datasets and protocols."""
    sec = overview_section(
        ctx.results, ctx.meta, ctx.runs, ctx.found, short_cells=len(ctx.coverage),
        failed_runs=ctx.failed_runs,
    )  # fmt: skip
    if ctx.results.empty:
        sec.blocks.append(Paragraph("results.csv holds no finished run yet."))
    return sec


def section_complexity(ctx: BenchContext) -> Section | None:
    """Extra parameters, calibration data, stages (Tab. 1/7)."""
    if ctx.results.empty:
        return None
    methods = list(ctx.results["method"].unique())
    if ctx.runs is not None:
        methods += [m for m in ctx.runs["method"].unique() if m not in methods]
    info = (ctx.meta or {}).get("datasets")
    info = info if isinstance(info, dict) else {}
    return Section("Complexity", [T.complexity_table(methods, info)], "complexity")


def section_comparison(ctx: BenchContext) -> Section | None:
    """One Tab. 2 table per protocol and dataset."""
    sec = Section("Comparison of all methods", key="comparison")
    for p in ctx.protocols:
        for ds in ctx.datasets:
            _add(sec.blocks, T.comparison_table(ctx.results, ds, p, plan=ctx.plan))
    return sec if sec.blocks else None


def section_effect(ctx: BenchContext) -> Section | None:
    """Where COG's effect comes from (:mod:`cogcal.report.effect`)."""
    return effect_section(ctx.effect)


def section_pairwise(ctx: BenchContext) -> Section | None:
    """ECE, RMSCE and MCE over bin counts, COG vs counterpart (Tab. 9-11)."""
    sec = Section("Post-hoc calibration vs COG across bin counts", key="pairwise")
    for family in ("ece", "rmsce", "mce"):
        for p in ctx.protocols:
            for ds in ctx.datasets:
                _add(
                    sec.blocks,
                    T.pairwise_calibration_table(ctx.results, ds, p, family, plan=ctx.plan),
                )
    return sec if sec.blocks else None


def section_reliability(ctx: BenchContext) -> Section | None:
    """Reliability diagrams, seeds pooled: each post-hoc method vs its COG variant, and the
    top-ranked method vs cog-fc (Fig. 3 style), from the runs' saved test logits."""
    if ctx.results.empty:
        return None
    sec = Section("Reliability diagrams", key="reliability")
    for p in ctx.protocols:
        for ds in ctx.datasets:
            d = aggregate(ctx.results, split="test", dataset=ds, protocol=p)
            present = list(d["method"].unique())
            shown = [(base, cog, f"{base} vs {cog}") for cog, base in T.present_pairs(present)]
            if "cog-fc" in present and not d.empty:
                top = str(summary_rank(d, split=None).iloc[0]["method"])
                if top != "cog-fc":
                    shown.append((top, "cog-fc", f"top-ranked {top} vs cog-fc (Fig. 3 style)"))
            for a, b, note in shown:
                name = f"reliability_{slug(p)}_{slug(ds)}_{slug(a)}_vs_{slug(b)}.png"
                seeds = _reliability_figure(ctx, ds, p, [a, b], ctx.figdir / name, note)
                if seeds:
                    sec.blocks.append(Figure(
                        f"figures/{name}",
                        f"{ds}, {p}: {note}; test split, 15 bins, the test logits of seeds "
                        f"{', '.join(map(str, seeds))} pooled",
                    ))  # fmt: skip
    if not sec.blocks:
        why = "no runs.csv" if ctx.runs is None else "no readable test logits in the run folders"
        sec.blocks.append(Paragraph(f"Reliability diagrams skipped: {why}."))
    return sec


def section_pareto(ctx: BenchContext) -> Section | None:
    """Test accuracy against ECE-15 with the Pareto front."""
    sec = Section("Accuracy against calibration", key="pareto")
    for p in ctx.protocols:
        for ds in ctx.datasets:
            name = f"pareto_{slug(p)}_{slug(ds)}.png"
            if _pareto_figure(ctx.results, ds, p, ctx.figdir / name):
                caption = f"{ds}, {p}: test accuracy vs ECE-15, mean ± std over seeds; dashed: Pareto front"
                sec.blocks.append(Figure(f"figures/{name}", caption))
    return sec if sec.blocks else None


def section_multitask(ctx: BenchContext) -> Section | None:
    """Multi-task tables and figures (:mod:`cogcal.report.multitask`)."""
    return multitask_section(ctx.results, ctx.figdir, plan=ctx.plan)


def section_robustness(ctx: BenchContext) -> Section | None:
    """OOD detection and covariate shift (:mod:`cogcal.report.robustness`)."""
    df = ctx.results
    if not df["split"].isin(["ood", "shift"]).any():
        return None
    unavailable = {}
    for ds in sorted(set(rows(df, split=["ood", "shift"])["dataset"])):
        dirs = [p for _, p in ctx.run_dirs(dataset=ds)][:50]  # the sets depend on the data
        unavailable[ds] = unavailable_sets(dirs)
    return robustness_section(df, ctx.figdir, unavailable)


def section_tuning(ctx: BenchContext) -> Section | None:
    """Chosen learning rates, grid edges, every trained point (:mod:`cogcal.report.tuning`)."""
    return tuning_section(ctx.tuning)


def section_runtimes(ctx: BenchContext) -> Section | None:
    """Seconds per run."""
    table = T.runtime_table(ctx.runs)
    return None if table is None else Section("Run times", [table], "runtimes-sec")


def section_failures(ctx: BenchContext) -> Section:
    """Runs that failed, diverged or were interrupted; cells with fewer seeds."""
    return failures_section(ctx.runs, ctx.coverage)


#: The bench report's sections, in order: each ``(context) -> Section or None``.
SECTIONS: tuple[Callable[[BenchContext], Section | None], ...] = (
    section_verdict,
    section_overview,
    section_complexity,
    section_comparison,
    section_claims,
    section_effect,
    section_pairwise,
    section_reliability,
    section_pareto,
    section_multitask,
    section_robustness,
    section_tuning,
    section_runtimes,
    section_failures,
)


#: Tables of one protocol and dataset, by the start of their key, whose methods a tuned
#: choice at a grid edge affects (their first column names the methods).
EDGE_TABLES: tuple[str, ...] = ("comparison", "mtl", "ood", "shift")


def _tables(blocks: list[Any]) -> list[Table]:
    out: list[Table] = []
    for block in blocks:
        if isinstance(block, Table):
            out.append(block)
        elif isinstance(block, Section):
            out += _tables(block.blocks)
    return out


def annotate_edges(sections: list[Section], ctx: BenchContext) -> None:
    """Add, under every protocol/dataset table (:data:`EDGE_TABLES`), a note for each tuned
    choice at a grid edge that one of the table's methods uses."""
    if ctx.tuning is None or ctx.tuning.empty:
        return
    keys = {
        f"{kind}-{slug(p)}-{slug(ds)}": (p, ds)
        for kind in EDGE_TABLES
        for p in set(ctx.tuning["protocol"])
        for ds in set(ctx.tuning["dataset"])
    }
    for table in _tables(list(sections)):
        if table.key in keys:
            protocol, dataset = keys[table.key]
            methods = [row[0].text for row in table.rows]
            table.notes += edge_notes(ctx.tuning, protocol, dataset, methods)


def build_report(results_dir: str | Path) -> Path:
    """Rebuild ``report.md``, ``report.html`` and ``figures/`` of a bench folder.

    Parameters
    ----------
    results_dir : str or Path
        Folder holding ``results.csv`` (``cogcal bench --out``).

    Returns
    -------
    Path
        The path of ``report.html``.

    Raises
    ------
    ValueError
        When ``results.csv`` is missing, or a file of the folder is malformed.
    """
    ctx = load_context(results_dir)
    sections = [s for builder in SECTIONS if (s := builder(ctx)) is not None]
    annotate_edges(sections, ctx)
    title = "cogcal bench report"
    suite = (ctx.meta or {}).get("suite")
    if isinstance(suite, dict) and suite.get("name"):
        title += f": {suite['name']}"
    _io.write_text(ctx.root / "report.md", render_markdown(title, sections))
    return _io.write_text(ctx.root / "report.html", render_html(title, sections, ctx.root))


# --------------------------------------------------------------------------- dispatch


def build_any(path: str | Path) -> Path:
    """Write the report of ``path``: :func:`build_report` for a bench folder,
    :func:`~cogcal.report.run_report.build_run_report` for a run folder (see
    :func:`~cogcal.report.run_report.report_kind`).

    Returns
    -------
    Path
        The path of ``report.html``.
    """
    if report_kind(path) == "bench":
        return build_report(path)
    return build_run_report(path)
