"""Build ``report.md`` and ``report.html`` of a bench folder (:func:`build_report`) or of
one run folder (:func:`build_any` dispatches on :func:`report_kind`).

A bench report is recomputed from the folder's files: :data:`SECTIONS` are builders
``(context) -> Section or None`` run in order on one :class:`BenchContext`, the verdict
first. Run folders are read only through :class:`cogcal.runs.RunDir`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cogcal import _io
from cogcal.report import claims as C
from cogcal.report import frame as F
from cogcal.report import overview as O
from cogcal.report import regime as R
from cogcal.report import tables as T
from cogcal.report._common import is_cog, save_figure, slug
from cogcal.report.blocks import Figure, Link, Paragraph, Section, Table, Text
from cogcal.report.calibration_report import build_calibration_report
from cogcal.report.diagrams import plot_reliability
from cogcal.report.effect import effect_section
from cogcal.report.multitask import multitask_section
from cogcal.report.render import render_html, render_markdown
from cogcal.report.robustness import robustness_section, unavailable_sets
from cogcal.report.run_report import build_run_report, report_kind
from cogcal.report.stats import pareto_front, summary_rank
from cogcal.report.tuning import edge_choices, tuning_section
from cogcal.runs import RunDir, RunFolderError

__all__ = ["SECTIONS", "BenchContext", "build_any", "build_report", "load_context"]


@dataclass
class BenchContext:
    """Everything the section builders read, loaded once: the bench folder ``root``, its
    normalised ``results``, ``runs`` / ``tuning`` / ``effect`` tables and ``bench.json``
    (``meta``) when present, and the planned seeds per cell (``plan``)."""

    root: Path
    results: pd.DataFrame
    runs: pd.DataFrame | None = None
    tuning: pd.DataFrame | None = None
    effect: pd.DataFrame | None = None
    meta: dict[str, Any] | None = None
    plan: F.SeedPlan = field(default_factory=lambda: F.SeedPlan({}))

    @property
    def figdir(self) -> Path:
        return self.root / "figures"

    @cached_property
    def datasets(self) -> list[str]:
        return sorted(set(self.results["dataset"]))

    @cached_property
    def protocols(self) -> list[str]:
        return F.protocol_order(set(self.results["protocol"]))

    @cached_property
    def coverage(self) -> list[tuple[str, str, str, list[int], int]]:
        return O.coverage_rows(self.results, self.plan)

    @property
    def failed_runs(self) -> int:
        return 0 if self.runs is None else int(self.runs["status"].isin(O.FAILED_STATUSES).sum())

    @property
    def found(self) -> dict[str, bool]:
        files = {
            "bench.json (suite, budgets, sessions)": self.meta,
            "runs.csv (failures, run times, checkpoints, reliability diagrams)": self.runs,
            "tuning.csv (selected learning rates, grid edges)": self.tuning,
            "effect.csv (where COG's effect comes from)": self.effect,
        }
        return {name: table is not None for name, table in files.items()}

    @cached_property
    def complete(self) -> pd.DataFrame:
        """The complete runs of ``runs.csv`` that have a folder (empty without runs.csv)."""
        if self.runs is None:
            return pd.DataFrame(columns=["dataset", "protocol", "method", "seed", "run_dir"])
        return self.runs[(self.runs["status"] == "complete") & (self.runs["run_dir"] != "")]

    @cached_property
    def checkpoints(self) -> C.Checkpoints:
        """The checkpoint epoch of every complete run (from its record)."""
        r = self.complete
        keys = zip(r["dataset"], r["protocol"], r["method"], r["seed"], r["run_dir"], strict=True)
        return C.Checkpoints.read([(d, p, m, int(s), self._path(f)) for d, p, m, s, f in keys])

    @cached_property
    def families(self) -> dict[str, dict[str, Any]]:
        """The paired comparison families per protocol (:func:`~cogcal.report.claims.families`)."""
        return {p: C.families(self.results, p, self.checkpoints) for p in self.protocols}

    @cached_property
    def claims(self) -> dict[str, Any]:
        """The judged claims per protocol (class counts from ``bench.json``)."""
        return {
            p: C.judge_claims(self.results, p, self.families[p], self.classes)
            for p in self.protocols
        }

    @cached_property
    def classes(self) -> dict[str, int]:
        """Classes (multi-task: tasks) per dataset, from ``bench.json``."""
        info = (self.meta or {}).get("datasets") or {}
        return {k: int(v.get("num_classes") or 0) for k, v in info.items()}

    @cached_property
    def regimes(self) -> dict[str, dict[str, Any]]:
        """Per protocol and dataset, what there was to calibrate
        (:func:`~cogcal.report.regime.regimes`): ce's test ECE-15 from the results, its
        confidence and accuracy per seed from the ce runs' saved test logits."""
        out = {}
        for p in self.protocols:
            per: dict[str, pd.DataFrame] = {}
            for ds in self.datasets:
                got = []
                for seed, path in self.run_dirs(dataset=ds, protocol=p, method=R.BASE):
                    try:
                        got.append((seed, *R.confidence_and_accuracy(*RunDir(path).read_logits("test"))))  # fmt: skip
                    except (RunFolderError, ValueError):
                        continue
                per[ds] = pd.DataFrame(got, columns=["seed", "confidence", "accuracy"])
            out[p] = R.regimes(self.results, p, per)
        return out

    def _path(self, run_dir: str) -> Path:
        path = Path(run_dir)
        return path if path.is_absolute() else self.root / path

    def run_dirs(self, **where: Any) -> list[tuple[int, Path]]:
        """``(seed, folder)`` of the complete runs matching ``where`` (``dataset=``,
        ``protocol=``, ``method=``), sorted by seed."""
        r = self.complete
        for col, value in where.items():
            r = r[r[col] == value]
        return sorted((int(s), self._path(d)) for s, d in zip(r["seed"], r["run_dir"], strict=True))


