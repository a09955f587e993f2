"""The "Where COG's effect comes from" section, from ``effect.csv``.

Per dataset, three kinds of runs (:data:`cogcal.report.schema.EFFECT_VARIANTS`): ``ce``
without a schedule (the paper's baseline recipe), ``ce`` with the step schedule COG uses,
and ``cog-fc`` (the final layer on the slower rate λ_c = ratio × λ_f) with the same
schedule at each ratio. Two differences separate COG from the paper's baseline:

* the **schedule effect**: ``ce (step schedule)`` against ``ce (no schedule)``;
* the **calibrator-rate effect**: ``cog-fc (ratio R)`` against ``ce (step schedule)``.

Each is judged per metric with the seed-spread rule
(:data:`cogcal.report.aggregate.SPREAD_RULE`), and one generated sentence per dataset
says which differences exceed the spread.
"""

from __future__ import annotations

import math

import pandas as pd

from cogcal.report._common import slug
from cogcal.report.aggregate import HIGHER_IS_BETTER, SPREAD_RULE, Stat, compare
from cogcal.report.blocks import Paragraph, Section, Table, Text
from cogcal.report.frame import effect_ratio, rows
from cogcal.report.tables import FEWER_SEEDS_NOTE, LABELS, NAMES, _cell, stat_text

__all__ = [
    "EFFECT_METRICS",
    "effect_key",
    "effect_section",
    "effect_sentence",
    "effect_stats",
    "effect_table",
    "effect_variants",
]

#: The metrics of the effect table and sentence, in order.
EFFECT_METRICS: tuple[str, ...] = ("nll", "brier", "ece_15", "acc")
NO_SCHEDULE = "ce (no schedule)"
STEP = "ce (step schedule)"


def effect_key(dataset: str) -> str:
    """The anchor of :func:`effect_table`."""
    return f"effect-{slug(dataset)}"


def effect_variants(effect: pd.DataFrame, dataset: str) -> list[str]:
    """The variants of ``dataset`` in table order: no schedule, step, then cog-fc by ratio."""
    present = set(effect.loc[effect["dataset"] == dataset, "variant"])
    ratios = sorted(
        (v for v in present if effect_ratio(v) is not None), key=lambda v: effect_ratio(v)
    )
    return [v for v in (NO_SCHEDULE, STEP) if v in present] + ratios


def effect_stats(
    effect: pd.DataFrame, dataset: str, *, split: str = "test"
) -> dict[str, dict[str, Stat]]:
    """``{variant: {metric: Stat}}`` of ``dataset`` over seeds (NaN values are not seeds)."""
    d = rows(effect, dataset=dataset, split=split)
    out: dict[str, dict[str, Stat]] = {}
    for (variant, metric), grp in d.groupby(["variant", "metric"]):
        out.setdefault(str(variant), {})[str(metric)] = Stat.of(list(grp["value"]))
    return out


def _rates(effect: pd.DataFrame, dataset: str, variant: str, column: str) -> str:
    vals = rows(effect, dataset=dataset)
    vals = vals.loc[vals["variant"] == variant, column].dropna().unique()
    return ", ".join(f"{v:g}" for v in sorted(vals)) or "—"


def effect_table(effect: pd.DataFrame, dataset: str, *, split: str = "test") -> Table | None:
    """Rows ce (no schedule), ce (step schedule), cog-fc at each ratio; columns NLL, Brier,
    ECE-15 and accuracy as mean ± std over seeds (best mean in bold)."""
    stats = effect_stats(effect, dataset, split=split)
    variants = [v for v in effect_variants(effect, dataset) if v in stats]
    if not variants:
        return None
    most = max(s.n for v in variants for s in stats[v].values())
    best = {}
    for m in EFFECT_METRICS:
        means = [stats[v][m].mean for v in variants if m in stats[v]]
        means = [x for x in means if math.isfinite(x)]
        if means:
            best[m] = max(means) if m in HIGHER_IS_BETTER else min(means)
    table_rows = []
    flagged = False
    for v in variants:
        schedule = rows(effect, dataset=dataset)
        schedule = ", ".join(sorted(set(schedule.loc[schedule["variant"] == v, "schedule"])))
        row = [
            _cell(v),
            _cell(schedule or "—"),
            _cell(_rates(effect, dataset, v, "lr")),
            _cell(_rates(effect, dataset, v, "calibrator_lr")),
        ]
        for m in EFFECT_METRICS:
            s = stats[v].get(m)
            if s is None:
                row.append(_cell("—"))
                continue
            flagged |= s.n < most
            bold = m in best and math.isfinite(s.mean) and math.isclose(s.mean, best[m])
            row.append(_cell(stat_text(s.mean, s.std, s.n, most), bold=bold))
        table_rows.append(row)
    header = ["Variant", "Schedule", "λ_f (lr)", "λ_c"] + [LABELS[m] for m in EFFECT_METRICS]
    notes: list[Text] = [
        f"{split} split, mean ± sample std over {most} seed(s); best mean in bold. Schedule "
        "effect = ce (step schedule) against ce (no schedule); calibrator-rate effect = "
        "cog-fc at each ratio against ce (step schedule)."
    ]
    if flagged:
        notes.append(FEWER_SEEDS_NOTE)
    return Table(
        f"{dataset}: where COG's effect comes from", header, table_rows, notes, effect_key(dataset)
    )


