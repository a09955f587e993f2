"""Tests of the verdict and the paper's claims (paired statistics, Holm, budget caveats),
of the effect sentence and of the grid-edge tables.

The synthetic cells have seed noise that differs by method, so the per-seed differences
vary; every expected verdict is recomputed independently with scipy.stats.ttest_rel and a
hand-written Holm step-down.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from cogcal.report.blocks import Link
from cogcal.report.build import build_report
from cogcal.report.claims import Checkpoints, families, judge_claims, verdict_section
from cogcal.report.effect import effect_sentence, effect_table
from cogcal.report.frame import load_bench_csv, normalise_results
from cogcal.report.tuning import edge_choices, grid_table
from cogcal.runs.columns import EFFECT_COLUMNS, RESULT_COLUMNS, TUNING_COLUMNS
from test_report_render import result_row, write_csv, write_run

SD = 0.01
#             acc    nll    brier  ece_15
MEANS = {
    "ce": (0.80, 0.50, 0.25, 0.08),
    "ts": (0.80, 0.305, 0.20, 0.025),
    "ms": (0.80, 0.32, 0.185, 0.05),
    "cog-fc": (0.81, 0.30, 0.18, 0.04),
    "cog-ts": (0.80, 0.35, 0.205, 0.02),
    "cog-ms": (0.60, 0.325, 0.22, 0.055),
}
METRICS = ("acc", "nll", "brier", "ece_15")
PAIRS = (("cog-fc", "ce"), ("cog-ts", "ts"), ("cog-ms", "ms"))


def noise(method: str, seeds: int) -> np.ndarray:
    return SD * np.random.default_rng(sum(map(ord, method))).standard_normal(seeds)


def frame(means=MEANS, protocol="paper", seeds=5) -> pd.DataFrame:
    rows = []
    for method, values in means.items():
        for seed, off in enumerate(noise(method, seeds)):
            for metric, mean in zip(METRICS, values, strict=True):
                rows.append(result_row("d1", method, protocol, seed, "test", metric, mean + off))
    df = pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS).astype(object).fillna("").astype(str)
    return normalise_results(df)


def _text(sentence) -> str:
    return "".join(p.text if isinstance(p, Link) else p for p in sentence)


def reference_verdicts(means=MEANS, seeds=5) -> dict[tuple[str, str, str], str]:
    """Each COG-vs-counterpart verdict from scipy's paired t-test and Holm by hand."""
    pvals, diffs = {}, {}
    for a, b in PAIRS:
        for j, metric in enumerate(METRICS):
            va = means[a][j] + noise(a, seeds)
            vb = means[b][j] + noise(b, seeds)
            pvals[(a, b, metric)] = sps.ttest_rel(va, vb).pvalue
            diffs[(a, b, metric)] = float(np.mean(va - vb))
    order = sorted(pvals, key=pvals.get)
    out, running = {}, 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvals[key]))
        good = (diffs[key] > 0) == (key[2] == "acc")
        out[key] = ("better" if good else "worse") if running < 0.05 else "undecided"
    return out


def test_cog_family_matches_scipy_and_holm():
    found = families(frame(), "paper", None)["cog"]
    got = {(c.a, c.b, c.metric): c.verdict for c in found}
    assert got == reference_verdicts()
    assert got[("cog-ms", "ms", "acc")] == "worse" and got[("cog-fc", "ce", "nll")] == "better"
    assert {"better", "worse", "undecided"} <= set(got.values())
    gap = next(c for c in found if (c.a, c.metric) == ("cog-ms", "acc"))
    assert gap.gap == pytest.approx(0.2, abs=0.02) and "test accuracies" in gap.caveats()[0]


