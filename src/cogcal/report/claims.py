"""The verdict that opens a bench report, and "The paper's claims at this scale".

Every statement rests on paired comparisons Holm-corrected over their family
(:data:`cogcal.report.stats.PAIRED_RULE`; the families: :func:`families`). A comparison is
**budget-bound** when its methods' test accuracies differ by more than :data:`ACC_MARGIN`
or one of them was still improving at the last epoch of its budget (:class:`Checkpoints`);
the verdict says so in the sentence that uses it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from cogcal.report._common import method_order, slug
from cogcal.report.blocks import Link, Paragraph, Section, Table, Text
from cogcal.report.frame import aggregate, rows, seed_values
from cogcal.report.regime import Regime
from cogcal.report.stats import PAIRED_RULE, Paired, paired_family, pairwise_wins, summary_rank
from cogcal.report.tables import LABELS, cell, comparison_key, fmt, present_pairs
from cogcal.runs import RunDir, RunFolderError
from cogcal.runs.columns import METRIC_NAMES as NAMES

#: Metrics of the COG-against-counterpart comparisons.
COG_METRICS: tuple[str, ...] = ("nll", "brier", "ece_15", "acc")
#: Test accuracies further apart than this make a comparison budget-bound.
ACC_MARGIN = 0.02
#: The expressive COG variants cog-fc is compared with.
EXPRESSIVE: tuple[str, ...] = ("cog-ts", "cog-ms", "cog-vs", "cog-dir")
#: The strongest post-hoc calibrators every COG variant is also compared with (beyond its
#: own counterpart), those of them a suite runs: Dirichlet calibration, structured matrix
#: scaling (the strongest post-hoc method on vision logits in Berta et al. 2026) and the
#: non-parametric maps (docs/method.md §2).
STRONG_POSTHOC: tuple[str, ...] = ("dirichlet", "sms", "isotonic", "histogram")
#: Classes from which a dataset counts as "many classes".
MANY_CLASSES = 100
#: "COG-FC ranks near the top": the places that count as near the top.
TOP = 3
NOT_TESTED = "not tested in this suite"
CLAIMS: tuple[str, ...] = (
    "COG variants match or beat their post-hoc counterparts",
    "COG-FC is as good as the expressive variants (cog-ts, cog-ms, ...)",
    "COG-FC ranks near the top",
    "COG helps OOD detection",
    "COG-FC beats TS on most tasks in multi-task learning",
    "Post-hoc matrix scaling is unstable with many classes, COG-MS is not",
)


@dataclass
class Checkpoints:
    """Per run and stage, the epoch its kept checkpoint came from (the runs' records).

    ``frame`` columns: dataset, protocol, method, seed, stage, ``budget`` (the stage's
    epochs), ``ran`` (epochs run), ``best`` (0-based epoch of the checkpoint), ``stopped``
    (``""``, ``lr_floor`` or ``patience``) and ``last`` (the checkpoint is the last epoch
    of a stage that ran its whole budget: still improving).
    """

    frame: pd.DataFrame = field(default_factory=pd.DataFrame)

    @classmethod
    def read(cls, runs: Sequence[tuple[str, str, str, int, object]]) -> Checkpoints:
        """From ``(dataset, protocol, method, seed, run folder)`` of finished runs."""
        out = []
        for *key, path in runs:
            try:
                record = RunDir(path).read_record()
            except RunFolderError:
                continue
            for stage, budget in (("stage1", "epochs"), ("stage2", "stage2_epochs")):
                t = (record.timing or {}).get(stage) if record is not None else None
                if not isinstance(t, dict) or "best_epoch" not in t:
                    continue
                ran, best = int(t.get("epochs_run", 0)), int(t["best_epoch"])
                stopped = str(t.get("stopped") or "")
                budget = record.config.get(budget)  # type: ignore[union-attr]
                budget = int(budget) if isinstance(budget, int | float) else ran
                last = best == ran - 1 and ran >= budget and stopped != "patience"
                out.append((*key, stage, budget, ran, best, stopped, last))
        cols = ["dataset", "protocol", "method", "seed", "stage", "budget", "ran", "best"]
        return cls(pd.DataFrame(out, columns=[*cols, "stopped", "last"]))

    def late(self, dataset: str, protocol: str, method: str) -> tuple[int, int]:
        """``(seeds whose checkpoint is a last epoch, seeds)`` of one method."""
        f = self.frame
        if f.empty:
            return 0, 0
        f = f[(f["dataset"] == dataset) & (f["protocol"] == protocol) & (f["method"] == method)]
        seeds = f.groupby("seed")["last"].any()
        return int(seeds.sum()), len(seeds)

    def table(self) -> Table | None:
        """Per protocol, dataset, method and stage: budget, checkpoint epoch per seed, how
        many at the last epoch."""
        if self.frame.empty:
            return None
        body = []
        for (p, ds, m, st), g in self.frame.groupby(["protocol", "dataset", "method", "stage"]):
            epochs = ", ".join(str(int(b) + 1) for b in g.sort_values("seed")["best"])
            k, stopped = int(g["last"].sum()), ", ".join(sorted(set(g["stopped"]) - {""}))
            row = (p, ds, m, st, int(g["budget"].max()), epochs, stopped or "budget")
            body.append([*map(cell, row), cell(f"{k} of {len(g)}", k > 0)])
        order = method_order([r[2].text for r in body])
        body.sort(key=lambda r: (r[0].text, r[1].text, order.index(r[2].text), r[3].text))
        header = ["Protocol", "Dataset", "Method", "Stage", "Budget (epochs)",
                  "Checkpoint epoch per seed", "Stopped by", "At last epoch"]  # fmt: skip
        notes: list[Text] = [
            "Epochs count from 1; the kept checkpoint is the epoch of lowest validation Brier. "
            "One at the last epoch of a stage that ran its whole budget (bold) means the run was "
            "still improving: comparisons with that method are budget-bound. From each run's "
            "metrics.json (timing)."
        ]
        return Table("Checkpoint epochs and budgets", header, body, notes, "checkpoints")


@dataclass
class Comparison:
    """One paired comparison of method ``a`` with ``b`` (``a - b`` per seed), with its
    budget caveats: ``late`` = ``{method: (seeds at the last epoch, seeds)}``, ``gap`` =
    the test accuracy difference when larger than :data:`ACC_MARGIN`."""

    dataset: str
    a: str
    b: str
    metric: str
    test: Paired
    late: dict[str, tuple[int, int]] = field(default_factory=dict)
    gap: float | None = None

    @property
    def verdict(self) -> str:
        return self.test.verdict

    def text(self) -> str:
        """``cog-ts vs ts, mnist1d NLL: Δ -0.012 [-0.020, -0.004], better``."""
        metric = NAMES.get(self.metric, self.metric)
        return f"{self.a} vs {self.b}, {self.dataset} {metric}: {self.test.text()}, {self.verdict}"

    def caveats(self) -> list[str]:
        out = [f"{m}'s checkpoint at its last epoch in {k} of {n} seeds" for m, (k, n) in self.late.items()]  # fmt: skip
        return out + ([f"test accuracies {self.gap:.3f} apart"] if self.gap is not None else [])


def compare_family(
    df: pd.DataFrame,
    measure: str,
    protocol: str,
    pairs: Sequence[tuple[str, str, str]],
    metrics: Sequence[str],
    checkpoints: Checkpoints | None = None,
) -> list[Comparison]:
    """Paired comparisons ``(dataset, a, b)`` x ``metrics`` of ``measure``
    (:func:`~cogcal.report.frame.seed_values`), Holm-corrected together, with caveats."""
    values = seed_values(df, measure, protocol=protocol)
    acc = seed_values(df, "test", protocol=protocol, metric="acc")
    acc = acc.groupby(["dataset", "method"])["value"].mean()
    todo = [(ds, a, b, m) for ds, a, b in pairs for m in metrics]
    wanted = [(m, (ds, a), (ds, b)) for ds, a, b, m in todo]
    tests = paired_family(values, ["dataset", "method"], wanted)
    found = []
    for (ds, a, b, metric), t in zip(todo, tests, strict=True):
        if t is None:
            continue
        c = Comparison(ds, a, b, metric, t)
        gap = abs(acc.get((ds, a), math.nan) - acc.get((ds, b), math.nan))
        c.gap = gap if gap > ACC_MARGIN else None
        for m in (a, b):
            k, n = checkpoints.late(ds, protocol, m) if checkpoints else (0, 0)
            if k:
                c.late[m] = (k, n)
        found.append(c)
    return found


def families(
    df: pd.DataFrame, protocol: str, checkpoints: Checkpoints | None
) -> dict[str, list[Comparison]]:
    """The comparison families of ``protocol``: ``cog`` (each COG variant vs its
    counterpart, test), ``strong`` (each COG variant vs each of :data:`STRONG_POSTHOC`
    present, test), ``fc`` (cog-fc vs the expressive variants, test), ``ood`` and
    ``shift`` (COG vs counterpart on OOD AUROC / FPR95 and on the shift averages)."""
    d = aggregate(df, split="test", protocol=protocol)
    pairs, strong, fc = [], [], []
    for ds in sorted(set(d["dataset"])):
        present = set(rows(d, dataset=ds)["method"])
        pairs += [(ds, c, b) for c, b in present_pairs(list(present))]
        cogs = [c for c, _ in present_pairs(list(present))]
        strong += [(ds, c, b) for c in cogs for b in STRONG_POSTHOC if b in present]
        fc += [(ds, "cog-fc", e) for e in EXPRESSIVE if e in present and "cog-fc" in present]
    out = {
        "cog": compare_family(df, "test", protocol, pairs, COG_METRICS, checkpoints),
        "strong": compare_family(df, "test", protocol, strong, COG_METRICS, checkpoints),
        "fc": compare_family(df, "test", protocol, fc, COG_METRICS, checkpoints),
    }
    for measure, metrics in (("ood", ("auroc", "fpr95")), ("shift", COG_METRICS)):
        if (df["split"] == measure).any():
            out[measure] = compare_family(df, measure, protocol, pairs, metrics, checkpoints)
    return out


#: Title and anchor of each family's table.
FAMILY_TABLES = {
    "cog": ("COG variant vs post-hoc counterpart, test", "paired"),
    "strong": ("COG variant vs the strongest post-hoc calibrators, test", "paired-strong"),
    "fc": ("cog-fc vs the expressive COG variants, test", "paired-fc"),
    "ood": ("COG vs counterpart, OOD detection (pooled sets)", "paired-ood"),
    "shift": (
        "COG vs counterpart, covariate shift (mean over conditions, severities)",
        "paired-shift",
    ),  # fmt: skip
}


def paired_table(found: Sequence[Comparison], title: str, key: str) -> Table | None:
    """One row per comparison: per-seed differences, Δ with its 95% interval, Holm p,
    verdict, budget caveats."""
    if not found:
        return None
    body = [
        [cell(c.dataset), cell(f"{c.a} vs {c.b}"), cell(LABELS.get(c.metric, c.metric))]
        + [cell(", ".join(f"{x:+.3f}" for x in c.test.diffs)), cell(c.test.text())]
        + [cell(fmt(c.test.p_adj)), cell(c.verdict, bold=c.verdict != "undecided")]
        + [cell("; ".join(c.caveats()) or "—")]
        for c in found
    ]
    m = sum(math.isfinite(c.test.p) for c in found)
    notes: list[Text] = [
        "Per seed: first − second method (seeds in order). Δ: their mean with its 95% "
        f"Student-t interval; p: paired t-test, Holm-adjusted over the {m} comparisons of "
        "this table; better / worse (bold): decided for the first method. Budget caveat: "
        f"accuracies more than {ACC_MARGIN} apart, or a checkpoint at the last epoch of its "
        "budget (still improving)."
    ]
    header = ["Dataset", "Comparison", "Metric", "Per-seed differences", "Δ [95% CI]", "p (Holm)"]
    return Table(title, [*header, "Verdict", "Budget caveat"], body, notes, key)


def _join(words: Sequence[str]) -> str:
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _bound(found: Sequence[Comparison]) -> str:
    """``; budget-bound — ...`` naming the methods still improving at their last epoch and
    the pairs whose accuracies are more than :data:`ACC_MARGIN` apart ("" without any)."""
    late = {m: kn for c in found for m, kn in c.late.items()}
    gaps = list(dict.fromkeys(f"{c.a} vs {c.b}" for c in found if c.gap is not None))
    late_text = ", ".join(f"{m} ({k} of {n} seeds)" for m, (k, n) in late.items())
    parts = [f"still improving at the last epoch: {late_text}"] if late else []
    parts += [f"accuracies more than {ACC_MARGIN} apart: {_join(gaps)}"] if gaps else []
    return "; budget-bound — " + "; ".join(parts) if parts else ""


HOLDS, FAILS, UNDECIDED, MIXED = "holds", "does not hold", "undecided", "mixed"
#: Order in which the datasets of a claim are named: where it fails first.
_WHERE_ORDER = (FAILS, HOLDS, UNDECIDED)


def overall(per_dataset: Sequence[str]) -> str:
    """The overall judgement of a claim from its per-dataset ones: ``mixed`` when it holds
    on some dataset and does not hold on another; otherwise ``does not hold`` if it fails
    anywhere, ``holds`` if it holds anywhere, ``undecided`` if it was judged, and
    :data:`NOT_TESTED` on no dataset.

    >>> overall(["holds", "undecided"]), overall(["holds", "does not hold"]), overall([])
    ('holds', 'mixed', 'not tested in this suite')
    """
    found = set(per_dataset)
    if not found:
        return NOT_TESTED
    if {HOLDS, FAILS} <= found:
        return MIXED
    return FAILS if FAILS in found else HOLDS if HOLDS in found else UNDECIDED


@dataclass
class Judgement:
    """One claim judged ``holds``, ``does not hold``, ``mixed`` (holds on some datasets,
    not on others), ``undecided`` or ``not tested in this suite``, with the numbers behind
    it and the anchor of their table; ``per_dataset`` maps each dataset it was judged on to
    ``(judgement, evidence)``, the evidence naming the paired intervals it rests on."""

    claim: str
    judgement: str
    evidence: str
    key: str = ""
    short: str = ""
    per_dataset: dict[str, tuple[str, str]] = field(default_factory=dict)

    def where(self) -> str:
        """``does not hold on a (…); holds on b (…) and c (…); undecided on d (…)``."""
        groups = []
        for word in _WHERE_ORDER:
            named = [f"{ds} ({ev})" if ev else ds for ds, (j, ev) in self.per_dataset.items() if j == word]  # fmt: skip
            groups += [f"{word} on {_join(named)}"] if named else []
        return "; ".join(groups)


def _brief(c: Comparison) -> str:
    """``cog-ts vs ts NLL Δ -0.012 [-0.020, -0.004]``."""
    return f"{c.a} vs {c.b} {NAMES.get(c.metric, c.metric)} {c.test.text()}"


def _listed(found: Sequence[Comparison], shown: int = 2) -> str:
    """The ``shown`` most clearly decided of ``found`` (smallest Holm p first), then how
    many more."""
    found = sorted(found, key=lambda c: c.test.p_adj)
    texts = [_brief(c) for c in found[:shown]]
    return "; ".join(texts) + (f"; {len(found) - shown} more" if len(found) > shown else "")


def _direction_on(found: Sequence[Comparison]) -> tuple[str, str]:
    """The match-or-beat rule on some comparisons: ``(judgement, evidence)``, the evidence
    quoting the decided losses (does not hold), the decided wins (holds) or the closest
    comparison (undecided) with their paired intervals."""
    worse = [c for c in found if c.verdict == "worse"]
    better = [c for c in found if c.verdict == "better"]
    if worse:
        return FAILS, "worse: " + _listed(worse)
    if better:
        return HOLDS, "better: " + _listed(better)
    tested = sorted((c for c in found if math.isfinite(c.test.p_adj)), key=lambda c: c.test.p_adj)
    if not tested:
        return UNDECIDED, f"{len(found)} comparisons, none testable"
    c = tested[0]
    return (
        UNDECIDED,
        f"none decided of {len(found)}; closest {_brief(c)}, Holm p {c.test.p_adj:.2f}",
    )


def _direction(found: Sequence[Comparison], claim: str, key: str) -> Judgement:
    """A claim that the first methods match or beat the second ones over ``found``, per
    dataset (:func:`_direction_on`: "does not hold" with a decided loss, "holds" with a
    decided win and no loss, else "undecided") and overall (:func:`overall`)."""
    t = Counter(c.verdict for c in found)
    per = {
        ds: _direction_on([c for c in found if c.dataset == ds])
        for ds in dict.fromkeys(c.dataset for c in found)
    }
    losses = [c.text() for c in found if c.verdict == "worse"]
    text = f"{t['better']} decided better, {t['worse']} worse, {t['undecided']} undecided of {len(found)} paired comparisons (Holm)"
    if losses:
        text += ": worse in " + "; ".join(losses[:3]) + (" …" if len(losses) > 3 else "")
    short = f"{t['better']} better, {t['worse']} worse, {t['undecided']} undecided of {len(found)} (Holm)"
    short += "; budget-bound" if _bound(found) else ""
    judgement = overall([j for j, _ in per.values()])
    return Judgement(claim, judgement, text + _bound(found), key, short, per)


def _rank_claim(df: pd.DataFrame, protocol: str) -> Judgement:
    d = aggregate(df, split="test", protocol=protocol)
    places = []
    for ds in sorted(set(d["dataset"])):
        r = summary_rank(rows(d, dataset=ds), split=None).dropna(subset=["rank"])
        if "cog-fc" in set(r["method"]):
            mine = r.loc[r["method"] == "cog-fc", "rank"].iloc[0]
            places.append((ds, int((r["rank"] < mine).sum()) + 1, len(r)))
    if not places:
        return Judgement(CLAIMS[2], NOT_TESTED, "cog-fc has no summary rank here.")
    per = {ds: (HOLDS if pl <= TOP else FAILS, f"place {pl} of {n}") for ds, pl, n in places}
    text = "; ".join(f"{ds}: place {pl} of {n}" for ds, pl, n in places)
    rule = f"by summary rank on test Acc, NLL and Brier (means; holds: top {TOP})"
    text += f" {rule[:-1]} on every dataset)"
    key = comparison_key(places[0][0], protocol)
    return Judgement(CLAIMS[2], overall([j for j, _ in per.values()]), text, key, rule, per)


def _mtl_claim(df: pd.DataFrame, protocol: str) -> Judgement:
    d = rows(df, split="test", protocol=protocol, condition="", severity="")
    d = d[~d["task"].isin(["", "mean"])]
    if d.empty or not {"cog-fc", "ts"} <= set(d["method"]):
        why = "needs multi-task results of cog-fc and ts; the mtl-quick and claims suites test it."
        return Judgement(CLAIMS[4], NOT_TESTED, why)
    counts = {ds: pairwise_wins(rows(d, dataset=ds), "cog-fc", "ts") for ds in sorted(set(d["dataset"]))}  # fmt: skip
    per = {
        ds: (HOLDS if n and w > n / 2 else FAILS, f"cog-fc better on both on {w} of {n} tasks")
        for ds, (w, n) in counts.items()
    }
    text = "; ".join(f"{ds}: cog-fc better on both accuracy and Brier on {w} of {n} tasks" for ds, (w, n) in counts.items())  # fmt: skip
    key = f"mtl-wins-{slug(protocol)}-{slug(next(iter(counts)))}"
    short = "cog-fc vs ts on test accuracy and Brier per task, means over seeds (holds: more than half of the tasks)"  # fmt: skip
    judgement = overall([j for j, _ in per.values()])
    return Judgement(CLAIMS[4], judgement, text + " (means over seeds)", key, short, per)


def judge_claims(
    df: pd.DataFrame, protocol: str, fams: dict[str, list[Comparison]], classes: dict[str, int]
) -> list[Judgement]:
    """:data:`CLAIMS` judged under ``protocol`` from the comparison families
    (:func:`families`) and the results; ``classes`` maps a dataset to its class count."""
    p = slug(protocol)
    cog, fc = fams.get("cog", []), fams.get("fc", [])
    ood = [c for c in fams.get("ood", []) if c.metric == "auroc"]
    many = [c for c in cog if c.a == "cog-ms" and classes.get(c.dataset, 0) >= MANY_CLASSES]

    def untested(i: int, why: str) -> Judgement:
        return Judgement(CLAIMS[i], NOT_TESTED, why)

    return [
        _direction(cog, CLAIMS[0], f"paired-{p}") if cog
        else untested(0, "no COG variant next to its counterpart."),
        _direction(fc, CLAIMS[1], f"paired-fc-{p}") if fc
        else untested(1, "cog-fc and an expressive COG variant are not both in it."),
        _rank_claim(df, protocol),
        _direction(ood, CLAIMS[3], f"paired-ood-{p}") if ood
        else untested(3, "no OOD results of a COG variant and its counterpart."),
        _mtl_claim(df, protocol),
        _direction(many, CLAIMS[5], f"paired-{p}") if many
        else untested(5, f"needs ms and cog-ms on a dataset with ≥ {MANY_CLASSES} classes; the claims suite tests it on blobs-100 (a CPU proxy), the paper-cifar100 suite tests it on CIFAR-100."),
    ]  # fmt: skip


def _answer(found: Sequence[Comparison]) -> str:
    """Does COG help, over ``found``? ``yes`` (decided wins only), ``no`` (decided losses
    only), ``mixed`` or ``undecided``."""
    t = Counter(c.verdict for c in found)
    return {(True, False): "yes", (False, True): "no", (True, True): "mixed"}.get((t["better"] > 0, t["worse"] > 0), "undecided")  # fmt: skip


def _cog_sentence(
    df: pd.DataFrame,
    dataset: str,
    fams: dict[str, dict[str, list[Comparison]]],
    regimes: dict[str, dict[str, Regime]] | None = None,
) -> Text:
    """Does COG help on ``dataset``? One sentence, one clause per protocol, with what there
    was to calibrate (``regimes``: ce's test ECE-15 and its direction)."""
    clauses: list[str | Link] = []
    for p, fam in fams.items():
        found = [c for c in fam.get("cog", []) if c.dataset == dataset]
        if not found:
            continue
        t = Counter(c.verdict for c in found)
        regime = ((regimes or {}).get(p) or {}).get(dataset)
        ce = seed_values(df, "test", dataset=dataset, protocol=p, method="ce", metric="ece_15")["value"]  # fmt: skip
        state = f"; {regime.text()}" if regime is not None else f"; ce's test ECE-15 is {ce.mean():.3f}" if len(ce) else ""  # fmt: skip
        clauses += [
            f"{p} protocol: {_answer(found)} — against its post-hoc counterpart ({_join(sorted({f'{c.a} vs {c.b}' for c in found}))}) "
            f"COG is better in {t['better']}, worse in {t['worse']} and undecided in {t['undecided']} of {len(found)} "
            f"paired comparisons (Holm over {len(fam['cog'])})"
            + state + _bound(found) + " (",
            Link("table", f"paired-{slug(p)}"),
            "); ",
        ]  # fmt: skip
    for p, fam in fams.items():
        strong = [c for c in fam.get("strong", []) if c.dataset == dataset]
        if strong:
            t = Counter(c.verdict for c in strong)
            against = _join(list(dict.fromkeys(c.b for c in strong)))
            clauses += [
                f"{p} protocol, against the strongest post-hoc calibrators ({against}): COG is "
                f"better in {t['better']}, worse in {t['worse']} and undecided in "
                f"{t['undecided']} of {len(strong)} paired comparisons (Holm over "
                f"{len(fam['strong'])}){_bound(strong)} (",
                Link("table", f"paired-strong-{slug(p)}"),
                "); ",
            ]  # fmt: skip
    if not clauses:
        return f"{dataset}: no COG variant next to its counterpart."
    return [f"Does COG help on {dataset}? ", *clauses[:-1], ")."]


def _best_sentence(df: pd.DataFrame, dataset: str, protocol: str) -> Text | None:
    """Per metric, the method with the lowest test mean and how many others it beats
    (decided, Holm over the dataset's best-method comparisons)."""
    d = seed_values(df, "test", dataset=dataset, protocol=protocol).set_index("seed")
    pairs = []
    for metric in ("nll", "brier", "ece_15"):
        means = d[d["metric"] == metric].groupby("method")["value"].mean()
        if not means.empty:
            pairs += [(metric, str(means.idxmin()), m) for m in method_order(means.index) if m != means.idxmin()]  # fmt: skip
    if not pairs:
        return None
    tests = paired_family(d.reset_index(), "method", pairs)
    clauses = []
    for metric in dict.fromkeys(x for x, _, _ in pairs):
        mine = [(a, b, t) for (x, a, b), t in zip(pairs, tests, strict=True) if x == metric and t is not None]  # fmt: skip
        top = mine[0][0]
        open_ = [b for _, b, t in mine if t.verdict != "better"]
        text = f"lowest {NAMES[metric]} {top} ({d[(d['method'] == top) & (d['metric'] == metric)]['value'].mean():.3f}), decided better than {len(mine) - len(open_)} of {len(mine)} others"
        clauses.append(text + (f", not separated from {_join(open_)}" if open_ else ""))
    m = sum(t is not None and math.isfinite(t.p) for t in tests)
    head = f"Best on {dataset}, {protocol} protocol: " + "; ".join(clauses) + f" (Holm over {m}; "
    return [head, Link("table", comparison_key(dataset, protocol)), ")."]


def _overall_sentence(fams: dict[str, dict[str, list[Comparison]]], protocol: str) -> Text | None:
    """Across the datasets of ``protocol``: where COG helps against its post-hoc
    counterpart and where it does not, then the same against the strongest post-hoc
    calibrators (None with fewer than two datasets: the per-dataset sentence says it)."""
    words = {"yes": "helps on", "no": "does not help on", "mixed": "is mixed on", "undecided": "is undecided on"}  # fmt: skip
    parts: list[str | Link] = []
    for name, against, key in (
        ("cog", "against its post-hoc counterpart", "paired"),
        ("strong", "against the strongest post-hoc calibrators", "paired-strong"),
    ):
        found = fams[protocol].get(name, [])
        datasets = list(dict.fromkeys(c.dataset for c in found))
        if len(datasets) < 2 and name == "cog":
            return None
        if not datasets:
            continue
        answers = {ds: _answer([c for c in found if c.dataset == ds]) for ds in datasets}
        said = [f"{w} {_join(sorted(d for d, a in answers.items() if a == k))}" for k, w in words.items() if k in answers.values()]  # fmt: skip
        parts += [f"{against} COG {_join(said)} (", Link("table", f"{key}-{slug(protocol)}"), "); "]
    return [f"Overall, {protocol} protocol: ", *parts[:-1], ")."]


def _claim_line(protocol: str, j: Judgement) -> Text:
    """``fair: “claim” — mixed: does not hold on a (…); holds on b (…); 1 better, … (table).``"""
    where = j.where()
    summary = (j.short or j.evidence).rstrip(".")
    text = f"{protocol}: “{j.claim}” — {j.judgement}: " + (f"{where}; {summary}" if where else summary)  # fmt: skip
    return [text + " (", Link("table", j.key or f"claims-{slug(protocol)}"), ")."]


def verdict_section(
    df: pd.DataFrame,
    fams: dict[str, dict[str, list[Comparison]]],
    claims: dict[str, list[Judgement]],
    datasets: Sequence[str],
    details: Sequence[Text] = (),
    regimes: dict[str, dict[str, Regime]] | None = None,
) -> Section:
    """The verdict: per dataset one answer to "does COG help here?" (with what there was
    to calibrate, ``regimes``: :mod:`cogcal.report.regime`), one overall sentence per
    protocol, each claim in one line naming the datasets where it holds, does not hold or
    is undecided, then the details (best methods, grid edges, coverage) and the rule."""
    items: list[Text] = [_claim_line(p, j) for p, judged in claims.items() for j in judged]
    best = [s for p in fams for ds in datasets if (s := _best_sentence(df, ds, p)) is not None]
    answers = [_cog_sentence(df, ds, fams, regimes) for ds in datasets]
    answers += [s for p in fams if (s := _overall_sentence(fams, p)) is not None]
    return Section("Verdict", [
        Paragraph(items=answers or ["There are no test results yet."]),
        Paragraph("The paper's claims at this scale:", items=items),
        Paragraph("Details:", items=[*best, *details]),
        Paragraph("Rule: " + PAIRED_RULE),
    ], key="verdict")  # fmt: skip


def per_dataset_table(judged: Sequence[Judgement], protocol: str) -> Table | None:
    """One row per claim and dataset it was judged on: the judgement there and the paired
    intervals (or places, task counts) it rests on."""
    body = [
        [cell(f"C{i + 1}"), cell(ds), cell(word, bold=word != UNDECIDED), cell(ev or "—")]
        for i, j in enumerate(judged)
        for ds, (word, ev) in j.per_dataset.items()
    ]
    if not body:
        return None
    claims = "; ".join(f"C{i + 1}: {j.claim}" for i, j in enumerate(judged))
    notes: list[Text] = [
        f"{claims}. Paired intervals: mean per-seed difference (first − second method) with "
        "its 95% Student-t interval, decided by the Holm-adjusted p-value of the claim's "
        "family over every dataset (tables below)."
    ]
    header = ["Claim", "Dataset", "Judgement", "On this dataset"]
    return Table(f"Claims per dataset, {protocol} protocol", header, body, notes, f"claims-datasets-{slug(protocol)}")  # fmt: skip


def claims_section(
    fams: dict[str, dict[str, list[Comparison]]],
    claims: dict[str, list[Judgement]],
    checkpoints: Checkpoints | None,
) -> Section:
    """Per protocol the claims table and the paired comparisons behind it, then the
    checkpoint epochs."""
    sec = Section("The paper's claims at this scale", key="claims")
    sec.blocks.append(Paragraph(
        "“Holds” for a match-or-beat claim means that decided comparisons exist and none is "
        "against it (with few seeds an undetected difference remains possible); for a "
        "“helps” or “beats” claim, a decided improvement and no decided loss. " + PAIRED_RULE
    ))  # fmt: skip
    for p, judged in claims.items():
        body = [[cell(j.claim), cell(j.judgement, bold=True), cell(j.evidence)] for j in judged]
        links = [x for k in dict.fromkeys(j.key for j in judged if j.key) for x in (Link(k, k), " ")]  # fmt: skip
        notes: list[Text] = [["Tables: ", *links]] if links else []
        header = ["Claim", "Judgement", "Evidence"]
        sec.blocks.append(Table(f"Claims, {p} protocol", header, body, notes, f"claims-{slug(p)}"))
        table = per_dataset_table(judged, p)
        sec.blocks += [table] if table is not None else []
        for name, (title, key) in FAMILY_TABLES.items():
            t = paired_table(fams[p].get(name, []), f"{title} — {p} protocol", f"{key}-{slug(p)}")
            sec.blocks += [t] if t is not None else []
    table = checkpoints.table() if checkpoints is not None else None
    sec.blocks += [table] if table is not None else []
    return sec
