"""`cogcal calibrate --conformal ALPHA`: split conformal prediction sets fitted on validation
rows the post-hoc calibrator did not see, stored (bound) in the calibration folder, loaded by
`cogcal.load_calibrator`; and the progress of long post-hoc fits (issue 40, item 5)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import cogcal
import cogcal.commands.calibrate as calibrate_command
from cogcal.cli import main
from cogcal.conformal import ConformalSets
from cogcal.posthoc import calibrate, conformal_split


def _logits(n: int, k: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    return 4.0 * np.eye(k)[y] + 1.5 * rng.normal(size=(n, k)), y


def _split(tmp_path, z, y, seed: int, n_val: int):
    perm = np.random.default_rng(seed).permutation(len(y))
    val, test = perm[:n_val], perm[n_val:]
    np.savez(tmp_path / "val.npz", logits=z[val], labels=y[val])
    np.savez(tmp_path / "test.npz", logits=z[test], labels=y[test])


def _run(tmp_path, *extra: str) -> int:
    return main([
        "calibrate", "--val", str(tmp_path / "val.npz"), "--test", str(tmp_path / "test.npz"),
        "--out", str(tmp_path / "cal"), "--overwrite", *extra,
    ])  # fmt: skip


@pytest.mark.parametrize("method", ["lac", "aps"])
def test_mean_test_coverage_over_20_random_splits_is_1_minus_alpha(tmp_path, monkeypatch,
                                                                   capsys, method):  # fmt: skip
    """Through the command's own path (the report aside, it is drawn in the next test)."""
    monkeypatch.setattr(calibrate_command, "build_calibration_report", lambda path: None)
    z, y = _logits(1200)
    alpha, covered = 0.1, []
    for seed in range(20):
        _split(tmp_path, z, y, seed, n_val=600)
        assert _run(tmp_path, "--method", "ts", "--conformal", str(alpha),
                    "--conformal-method", method) == 0  # fmt: skip
        metrics = json.loads((tmp_path / "cal" / "metrics.json").read_text())
        covered.append(metrics["conformal"]["test_coverage"])
        assert metrics["conformal"]["threshold_rows"] == 300
    assert abs(np.mean(covered) - (1 - alpha)) <= 0.015, covered
    capsys.readouterr()


def test_the_sets_are_stored_bound_loaded_and_reported(tmp_path, capsys):
    z, y = _logits(800)
    _split(tmp_path, z, y, 0, n_val=400)
    assert _run(tmp_path, "--method", "ts", "--conformal", "0.2") == 0
    out = capsys.readouterr().out
    assert "conformal sets (lac, alpha 0.2): test coverage" in out
    folder = tmp_path / "cal"
    meta = json.loads((folder / "calibration.json").read_text())
    assert meta["conformal"]["calibrator_rows"] == 200
    assert "conformal.json" in meta["integrity"]["files"]
    metrics = json.loads((folder / "metrics.json").read_text())["conformal"]
    assert {"test_coverage", "test_mean_set_size", "test_coverage_by_set_size"} <= set(metrics)
    cal = cogcal.load_calibrator(folder)
    assert isinstance(cal.conformal, ConformalSets) and cal.conformal.alpha == 0.2
    stored = json.loads((folder / "conformal.json").read_text())
    assert stored == cal.conformal.to_dict()
    sets = cal.predict_sets(z[:5])
    assert sets.shape == (5, 5) and sets.dtype == bool
    report = (folder / "report.md").read_text()
    assert "Prediction sets" in report and "Coverage by set size" in report
    # an edited threshold is refused in one line naming the file
    stored["threshold_"] = 0.99
    (folder / "conformal.json").write_text(json.dumps(stored))
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "conformal.json" in err and "sha256" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(Exception, match="conformal.json"):
        cogcal.load_calibrator(folder)
    (folder / "conformal.json").unlink()
    with pytest.raises(Exception, match="conformal.json: is missing"):
        cogcal.load_calibrator(folder)


def test_without_conformal_there_are_no_sets(tmp_path, capsys):
    z, y = _logits(400)
    _split(tmp_path, z, y, 0, n_val=200)
    assert _run(tmp_path, "--method", "ts") == 0
    cal = cogcal.load_calibrator(tmp_path / "cal")
    assert cal.conformal is None and not (tmp_path / "cal" / "conformal.json").exists()
    with pytest.raises(RuntimeError, match="no conformal sets"):
        cal.predict_sets(np.zeros((1, 5)))
    capsys.readouterr()


