"""Tests of the robustness report sections (OOD detection, covariate shift; Tab. 3/4).

Tables are checked on a hand-made tidy table with known values; the report is built from
a synthetic bench folder whose run folders are written through RunDir.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pandas as pd
import pytest

from cogcal.report.build import build_report
from cogcal.report.claims import families, judge_claims
from cogcal.report.robustness import (
    ood_table,
    robustness_section,
    severity_figure,
    shift_table,
    unavailable_sets,
)
from cogcal.runs.columns import RESULT_COLUMNS as COLUMNS
from test_report_render import write_csv, write_run

METHODS = ("ce", "ts", "cog-fc", "cog-ts")
# OOD AUROC per (method, set) for seeds 0, 1, 2. cog-fc is clearly worse than ce on the
# pooled AUROC (beyond the seed spread); cog-ts is the best everywhere.
AUROC = {
    ("ce", "a"): [0.70, 0.80, 0.90],
    ("ts", "a"): [0.60, 0.60, 0.60],
    ("cog-fc", "a"): [0.75, 0.75, 0.75],
    ("cog-ts", "a"): [0.95, 0.95, 0.95],
    ("ce", "b"): [0.50, 0.50, 0.50],
    ("ts", "b"): [0.55, 0.55, 0.55],
    ("cog-fc", "b"): [0.52, 0.52, 0.52],
    ("cog-ts", "b"): [0.60, 0.61, 0.62],
    ("ce", "pooled"): [0.80, 0.81, 0.82],
    ("ts", "pooled"): [0.70, 0.70, 0.70],
    ("cog-fc", "pooled"): [0.60, 0.61, 0.62],
    ("cog-ts", "pooled"): [0.90, 0.90, 0.90],
}
# Shift accuracy = base - 0.1 * severity - cond_offset (+ seed noise); ECE grows.
SHIFT_BASE = {"ce": 0.80, "ts": 0.80, "cog-fc": 0.85, "cog-ts": 0.83}
COND_OFFSET = {"c1": 0.0, "c2": 0.04}


def _row(method, seed, split, metric, value, condition="", severity="", task=""):
    return {
        "dataset": "d",
        "method": method,
        "protocol": "paper",
        "seed": seed,
        "split": split,
        "metric": metric,
        "value": value,
        "task": task,
        "condition": condition,
        "severity": severity,
    }


def make_df(*, severities=(1, 2, 3)) -> pd.DataFrame:
    rows = []
    for method in METHODS:
        for seed in range(3):
            noise = 0.001 * seed
            for metric, v in {"acc": SHIFT_BASE[method] + 0.1, "nll": 0.3, "brier": 0.2}.items():
                rows.append(_row(method, seed, "test", metric, v + noise))
            rows.append(_row(method, seed, "test", "ece_15", 0.02 + noise))
            for s in ("a", "b", "pooled"):
                rows.append(_row(method, seed, "ood", "auroc", AUROC[(method, s)][seed], s))
                rows.append(_row(method, seed, "ood", "fpr95", 1 - AUROC[(method, s)][seed] / 2, s))
            for cond, off in COND_OFFSET.items():
                for sev in severities:
                    acc = SHIFT_BASE[method] - 0.1 * sev - off + noise
                    vals = {
                        "acc": acc,
                        "nll": 1 - acc,
                        "brier": (1 - acc) / 2,
                        "ece_15": 0.05 * sev,
                    }
                    if method == "cog-ts":
                        vals["ece_15"] += 0.2  # COG loses on shift ECE: must show
                    for metric, v in vals.items():
                        rows.append(_row(method, seed, "shift", metric, v, cond, str(sev)))
            for sev in severities:  # the runner's summary condition: must not be counted
                for metric in ("acc", "nll", "brier", "ece_15"):
                    rows.append(_row(method, seed, "shift", metric, 99.0, "mean", str(sev)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _col(t, name):
    return t.header.index(name)


def _row_of(t, method, first=0):
    return next(r for r in t.rows if r[first].text == method)


def test_ood_table_values_and_bold():
    t = ood_table(make_df(), "d", "paper")
    assert t is not None and t.header[0] == "Method" and t.header[-1] == "Rank ↓"
    # individual sets first (sorted), pooled last, AUROC then FPR95 for each
    assert t.header[1:7] == [
        "a AUROC ↑",
        "a FPR95 ↓",
        "b AUROC ↑",
        "b FPR95 ↓",
        "pooled AUROC ↑",
        "pooled FPR95 ↓",
    ]
    assert [r[0].text for r in t.rows] == list(METHODS)  # registry order
    ce = _row_of(t, "ce")
    assert ce[_col(t, "a AUROC ↑")].text == "0.800 ± 0.100"  # mean ± sample std
    for col in range(1, 7):
        bold = [r[0].text for r in t.rows if r[col].bold]
        assert bold == ["cog-ts"], (t.header[col], bold)  # best AUROC and lowest FPR95
    assert _row_of(t, "cog-ts")[-1].text == "1.00" and _row_of(t, "cog-ts")[-1].bold
    short = make_df()
    short = short[~((short["method"] == "ts") & (short["seed"] == 2))]
    cells = {r[0].text: r for r in ood_table(short, "d", "paper").rows}
    assert cells["ts"][1].text == "0.600 ± 0.000 (2 of 3 seeds)"
    assert cells["ce"][1].text == "0.800 ± 0.100"
    assert ood_table(make_df(), "d", "fair") is None
    assert ood_table(make_df(), "other", "paper") is None


def test_shift_tables_average_conditions_and_severities():
    df = make_df()
    t = shift_table(df, "d", "paper")
    assert t.header == ["Method", "Acc ↑", "NLL ↓", "Brier ↓", "ECE-15 ↓", "Rank ↓"]
    # hand count: mean over c1, c2 and severities 1..3 of base - 0.1 s - off, seeds 0..2
    for method, base in SHIFT_BASE.items():
        expect = base - 0.2 - 0.02 + 0.001
        cell = _row_of(t, method)[1]
        assert cell.text == f"{expect:.3f} ± 0.001", method
    acc_bold = [r[0].text for r in t.rows if r[1].bold]
    assert acc_bold == ["cog-fc"]
    ece_bold = {r[0].text for r in t.rows if r[4].bold}
    assert ece_bold == {"ce", "ts", "cog-fc"}  # ties share the bold
    assert "99" not in " ".join(c.text for r in t.rows for c in r)  # 'mean' not counted
    ranks = [float(r[-1].text) for r in t.rows]
    assert ranks == sorted(ranks) and t.rows[0][0].text == "cog-fc"


def test_paired_ood_and_shift_comparisons_and_the_ood_claim():
    fams = families(make_df(), "paper", None)
    ood = {(c.a, c.b, c.metric): c for c in fams["ood"]}
    worse = ood[("cog-fc", "ce", "auroc")]  # pooled AUROC 0.61 against 0.81 in every seed
    assert worse.test.diff == pytest.approx(-0.2) and worse.test.diffs == pytest.approx((-0.2,) * 3)
    assert worse.verdict == "worse"
    assert ood[("cog-ts", "ts", "auroc")].verdict == "better"
    shift = {(c.a, c.b, c.metric): c for c in fams["shift"]}
    assert shift[("cog-ts", "ts", "ece_15")].verdict == "worse"  # COG loses on shift ECE
    assert shift[("cog-ts", "ts", "ece_15")].test.diff == pytest.approx(0.2)  # 'mean' not counted
    claim = judge_claims(make_df(), "paper", fams, {})[3]
    assert claim.claim == "COG helps OOD detection" and claim.judgement == "does not hold"
    assert "1 decided better, 1 worse" in claim.evidence and claim.key == "paired-ood-paper"


def test_severity_figure(tmp_path):
    df = make_df()
    path = severity_figure(df, "d", "paper", tmp_path / "f" / "sev.png")
    assert path.is_file() and path.stat().st_size > 5000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one = make_df(severities=(2,))
    assert severity_figure(one, "d", "paper", tmp_path / "one.png") is None  # no line
    assert not (tmp_path / "one.png").exists()


def test_section_absent_without_rows_and_errors(tmp_path):
    df = make_df()
    plain = df[df["split"].isin(["val", "test"])]
    assert robustness_section(plain, tmp_path) is None


def _write_bench(out: Path, df: pd.DataFrame, unavailable: dict | None = None) -> Path:
    out.mkdir(parents=True)
    write_csv(out / "results.csv", COLUMNS, df.to_dict("records"))
    if unavailable is not None:
        run = out / "runs" / "ce-seed0"
        config = {"method": "ce", "dataset": "d", "seed": 0, "task": "multiclass"}
        write_run(run, config, {"acc": 0.9}, {"acc": 0.9}, unavailable=unavailable)
        write_csv(
            out / "runs.csv",
            ["dataset", "method", "protocol", "seed", "status", "model", "epochs", "schedule",
             "lr", "calibrator_lr", "train_seconds", "total_seconds", "copied_from", "run_dir",
             "log"],
            [{"dataset": "d", "method": "ce", "protocol": "paper", "seed": 0,
              "status": "complete", "run_dir": "runs/ce-seed0"}],
        )  # fmt: skip
    return out


@pytest.mark.slow
def test_report_sections_and_self_contained(tmp_path):
    un = {"ood": {"svhn": "missing file svhn/test_32x32.mat"}, "shift": {}}
    out = _write_bench(tmp_path / "b", make_df(), un)
    assert unavailable_sets([out / "runs" / "ce-seed0"])["ood"] == {
        "svhn": "missing file svhn/test_32x32.mat"
    }
    assert unavailable_sets([out / "runs" / "missing"]) == {"ood": {}, "shift": {}}
    page = build_report(out).read_text()
    md = (out / "report.md").read_text()
    for text in (
        "Robustness: OOD detection and covariate shift",
        "OOD detection (Tab. 3 style)",
        "Covariate shift (Tab. 4 style)",
        "COG vs counterpart, OOD detection (pooled sets) — paper protocol",
        "COG vs counterpart, covariate shift",
    ):
        assert text in md and text in page, text
    assert "'svhn' not evaluated" in md and "&#x27;svhn&#x27; not evaluated" in page
    assert (out / "figures" / "shift_severity_paper_d.png").is_file()
    assert "](figures/shift_severity_paper_d.png)" in md
    assert not re.findall(r'(?:src|href)="(?!data:|#)[^"]*"', page)  # self-contained
    imgs = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert imgs and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in imgs)
    assert "<script" not in page

    plain = _write_bench(tmp_path / "p", make_df().query("split in ['val', 'test']"))
    build_report(plain)
    assert "Robustness" not in (plain / "report.md").read_text()