def test_verdict_opens_with_an_answer_per_dataset_and_flags_budget_bound():
    df = frame()
    late = [("d1", "paper", "ts", s, "stage1", 20, 20, 19, "", True) for s in range(5)]
    late += [("d1", "paper", "ts", s, "stage2", 5, 5, 2, "", False) for s in range(5)]
    cols = ["dataset", "protocol", "method", "seed", "stage", "budget", "ran", "best", "stopped"]
    ckpt = Checkpoints(pd.DataFrame(late, columns=[*cols, "last"]))
    fams = {"paper": families(df, "paper", ckpt)}
    claims = {"paper": judge_claims(df, "paper", fams["paper"], {})}
    sec = verdict_section(df, fams, claims, ["d1"])
    answer = _text(sec.blocks[0].items[0])
    t = list(reference_verdicts().values())
    better, worse = t.count("better"), t.count("worse")
    assert answer.startswith(
        f"Does COG help on d1? paper protocol: mixed — against its post-hoc counterpart "
        f"(cog-fc vs ce, cog-ms vs ms and cog-ts vs ts) COG is better in {better}, worse in "
        f"{worse} and undecided in {12 - better - worse} of 12 paired comparisons (Holm over 12)"
    )
    assert "budget-bound — still improving at the last epoch: ts (5 of 5 seeds)" in answer
    assert "accuracies more than 0.02 apart: cog-ms vs ms" in answer
    claims_text = [_text(i) for i in sec.blocks[1].items]
    assert claims_text[0].startswith(
        "paper: “COG variants match or beat their post-hoc counterparts” — does not hold"
    )
    assert claims_text[0].endswith("undecided of 12 (Holm); budget-bound (table).")
    assert (
        "worse in cog-" in claims["paper"][0].evidence
        and "ts (5 of 5 seeds)" in claims["paper"][0].evidence
    )
    assert "“COG-FC ranks near the top” — holds: holds on d1 (place 1 of 6)" in claims_text[2]
    assert "not tested in this suite: needs multi-task results" in claims_text[4]
    assert "the paper-cifar100 suite tests it" in claims_text[5]
    assert "Holm" in sec.blocks[-1].text and "Student-t" in sec.blocks[-1].text
    assert ckpt.table().rows[0][-1].bold  # ts stage1: 5 of 5 at the last epoch


def test_few_seeds_are_undecided_and_many_classes_are_judged():
    one = frame(seeds=1)
    fams = families(one, "paper", None)
    assert {c.verdict for c in fams["cog"]} == {"undecided"}
    judged = judge_claims(one, "paper", fams, {"d1": 100})
    assert [j.judgement for j in judged[:2]] == ["undecided", "undecided"]
    assert judged[5].judgement == "undecided" and judged[5].key == "paired-paper"
    many = judge_claims(frame(), "paper", families(frame(), "paper", None), {"d1": 100})[5]
    verdicts = reference_verdicts()
    expect = [verdicts[("cog-ms", "ms", m)] for m in METRICS]
    assert many.judgement == ("does not hold" if "worse" in expect else "holds")
    assert judge_claims(frame(), "paper", {}, {"d1": 10})[5].judgement == "not tested in this suite"


def test_checkpoints_read_from_run_records(tmp_path):
    runs = []
    for seed, (best1, best2) in enumerate(((9, 4), (5, 2))):
        config = {"method": "tst", "dataset": "d1", "seed": seed, "epochs": 10, "stage2_epochs": 5}
        timing = {
            "stage1": {"epochs_run": 10, "best_epoch": best1, "stopped": None},
            "stage2": {"epochs_run": 5, "best_epoch": best2, "stopped": None},
        }
        write_run(tmp_path / f"s{seed}", config, {"acc": 0.9}, {"acc": 0.9}, timing=timing)
        runs.append(("d1", "fair", "tst", seed, tmp_path / f"s{seed}"))
    runs.append(("d1", "fair", "tst", 2, tmp_path / "missing"))
    ckpt = Checkpoints.read(runs)
    assert ckpt.late("d1", "fair", "tst") == (1, 2)  # seed 0: both stages at their last epoch
    assert ckpt.late("d1", "fair", "ce") == (0, 0)
    rows = {r[3].text: [c.text for c in r] for r in ckpt.table().rows}
    assert rows["stage1"][4:] == ["10", "10, 6", "budget", "1 of 2"]
    assert rows["stage2"][4:] == ["5", "5, 3", "budget", "1 of 2"]
    stopped = Checkpoints.read([])
    assert stopped.table() is None and stopped.late("d1", "fair", "tst") == (0, 0)


