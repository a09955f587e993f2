"""The "Where COG's effect comes from" section, from ``effect.csv``.

Per dataset: ``ce`` without a schedule (the paper's baseline recipe), ``ce`` with COG's
step schedule, and ``cog-fc`` with that schedule at each ratio λ_c/λ_f. The schedule
effect (step against none) and the calibrator-rate effect (cog-fc against ce with the
step schedule) are judged with paired comparisons, Holm over the dataset's comparisons.
"""

from __future__ import annotations

import re

import pandas as pd

from cogcal.report._common import slug
from cogcal.report.blocks import Paragraph, Section, Table, plain
from cogcal.report.frame import rows
from cogcal.report.stats import PAIRED_RULE, paired_family
from cogcal.report.tables import LABELS, stat_table, stats_of
from cogcal.runs.columns import METRIC_NAMES as NAMES

#: The metrics of the effect table and sentence, in order.
EFFECT_METRICS: tuple[str, ...] = ("nll", "brier", "ece_15", "acc")
NO_SCHEDULE = "ce (no schedule)"
STEP = "ce (step schedule)"


def effect_ratio(variant: str) -> float | None:
    """The ratio λ_c/λ_f of an ``effect.csv`` variant ``"cog-fc (ratio R)"`` (else None).

    >>> effect_ratio("cog-fc (ratio 0.1)"), effect_ratio("ce (step schedule)")
    (0.1, None)
    """
    m = re.fullmatch(r"cog-fc \(ratio ([0-9.eE+-]+)\)", variant)
    return float(m.group(1)) if m else None


def effect_variants(effect: pd.DataFrame, dataset: str) -> list[str]:
    """The variants of ``dataset`` in table order: no schedule, step, then cog-fc by ratio."""
    present = set(effect.loc[effect["dataset"] == dataset, "variant"])
    ratios = sorted((r, v) for v in present if (r := effect_ratio(v)) is not None)
    return [v for v in (NO_SCHEDULE, STEP) if v in present] + [v for _, v in ratios]


def effect_table(effect: pd.DataFrame, dataset: str, *, split: str = "test") -> Table | None:
    """Rows ce (no schedule), ce (step schedule), cog-fc at each ratio; columns NLL, Brier,
    ECE-15 and accuracy as mean ± std over seeds (best mean in bold)."""
    stats = stats_of(rows(effect, dataset=dataset, split=split), ("variant", "metric"))
    variants = [v for v in effect_variants(effect, dataset) if any(k[0] == v for k in stats)]
    if not variants:
        return None
    d = rows(effect, dataset=dataset)

    def used(variant: str, column: str) -> str:
        values = sorted(d.loc[d["variant"] == variant, column].dropna().unique())
        return ", ".join(map(plain, values)) or "—"

    labels = {v: [v, *(used(v, c) for c in ("schedule", "lr", "calibrator_lr"))] for v in variants}
    return stat_table(
        f"{dataset}: where COG's effect comes from",
        f"effect-{slug(dataset)}",
        ["Variant", "Schedule", "λ_f (lr)", "λ_c"],
        [(v, labels[v]) for v in variants],
        [(m, LABELS[m], m) for m in EFFECT_METRICS],
        stats,
        notes=[
            f"{split} split, mean ± sample std over seeds; best mean in bold. Schedule effect = "
            "ce (step schedule) against ce (no schedule); calibrator-rate effect = cog-fc at "
            "each ratio against ce (step schedule)."
        ],
    )


def effect_sentence(effect: pd.DataFrame, dataset: str, *, split: str = "test") -> str | None:
    """Which of the schedule and calibrator-rate effects are decided on ``dataset``, metric
    by metric (paired over seeds, Holm over the sentence's comparisons); None without rows.

    Each difference is ``a - b`` of the per-seed values with its 95% interval, tagged
    ``better`` or ``worse`` for ``a`` when decided.
    """
    d = rows(effect, dataset=dataset, split=split)
    if d.empty:
        return None
    present = effect_variants(effect, dataset)
    effects = [("schedule effect", STEP, NO_SCHEDULE)]
    effects += [("calibrator-rate effect", v, STEP) for v in present if effect_ratio(v)]
    tests = paired_family(d, "variant", [(m, a, b) for _, a, b in effects for m in EFFECT_METRICS])
    clauses = []
    for i, (label, a, b) in enumerate(effects):
        mine = tests[i * len(EFFECT_METRICS) : (i + 1) * len(EFFECT_METRICS)]
        head = f"the {label} ({a} against {b})"
        if all(t is None for t in mine):
            clauses.append(f"{head} cannot be measured (a variant has no {split} rows)")
            continue
        decided = [
            f"{NAMES[m]} {t.text()} {t.verdict}"
            for m, t in zip(EFFECT_METRICS, mine, strict=True)
            if t is not None and t.verdict != "undecided"
        ]
        clauses.append(
            f"{head} is decided on {'; '.join(decided)}"
            if decided
            else f"{head} is undecided on every metric"
        )
    if len(effects) == 1:
        clauses.append("no cog-fc run measures the calibrator-rate effect")
    m = sum(t is not None and t.n > 1 for t in tests)
    return f"On {dataset} ({split} split; paired, Holm over {m}), " + "; ".join(clauses) + "."


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
            "the same schedule at each ratio λ_c/λ_f. Rule: " + PAIRED_RULE
        )
    )
    if not (effect["split"] == "test").any():
        sec.blocks.append(Paragraph("effect.csv holds no test-split rows."))
    for dataset in sorted(set(effect["dataset"])):
        table, sentence = effect_table(effect, dataset), effect_sentence(effect, dataset)
        sec.blocks += [table, Paragraph(sentence)] if table is not None and sentence else []
    return sec
