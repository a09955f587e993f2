"""Tests of the multi-task report sections (paper §4.3: Tab. 6, Fig. 6, pairwise wins).

Tables are checked on a hand-made tidy table with known per-task values, and the report
is built from a synthetic bench folder.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cogcal.report.build import build_report
from cogcal.report.claims import judge_claims
from cogcal.report.multitask import (
    multitask_section,
    multitask_table,
    per_task_figure,
    task_difficulty,
    wins_table,
)
from cogcal.runs.columns import RESULT_COLUMNS as COLUMNS
from test_report_render import write_csv

METHODS = ("ce", "ts", "cog-fc")
TASKS = ("easy", "hard", "mid", "noisy")
# Per-task accuracy of each method (seed 0; seed 1 adds 0.01). Mean over methods:
# easy 0.95, hard 0.60, mid 0.80, noisy 0.70 -> difficulty order hard, noisy, mid, easy.
ACC = {
    "ce": {"easy": 0.95, "hard": 0.58, "mid": 0.80, "noisy": 0.70},
    "ts": {"easy": 0.95, "hard": 0.59, "mid": 0.78, "noisy": 0.72},
    "cog-fc": {"easy": 0.95, "hard": 0.63, "mid": 0.82, "noisy": 0.68},
}
# Brier: cog-fc lower than ts on easy, hard, mid; higher on noisy.
BRIER = {
    "ce": {"easy": 0.05, "hard": 0.30, "mid": 0.15, "noisy": 0.20},
    "ts": {"easy": 0.04, "hard": 0.28, "mid": 0.14, "noisy": 0.18},
    "cog-fc": {"easy": 0.03, "hard": 0.25, "mid": 0.12, "noisy": 0.21},
}


def make_df(*, with_mean: bool = True) -> pd.DataFrame:
    rows = []
    for method in METHODS:
        for seed in (0, 1):
            per = {
                "acc": {t: ACC[method][t] + 0.01 * seed for t in TASKS},
                "brier": {t: BRIER[method][t] for t in TASKS},
                "nll": {t: 2 * BRIER[method][t] + 0.1 for t in TASKS},
                "ece_15": {t: 0.01 * (1 + TASKS.index(t)) for t in TASKS},
            }
            for metric, vals in per.items():
                for task, v in vals.items():
                    rows.append(["mt", method, "paper", seed, "test", metric, v, task, "", ""])
                if with_mean:
                    mean = float(np.mean(list(vals.values())))
                    rows.append(["mt", method, "paper", seed, "test", metric, mean, "mean", "", ""])
            rows.append(["single", method, "paper", seed, "test", "acc", 0.9, "", "", ""])
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_difficulty_order_and_datasets():
    df = make_df()
    assert task_difficulty(df, "mt", "paper") == ["hard", "noisy", "mid", "easy"]
    # Brier is an error: the hardest task (largest mean Brier) comes first
    assert task_difficulty(df, "mt", "paper", metric="brier")[0] == "hard"
    with pytest.raises(ValueError, match="no per-task"):
        task_difficulty(df, "single", "paper")


@pytest.mark.parametrize("with_mean", [True, False])
def test_tab6_table(with_mean):
    t = multitask_table(make_df(with_mean=with_mean), "mt", "paper")
    assert "mean over 4 tasks (Tab. 6)" in t.title
    assert t.header == ["Method", "Acc ↑", "NLL ↓", "Brier ↓", "ECE-15 ↓", "Rank ↓"]
    acc = {r[0].text: r[1] for r in t.rows}
    # cog-fc: mean over tasks (0.95 + 0.63 + 0.82 + 0.68) / 4 = 0.77, seeds +0 / +0.01
    assert acc["cog-fc"].text == f"{0.7700 + 0.005:.3f} ± 0.007"
    assert [m for m, c in acc.items() if c.bold] == ["cog-fc"]
    brier = {r[0].text: r[3] for r in t.rows}
    assert [m for m, c in brier.items() if c.bold] == ["cog-fc"]  # 0.1525 < 0.16 < 0.175
    assert t.rows[0][0].text == "cog-fc" and t.rows[0][-1].text == "1.00"
    assert multitask_table(make_df(), "single", "paper") is None


def test_pairwise_wins_against_hand_count():
    table, sentences = wins_table(make_df(), "mt", "paper")
    rows = {(r[0].text, r[1].text): r for r in table.rows}
    assert set(rows) == {("cog-fc", "ce"), ("cog-fc", "ts")}
    # vs ts: higher acc and lower Brier on hard and mid (easy: equal acc; noisy: worse)
    assert rows[("cog-fc", "ts")][2].text == "2 of 4"
    assert rows[("cog-fc", "ts")][4].text == "1 of 4"  # ts better on both on noisy
    assert rows[("cog-fc", "ts")][5].text == "1"
    assert rows[("cog-fc", "ts")][2].bold and not rows[("cog-fc", "ts")][4].bold
    # vs ce: hard, mid -> 2; ce better on both on noisy (0.70 > 0.68, 0.20 < 0.21)
    assert rows[("cog-fc", "ce")][2].text == "2 of 4"
    assert rows[("cog-fc", "ce")][4].text == "1 of 4"
    assert "cog-fc beats ts on both accuracy and Brier on 2 of 4 tasks (50%)." in sentences
    assert wins_table(make_df().query("method != 'cog-fc'"), "mt", "paper") is None
    # the paper's claim needs more than half of the tasks: 2 of 4 is not most
    claim = judge_claims(make_df(), "paper", {}, {})[4]
    assert claim.judgement == "does not hold" and "on 2 of 4 tasks" in claim.evidence
    assert claim.key == "mtl-wins-paper-mt"
    single = judge_claims(make_df().query("dataset == 'single'"), "paper", {}, {})[4]
    assert single.judgement == "not tested in this suite" and "mtl-quick" in single.evidence


def test_per_task_figure(tmp_path):
    df = make_df()
    path = per_task_figure(df, "mt", "paper", tmp_path / "figs" / "pt.png")
    assert path.is_file() and path.stat().st_size > 5000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert per_task_figure(df, "single", "paper", tmp_path / "none.png") is None


def test_section_absent_without_tasks(tmp_path):
    df = make_df()
    assert multitask_section(df[df["dataset"] == "single"], tmp_path) is None
    sec = multitask_section(df, tmp_path)
    assert sec is not None and sec.title == "Multi-task learning"
    assert [b.title for b in sec.blocks[1:]] == ["mt — paper protocol"]


def _write(out: Path, df: pd.DataFrame) -> Path:
    out.mkdir(parents=True)
    write_csv(out / "results.csv", COLUMNS, df.to_dict("records"))
    return out


@pytest.mark.slow
def test_report_has_multitask_sections_self_contained(tmp_path):
    out = _write(tmp_path / "b", make_df())
    page = build_report(out).read_text()
    md = (out / "report.md").read_text()
    assert "## Multi-task learning" in md and "(Tab. 6)" in md and "pairwise wins" in md
    assert "](figures/per_task_paper_mt.png)" in md
    assert not re.findall(r'(?:src|href)="(?!data:|#)[^"]*"', page)
    imgs = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert imgs and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in imgs)
    plain = _write(tmp_path / "p", make_df().query("dataset == 'single'"))
    build_report(plain)
    assert "Multi-task" not in (plain / "report.md").read_text()
