"""Reliability round 4: predict never drops or invents rows, tune never writes into folders
it does not own, plugins train in a suite as with `cogcal train`, no wait without end.

Each test is the repro of one failure a hostile user found (tiny data, one epoch, the CLI
called in-process where possible); the item numbers are those of the issue.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml

from cogcal.cli import main

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")


def _table(path: Path, n: int = 40, *, big: str | None = None) -> Path:
    """A separable two-class table ``a,b,label`` (``big`` replaces row 3's ``b``)."""
    rows = ["a,b,label"]
    for i in range(n):
        b = big if big is not None and i == 3 else f"{(i * 7) % 5 / 5:.2f}"
        rows.append(f"{i % 2 + (i % 3) / 10:.2f},{b},{'xy'[i % 2]}")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory) -> Path:
    """A finished run trained on a CSV table (1 epoch)."""
    root = tmp_path_factory.mktemp("csvrun")
    table = _table(root / "t.csv")
    argv = ["train", "--dataset", f"csv:{table}", "--target", "label", "--method", "ce"]
    argv += ["--lr", "1e-2", "--epochs", "1", "--no-progress", "--out", str(root / "run")]
    assert main(argv) == 0
    return root / "run"


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("cogcal: ")]
    assert len(lines) == 1 and lines[0].startswith("cogcal: error: "), err
    return lines[0]


# --------------------------------------------------------------------------- item 1


