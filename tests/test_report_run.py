"""Tests of the one-run report (build_run_report) and of report_kind / build_any."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from cogcal.report.build import build_any
from cogcal.report.run_report import build_run_report, report_kind
from cogcal.runs import RunDir
from test_report_render import write_run

BINS = (5, 10, 15, 20, 50, 100)


def _metrics(acc, nll, brier, ece, **extra):
    m = {"acc": acc, "nll": nll, "brier": brier}
    for b in BINS:
        m |= {f"ece_{b}": ece + 0.001 * b, f"rmsce_{b}": 1.5 * ece, f"mce_{b}": 3 * ece}
    m["ece_15"] = ece
    return m | extra


def _logits(n=200, k=4, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k)) + 2.0 * np.eye(k)[y]
    return z.astype(np.float32), y


def make_run(path, **record):
    config = {
        "method": "ts", "dataset": "mnist1d", "model": "mlp", "seed": 3, "epochs": 5,
        "lr": 1e-4, "calibrator_lr": None, "schedule": "none", "task": "multiclass",
        "data": {"fingerprint": "abc123", "num_classes": 4},
    }  # fmt: skip
    return write_run(
        path,
        config,
        _metrics(0.91, 0.31, 0.14, 0.021),
        _metrics(0.9012, 0.3345, 0.1456, 0.0234),
        logits=_logits(),
        val_uncalibrated=_metrics(0.91, 0.45, 0.16, 0.08),
        **record,
    )


def test_single_run_report(tmp_path):
    run = make_run(
        tmp_path / "run",
        ood={"svhn": {"auroc": 0.8765, "fpr95": 0.5}, "pooled": {"auroc": 0.8, "fpr95": 0.6}},
        shift={"noise": {"1": _metrics(0.8, 0.5, 0.2, 0.03), "2": _metrics(0.7, 0.7, 0.3, 0.05)}},
        unavailable={"ood": {"cifar10": "missing file cifar-10-batches-py"}, "shift": {}},
        timing={"stage1": {"seconds": 12.5, "epochs_run": 5}, "total_seconds": 14.25},
    )
    assert report_kind(run) == "run"
    html_path = build_run_report(run)
    assert html_path == run / "report.html"
    md = (run / "report.md").read_text()
    assert md.startswith("# cogcal run report: ts on mnist1d, seed 3")
    assert "| method | ts |" in md and "| data.fingerprint | abc123 |" in md
    assert "| calibrator\\_lr | — |" in md
    metrics = md.split("**Metrics**")[1].split("\n\n*")[0]
    assert "| test | 0.9012 | 0.3345 | 0.1456 | 0.0234 | 0.0351 | 0.0702 |" in metrics
    assert "| validation, before post-hoc calibration | 0.9100 | 0.4500 |" in metrics
    sweep = md.split("**Calibration errors over bin counts**")[1]
    assert "| 100 | 0.1210 |" in sweep  # ece_100 of validation = 0.021 + 0.1
    assert "| svhn | 0.8765 | 0.5000 |" in md and "| pooled | 0.8000 | 0.6000 |" in md
    assert "| noise | 2 | 0.7000 | 0.7000 | 0.3000 | 0.0500 |" in md
    assert "ood cifar10: missing file cifar-10-batches-py" in md
    assert "stage1 | seconds 12.5; epochs\\_run 5" in md
    assert "](reliability.png)" in md and (run / "reliability.png").is_file()
    page = html_path.read_text()
    imgs = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(imgs) == 1 and base64.b64decode(imgs[0])[:4] == b"\x89PNG"
    assert not re.findall(r'(?:src|href)="(?!data:|#)[^"]*"', page)
    assert build_any(run) == html_path


def test_multitask_run_has_per_task_table(tmp_path):
    names = ("smile", "hat")
    test = _metrics(0.8, 0.4, 0.15, 0.03)
    for i, t in enumerate(names):
        test |= {f"acc/{t}": 0.7 + 0.2 * i, f"nll/{t}": 0.5, f"brier/{t}": 0.2, f"ece_15/{t}": 0.01}
    rng = np.random.default_rng(1)
    path = tmp_path / "mtl"
    config = {"method": "cog-fc", "dataset": "mt", "seed": 0, "task": "multilabel"}
    logits = (rng.normal(size=(50, 2)).astype(np.float32), rng.integers(0, 2, (50, 2)))
    write_run(path, config, test, test, logits=logits)
    build_run_report(path)
    md = (path / "report.md").read_text()
    tasks = md.split("**Per-task metrics**")[1]
    assert "| smile | 0.7000 | 0.5000 | 0.2000 | 0.0100 |" in tasks
    assert "| hat | 0.9000 |" in tasks
    assert "pooled over tasks" in md


def test_run_without_logits_still_reports(tmp_path):
    run = make_run(tmp_path / "run")
    (run / "test_logits.npz").unlink()
    build_run_report(run)
    md = (run / "report.md").read_text()
    assert "No reliability diagram: cannot read" in md and r"test\_logits.npz" in md


def test_folders_that_are_not_finished_runs(tmp_path):
    with pytest.raises(ValueError, match="does not exist; expected a bench folder"):
        report_kind(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        report_kind(tmp_path / "file.txt")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    (other / "data").mkdir()
    with pytest.raises(ValueError, match=r"holds data/, notes.txt; expected a bench folder"):
        build_run_report(other)
    unfinished = tmp_path / "unfinished"
    RunDir(unfinished).path.mkdir()
    RunDir(unfinished).write_config({"method": "ce", "dataset": "mnist1d", "seed": 0})
    with pytest.raises(ValueError, match="unfinished cogcal run .*no checkpoint.*--resume"):
        build_run_report(unfinished)
    (unfinished / "metrics.json").write_text(json.dumps({"status": "diverged", "error": "nan"}))
    with pytest.raises(ValueError, match=r"diverged \(nan\)"):
        build_any(unfinished)
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "results.csv").write_text("dataset\n")
    assert report_kind(bench) == "bench"
    with pytest.raises(ValueError, match="bench folder"):
        build_run_report(bench)