def _join(words: list[str], last: str = "and") -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + f" {last} " + words[-1]


def _clause(label: str, a: str, b: str, stats: dict[str, dict[str, Stat]], split: str) -> str:
    missing = [v for v in (a, b) if v not in stats]
    if missing:
        return f"the {label} cannot be measured ({_join(missing)} has no {split} rows)"
    beyond, within, unknown = [], [], []
    for m in EFFECT_METRICS:
        sa, sb = stats[a].get(m), stats[b].get(m)
        if sa is None or sb is None:
            unknown.append(NAMES[m])
            continue
        verdict = compare(sa, sb, higher_is_better=m in HIGHER_IS_BETTER)
        if verdict in ("better", "worse"):
            beyond.append(f"{NAMES[m]} ({sa.mean - sb.mean:+.3f}, {verdict})")
        elif verdict == "within":
            within.append(NAMES[m])
        else:
            unknown.append(NAMES[m])
    head = f"the {label} ({a} against {b})"
    if not beyond and not within:
        return f"{head} cannot be judged (fewer than 2 seeds or missing metrics)"
    if beyond:
        text = f"{head} exceeds the seed spread on {_join(beyond)}"
        if within:
            text += f" but not on {_join(within, 'or')}"
    else:
        text = f"{head} stays within the seed spread on {_join(within)}"
    if unknown:
        text += f" ({_join(unknown)} not judged: fewer than 2 seeds)"
    return text


def effect_sentence(effect: pd.DataFrame, dataset: str, *, split: str = "test") -> str | None:
    """One sentence saying which of the schedule and calibrator-rate effects exceed the
    seed spread on ``dataset``, metric by metric (None without rows).

    Differences are ``a - b`` of the means (negative is better for NLL, Brier and ECE,
    positive for accuracy), each tagged ``better`` or ``worse`` for ``a``.
    """
    stats = effect_stats(effect, dataset, split=split)
    if not stats:
        return None
    clauses = [_clause("schedule effect", STEP, NO_SCHEDULE, stats, split)]
    for v in effect_variants(effect, dataset):
        if effect_ratio(v) is not None:
            clauses.append(_clause("calibrator-rate effect", v, STEP, stats, split))
    if len(clauses) == 1:
        clauses.append("no cog-fc run measures the calibrator-rate effect")
    return f"On {dataset} ({split} split), " + "; ".join(clauses) + "."


def effect_section(effect: pd.DataFrame | None) -> Section | None:
    """The section, one table and one sentence per dataset (None without effect.csv)."""
    if effect is None:
        return None
    sec = Section("Where COG's effect comes from", key="effect")
    sec.blocks.append(
        Paragraph(
            "COG differs from the paper's cross-entropy baseline in two ways: it uses the step "
            "schedule, and it trains the final layer on a slower learning rate. The runs below "
            "separate them: ce without schedule, ce with the step schedule, and cog-fc with "
            "the same schedule at each ratio λ_c/λ_f. Rule: " + SPREAD_RULE
        )
    )
    split = "test" if (effect["split"] == "test").any() else None
    if effect.empty or split is None:
        sec.blocks.append(Paragraph("effect.csv holds no test-split rows."))
        return sec
    for dataset in sorted(set(effect["dataset"])):
        table = effect_table(effect, dataset, split=split)
        if table is None:
            continue
        sec.blocks.append(table)
        sentence = effect_sentence(effect, dataset, split=split)
        if sentence:
            sec.blocks.append(Paragraph(sentence))
    return sec
