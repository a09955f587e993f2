"""Tests of the report: tables from results.csv, self-contained HTML, embedded images.

A synthetic bench folder (results.csv, runs.csv, tune.json, test logits) is written
here, so these tests need no training. ``bench/report_render_check.py`` additionally
opens a report in headless Chromium; the last test runs it when Chromium is installed.
"""

from __future__ import annotations

import base64
import csv
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cogcal.bench.results import COLUMNS
from cogcal.report.build import build_report, load_results
from cogcal.report.tables import comparison_table, losses_table, pairwise_calibration_table

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("ce", "ts", "ms", "cog-fc", "cog-ts", "cog-ms")


def make_bench_dir(out: Path, *, logits: bool = True) -> Path:
    """A synthetic bench folder with 2 protocols, 6 methods, 3 seeds, one dataset."""
    rng = np.random.default_rng(0)
    rows = []
    runs = []
    for protocol in ("paper", "fair"):
        for i, method in enumerate(METHODS):
            for seed in range(3):
                acc = 0.80 + 0.01 * i + 0.005 * rng.standard_normal()
                nll = 0.70 - 0.02 * i + 0.01 * rng.standard_normal()
                vals = {"acc": acc, "nll": nll, "brier": nll / 2}
                for b in (5, 10, 15, 20, 50, 100):
                    e = 0.05 - 0.004 * i + 0.0005 * b + 0.002 * rng.random()
                    vals |= {f"ece_{b}": e, f"rmsce_{b}": 1.3 * e, f"mce_{b}": 4 * e}
                if method == "cog-ms":
                    vals["acc"] -= 0.2  # COG loses somewhere: the report must say so
                for split in ("val", "test"):
                    for metric, v in vals.items():
                        rows.append(
                            ["mnist1d", method, protocol, seed, split, metric, v, "", "", ""]
                        )
                rows.append(
                    ["mnist1d", method, protocol, seed, "shift", "acc", acc - 0.1, "", "noise", 2]
                )
                run_dir = out / "runs" / protocol / "mnist1d" / method / f"seed{seed}"
                run_dir.mkdir(parents=True)
                if logits:
                    labels = rng.integers(0, 10, 300)
                    z = rng.normal(size=(300, 10)) + (2 + i / 3) * np.eye(10)[labels]
                    np.savez(
                        run_dir / "test_logits.npz", logits=z.astype(np.float32), labels=labels
                    )
                runs.append(
                    {
                        "dataset": "mnist1d",
                        "method": method,
                        "protocol": protocol,
                        "seed": seed,
                        "status": "complete",
                        "model": "cnn1d",
                        "epochs": 20,
                        "lr": 1e-3,
                        "calibrator_lr": "",
                        "train_seconds": 10 + i,
                        "total_seconds": 11 + i,
                        "copied_from": "",
                        "run_dir": str(run_dir.relative_to(out)),
                        "log": "",
                    }
                )
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(rows)
    pd.DataFrame(runs).to_csv(out / "runs.csv", index=False)
    tune = out / "tune" / "fair" / "mnist1d" / "ce"
    tune.mkdir(parents=True)
    (tune / "tune.json").write_text(
        json.dumps(
            {
                "protocol": "fair",
                "dataset": "mnist1d",
                "method": "ce",
                "used_by": ["ce", "ts", "ms"],
                "best": {"lr": 1e-3},
                "table": [{"lr": 1e-4, "val_nll": 0.9}, {"lr": 1e-3, "val_nll": 0.7}],
            }
        )
    )
    (out / "bench.json").write_text(
        json.dumps(
            {
                "suite": {"name": "synthetic", "description": "test data", "train": {"epochs": 20}},
                "datasets": {
                    "mnist1d": {"task": "multiclass", "num_classes": 10, "feature_dim": 64}
                },
                "sessions": [{"wall_seconds": 12.0, "jobs": 2, "counts": {}}],
            }
        )
    )
    (out / "failed.txt").write_text(
        "# run\terror\tlog\npaper/mnist1d/ls/seed1\tboom\truns/x/run.log\n"
    )
    return out


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[str, int] = {}
        self.imgs: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith(("#", "data:")):
                self.urls.append(a[key])


def test_report_is_self_contained(tmp_path):
    out = make_bench_dir(tmp_path / "b")
    html_path = build_report(out)
    assert html_path == out / "report.html"
    page = html_path.read_text()
    parser = _Collect()
    parser.feed(page)
    assert parser.urls == []  # no external resource: opens offline
    assert "<script" not in page
    # complexity, comparison x2, losses, pairwise x6, shift x2, tuning, runtimes, failures
    assert parser.tags["table"] >= 14
    assert len(parser.imgs) == 2 * 3 + 2 * 1 + 2  # pairs + top-ranked-vs-cog-fc + pareto
    for src in parser.imgs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    for section in (
        "Complexity",
        "Where COG loses",
        "Run times",
        "Selected learning rates",
        "Failed runs",
        "Reliability diagrams",
        "Accuracy against calibration",
    ):
        assert section in page
    md = (out / "report.md").read_text()
    assert "| Method |" in md and "](figures/reliability_paper_mnist1d_ts_vs_cog-ts.png)" in md
    assert (out / "figures" / "pareto_fair_mnist1d.png").is_file()


def test_report_from_results_csv_alone(tmp_path):
    full = make_bench_dir(tmp_path / "full", logits=False)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(full / "results.csv", alone / "results.csv")
    build_report(alone)
    md = (alone / "report.md").read_text()
    assert "Not found, sections skipped" in md and "Where COG loses" in md
    assert "Tab. 9 style" in md and "Pareto" in md
    with pytest.raises(ValueError, match="does not exist"):
        build_report(tmp_path / "empty")


def test_tables_content(tmp_path):
    df = load_results(make_bench_dir(tmp_path / "b", logits=False))
    t = comparison_table(df, "mnist1d", "paper")
    header = t.header
    assert header[0] == "Method" and header[-1] == "Rank ↓"
    # rows are sorted by summary rank, and each column has exactly one bold best value
    ranks = [float(r[-1].text) for r in t.rows]
    assert ranks == sorted(ranks)
    for j in range(1, len(header)):
        assert sum(r[j].bold for r in t.rows) >= 1
    acc_col = header.index("Acc ↑")
    best_acc = max(t.rows, key=lambda r: float(r[acc_col].text.split(" ± ")[0]))
    assert best_acc[acc_col].bold and not any(r[acc_col].bold for r in t.rows if r is not best_acc)
    p = pairwise_calibration_table(df, "mnist1d", "fair", "mce")
    assert [r[0].text for r in p.rows] == ["ce", "cog-fc", "ts", "cog-ts", "ms", "cog-ms"]
    assert p.header[1:7] == [f"B={b}" for b in (5, 10, 15, 20, 50, 100)]
    assert "[" in p.rows[0][1].text and "±" in p.rows[0][1].text
    losses = losses_table(df)
    assert any(r[2].text == "cog-ms vs ms" and r[3].text == "Acc ↑" for r in losses.rows)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed")
def test_report_renders_in_headless_chromium(tmp_path):
    out = make_bench_dir(tmp_path / "b")
    build_report(out)
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "report_render_check.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["ok"] and summary["images_rendered"] == summary["images"] >= 8