def _tuning(tmp_path, at_edge: bool):
    rows = []
    for lr, nll, chosen, status in (
        (1e-4, 0.9, False, "complete"),
        (1e-3, 0.7, True, "complete"),
        (1e-2, "", False, "diverged"),
    ):
        rows.append(
            {"protocol": "fair", "dataset": "d1", "group": "ce", "used_by": "ce ts ms",
             "lr": lr, "val_nll": nll, "status": status, "chosen": chosen,
             "at_edge": at_edge, "edges": "lr low" if at_edge else "", "extensions": 2,
             "cap_reached": at_edge}
        )  # fmt: skip
    rows.append(
        {"protocol": "fair", "dataset": "d1", "group": "cog-fc", "used_by": "cog-fc",
         "lr": 1e-3, "ratio": 0.1, "calibrator_lr": 1e-4, "val_nll": 0.6, "status": "complete",
         "chosen": True, "at_edge": False, "extensions": 0, "cap_reached": False}
    )  # fmt: skip
    write_csv(tmp_path / "tuning.csv", TUNING_COLUMNS, rows)
    return load_bench_csv(tmp_path, "tuning.csv")


EFFECT = {  # variant: (nll, brier, ece_15, acc)
    "ce (no schedule)": (0.50, 0.25, 0.08, 0.80),
    "ce (step schedule)": (0.40, 0.245, 0.085, 0.80),
    "cog-fc (ratio 0.1)": (0.395, 0.24, 0.05, 0.805),
    "cog-fc (ratio 0.01)": (0.405, 0.25, 0.08, 0.80),
}


def _effect(tmp_path, effect=EFFECT):
    rows = []
    for variant, values in effect.items():
        for seed, off in enumerate((-SD, 0.0, SD)):
            for metric, v in zip(("nll", "brier", "ece_15", "acc"), values, strict=True):
                rows.append(
                    {"dataset": "d1", "variant": variant, "schedule": "none" if "no" in variant
                     else "step", "lr": 1e-3, "calibrator_lr": "" if variant.startswith("ce")
                     else 1e-3 * float(variant.split()[-1][:-1]), "seed": seed, "split": "test",
                     "metric": metric, "value": v + off}
                )  # fmt: skip
    write_csv(tmp_path / "effect.csv", EFFECT_COLUMNS, rows)
    return load_bench_csv(tmp_path, "effect.csv")


def test_edge_choices_and_tuning_table(tmp_path):
    tuning = _tuning(tmp_path, at_edge=True)
    [edge] = edge_choices(tuning)
    assert edge.used_by == ("ce", "ts", "ms") and edge.cap_reached
    assert edge.text() == (
        "fair/d1 ce (used by ce, ts, ms): lr 0.001 on the lr low edge after 2 extension(s), "
        "cap reached"
    )
    t = grid_table(tuning, "fair", "d1")
    statuses = {(r[0].text, r[1].text): (r[4].text, r[7].text, r[8].text) for r in t.rows}
    assert statuses[("ce", "0.01")] == ("—", "diverged", "")
    assert statuses[("ce", "0.001")] == ("0.7000", "complete", "chosen")
    assert statuses[("cog-fc", "0.001")] == ("0.6000", "complete", "chosen")
    assert edge_choices(_tuning(tmp_path, at_edge=False)) == []


def test_effect_sentence_and_table(tmp_path):
    effect = _effect(tmp_path)
    text = effect_sentence(effect, "d1")
    # identical seed offsets: every non-zero difference is exact over seeds, hence decided
    assert text.startswith("On d1 (test split; paired, Holm over 12), the schedule effect")
    assert "(ce (step schedule) against ce (no schedule)) is decided on NLL Δ -0.100" in text
    assert "(cog-fc (ratio 0.1) against ce (step schedule)) is decided on NLL Δ -0.005" in text
    t = effect_table(effect, "d1")
    assert [r[0].text for r in t.rows] == [
        "ce (no schedule)",
        "ce (step schedule)",
        "cog-fc (ratio 0.01)",
        "cog-fc (ratio 0.1)",
    ]
    assert t.header[4:] == ["NLL ↓", "Brier ↓", "ECE-15 ↓", "Acc ↑"]
    row = {r[0].text: r for r in t.rows}["cog-fc (ratio 0.1)"]
    assert [c.text for c in row[1:5]] == ["step", "0.001", "0.0001", "0.395 ± 0.010"]
    assert row[4].bold and row[6].bold  # best NLL and ECE-15