def load_context(results_dir: str | Path) -> BenchContext:
    """Read every file of a bench folder; ``ValueError`` when ``results.csv`` is missing or
    malformed (:func:`~cogcal.report.frame.load_results`)."""
    root = Path(results_dir)
    runs, meta = F.load_bench_csv(root, "runs.csv"), F.read_bench_json(root)
    tuning, effect = F.load_bench_csv(root, "tuning.csv"), F.load_bench_csv(root, "effect.csv")
    plan = F.SeedPlan.from_bench(runs, meta)
    return BenchContext(root, F.load_results(root), runs, tuning, effect, meta, plan)


def _pareto_figure(df: pd.DataFrame, dataset: str, protocol: str, path: Path) -> Path | None:
    from matplotlib.figure import Figure as MplFigure  # here: matplotlib (heavy) loads only to draw

    d = F.aggregate(df, split="test", dataset=dataset, protocol=protocol, metric=["acc", "ece_15"])
    if d.empty or set(d["metric"]) != {"acc", "ece_15"}:
        return None
    stats = T.stats_of(d, ("method", "metric"))
    front = pareto_front(d, x="ece_15", y="acc", split=None)
    fig = MplFigure(figsize=(6.4, 4.6), layout="constrained")
    ax = fig.subplots()
    for method in dict.fromkeys(m for m, _ in stats):
        e, a = stats.get((method, "ece_15")), stats.get((method, "acc"))
        if e is None or a is None or not np.isfinite([e.mean, a.mean]).all():
            continue
        x, y, c = e.mean, a.mean, "red" if is_cog(method) else "blue"
        ax.errorbar(x, y, xerr=np.nan_to_num(e.std), yerr=np.nan_to_num(a.std), fmt="o",
                    color=f"tab:{c}", ms=6, capsize=2, lw=0.8)  # fmt: skip
        ax.annotate(str(method), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.plot(front["ece_15"], front["acc"], "o--", color="0.4", mfc="none", ms=13, lw=1,
            label="Pareto front")  # fmt: skip
    ax.plot([], [], "o", color="tab:red", label="COG")
    ax.plot([], [], "o", color="tab:blue", label="other")
    ax.set(xlabel="ECE (15 bins), test — lower is better", ylabel="accuracy, test — higher is better",
           title=f"{dataset}, {protocol} protocol: accuracy vs calibration")  # fmt: skip
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def _add(blocks: list, table: Table | None) -> None:
    """Add ``table``; one without rows renders badly, so it is said in words."""
    if table is not None:
        words = Paragraph(f"{table.title}: " + " ".join(map(str, table.notes)))
        blocks.append(table if table.rows else words)


def section_verdict(ctx: BenchContext) -> Section:
    """The verdict (:mod:`cogcal.report.claims`): per dataset whether COG helps, what there
    was to calibrate (:mod:`cogcal.report.regime`), the claims, then best methods, grid
    edges and coverage."""
    details: list[Text] = []
    edges = edge_choices(ctx.tuning)
    if ctx.tuning is None:
        details.append("No tuning.csv: whether a tuned choice sits at a grid edge is unknown.")
    elif edges:
        details.append([f"{len(edges)} tuned choice(s) still sit at a grid edge (", Link("listed", "tuning-edges"), ")."])  # fmt: skip
    else:
        details.append(["Every tuned choice is interior to its grid (", Link("tuning", "tuning"), ")."])  # fmt: skip
    if ctx.coverage or ctx.failed_runs:
        text = f"{len(ctx.coverage)} result cell(s) hold fewer seeds than planned, {ctx.failed_runs} run(s) failed, "
        details.append([text + "diverged or were interrupted (", Link("failures", "failures"), ")."])  # fmt: skip
    sec = C.verdict_section(
        ctx.results, ctx.families, ctx.claims, ctx.datasets, details, ctx.regimes
    )
    # after the per-dataset answers: ce's test ECE-15 and direction, per dataset
    regime = R.regime_table(ctx.regimes, ctx.classes)
    sec.blocks[1:1] = [regime] if regime is not None else []
    notice = O.unfinished_notice(ctx.runs, ctx.meta)  # first: the verdict is partial
    sec.blocks[0:0] = [notice] if notice is not None else []
    return sec


def section_overview(ctx: BenchContext) -> Section:
    """Suite, budgets, run counts, datasets and protocols."""
    sec = O.overview_section(ctx.results, ctx.meta, ctx.runs, ctx.found)
    sec.blocks += [Paragraph("results.csv holds no finished run yet.")] if ctx.results.empty else []
    return sec


def section_complexity(ctx: BenchContext) -> Section | None:
    """Extra parameters, calibration data, stages (Tab. 1/7)."""
    if ctx.results.empty:
        return None
    methods = [*ctx.results["method"], *(ctx.runs["method"] if ctx.runs is not None else [])]
    info = (ctx.meta or {}).get("datasets") or {}
    table = T.complexity_table(list(dict.fromkeys(methods)), info)
    return Section("Complexity", [table], "complexity")


def section_comparison(ctx: BenchContext) -> Section | None:
    """One Tab. 2 table per protocol and dataset."""
    sec = Section("Comparison of all methods", key="comparison")
    for p in ctx.protocols:
        for ds in ctx.datasets:
            _add(sec.blocks, T.comparison_table(ctx.results, ds, p, plan=ctx.plan))
    return sec if sec.blocks else None


def section_claims(ctx: BenchContext) -> Section | None:
    """The paper's claims, the paired comparisons behind them, the checkpoint epochs."""
    return (
        None if ctx.results.empty else C.claims_section(ctx.families, ctx.claims, ctx.checkpoints)
    )


def section_pairwise(ctx: BenchContext) -> Section | None:
    """ECE, RMSCE and MCE over bin counts, COG vs counterpart (Tab. 9-11)."""
    sec = Section("Post-hoc calibration vs COG across bin counts", key="pairwise")
    for family in ("ece", "rmsce", "mce"):
        for p in ctx.protocols:
            for ds in ctx.datasets:
                _add(sec.blocks, T.pairwise_calibration_table(ctx.results, ds, p, family, plan=ctx.plan))  # fmt: skip
    return sec if sec.blocks else None


def _reliability_figure(
    ctx: BenchContext, dataset: str, protocol: str, methods: list[str], path: Path, note: str
) -> list[int]:
    """Side-by-side diagrams of ``methods``, each pooling the saved test logits (read
    through RunDir) of every seed all of them have; the seeds pooled (empty: no figure)."""
    found = [dict(ctx.run_dirs(dataset=dataset, protocol=protocol, method=m)) for m in methods]
    data: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {m: [] for m in methods}
    seeds = []
    for seed in sorted(set.intersection(*(set(f) for f in found))):
        try:
            got = [RunDir(f[seed]).read_logits("test") for f in found]
        except RunFolderError:
            continue
        seeds.append(seed)
        for m, (z, y) in zip(methods, got, strict=True):
            data[m].append((np.asarray(z), np.asarray(y)))
    # Multi-label runs store (N, T) 0/1 labels: their diagrams pool every (sample, task).
    kinds = {y.ndim for v in data.values() for _, y in v}
    if not seeds or len(kinds) != 1 or any(z.ndim != 2 for v in data.values() for z, _ in v):
        return []
    task = "multilabel" if kinds.pop() == 2 else "multiclass"
    pooled = {m: tuple(np.concatenate(a) for a in zip(*v, strict=True)) for m, v in data.items()}
    title = f"{dataset}, {protocol}, {len(seeds)} seed(s) pooled: {note}"
    title += " (pooled over tasks)" if task == "multilabel" else ""
    save_figure(plot_reliability(pooled, None, n_bins=15, title=title, task=task), path)
    return seeds


def section_reliability(ctx: BenchContext) -> Section | None:
    """Reliability diagrams, seeds pooled: each post-hoc method vs its COG variant, and the
    top-ranked method vs cog-fc (Fig. 3 style), from the runs' saved test logits."""
    if ctx.results.empty:
        return None
    sec = Section("Reliability diagrams", key="reliability")
    for p in ctx.protocols:
        for ds in ctx.datasets:
            d = F.aggregate(ctx.results, split="test", dataset=ds, protocol=p)
            present = list(d["method"].unique())
            shown = [(base, cog, f"{base} vs {cog}") for cog, base in T.present_pairs(present)]
            top = str(summary_rank(d, split=None).iloc[0]["method"]) if "cog-fc" in present else "cog-fc"  # fmt: skip
            if top != "cog-fc":
                shown.append((top, "cog-fc", f"top-ranked {top} vs cog-fc (Fig. 3 style)"))
            for a, b, note in shown:
                name = f"reliability_{slug(p)}_{slug(ds)}_{slug(a)}_vs_{slug(b)}.png"
                seeds = _reliability_figure(ctx, ds, p, [a, b], ctx.figdir / name, note)
                caption = f"{ds}, {p}: {note}; test split, 15 bins, test logits of seeds {', '.join(map(str, seeds))} pooled"
                sec.blocks += [Figure(f"figures/{name}", caption)] if seeds else []
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


def section_robustness(ctx: BenchContext) -> Section | None:
    """OOD detection and covariate shift (:mod:`cogcal.report.robustness`)."""
    df = ctx.results
    datasets = sorted(set(F.rows(df, split=["ood", "shift"])["dataset"]))
    # the sets a run could not evaluate depend on the data: 50 runs per dataset suffice
    unavailable = {ds: unavailable_sets([p for _, p in ctx.run_dirs(dataset=ds)][:50]) for ds in datasets}  # fmt: skip
    return robustness_section(df, ctx.figdir, unavailable) if datasets else None


def section_runtimes(ctx: BenchContext) -> Section | None:
    """Seconds per run."""
    table = T.runtime_table(ctx.runs)
    return None if table is None else Section("Run times", [table], "runtimes-sec")


#: The bench report's sections, in order: each ``(context) -> Section or None``.
SECTIONS: tuple[Callable[[BenchContext], Section | None], ...] = (
    section_verdict,
    section_overview,
    section_complexity,
    section_comparison,
    section_claims,
    lambda ctx: effect_section(ctx.effect),
    section_pairwise,
    section_reliability,
    section_pareto,
    lambda ctx: multitask_section(ctx.results, ctx.figdir, plan=ctx.plan),
    section_robustness,
    lambda ctx: tuning_section(ctx.tuning),
    section_runtimes,
    lambda ctx: O.failures_section(ctx.runs, ctx.coverage),
)

#: Tables of one protocol and dataset, by the start of their key, whose methods a tuned
#: choice at a grid edge affects (their first column names the methods).
EDGE_TABLES: tuple[str, ...] = ("comparison", "mtl", "ood", "shift")


def annotate_edges(blocks: list[Any], ctx: BenchContext) -> None:
    """Under every protocol/dataset table (:data:`EDGE_TABLES`), one note counting the
    tuned choices at a grid edge that the table's methods use, linking to their list."""
    edges = edge_choices(ctx.tuning)
    for block in blocks:
        if isinstance(block, Section):
            annotate_edges(block.blocks, ctx)
        if not isinstance(block, Table):
            continue
        methods = {row[0].text for row in block.rows}
        keys = [
            (f"{k}-{slug(e.protocol)}-{slug(e.dataset)}", e) for e in edges for k in EDGE_TABLES
        ]
        hit = [e for k, e in keys if k == block.key and methods & set(e.used_by)]
        if hit:
            used = ", ".join(dict.fromkeys(m for e in hit for m in e.used_by if m in methods))
            block.notes.append([f"{len(hit)} tuned choice(s) used by {used} sit at a grid edge (",
                                Link("grid edges", "tuning-edges"), ")."])  # fmt: skip


def build_report(results_dir: str | Path) -> Path:
    """Rebuild ``report.md``, ``report.html`` and ``figures/`` of a bench folder (one that
    holds ``results.csv``) and return the path of ``report.html``; ``ValueError`` when
    ``results.csv`` is missing or a file of the folder is malformed."""
    ctx = load_context(results_dir)
    sections = [s for builder in SECTIONS if (s := builder(ctx)) is not None]
    annotate_edges(sections, ctx)
    suite = (ctx.meta or {}).get("suite")
    name = suite.get("name") if isinstance(suite, dict) else None
    title = "cogcal bench report" + (f": {name}" if name else "")
    _io.write_text(ctx.root / "report.md", render_markdown(title, sections))
    return _io.write_text(ctx.root / "report.html", render_html(title, sections, ctx.root))


def build_any(path: str | Path) -> Path:
    """Write the report of ``path`` (:func:`build_report` for a bench folder,
    :func:`~cogcal.report.run_report.build_run_report` for a run folder,
    :func:`~cogcal.report.calibration_report.build_calibration_report` for a
    ``cogcal calibrate`` folder; see
    :func:`~cogcal.report.run_report.report_kind`) and return the path of ``report.html``."""
    kind = report_kind(path)
    if kind == "calibration":
        return build_calibration_report(path)
    return build_report(path) if kind == "bench" else build_run_report(path)
