"""The verdict that opens a bench report: a few sentences generated from the numbers.

Every sentence links to the table it comes from, and every comparison in it follows one
rule, :data:`cogcal.report.aggregate.SPREAD_RULE` (stated in the report): two means differ
*beyond the seed spread* when their absolute difference is larger than the larger of
their two sample standard deviations over seeds; with fewer than 2 seeds on either side
no difference is claimed. The sentences:

1. per dataset and protocol, the method with the lowest mean NLL, Brier and ECE-15 (test
   split) and the methods within the seed spread of it (:func:`best_sentence`);
2. per protocol, how each COG variant compares with its counterpart
   (:func:`cogcal.report._common.counterparts`) on NLL, Brier, ECE-15 and accuracy:
   how many comparisons COG wins and loses beyond the spread, naming every loss
   (:func:`cog_sentence`);
3. which tuned choices still sit at a grid edge (:func:`edge_sentence`);
4. when some cells have fewer seeds than planned or runs failed, how many
   (:func:`coverage_sentence`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from cogcal.report.aggregate import HIGHER_IS_BETTER, SPREAD_RULE, Stat, compare
from cogcal.report.blocks import Link, Paragraph, Section, Text
from cogcal.report.tables import NAMES, comparison_key, pair_stats, present_pairs, stat_text
from cogcal.report.tuning import edge_choices

__all__ = [
    "BEST_METRICS",
    "COG_METRICS",
    "best_sentence",
    "cog_sentence",
    "coverage_sentence",
    "edge_sentence",
    "verdict_section",
]

#: Metrics of the "best method" sentences.
BEST_METRICS: tuple[str, ...] = ("nll", "brier", "ece_15")
#: Metrics of the COG-against-counterpart sentence.
COG_METRICS: tuple[str, ...] = ("nll", "brier", "ece_15", "acc")
_LISTED = 6  # losses named in one sentence before "and N more"


def _join(words: Sequence[str], last: str = "and") -> str:
    words = list(words)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + f" {last} " + words[-1]


def _stat(s: Stat) -> str:
    return stat_text(s.mean, s.std, s.n, None)


def best_sentence(df: pd.DataFrame, dataset: str, protocol: str) -> Text | None:
    """Which methods are best on NLL, Brier and ECE-15 within the seed spread.

    For each metric, the method with the lowest mean on the test split is named with its
    mean ± std, followed by the methods whose difference from it is within the seed
    spread (``compare(...) == "within"``); methods with fewer than 2 seeds cannot be
    placed and are named as such. None without test rows of these metrics.
    """
    stats = {
        (k[2], k[3]): s
        for k, s in pair_stats(df, BEST_METRICS).items()
        if k[0] == dataset and k[1] == protocol
    }
    clauses = []
    for metric in BEST_METRICS:
        cells = {m: s for (m, mm), s in stats.items() if mm == metric and np.isfinite(s.mean)}
        if not cells:
            continue
        hib = metric in HIGHER_IS_BETTER
        best = (max if hib else min)(sorted(cells), key=lambda m: cells[m].mean)
        text = f"lowest {NAMES[metric]}: {best} ({_stat(cells[best])})"
        if cells[best].n < 2:
            text += ", but with one seed its spread is unknown"
            clauses.append(text)
            continue
        ties, unknown = [], []
        for m in sorted(cells):
            if m == best:
                continue
            verdict = compare(cells[m], cells[best], higher_is_better=hib)
            if verdict == "within":
                ties.append(m)
            elif verdict == "unknown":
                unknown.append(m)
        if ties:
            text += f", with {_join(ties)} within the seed spread"
        elif len(cells) > 1:
            text += ", every other method beyond the seed spread"
        if unknown:
            text += f" ({_join(unknown)}: fewer than 2 seeds, not compared)"
        clauses.append(text)
    if not clauses:
        return None
    return [
        f"{dataset}, {protocol} protocol — " + "; ".join(clauses) + " (",
        Link(f"{dataset}, {protocol} table", comparison_key(dataset, protocol)),
        ").",
    ]


def cog_sentence(df: pd.DataFrame, protocol: str) -> Text | None:
    """How the COG variants compare with their counterparts under ``protocol``.

    Every (dataset, pair, metric) of NLL, Brier, ECE-15 and accuracy on the test split is
    one comparison, classified by :func:`~cogcal.report.aggregate.compare`. The sentence
    counts wins, ties and losses beyond the spread and names every loss (up to six, then
    a count). None when no COG variant is present next to its counterpart.
    """
    idx = {k: s for k, s in pair_stats(df, COG_METRICS).items() if k[1] == protocol}
    datasets = sorted({k[0] for k in idx})
    counts = {"better": 0, "within": 0, "worse": 0, "unknown": 0}
    losses: list[str] = []
    pairs_seen: list[str] = []
    for dataset in datasets:
        methods = [k[2] for k in idx if k[0] == dataset]
        for cog, base in present_pairs(methods):
            label = f"{cog} vs {base}"
            if label not in pairs_seen:
                pairs_seen.append(label)
            for metric in COG_METRICS:
                a = idx.get((dataset, protocol, cog, metric))
                b = idx.get((dataset, protocol, base, metric))
                if a is None or b is None:
                    continue
                verdict = compare(a, b, higher_is_better=metric in HIGHER_IS_BETTER)
                counts[verdict] += 1
                if verdict == "worse":
                    losses.append(
                        f"{cog} vs {base} on {dataset}, {NAMES[metric]} ({_stat(a)} against "
                        f"{_stat(b)})"
                    )
    total = sum(counts.values())
    if not total:
        return None
    metrics = _join([NAMES[m] for m in COG_METRICS])
    text = (
        f"{protocol.capitalize()} protocol, COG against its counterpart ({_join(pairs_seen)}; "
        f"{metrics}): COG is better beyond the seed spread in {counts['better']} of {total} "
        f"comparisons, within the spread in {counts['within']}"
    )
    if counts["unknown"]:
        text += f", not judged in {counts['unknown']} (fewer than 2 seeds)"
    if losses:
        shown = losses[:_LISTED]
        more = f" and {len(losses) - _LISTED} more" if len(losses) > _LISTED else ""
        text += f", and loses beyond the spread in {counts['worse']}: " + "; ".join(shown) + more
    else:
        text += ", and never worse beyond the spread"
    return [text + " (", Link("Where COG loses", "losses"), ")."]


def edge_sentence(tuning: pd.DataFrame | None) -> Text:
    """Which tuned choices still sit at a grid edge (from ``tuning.csv``)."""
    if tuning is None:
        return (
            "No tuning.csv was found, so whether a tuned learning rate sits at a grid edge "
            "cannot be checked."
        )
    groups = tuning.groupby(["protocol", "dataset", "group"]).ngroups if not tuning.empty else 0
    edges = edge_choices(tuning)
    if not edges:
        return [
            f"Every tuned choice ({groups} tuning group(s)) is interior to its grid (",
            Link("tuning", "tuning"),
            ").",
        ]
    return [
        f"{len(edges)} of {groups} tuned choice(s) still sit at a grid edge, so the methods "
        "using them may do better with a wider grid: " + "; ".join(e.text() for e in edges) + " (",
        Link("tuning", "tuning"),
        ").",
    ]


def coverage_sentence(short_cells: int, failed_runs: int) -> Text | None:
    """How many cells have fewer seeds than planned and how many runs did not finish."""
    if not short_cells and not failed_runs:
        return None
    parts = []
    if short_cells:
        parts.append(f"{short_cells} result cell(s) hold fewer seeds than planned")
    if failed_runs:
        parts.append(f"{failed_runs} run(s) failed, diverged or were interrupted")
    return [
        _join(parts) + "; the tables mark those cells and average the seeds present (",
        Link("failures and missing seeds", "failures"),
        ").",
    ]


def verdict_section(
    df: pd.DataFrame,
    tuning: pd.DataFrame | None,
    *,
    datasets: Sequence[str],
    protocols: Sequence[str],
    short_cells: int = 0,
    failed_runs: int = 0,
) -> Section:
    """The verdict: the sentences of this module as a list, then the spread rule."""
    items: list[Text] = []
    for protocol in protocols:
        for dataset in datasets:
            s = best_sentence(df, dataset, protocol)
            if s is not None:
                items.append(s)
    for protocol in protocols:
        s = cog_sentence(df, protocol)
        if s is not None:
            items.append(s)
    if not items:
        items.append("There are no test results to compare yet.")
    items.append(edge_sentence(tuning))
    cov = coverage_sentence(short_cells, failed_runs)
    if cov is not None:
        items.append(cov)
    blocks = [
        Paragraph("Generated from the numbers of this report (test split, means over seeds):"),
        Paragraph(items=items),
        Paragraph("Rule: " + SPREAD_RULE),
    ]
    return Section("Verdict", blocks, key="verdict")