@pytest.mark.slow
def test_full_report_verdict_claims_and_links(tmp_path):
    df = frame()
    rows = df.astype({"seed": str, "value": str}).to_dict("records")
    write_csv(tmp_path / "results.csv", RESULT_COLUMNS, rows)
    _tuning(tmp_path, at_edge=True)
    _effect(tmp_path)
    build_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    verdict = md.split("## Verdict")[1].split("\n## ")[0]
    assert verdict.lstrip().startswith("- Does COG help on d1? paper protocol:")
    assert "The paper's claims at this scale:" in verdict
    assert "Best on d1, paper protocol: lowest NLL cog-fc" in verdict
    assert "1 tuned choice(s) still sit at a grid edge ([listed](#tuning-edges))" in verdict
    for key in ("comparison-paper-d1", "paired-paper", "tuning-edges"):
        assert f"](#{key})" in verdict and f'<a id="{key}"></a>' in md
    claims = md.split("## The paper's claims at this scale")[1].split("\n## ")[0]
    assert "**Claims, paper protocol**" in claims and "| Per-seed differences |" in claims
    page = (tmp_path / "report.html").read_text()
    assert '<a href="#paired-paper">table</a>' in page


def test_sms_is_a_strong_posthoc_calibrator_when_the_suite_runs_it():
    """STRONG_POSTHOC names sms (Berta et al. 2026's strongest on vision logits): present, every
    COG variant is compared with it; absent (the family below), the family simply lacks it."""
    means = {**MEANS, "sms": (0.80, 0.29, 0.18, 0.02)}
    found = families(frame(means), "paper", None)["strong"]
    assert {(c.a, c.b) for c in found} == {(a, "sms") for a, _ in PAIRS}
    assert {c.metric for c in found} == set(METRICS)


@pytest.mark.slow
def test_strong_family_compares_every_cog_variant_with_each_strong_posthoc_calibrator():
    """Dirichlet and isotonic present: each COG variant against each of them, one Holm family,
    verdicts recomputed with scipy and a hand-written Holm step-down; the verdict says it."""
    means = {**MEANS, "dirichlet": (0.80, 0.29, 0.18, 0.02), "isotonic": (0.80, 0.33, 0.19, 0.03)}
    found = families(frame(means), "paper", None)["strong"]
    pairs = [(a, b) for a, _ in PAIRS for b in ("dirichlet", "isotonic")]
    assert {(c.a, c.b) for c in found} == set(pairs) and len(found) == len(pairs) * len(METRICS)
    pvals, diffs = {}, {}
    for a, b in pairs:
        for j, metric in enumerate(METRICS):
            va, vb = means[a][j] + noise(a, 5), means[b][j] + noise(b, 5)
            pvals[(a, b, metric)] = sps.ttest_rel(va, vb).pvalue
            diffs[(a, b, metric)] = float(np.mean(va - vb))
    order, running, want = sorted(pvals, key=pvals.get), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvals[key]))
        good = (diffs[key] > 0) == (key[2] == "acc")
        want[key] = ("better" if good else "worse") if running < 0.05 else "undecided"
    assert {(c.a, c.b, c.metric): c.verdict for c in found} == want
    assert "worse" in want.values()
    fams = {"paper": families(frame(means), "paper", None)}
    claims = {"paper": judge_claims(frame(means), "paper", fams["paper"], {"d1": 10})}
    text = _text(verdict_section(frame(means), fams, claims, ["d1"]).blocks[0].items[0])
    assert "against the strongest post-hoc calibrators (dirichlet and isotonic)" in text
    assert f"of {len(found)} paired comparisons" in text
    # without them the family is empty and the sentence does not mention it
    plain = families(frame(), "paper", None)
    assert plain["strong"] == []
