"""Tests of the generated sentences: verdict, effect section, grid edges, spread rule.

Every cell below has three seeds at mean - s, mean, mean + s, so its sample standard
deviation is exactly s (= SD); the expected sentences are worked out by hand from MEANS.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cogcal.report.aggregate import Stat, compare
from cogcal.report.blocks import Link
from cogcal.report.build import build_report
from cogcal.report.effect import effect_sentence, effect_table
from cogcal.report.frame import load_effect, load_tuning, normalise_results
from cogcal.report.schema import EFFECT_COLUMNS, RESULT_COLUMNS, TUNING_COLUMNS
from cogcal.report.tuning import edge_choices, grid_table
from cogcal.report.verdict import best_sentence, cog_sentence, coverage_sentence, edge_sentence
from test_report_render import result_row, write_csv

SD = 0.01
#             acc    nll    brier  ece_15
MEANS = {
    "ce": (0.80, 0.50, 0.25, 0.08),
    "ts": (0.80, 0.305, 0.20, 0.025),
    "ms": (0.80, 0.32, 0.185, 0.05),
    "cog-fc": (0.85, 0.30, 0.18, 0.04),
    "cog-ts": (0.80, 0.35, 0.205, 0.02),
    "cog-ms": (0.60, 0.325, 0.22, 0.055),
}
METRICS = ("acc", "nll", "brier", "ece_15")


def frame(means=MEANS, protocol="paper", seeds=3) -> pd.DataFrame:
    rows = []
    offsets = (-SD, 0.0, SD)[:seeds] if seeds > 1 else (0.0,)
    for method, values in means.items():
        for seed, off in enumerate(offsets):
            for metric, mean in zip(METRICS, values, strict=True):
                rows.append(result_row("d1", method, protocol, seed, "test", metric, mean + off))
    df = pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS).astype(object).fillna("").astype(str)
    return normalise_results(df)


def _text(sentence) -> str:
    return "".join(p.text if isinstance(p, Link) else p for p in sentence)


def _links(sentence) -> list[str]:
    return [p.key for p in sentence if isinstance(p, Link)]


def test_spread_rule():
    a, b = Stat(0.30, 0.01, 3), Stat(0.305, 0.01, 3)
    assert compare(a, b, higher_is_better=False) == "within"
    assert compare(Stat(0.30, 0.01, 3), Stat(0.32, 0.005, 3), higher_is_better=False) == "better"
    assert compare(Stat(0.60, 0.01, 3), Stat(0.80, 0.01, 3), higher_is_better=True) == "worse"
    assert compare(Stat(0.3, math.nan, 1), Stat(0.5, 0.01, 3), higher_is_better=False) == "unknown"
    assert Stat.of([0.29, 0.30, 0.31]).std == pytest.approx(SD)


def test_best_sentence():
    s = best_sentence(frame(), "d1", "paper")
    assert _text(s) == (
        "d1, paper protocol — lowest NLL: cog-fc (0.300 ± 0.010), with ts within the seed "
        "spread; lowest Brier: cog-fc (0.180 ± 0.010), with ms within the seed spread; "
        "lowest ECE-15: cog-ts (0.020 ± 0.010), with ts within the seed spread "
        "(d1, paper table)."
    )
    assert _links(s) == ["comparison-paper-d1"]
    assert best_sentence(frame(), "d1", "fair") is None
    one = best_sentence(frame(seeds=1), "d1", "paper")
    assert "lowest NLL: cog-fc (0.300), but with one seed its spread is unknown" in _text(one)


def test_cog_sentence_says_where_cog_loses():
    s = cog_sentence(frame(), "paper")
    assert _text(s) == (
        "Paper protocol, COG against its counterpart (cog-fc vs ce, cog-ts vs ts and cog-ms vs "
        "ms; NLL, Brier, ECE-15 and accuracy): COG is better beyond the seed spread in 4 of 12 "
        "comparisons, within the spread in 5, and loses beyond the spread in 3: cog-ts vs ts "
        "on d1, NLL (0.350 ± 0.010 against 0.305 ± 0.010); cog-ms vs ms on d1, Brier (0.220 ± "
        "0.010 against 0.185 ± 0.010); cog-ms vs ms on d1, accuracy (0.600 ± 0.010 against "
        "0.800 ± 0.010) (Where COG loses)."
    )
    assert _links(s) == ["losses"]
    wins = {**MEANS, "cog-ts": MEANS["ts"], "cog-ms": MEANS["ms"]}
    assert "never worse beyond the spread" in _text(cog_sentence(frame(wins), "paper"))
    one = _text(cog_sentence(frame(seeds=1), "paper"))
    assert "in 0 of 12 comparisons" in one and "not judged in 12 (fewer than 2 seeds)" in one
    only_base = {k: v for k, v in MEANS.items() if not k.startswith("cog")}
    assert cog_sentence(frame(only_base), "paper") is None


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
    return load_tuning(tmp_path)


def test_edge_sentence_and_tuning_table(tmp_path):
    tuning = _tuning(tmp_path, at_edge=True)
    s = edge_sentence(tuning)
    assert _text(s) == (
        "1 of 2 tuned choice(s) still sit at a grid edge, so the methods using them may do "
        "better with a wider grid: fair/d1 ce (used by ce, ts, ms): lr 0.001 on the lr low "
        "edge after 2 extension(s), cap reached (tuning)."
    )
    assert _links(s) == ["tuning"]
    [edge] = edge_choices(tuning)
    assert edge.used_by == ("ce", "ts", "ms") and edge.cap_reached
    t = grid_table(tuning, "fair", "d1")
    statuses = {(r[0].text, r[1].text): (r[4].text, r[7].text, r[8].text) for r in t.rows}
    assert statuses[("ce", "0.01")] == ("—", "diverged", "")
    assert statuses[("ce", "0.001")] == ("0.7000", "complete", "chosen")
    assert statuses[("cog-fc", "0.001")] == ("0.6000", "complete", "chosen")
    interior = edge_sentence(_tuning(tmp_path, at_edge=False))
    assert (
        _text(interior)
        == "Every tuned choice (2 tuning group(s)) is interior to its grid (tuning)."
    )
    assert "cannot be checked" in edge_sentence(None)


def test_coverage_sentence():
    assert coverage_sentence(0, 0) is None
    s = coverage_sentence(2, 1)
    assert _text(s).startswith("2 result cell(s) hold fewer seeds than planned and 1 run(s)")
    assert _links(s) == ["failures"]


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
    return load_effect(tmp_path)


def test_effect_sentence_and_table(tmp_path):
    effect = _effect(tmp_path)
    assert effect_sentence(effect, "d1") == (
        "On d1 (test split), the schedule effect (ce (step schedule) against ce (no schedule)) "
        "exceeds the seed spread on NLL (-0.100, better) but not on Brier, ECE-15 or accuracy; "
        "the calibrator-rate effect (cog-fc (ratio 0.01) against ce (step schedule)) stays "
        "within the seed spread on NLL, Brier, ECE-15 and accuracy; the calibrator-rate effect "
        "(cog-fc (ratio 0.1) against ce (step schedule)) exceeds the seed spread on ECE-15 "
        "(-0.035, better) but not on NLL, Brier or accuracy."
    )
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
    worse = {**EFFECT, "cog-fc (ratio 0.1)": (0.45, 0.245, 0.085, 0.80)}
    text = effect_sentence(_effect(tmp_path, worse), "d1")
    assert "(cog-fc (ratio 0.1) against ce (step schedule)) exceeds the seed spread on NLL " in text
    assert "NLL (+0.050, worse)" in text


def test_full_report_verdict_links_and_states_rule(tmp_path):
    df = frame()
    rows = df.astype({"seed": str, "value": str}).to_dict("records")
    write_csv(tmp_path / "results.csv", RESULT_COLUMNS, rows)
    _tuning(tmp_path, at_edge=True)
    _effect(tmp_path)
    build_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    verdict = md.split("## Verdict")[1].split("\n## ")[0]
    assert "lowest NLL: cog-fc (0.300 ± 0.010), with ts within the seed spread" in verdict
    assert "loses beyond the spread in 3" in verdict
    assert "fair/d1 ce (used by ce, ts, ms): lr 0.001 on the lr low edge" in verdict
    assert "Rule: two means differ beyond the seed spread when" in verdict
    for key in ("comparison-paper-d1", "losses", "tuning"):
        assert f"](#{key})" in verdict and f'<a id="{key}"></a>' in md
    effect = md.split("## Where COG's effect comes from")[1].split("\n## ")[0]
    assert "exceeds the seed spread on NLL (-0.100, better)" in effect
    page = (tmp_path / "report.html").read_text()
    assert '<a href="#comparison-paper-d1">d1, paper table</a>' in page