@pytest.mark.filterwarnings("ignore::cogcal.calibrators.SeparableDataWarning")
def test_a_bad_level_and_too_few_rows_are_one_line(tmp_path, capsys):
    z, y = _logits(60)
    _split(tmp_path, z, y, 0, n_val=30)
    assert _run(tmp_path, "--method", "ts", "--conformal", "1.5") == 2
    assert "--conformal 1.5" in capsys.readouterr().err
    assert _run(tmp_path, "--method", "ts", "--conformal", "0.01") == 2
    err = capsys.readouterr().err
    assert "val.npz" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cal" / "calibration.json").exists()


def test_python_calibrate_fits_the_threshold_on_rows_the_calibrator_did_not_see():
    z, y = _logits(600)
    cal = calibrate(z, y, method="ts", conformal=0.1)
    held = conformal_split(y).numpy()
    alone = calibrate(z[~held], y[~held], method="ts")
    assert cal.calibrator.temperature == pytest.approx(alone.calibrator.temperature)
    ref = ConformalSets(alpha=0.1).fit(probs=alone.predict_proba(z[held]), labels=y[held])
    assert cal.conformal.threshold_ == pytest.approx(ref.threshold_)


# --------------------------------------------------------------------------- progress


def test_progress_is_called_with_every_candidate_and_fold():
    z, y = _logits(300, k=3)
    steps: list[str] = []
    cal = calibrate(z, y, candidates=("ts", "isotonic", "ms"), cv=3, progress=steps.append)
    for name in ("ts", "isotonic"):
        assert [s for s in steps if s.startswith(f"{name}, fold")] == [
            f"{name}, fold {f}/3" for f in (1, 2, 3)
        ]
    assert any(s.startswith("ms, penalty by 3-fold cross-validation") for s in steps)
    assert steps[-1].startswith(cal.method) or cal.method == "ms"
    steps.clear()
    calibrate(z, y, method="ts", conformal=0.1, progress=steps.append)
    assert steps == ["ts, fit on all 150 rows", "conformal threshold on 150 held-out rows"]


def test_a_large_auto_fit_is_announced_up_front(tmp_path, monkeypatch, capsys):
    z, y = _logits(200, k=3)
    _split(tmp_path, z, y, 0, n_val=100)
    monkeypatch.setattr(calibrate_command, "AUTO_ANNOUNCE", 100 * 9 - 1)
    monkeypatch.setattr(calibrate_command, "build_calibration_report", lambda path: None)
    assert _run(tmp_path, "--method", "auto", "--cv", "2") == 0
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "may take about" in ln)
    assert "--method ts" in line and "--cv 3" in line and "What auto costs" in line
    assert "\r" not in err  # not a terminal: no status line
    monkeypatch.setattr(calibrate_command, "AUTO_ANNOUNCE", 100 * 9)
    assert _run(tmp_path, "--method", "auto", "--cv", "2") == 0
    assert "may take about" not in capsys.readouterr().err


def test_the_status_line_on_a_terminal(tmp_path, monkeypatch, capsys):
    import io

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    monkeypatch.setattr("sys.stderr", stream)
    monkeypatch.setattr(calibrate_command, "build_calibration_report", lambda path: None)
    z, y = _logits(200, k=3)
    _split(tmp_path, z, y, 0, n_val=100)
    assert _run(tmp_path, "--method", "ts") == 0
    text = stream.getvalue()
    assert "\rcogcal: ts, fit on all 100 rows" in text.replace("\033[K", "")
    assert text.endswith("\r\033[K")


@pytest.mark.slow
def test_predict_sets_writes_each_rows_set_fitted_on_the_validation_split(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--dataset", "digits", "--model", "mlp", "--method", "cog-fc",
                 "--epochs", "2", "--lr", "1e-3", "--no-progress",
                 "--data-root", str(tmp_path / "data"), "--out", str(run)]) == 0  # fmt: skip
    x = np.random.default_rng(0).uniform(0, 16, size=(50, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "p.csv"
    capsys.readouterr()
    assert main(["predict", str(run), "--input", str(tmp_path / "x.npy"), "--out", str(out),
                 "--sets", "0.1"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "prediction sets of level 0.9 (lac)" in err
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 50 and {"set_size", "set"} <= set(rows[0])
    for row in rows:
        members = row["set"].split("|") if row["set"] else []
        assert int(row["set_size"]) == len(members)
        probs = {k: float(row[k]) for k in map(str, range(10))}
        # a LAC set holds every class above one probability: the most probable first
        assert members == sorted(members, key=lambda k: -probs[k])
    assert main(["predict", str(run), "--input", str(tmp_path / "x.npy"), "--sets", "1.5"]) == 2
    assert "--sets must be" in capsys.readouterr().err
