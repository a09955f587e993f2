"""The verdict that opens a bench report, and "The paper's claims at this scale".

Every statement rests on paired comparisons (:func:`cogcal.report.stats.paired`) corrected
with Holm over their family (:data:`cogcal.report.stats.PAIRED_RULE`). The families, per
protocol: each COG variant against its counterpart (:func:`cogcal.report._common.counterparts`)
on test NLL, Brier, ECE-15 and accuracy over every dataset; cog-fc against the expressive
COG variants; COG against its counterpart on OOD AUROC / FPR95 and on the shift averages;
and, per dataset, the best method on each metric against every other method.

A comparison is **budget-bound** when its two methods' test accuracies differ by more than
:data:`ACC_MARGIN`, or when one of them did not converge: in some seed its kept
checkpoint (best validation Brier) is the last epoch of a stage that ran its whole budget,
so the run was still improving (:class:`Checkpoints`). The verdict says so in the
sentence that uses the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from cogcal.report._common import method_order, slug
from cogcal.report.blocks import Link, Paragraph, Section, Table, Text
from cogcal.report.frame import aggregate, rows, seed_values
from cogcal.report.stats import (
    HIGHER_IS_BETTER,
    PAIRED_RULE,
    Paired,
    holm,
    paired,
    pairwise_wins,
    summary_rank,
)
from cogcal.report.tables import LABELS, NAMES, cell, comparison_key, fmt, present_pairs

__all__ = [
    "ACC_MARGIN",
    "CLAIMS",
    "COG_METRICS",
    "Checkpoints",
    "Comparison",
    "Judgement",
    "compare_family",
    "judge_claims",
    "verdict_section",
]

#: Metrics of the COG-against-counterpart comparisons.
COG_METRICS: tuple[str, ...] = ("nll", "brier", "ece_15", "acc")
#: Metrics of the best-method statements.
BEST_METRICS: tuple[str, ...] = ("nll", "brier", "ece_15")
#: Test accuracies further apart than this make a comparison budget-bound.
ACC_MARGIN = 0.02
#: The expressive COG variants cog-fc is compared with.
EXPRESSIVE: tuple[str, ...] = ("cog-ts", "cog-ms", "cog-vs", "cog-dir")
#: Classes from which a dataset counts as "many classes".
MANY_CLASSES = 100
CLAIMS: tuple[str, ...] = (
    "COG variants match or beat their post-hoc counterparts",
    "COG-FC is as good as the expressive variants (cog-ts, cog-ms, ...)",
    "COG-FC ranks near the top",
    "COG helps OOD detection",
    "COG-FC beats TS on most tasks in multi-task learning",
    "Post-hoc matrix scaling is unstable with many classes, COG-MS is not",
)


# --------------------------------------------------------------------------- convergence


@dataclass
class Checkpoints:
    """Per run, the epoch its checkpoint came from, read from the runs' records.

    ``frame`` has one row per (dataset, protocol, method, seed, stage): ``budget`` (the
    stage's epochs), ``ran`` (epochs run), ``best`` (0-based epoch of the kept
    checkpoint), ``stopped`` (``""``, ``lr_floor`` or ``patience``) and ``last`` (the
    checkpoint is the last epoch and the stage ran its whole budget: still improving).
    """

    frame: pd.DataFrame = field(default_factory=pd.DataFrame)

    @classmethod
    def read(cls, runs: Sequence[tuple[str, str, str, int, object]]) -> Checkpoints:
        """From ``(dataset, protocol, method, seed, run folder)`` of finished runs."""
        from cogcal.train.rundir import RunDir, RunFolderError

        out = []
        for dataset, protocol, method, seed, path in runs:
            try:
                record = RunDir(path).read_record()
            except RunFolderError:
                continue
            if record is None:
                continue
            cfg = record.config
            for stage, budget in (
                ("stage1", cfg.get("epochs")),
                ("stage2", cfg.get("stage2_epochs")),
            ):
                t = (record.timing or {}).get(stage)
                if not isinstance(t, dict) or "best_epoch" not in t:
                    continue
                ran, best = int(t.get("epochs_run", 0)), int(t["best_epoch"])
                stopped = str(t.get("stopped") or "")
                budget = int(budget) if isinstance(budget, int | float) else ran
                last = best == ran - 1 and ran >= budget and stopped != "patience"
                out.append(
                    (dataset, protocol, method, seed, stage, budget, ran, best, stopped, last)
                )
        cols = ["dataset", "protocol", "method", "seed", "stage", "budget", "ran", "best"]
        return cls(pd.DataFrame(out, columns=[*cols, "stopped", "last"]))

    def unconverged(self, dataset: str, protocol: str, method: str) -> str | None:
        """``"ts: checkpoint at its last epoch in 3 of 5 seeds"``, or None."""
        f = self.frame
        if f.empty:
            return None
        f = f[(f["dataset"] == dataset) & (f["protocol"] == protocol) & (f["method"] == method)]
        if f.empty or not f["last"].any():
            return None
        seeds = f.groupby("seed")["last"].any()
        return (
            f"{method}'s checkpoint is its last epoch in {int(seeds.sum())} of {len(seeds)} seeds"
        )

    def table(self) -> Table | None:
        """Per (protocol, dataset, method, stage): budget, checkpoint epochs, how many at
        the last epoch."""
        if self.frame.empty:
            return None
        body = []
        f = self.frame
        for (p, ds, m, st), g in f.groupby(["protocol", "dataset", "method", "stage"], sort=False):
            epochs = ", ".join(str(int(b) + 1) for b in g.sort_values("seed")["best"])
            stopped = ", ".join(sorted(set(g["stopped"]) - {""})) or "budget"
            k = int(g["last"].sum())
            body.append(
                [cell(p), cell(ds), cell(m), cell(st), cell(int(g["budget"].max()))]
                + [cell(epochs), cell(stopped), cell(f"{k} of {len(g)}", bold=k > 0)]
            )
        order = method_order([r[2].text for r in body])
        body.sort(key=lambda r: (r[0].text, r[1].text, order.index(r[2].text), r[3].text))
        header = ["Protocol", "Dataset", "Method", "Stage", "Budget (epochs)"]
        header += ["Checkpoint epoch per seed", "Stopped by", "At last epoch"]
        notes: list[Text] = [
            "Epochs count from 1. The kept checkpoint is the epoch of lowest validation Brier; "
            "one at the last epoch of a stage that ran its whole budget (bold) means the run "
            "was still improving: comparisons with that method are flagged budget-bound. "
            "From each run's metrics.json (timing)."
        ]
        return Table("Checkpoint epochs and budgets", header, body, notes, "checkpoints")


# --------------------------------------------------------------------------- comparisons


@dataclass
class Comparison:
    """One paired comparison of method ``a`` with ``b`` (``a - b`` per seed)."""

    measure: str
    dataset: str
    protocol: str
    a: str
    b: str
    metric: str
    test: Paired
    family: str = ""
    caveats: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return self.test.verdict

    def text(self) -> str:
        """``cog-ts vs ts, mnist1d NLL: Δ -0.012 [-0.020, -0.004], better``."""
        return f"{self.a} vs {self.b}, {self.dataset} {NAMES.get(self.metric, self.metric)}: " + (
            f"{self.test.text()}, {self.verdict}"
        )


def compare_family(
    df: pd.DataFrame,
    measure: str,
    protocol: str,
    pairs: Sequence[tuple[str, str, str]],
    metrics: Sequence[str],
    family: str,
    checkpoints: Checkpoints | None = None,
) -> list[Comparison]:
    """Paired comparisons ``(dataset, a, b)`` x ``metrics`` of ``measure``
    (:func:`~cogcal.report.frame.seed_values`), Holm-corrected together as ``family``,
    with their budget caveats."""
    values = seed_values(df, measure, protocol=protocol)
    test_acc = seed_values(df, "test", protocol=protocol, metric="acc")
    found = []
    for dataset, a, b in pairs:
        d = values[values["dataset"] == dataset]
        for metric in metrics:
            s = [d[(d["method"] == m) & (d["metric"] == metric)].set_index("seed")["value"]
                 for m in (a, b)]  # fmt: skip
            t = paired(s[0], s[1], higher_is_better=metric in HIGHER_IS_BETTER)
            if t is not None:
                found.append(Comparison(measure, dataset, protocol, a, b, metric, t, family))
    for c, t in zip(found, holm([c.test for c in found]), strict=True):
        c.test = t  # type: ignore[assignment]
        c.caveats = _caveats(test_acc, c, checkpoints)
    return found


def _caveats(acc: pd.DataFrame, c: Comparison, checkpoints: Checkpoints | None) -> list[str]:
    out = []
    d = acc[acc["dataset"] == c.dataset]
    means = [d.loc[d["method"] == m, "value"].mean() for m in (c.a, c.b)]
    if all(math.isfinite(m) for m in means) and abs(means[0] - means[1]) > ACC_MARGIN:
        out.append(f"test accuracies differ by {abs(means[0] - means[1]):.3f} > {ACC_MARGIN}")
    for m in (c.a, c.b):
        why = checkpoints.unconverged(c.dataset, c.protocol, m) if checkpoints else None
        if why:
            out.append(why)
    return out


def paired_table(found: Sequence[Comparison], title: str, key: str) -> Table | None:
    """Every comparison of ``found``: means, Δ with its 95% interval, Holm p, verdict,
    budget caveats (one row each)."""
    if not found:
        return None
    body = []
    for c in found:
        v = c.verdict
        body.append(
            [cell(c.dataset), cell(f"{c.a} vs {c.b}"), cell(LABELS.get(c.metric, c.metric))]
            + [cell(c.test.text()), cell(c.test.n), cell(fmt(c.test.p_adj, None, 3))]
            + [cell(v, bold=v != "undecided"), cell("; ".join(c.caveats) or "—")]
        )
    m = sum(math.isfinite(c.test.p) for c in found)
    notes: list[Text] = [
        f"Δ = mean over seeds of the per-seed difference (first − second method) with its 95% "
        f"Student-t interval; p: paired t-test, Holm-adjusted over the {m} comparisons of this "
        "table. better / worse (bold): decided for the first method; otherwise undecided. "
        f"Budget caveat: accuracies more than {ACC_MARGIN} apart, or a checkpoint at the last "
        "epoch of its budget (still improving)."
    ]
    header = ["Dataset", "Comparison", "Metric", "Δ [95% CI]", "Seeds", "p (Holm)", "Verdict"]
    return Table(title, [*header, "Budget caveat"], body, notes, key)


def _tally(found: Sequence[Comparison]) -> dict[str, int]:
    out = {"better": 0, "worse": 0, "undecided": 0}
    for c in found:
        out[c.verdict] += 1
    return out


def _join(words: Sequence[str], last: str = "and") -> str:
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" {last} " + words[-1]


def _bound(found: Sequence[Comparison]) -> str:
    """``; budget-bound: ...`` naming the methods still improving at their last epoch and
    the pairs whose accuracies differ by more than :data:`ACC_MARGIN`."""
    why = list(dict.fromkeys(w for c in found for w in c.caveats))
    if not why:
        return ""
    late = [w.split("'s checkpoint is its last epoch in ") for w in why if "last epoch" in w]
    gaps = [f"{c.a} vs {c.b}" for c in found if any("accuracies" in w for w in c.caveats)]
    parts = []
    if late:
        parts.append(
            "still improving at the last epoch: "
            + ", ".join(f"{m} ({k.replace(' seeds', '')})" for m, k in late)
        )
    if gaps:
        parts.append(f"accuracies more than {ACC_MARGIN} apart: {_join(list(dict.fromkeys(gaps)))}")
    return "; budget-bound — " + "; ".join(parts)


# --------------------------------------------------------------------------- claims


@dataclass
class Judgement:
    """One claim: ``holds``, ``does not hold``, ``undecided`` or ``not tested in this
    suite``, with its evidence (linking to the table it comes from)."""

    claim: str
    judgement: str
    evidence: Text
    short: str = ""


def _direction(found: Sequence[Comparison], *, claim: str, key: str, want: str) -> Judgement:
    """A claim that ``a`` is not worse than ``b`` (``want="not worse"``) or better
    (``want="better"``) over ``found``."""
    t = _tally(found)
    decidable = [c for c in found if c.test.n >= 2]
    losses = [c.text() for c in found if c.verdict == "worse"]
    if not decidable or not (t["better"] or t["worse"]):
        judgement = "undecided"
    elif want == "not worse":
        judgement = "does not hold" if losses else "holds"
    elif t["better"] and not losses:
        judgement = "holds"
    elif losses:
        judgement = "does not hold"
    else:
        judgement = "undecided"
    text = (
        f"{t['better']} decided better, {t['worse']} decided worse, {t['undecided']} undecided "
        f"of {len(found)} paired comparisons (Holm)"
    )
    if losses:
        text += ": worse in " + "; ".join(losses[:4]) + (" …" if len(losses) > 4 else "")
    short = f"{t['better']} better, {t['worse']} worse of {len(found)}, Holm{_bound(found)}"
    return Judgement(
        claim, judgement, [text + _bound(found) + " (", Link("table", key), ")."], short
    )


def judge_claims(
    df: pd.DataFrame,
    protocol: str,
    families: dict[str, list[Comparison]],
    classes: dict[str, int],
) -> list[Judgement]:
    """Judge :data:`CLAIMS` under ``protocol`` from the comparison ``families`` (keys
    ``cog``, ``fc``, ``ood``) and the results (ranks, per-task rows); ``classes`` maps a
    dataset to its number of classes (``bench.json``)."""
    p = slug(protocol)
    out = []
    cog = families.get("cog", [])
    if cog:
        out.append(_direction(cog, claim=CLAIMS[0], key=f"paired-{p}", want="not worse"))
    else:
        out.append(
            Judgement(
                CLAIMS[0], "not tested in this suite", "no COG variant next to its counterpart."
            )
        )
    fc = families.get("fc", [])
    if fc:
        out.append(_direction(fc, claim=CLAIMS[1], key=f"paired-fc-{p}", want="not worse"))
    else:
        out.append(
            Judgement(
                CLAIMS[1],
                "not tested in this suite",
                "cog-fc and an expressive COG variant are not both in it.",
            )
        )
    out.append(_rank_claim(df, protocol))
    ood = [c for c in families.get("ood", []) if c.metric == "auroc"]
    if ood:
        out.append(_direction(ood, claim=CLAIMS[3], key=f"paired-ood-{p}", want="better"))
    else:
        out.append(
            Judgement(CLAIMS[3], "not tested in this suite", "no OOD results next to a COG pair.")
        )
    out.append(_mtl_claim(df, protocol))
    many = [c for c in cog if c.a == "cog-ms" and classes.get(c.dataset, 0) >= MANY_CLASSES]
    if many:
        j = _direction(many, claim=CLAIMS[5], key=f"paired-{p}", want="better")
        out.append(j)
    else:
        out.append(
            Judgement(
                CLAIMS[5],
                "not tested in this suite",
                f"needs ms and cog-ms on a dataset with ≥ {MANY_CLASSES} classes; the paper-cifar100 suite tests it.",
            )
        )
    return out


def _rank_claim(df: pd.DataFrame, protocol: str) -> Judgement:
    d = aggregate(df, split="test", protocol=protocol)
    if "cog-fc" not in set(d["method"]):
        return Judgement(CLAIMS[2], "not tested in this suite", "cog-fc is not in it.")
    places, links = [], []
    for ds in sorted(set(d["dataset"])):
        r = summary_rank(rows(d, dataset=ds), split=None).dropna(subset=["rank"])
        if "cog-fc" not in set(r["method"]):
            continue
        place = int((r["rank"] < float(r.loc[r["method"] == "cog-fc", "rank"].iloc[0])).sum()) + 1
        places.append((ds, place, len(r)))
        links += [Link(ds, comparison_key(ds, protocol)), ", "]
    if not places:
        return Judgement(CLAIMS[2], "undecided", "cog-fc has no summary rank.")
    judgement = "holds" if all(pl <= 3 for _, pl, _ in places) else "does not hold"
    text = "; ".join(f"{ds}: place {pl} of {n}" for ds, pl, n in places)
    rule = " by summary rank on test Acc, NLL, Brier (holds: top 3 on every dataset; means"
    evidence = [text + rule + ", no test) (", *links[:-1], ")."]
    return Judgement(CLAIMS[2], judgement, evidence, text)


def _mtl_claim(df: pd.DataFrame, protocol: str) -> Judgement:
    d = rows(df, split="test", protocol=protocol, condition="", severity="")
    d = d[~d["task"].isin(["", "mean"])]
    if d.empty or not {"cog-fc", "ts"} <= set(d["method"]):
        why = "needs multi-task results of cog-fc and ts; the mtl-quick suite tests it."
        return Judgement(CLAIMS[4], "not tested in this suite", why)
    parts, ok = [], []
    for ds in sorted(set(d["dataset"])):
        wins, total = pairwise_wins(rows(d, dataset=ds), "cog-fc", "ts")
        ok.append(total > 0 and wins > total / 2)
        parts += [
            f"{ds}: better on both accuracy and Brier on {wins} of {total} tasks (",
            Link("wins", f"mtl-wins-{slug(protocol)}-{slug(ds)}"),
            "); ",
        ]
    return Judgement(CLAIMS[4], "holds" if all(ok) else "does not hold", [*parts[:-1], ")."])


# --------------------------------------------------------------------------- verdict


def _cog_sentence(
    dataset: str,
    protocols: Sequence[str],
    fams: dict[str, dict[str, list[Comparison]]],
    df: pd.DataFrame,
) -> Text:
    """Does COG help on ``dataset``? One sentence, one clause per protocol."""
    clauses: list[str | Link] = []
    for p in protocols:
        found = [c for c in fams[p].get("cog", []) if c.dataset == dataset]
        if not found:
            continue
        t = _tally(found)
        answer = "undecided"
        if t["better"] and not t["worse"]:
            answer = "yes"
        elif t["worse"] and not t["better"]:
            answer = "no"
        elif t["better"]:
            answer = "mixed"
        if answer != "undecided" and _bound(found):
            answer += ", budget-bound"
        ce = seed_values(df, "test", dataset=dataset, protocol=p, method="ce", metric="ece_15")
        over = f"; ce test ECE-15 {ce['value'].mean():.3f}" if not ce.empty else ""
        pairs = _join(sorted({f"{c.a} vs {c.b}" for c in found}))
        clauses += [
            f"{p} protocol: {answer} — against its post-hoc counterpart ({pairs}) COG is "
            f"better in {t['better']}, worse in {t['worse']} and undecided in {t['undecided']} "
            f"of {len(found)} paired comparisons (Holm over {len(fams[p].get('cog', []))})"
            f"{over}{_bound(found)} (",
            Link("paired", f"paired-{slug(p)}"),
            "); ",
        ]
    if not clauses:
        return f"{dataset}: no COG variant next to its counterpart."
    return [f"Does COG help on {dataset}? ", *clauses[:-1], ")."]


def _best_sentence(df: pd.DataFrame, dataset: str, protocol: str) -> Text | None:
    """Per metric, the method with the best test mean and the methods it beats (decided,
    Holm over the dataset's best-method comparisons)."""
    d = seed_values(df, "test", dataset=dataset, protocol=protocol)
    methods = method_order(d["method"].unique())
    tops, pairs = {}, []
    for metric in BEST_METRICS:
        means = d[d["metric"] == metric].groupby("method")["value"].mean()
        if means.empty:
            continue
        tops[metric] = str(means.idxmin())
        pairs += [(metric, tops[metric], m) for m in methods if m != tops[metric]]
    if not tops:
        return None
    found = []
    for metric, a, b in pairs:
        s = [
            d[(d["method"] == m) & (d["metric"] == metric)].set_index("seed")["value"]
            for m in (a, b)
        ]
        found.append(paired(s[0], s[1], higher_is_better=False))
    tests = holm(found)
    clauses = []
    for metric, top in tops.items():
        mine = [
            (b, t)
            for (m, _, b), t in zip(pairs, tests, strict=True)
            if m == metric and t is not None
        ]
        beaten = [b for b, t in mine if t.verdict == "better"]
        open_ = [b for b, t in mine if t.verdict != "better"]
        mean = d[(d["method"] == top) & (d["metric"] == metric)]["value"].mean()
        text = f"lowest {NAMES[metric]} {top} ({mean:.3f})"
        text += f", decided better than {len(beaten)} of {len(mine)} others"
        if open_:
            text += f", not separated from {_join(open_)}"
        clauses.append(text)
    m = sum(t is not None and math.isfinite(t.p) for t in tests)
    return [
        f"Best methods on {dataset}, {protocol} protocol: "
        + "; ".join(clauses)
        + f" (Holm over {m}; ",
        Link("table", comparison_key(dataset, protocol)),
        ").",
    ]


def families(
    df: pd.DataFrame, protocol: str, checkpoints: Checkpoints | None
) -> dict[str, list[Comparison]]:
    """The comparison families of ``protocol``: ``cog`` (each COG variant vs its
    counterpart, test), ``fc`` (cog-fc vs the expressive variants), ``ood`` and
    ``shift`` (COG vs counterpart on OOD AUROC/FPR95 and the shift averages)."""
    d = aggregate(df, split="test", protocol=protocol)
    pairs, fc = [], []
    for ds in sorted(set(d["dataset"])):
        present = set(rows(d, dataset=ds)["method"])
        pairs += [(ds, c, b) for c, b in present_pairs(list(present))]
        if "cog-fc" in present:
            fc += [(ds, "cog-fc", e) for e in EXPRESSIVE if e in present]
    out = {
        "cog": compare_family(df, "test", protocol, pairs, COG_METRICS, "cog", checkpoints),
        "fc": compare_family(df, "test", protocol, fc, COG_METRICS, "fc", checkpoints),
    }
    if (df["split"] == "ood").any():
        out["ood"] = compare_family(
            df, "ood", protocol, pairs, ("auroc", "fpr95"), "ood", checkpoints
        )
    if (df["split"] == "shift").any():
        out["shift"] = compare_family(
            df, "shift", protocol, pairs, COG_METRICS, "shift", checkpoints
        )
    return out


def verdict_section(
    df: pd.DataFrame,
    fams: dict[str, dict[str, list[Comparison]]],
    claims: dict[str, list[Judgement]],
    *,
    datasets: Sequence[str],
    protocols: Sequence[str],
    details: Sequence[Text] = (),
) -> Section:
    """The verdict: one answer per dataset to "does COG help here?", the claims in one
    line each, then the details (best methods, grid edges, coverage) and the rule."""
    answers = [_cog_sentence(ds, protocols, fams, df) for ds in datasets]
    items: list[Text] = []
    for p in protocols:
        for j in claims.get(p, []):
            links = (
                [x for x in j.evidence if isinstance(x, Link)]
                if isinstance(j.evidence, list)
                else []
            )
            key = links[0].key if links else f"claims-{slug(p)}"
            short = f": {j.short}" if j.short else ""
            items.append([f"{p}: “{j.claim}” — {j.judgement}{short} (", Link("table", key), ")."])
    best = [s for p in protocols for ds in datasets if (s := _best_sentence(df, ds, p)) is not None]
    blocks = [
        Paragraph(items=answers or ["There are no test results to compare yet."]),
        Paragraph("The paper's claims at this scale:", items=items),
        Paragraph("Details:", items=[*best, *details]),
        Paragraph("Rule: " + PAIRED_RULE),
    ]
    return Section("Verdict", blocks, key="verdict")


def claims_section(
    fams: dict[str, dict[str, list[Comparison]]],
    claims: dict[str, list[Judgement]],
    checkpoints: Checkpoints | None,
) -> Section:
    """The claims tables, the paired comparisons behind them and the checkpoint epochs."""
    sec = Section("The paper's claims at this scale", key="claims")
    sec.blocks.append(Paragraph(
        "“Holds” for a match-or-beat claim means that no comparison is decided against it "
        "(with few seeds an undetected difference remains possible); for a “helps” or "
        "“beats” claim it means a decided improvement and no decided loss. " + PAIRED_RULE
    ))  # fmt: skip
    titles = {
        "cog": ("COG variant vs post-hoc counterpart, test", "paired"),
        "fc": ("cog-fc vs the expressive COG variants, test", "paired-fc"),
        "ood": ("COG vs counterpart, OOD detection (pooled sets)", "paired-ood"),
        "shift": (
            "COG vs counterpart, covariate shift (mean over conditions, severities)",
            "paired-shift",
        ),
    }
    for p, judged in claims.items():
        body = [
            [cell(j.claim), cell(j.judgement, bold=True), cell(_plain(j.evidence))] for j in judged
        ]
        links = [
            x
            for j in judged
            if not isinstance(j.evidence, str)
            for x in j.evidence
            if isinstance(x, Link)
        ]
        notes: list[Text] = [
            [
                "Evidence: ",
                *[
                    y
                    for x in dict.fromkeys((x.text, x.key) for x in links)
                    for y in (Link(x[1], x[1]), " ")
                ],
            ]
        ]
        sec.blocks.append(
            Table(
                f"Claims, {p} protocol",
                ["Claim", "Judgement", "Evidence"],
                body,
                notes,
                f"claims-{slug(p)}",
            )
        )
        for name, (title, key) in titles.items():
            t = paired_table(fams[p].get(name, []), f"{title} — {p} protocol", f"{key}-{slug(p)}")
            if t is not None:
                sec.blocks.append(t)
    table = checkpoints.table() if checkpoints is not None else None
    if table is not None:
        sec.blocks.append(table)
    return sec


def _plain(text: Text) -> str:
    return (
        text
        if isinstance(text, str)
        else "".join(p.text if isinstance(p, Link) else p for p in text)
    )