def _tune(out: Path, *extra: str) -> list[str]:
    return [
        "tune", "--dataset", "digits", "--model", "mlp", "--method", "ce", "--epochs", "1",
        "--lrs", "1e-3", "--max-extensions", "0", "--out", str(out), "--no-progress", *extra,
    ]  # fmt: skip


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_tune_never_writes_into_a_train_run_or_a_users_folder(csv_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(csv_run, run)
    before = _tree(run)
    assert main(_tune(run)) == 2
    line = _err_line(capsys)
    assert "is a `cogcal train` run folder" in line and "--out" in line
    assert _tree(run) == before  # not one file added, changed or removed
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(_tune(mine)) == 2
    assert "notes.txt" in _err_line(capsys)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_tune_marks_its_folder_and_continues_in_it(tmp_path):
    from cogcal.train.tuning import TUNE_MARK, check_tune_folder

    out = tmp_path / "t"
    assert main(_tune(out)) == 0
    summary = json.loads((out / "tune.json").read_text())
    assert summary[TUNE_MARK] == 1 and summary["best"] == {"lr": 1e-3}
    assert main(_tune(out)) == 0  # its own folder: the point is reused
    # a folder of an earlier cogcal tune (before the mark): only point runs and tables
    (out / "tune.json").unlink()
    check_tune_folder(out)
    (out / "lr0.001" / "config.json").write_text("{}")  # no longer a run cogcal wrote
    with pytest.raises(ValueError, match="was not written by cogcal tune"):
        check_tune_folder(out)


# --------------------------------------------------------------------------- item 2


def test_a_quote_left_open_is_an_error_naming_its_line(csv_run, tmp_path, capsys):
    from cogcal.data import load_dataset

    path = _table(tmp_path / "q.csv", n=21)
    lines = path.read_text().splitlines()
    lines[5] = '"' + lines[5]  # line 6 of the file: a quote that never closes
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"line 6 opens a quoted field that is never closed"):
        load_dataset(f"csv:{path}", target="label")
    features = tmp_path / "f.csv"
    features.write_text("\n".join(x.rsplit(",", 1)[0] for x in lines) + "\n")
    out = tmp_path / "p.csv"
    assert main(["predict", str(csv_run), "--input", str(features), "--out", str(out)]) == 2
    assert "line 6 opens a quoted field" in _err_line(capsys) and not out.exists()
    argv = ["train", "--dataset", f"csv:{path}", "--target", "label", "--lr", "1e-2"]
    assert main([*argv, "--epochs", "1", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "line 6 opens a quoted field" in _err_line(capsys)
    assert not (tmp_path / "r").exists()


def test_rows_the_reader_would_drop_are_an_error(tmp_path):
    """The second reading names where the two part; quoted newlines stay one row."""
    from cogcal.data.base import DatasetCorruptError
    from cogcal.data.tables import _check_records, read_table

    with pytest.raises(DatasetCorruptError, match=r"holds 3 rows .* but 2 were read, from line 3"):
        _check_records("a,b\n1,2\n3,4\n", ",", 1, [1, 2], what="t", error=DatasetCorruptError)
    path = tmp_path / "ok.csv"
    path.write_text('a,b\n"1\n2",3\n\n4,5\n')
    assert read_table(path, what="t", error=DatasetCorruptError).lines == [3, 5]


# --------------------------------------------------------------------------- item 3


def test_predict_refuses_values_beyond_float32(csv_run, tmp_path, capsys):
    from cogcal.commands.predict import predict

    table = tmp_path / "big.csv"
    rows = _table(tmp_path / "t.csv", n=6, big="1e39").read_text().splitlines()
    table.write_text("\n".join(r.rsplit(",", 1)[0] for r in rows) + "\n")
    out = tmp_path / "p.csv"
    assert main(["predict", str(csv_run), "--input", str(table), "--out", str(out)]) == 2
    line = _err_line(capsys)
    assert "line 5, column 'b': '1e39' is beyond the float32 range" in line
    assert not out.exists()
    x = np.zeros((4, 2))
    x[2, 1] = -1e39  # finite in float64
    np.save(tmp_path / "x.npy", x)
    assert main(["predict", str(csv_run), "--input", str(tmp_path / "x.npy")]) == 2
    assert "row 2 (0-based), column 'b', index 1 holds -1e+39" in _err_line(capsys)
    with pytest.raises(ValueError, match="beyond the float32 range"):
        predict(str(csv_run), x)
    assert np.isfinite(predict(str(csv_run), x[:2]).probabilities).all()


# --------------------------------------------------------------------------- item 5


@pytest.mark.slow
def test_predict_reads_a_folder_as_folder_datasets_do(tmp_path, capsys):
    from PIL import Image

    from cogcal.data.folders import image_files

    root = tmp_path / "imgs"
    for k, cls in enumerate("ab"):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            Image.new("L", (8, 8), 30 * k + 5 * i).save(root / cls / f"{i}.png")
    argv = ["train", "--dataset", f"folder:{root}", "--image-size", "8", "--method", "ce"]
    run = tmp_path / "run"
    assert main([*argv, "--lr", "1e-2", "--epochs", "1", "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    inputs = tmp_path / "in"
    (inputs / "x").mkdir(parents=True)
    Image.new("L", (8, 8), 3).save(inputs / "x" / "one.png")
    (inputs / "x" / "loop").symlink_to(inputs)  # a loop: the image again and again
    assert main(["predict", str(run), "--input", str(inputs)]) == 2
    assert "a folder it sits in (a loop" in _err_line(capsys)
    (inputs / "x" / "loop").unlink()
    (inputs / "out").symlink_to(root / "a")  # a link leaving the folder given
    with pytest.raises(ValueError, match="outside the dataset folder"):
        image_files(inputs, what="--input")
    (inputs / "out").unlink()
    assert main(["predict", str(run), "--input", str(inputs)]) == 0
    assert capsys.readouterr().out.count("\n") == 2  # the header and one row: one image


# --------------------------------------------------------------------------- item 6


@pytest.mark.parametrize("damage", ["garbage", "truncated", "shapes"])
def test_report_names_a_damaged_logits_file(csv_run, tmp_path, capsys, damage):
    run = tmp_path / "run"
    shutil.copytree(csv_run, run)
    path = run / "test_logits.npz"
    if damage == "garbage":
        path.write_bytes(os.urandom(300))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:
        np.savez(path, logits=np.zeros(5), labels=np.zeros(3))
    assert main(["report", str(run)]) == 2
    line = _err_line(capsys)
    assert f"{path} is damaged" in line and "--overwrite" in line
    assert not (run / "report.md").exists()
    path.unlink()  # a missing file: the report says so instead of drawing the diagram
    assert main(["report", str(run)]) == 0
    assert "No reliability diagram" in (run / "report.md").read_text()


# --------------------------------------------------------------------------- item 7


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--lrs", "1e-3,1e-3"], "--lrs lists 0.001 twice"),
        (["--method", "cog-fc", "--calibrator-ratios", "0.1,0.1"], "--calibrator-ratios lists 0.1"),
        (["--lr", "0.5"], "--lr is not a flag of `cogcal tune`"),
        (["--calibrator-lr", "1e-3"], "--calibrator-lr is not a flag of `cogcal tune`"),
        (["--calibrator-ratios", "abc"], "--calibrator-ratios expects comma-separated numbers"),
        (["--calibrator-ratios", "0.1"], "--calibrator-ratios applies to COG methods only"),
        (["--lrs", "1e-3,2e-3,5e-3"], "--lrs must be log-spaced"),
        (["--lrs", "1e-9"], "--lrs value 1e-09 is below 1e-08"),
    ],
)
def test_tune_flags_are_checked_and_errors_name_the_flag_typed(tmp_path, capsys, extra, said):
    out = tmp_path / "t"
    argv = ["tune", "--dataset", "digits", "--method", "ce", "--out", str(out), *extra]
    assert main(argv) == 2
    line = _err_line(capsys)
    assert said in line and "`lrs`" not in line
    assert not out.exists()


def test_the_python_grid_refuses_repeated_values():
    from cogcal.train.tuning import Grid

    with pytest.raises(ValueError, match="`ratios` lists 0.1 twice"):
        Grid((1e-3,), (0.1, 0.1))  # was a ZeroDivisionError
    assert Grid((1e-3, 1e-2), (0.01, 0.1)).extended(["lr high"]).lrs == (1e-3, 1e-2, 0.1)


# --------------------------------------------------------------------------- item 8


@pytest.mark.slow
def test_a_node_that_never_comes_ends_the_run_in_one_line(tmp_path):
    pytest.importorskip("lightning_fabric")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": SRC, "COGCAL_RENDEZVOUS_TIMEOUT": "2"}
    env.pop("MASTER_PORT", None)
    cmd = [sys.executable, "-m", "cogcal.cli", "train", "--dataset", "digits", "--model", "mlp"]
    cmd += ["--method", "ce", "--lr", "1e-3", "--epochs", "1", "--num-nodes", "2"]
    started = time.monotonic()
    proc = subprocess.run(
        [*cmd, "--out", str(out), "--no-progress"], env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("cogcal:")]
    assert len(errors) == 1 and "did not all start within 2 s" in errors[0], proc.stderr
    assert "COGCAL_RENDEZVOUS_TIMEOUT" in errors[0] and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 200
    bad = subprocess.run(
        [*cmd, "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=240,
        env={**env, "COGCAL_RENDEZVOUS_TIMEOUT": "soon"},
    )  # fmt: skip
    assert bad.returncode == 2 and "expected a positive number of seconds" in bad.stderr


# --------------------------------------------------------------------------- items 9, 10


def _reliability_section() -> str:
    return (ROOT / "docs" / "reliability.md").read_text()  # the README's former section


def test_a_plugins_sys_exit_is_what_the_readme_says(tmp_path, monkeypatch, capsys):
    """docs/reliability.md and the code agree: a plugin's sys.exit() is the plugin's error, exit 2
    naming it (as any exception it raises), never success and never `internal error`."""
    name = f"exiting_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import sys\ndef load():\n    sys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["train", "--dataset", f"{name}:load", "--method", "ce", "--lr", "1e-3"]
    assert main([*argv, "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "plugin raised SystemExit" in _err_line(capsys)
    section = " ".join(_reliability_section().split())
    assert "a plugin's `sys.exit()` is one too" not in section
    said = re.search(r"2 a user error \(.*?\): (.*?); 1 an environment failure", section)
    assert said and "a dataset plugin that raises or calls `sys.exit()`" in said.group(1)


PLUGIN = """
import numpy as np

def load():
    rng = np.random.default_rng(0)
    def pair(n):
        return rng.integers(0, 255, size=(n, 1, 8, 8)).astype(np.uint8), np.arange(n) % 2
    return {"train": pair(40), "val": pair(16), "test": pair(16), "num_classes": 2}
"""


@pytest.fixture
def image_plugin(tmp_path, monkeypatch) -> str:
    """A plugin of images whose backbone (cnn) comes from the plugin, not from its name."""
    name = f"cogcal_r4_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:load"


@pytest.mark.slow
def test_a_suite_trains_a_plugin_that_names_no_model(tmp_path, image_plugin):
    from cogcal.commands.bench import run_bench

    suite = {
        "name": "plugin",
        "datasets": {image_plugin: {}},  # no model: the plugin's default
        "methods": ["ce"],
        "seeds": 1,
        "protocols": ["fair"],
        "budget": {"fair": {"epochs": 1, "schedule": "none", "patience": None}},
        "tune": {"baseline_lrs": [1e-3], "max_extensions": 0},
        "effect": False,
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(suite))
    out = tmp_path / "b"
    summary = run_bench(
        path, out=out, jobs=1, data_root=tmp_path / "data", progress=False, report=False,
        allow_plugins=True,
    )  # fmt: skip
    assert summary.failed == 0, (out / "failed.txt").read_text()


@pytest.mark.slow
def test_tune_reuses_the_points_of_a_plugin_that_names_no_model(tmp_path, image_plugin):
    argv = ["tune", "--dataset", image_plugin, "--method", "ce", "--lrs", "1e-3"]
    argv += ["--epochs", "1", "--max-extensions", "0", "--out", str(tmp_path / "t")]
    assert main([*argv, "--no-progress"]) == 0
    assert main([*argv, "--no-progress"]) == 0  # was: "holds a run of another configuration"


# --------------------------------------------------------------------------- item 11


@pytest.mark.slow
def test_resume_says_the_csv_changed_in_words(tmp_path, capsys):
    table = _table(tmp_path / "t.csv")
    out = tmp_path / "run"
    argv = ["train", "--dataset", f"csv:{table}", "--target", "label", "--method", "ce"]
    argv += ["--lr", "1e-2", "--epochs", "2", "--out", str(out), "--no-progress"]
    assert main([*argv, "--checkpoint-seconds", "0"]) == 0
    (out / "metrics.json").unlink()  # an unfinished run with checkpoints
    with table.open("a") as f:
        f.write("0.5,0.5,x\n")
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    line = _err_line(capsys)
    assert f"the content of {table.resolve()} changed since the run in {out} started" in line
    assert "sha256" in line and "--overwrite" in line and "other settings" not in line


# --------------------------------------------------------------------------- item 12


def test_a_folder_class_too_small_for_every_split_is_refused(tmp_path):
    from PIL import Image

    from cogcal.data import load_dataset

    root = tmp_path / "imgs"
    for k, (cls, n) in enumerate({"a": 12, "b": 2}.items()):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            Image.new("L", (8, 8), 20 * k + i).save(root / cls / f"{i}.png")
    with pytest.raises(ValueError, match=r"class\(es\) 'b' \(2 images; none in"):
        load_dataset(f"folder:{root}", image_size=8)


def test_a_folder_of_two_images_per_class_is_one_line_and_exit_2(tmp_path, capsys):
    """Every class at 2 images (the repro: a run reporting "validation NLL 0.0000" on a
    split without some class): `cogcal train` refuses it in one line, before any folder."""
    from PIL import Image

    root = tmp_path / "imgs"
    for k, cls in enumerate("ab"):
        (root / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("L", (8, 8), 20 * k + i).save(root / cls / f"{i}.png")
    out = tmp_path / "r"
    argv = ["train", "--dataset", f"folder:{root}", "--method", "ce", "--lr", "1e-3"]
    assert main([*argv, "--epochs", "1", "--out", str(out), "--no-progress"]) == 2
    line = _err_line(capsys)
    assert "'a' (2 images; none in" in line and "'b' (2 images; none in" in line
    assert "at least 4 images" in line and not out.exists()
