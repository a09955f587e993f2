"""Never lose what the user has, never report a wrong result silently, and exit by cause.

Each test is the repro of one failure a hostile user found (kept small: tiny data, one or
two epochs, the CLI called in-process where possible).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import cogcal.train.runner as runner
from cogcal.cli import main
from cogcal.runs import RunDir

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _train(out: Path, *extra: str, epochs: int = 1) -> list[str]:
    return [
        "train", "--dataset", "digits", "--model", "mlp", "--method", "ce", "--lr", "1e-3",
        "--epochs", str(epochs), "--out", str(out), "--no-progress", *extra,
    ]  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before {path} appeared"


# --------------------------------------------------------------------------- item 1


@pytest.mark.slow
def test_a_second_train_on_a_folder_in_use_touches_nothing(tmp_path, capsys):
    """Item 1: the second `cogcal train` is refused before it reads or clears anything."""
    out = tmp_path / "lk"
    argv = _train(out, "--checkpoint-seconds", "1000", epochs=400)
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cogcal.cli", *argv], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(out / "logs" / "stage1.csv", proc)  # config.json written, epochs running
        before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
        config = (out / "config.json").read_text()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"in use by process {proc.pid}" in err and err.count("\n") == 1
        assert (out / "config.json").read_text() == config
        assert {"config.json", "logs/stage1.csv"} <= set(before)
        assert all((out / p).exists() for p in before)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert RunDir(out).is_marked()  # the run can still be resumed


# --------------------------------------------------------------------------- item 10


@pytest.mark.slow
def test_nan_first_in_the_validation_logits_is_divergence(tmp_path, monkeypatch, capsys):
    real = runner.stage1_model

    def poisoned(method, network, task):
        model = real(method, network, task)
        forward = model.forward

        def nan_in_eval(x):
            z = forward(x)
            return z if model.training else z * float("nan")

        model.forward = nan_in_eval
        return model

    monkeypatch.setattr(runner, "stage1_model", poisoned)
    out = tmp_path / "run"
    assert main(_train(out)) == 1
    err = capsys.readouterr().err
    assert "validation logits became non-finite in epoch 0" in err and err.count("\n") == 1
    record = json.loads((out / "metrics.json").read_text())
    assert record["status"] == "diverged" and "validation logits" in record["error"]
    assert set(record) >= {"config", "val", "test", "status"}  # one schema with complete runs


@pytest.mark.slow
def test_nan_in_the_test_logits_is_divergence(tmp_path, monkeypatch, capsys):
    real = runner.predict_logits

    def poisoned(model, batches, **kwargs):
        logits, labels = real(model, batches, **kwargs)
        return (logits * float("nan") if len(logits) == 360 else logits), labels

    monkeypatch.setattr(runner, "predict_logits", poisoned)
    out = tmp_path / "run"
    code = main(_train(out))
    err = capsys.readouterr().err
    assert code == 1, err
    assert "test logits are non-finite" in err
    assert json.loads((out / "metrics.json").read_text())["status"] == "diverged"


def _tune(out: Path, lrs: str) -> list[str]:
    return [
        "tune", "--dataset", "digits", "--model", "mlp", "--method", "ce", "--epochs", "1",
        "--lrs", lrs, "--out", str(out), "--no-progress",
    ]  # fmt: skip


@pytest.mark.slow
def test_tune_records_a_diverged_point_and_chooses_among_the_others(tmp_path):
    out = tmp_path / "t"
    assert main(_tune(out, "1e-3,1e30")) == 0
    summary = json.loads((out / "tune.json").read_text())
    status = {row["lr"]: row["status"] for row in summary["table"]}
    assert status[1e30] == "diverged" and summary["best"] == {"lr": 1e-3}


@pytest.mark.slow
def test_tune_extension_stops_at_the_learning_rate_floor(tmp_path):
    """1e3 diverges, the choice 1e-3 is at the low edge; the next value (1e-9) is below
    the floor: the search stops there, records why, and keeps both trained points."""
    out = tmp_path / "t"
    assert main(_tune(out, "1e-3,1e3")) == 0
    summary = json.loads((out / "tune.json").read_text())
    assert summary["best"] == {"lr": 1e-3} and not summary["at_edge"]
    assert summary["edges"] == summary["bounds"] == ["lr >= 1e-8 floor"]
    assert len(summary["table"]) == 2


# --------------------------------------------------------------------------- items 7, 8, 15


def _images(folder: Path, counts: dict[str, int]) -> None:
    from PIL import Image

    for k, (cls, n) in enumerate(sorted(counts.items())):
        (folder / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new("RGB", (8, 8), (40 * k + i, 10, 10)).save(folder / cls / f"{i}.png")


def test_folder_dataset_refuses_link_loops_and_links_leaving_it(tmp_path):
    from cogcal.data import load_dataset

    root = tmp_path / "imgs"
    _images(root, {"a": 12, "b": 12})
    assert len(load_dataset(f"folder:{root}").train.y) > 0
    (root / "a" / "up").symlink_to("..")  # a loop: every image again, b's labelled a
    with pytest.raises(ValueError, match=r"a/up is a link to .*a folder it sits in \(a loop"):
        load_dataset(f"folder:{root}")
    (root / "a" / "up").unlink()
    elsewhere = tmp_path / "elsewhere"
    _images(elsewhere, {"c": 3})
    (root / "b" / "more").symlink_to(elsewhere / "c")
    with pytest.raises(ValueError, match=r"b/more is a link to .*outside the dataset folder"):
        load_dataset(f"folder:{root}")
    (root / "b" / "more").unlink()
    (root / "b" / "twice").symlink_to(root / "a")  # inside, but the same images twice
    with pytest.raises(ValueError, match="are the same image file"):
        load_dataset(f"folder:{root}")
    (root / "b" / "twice").unlink()
    (tmp_path / "linked").symlink_to(root)  # linking the whole dataset folder is fine
    assert len(load_dataset(f"folder:{tmp_path / 'linked'}").train.y) > 0


def _csv(path: Path, labels: list[str], x: list[str] | None = None) -> Path:
    x = x or [str(i % 7) for i in range(len(labels))]
    path.write_text("x,label\n" + "".join(f"{a},{b}\n" for a, b in zip(x, labels, strict=True)))
    return path


def test_csv_labels_beyond_int64_are_an_error(tmp_path, capsys):
    from cogcal.data import load_dataset

    labels = ["0", "1"] * 10 + [str(10**30)] * 5
    path = _csv(tmp_path / "d.csv", labels)
    with pytest.raises(ValueError, match=r"label '1000000000000000000000000000000' \(line 22\)"):
        load_dataset(f"csv:{path}", target="label")
    assert main(_train(tmp_path / "r", "--dataset", f"csv:{path}", "--target", "label")) == 2
    assert "beyond the range" in capsys.readouterr().err
    big = _csv(tmp_path / "f.csv", ["0.0", "1.0"] * 10 + ["1e30"] * 5)
    with pytest.raises(ValueError, match="beyond the range"):
        load_dataset(f"csv:{big}", target="label")
    near = _csv(tmp_path / "n.csv", ["0", str(2**62)] * 10)  # exact: still two classes
    assert load_dataset(f"csv:{near}", target="label").class_names == ["0", str(2**62)]


def test_a_csv_class_too_small_for_every_split_is_an_error(tmp_path):
    from cogcal.data import load_dataset

    path = _csv(tmp_path / "d.csv", ["a", "b"] * 15 + ["c"])
    with pytest.raises(ValueError, match=r"class\(es\) 'c' \(1 rows; none in"):
        load_dataset(f"csv:{path}", target="label")


def test_csv_values_beyond_float32_are_an_error(tmp_path, capsys):
    from cogcal.data import load_dataset

    path = _csv(tmp_path / "d.csv", ["a", "b"] * 10, ["1"] * 19 + ["1e39"])
    with pytest.raises(
        ValueError, match=r"column 'x' holds '1e39' \(line 21\), beyond the float32"
    ):
        load_dataset(f"csv:{path}", target="label")
    assert main(_train(tmp_path / "r", "--dataset", f"csv:{path}", "--target", "label")) == 2
    err = capsys.readouterr().err
    assert "float32" in err and "JSON" not in err


def test_a_plugin_calling_sys_exit_is_an_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "exiting_plugin.py").write_text("import sys\ndef load():\n    sys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "r"
    assert main(_train(out, "--dataset", "exiting_plugin:load")) == 2
    err = capsys.readouterr().err
    assert "plugin raised SystemExit" in err and err.count("\n") == 1
    assert not out.exists()


# --------------------------------------------------------------------------- item 6


@pytest.mark.slow
def test_normalization_counts_for_registered_datasets(tmp_path, capsys):
    from cogcal.train.config import TrainConfig
    from cogcal.train.identity import same_config

    assert not same_config(
        TrainConfig(dataset="digits"), TrainConfig(dataset="digits", normalization="none")
    )
    out = tmp_path / "run"
    assert main(_train(out, "--checkpoint-seconds", "0", epochs=2)) == 0
    (out / "metrics.json").unlink()  # an unfinished run with checkpoints
    assert main(_train(out, "--resume", "--normalization", "none", epochs=2)) == 2
    assert "normalization: 'auto' -> 'none'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_same_csv_by_relative_and_absolute_path_is_one_dataset(tmp_path, monkeypatch):
    from cogcal.train.config import TrainConfig
    from cogcal.train.identity import same_config

    path = _csv(tmp_path / "d.csv", ["a", "b"] * 20)
    monkeypatch.chdir(tmp_path)
    rel = TrainConfig(dataset="csv:d.csv", target="label")
    assert same_config(rel, rel.replace(dataset=f"csv:{path}"))
    assert not same_config(rel, rel.replace(dataset=f"csv:{tmp_path / 'other.csv'}"))
    out = tmp_path / "run"
    argv = ["--target", "label", "--checkpoint-seconds", "0"]
    assert main(_train(out, "--dataset", "csv:d.csv", *argv, epochs=2)) == 0
    (out / "metrics.json").unlink()
    # recorded with its fingerprint: the same content under another spelling resumes
    assert main(_train(out, "--dataset", f"csv:{path}", "--resume", *argv, epochs=2)) == 0


def test_every_trainconfig_field_is_counted_or_listed_as_display_only():
    """A new TrainConfig field must either change result_fields() when changed, or be
    named here as display-only; otherwise runs that differ would be reused silently."""
    import dataclasses

    from cogcal.train.config import TrainConfig, result_fields

    display_only = {"data_root", "download", "mirror", "out", "progress", "checkpoint_seconds"}
    display_only |= {"extra"}
    for f in dataclasses.fields(TrainConfig):
        counted = f.metadata.get("results", True)
        assert counted != (f.name in display_only), (
            f"TrainConfig.{f.name}: count it in result_fields (metadata results=True) or list "
            "it as display-only here (and in the docs) if it cannot change results"
        )
    # every counted field reaches result_fields for a configuration it applies to
    config = TrainConfig(method="tst", dataset="csv:d.csv", target="y", schedule="step")
    fields = set(result_fields(config.resolved()))
    folder = set(result_fields(TrainConfig(dataset="folder:imgs").resolved()))
    counted = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("results", True)}
    assert counted - fields - folder == set()


# --------------------------------------------------------------------------- item 14


@pytest.mark.parametrize("error", [ValueError("shapes disagree"), KeyError("lr"), SystemExit(0)])
def test_a_bug_is_an_internal_error_not_a_user_error(tmp_path, monkeypatch, capsys, error):
    def buggy(*args, **kwargs):
        raise error

    monkeypatch.setattr(runner, "run", buggy)
    assert main(_train(tmp_path / "r")) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("cogcal: internal error (")
    assert "this is a bug in cogcal" in err and "cogcal: error:" not in err
    with pytest.raises(type(error)):
        main(["--debug", *_train(tmp_path / "r")])


def test_user_errors_exit_2_and_environment_errors_exit_1(tmp_path, capsys):
    assert main(_train(tmp_path / "r", "--lr", "-1")) == 2  # a flag: the user's input
    assert capsys.readouterr().err.startswith("cogcal: error: --lr")
    (tmp_path / "f").write_text("x")
    assert main(_train(tmp_path / "f" / "r")) == 2  # a run folder below a file
    capsys.readouterr()


# --------------------------------------------------------------------------- item 15


_BUDGET = {"lr": 1e-3, "epochs": 1, "schedule": "none", "patience": None}


def _suite(path: Path) -> Path:
    import yaml

    suite = {
        "name": "s",
        "datasets": {"digits": {"model": "mlp"}},
        "methods": ["ce"],
        "seeds": 1,
        "protocols": ["paper"],
        "budget": {"paper": {f: _BUDGET for f in ("baselines", "cog")}},
    }
    path.write_text(yaml.safe_dump(suite))
    return path


def test_an_unwritable_folder_exits_1_with_one_line_for_train_tune_and_bench(
    tmp_path, monkeypatch, capsys
):
    suite = _suite(tmp_path / "s.yaml")
    real = os.open

    def denied(path, *args, **kwargs):  # what a read-only folder does (tests may run as root)
        if str(path).endswith(".cogcal.lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    ro = tmp_path / "ro"
    ro.mkdir()
    for argv in (
        _train(ro),
        ["tune", "--dataset", "digits", "--method", "ce", "--out", str(ro), "--no-progress"],
        ["bench", "--suite", str(suite), "--out", str(ro), "--quiet", "--jobs", "1"],
    ):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Permission denied" in err, err
        assert "check the permissions" in err and ".cogcal-tmp" not in err
    assert list(ro.iterdir()) == []


def test_the_report_never_names_a_temporary_file(tmp_path, monkeypatch):
    from cogcal import _io

    real = os.open

    def denied(path, *args, **kwargs):  # the temporary file cannot be created
        if os.path.basename(str(path)).startswith(".report.md."):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(OSError) as exc:
        _io.write_text(tmp_path / "report.md", "x")
    assert exc.value.filename == str(tmp_path / "report.md")
    assert list(tmp_path.iterdir()) == []


def test_resume_hint_only_when_something_was_started(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    assert main(_train(tmp_path / "never")) == 130
    assert capsys.readouterr().err.strip() == "cogcal: interrupted (SIGINT)"
    started = tmp_path / "started"
    RunDir(started).path.mkdir()
    from cogcal.train.config import TrainConfig

    RunDir(started).write_config(TrainConfig().resolved())
    assert main(_train(started)) == 130
    assert "resume with --resume" in capsys.readouterr().err


# --------------------------------------------------------------------------- item 13


def test_vector_scaling_on_logits_of_another_width_names_logits():
    from cogcal.calibrators import MatrixScaling, VectorScaling

    for cal in (VectorScaling(3), MatrixScaling(3)):
        for width in (1, 5):
            with pytest.raises(ValueError, match=f"`logits` has {width} columns .* for 3 classes"):
                cal(torch.zeros(4, width))


def _net(outputs: int = 3) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, outputs))


def _data(n: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=g), torch.arange(n) % 3


@pytest.mark.parametrize(
    ("x", "match"),
    [
        (torch.randint(0, 5, (60, 4)), r"`model` cannot take the inputs of `train_data\[0\]`.*"
         r"dtype torch.int64.*x.float\(\)"),
        (torch.randn(60), r"`model` cannot take .*reshape a single feature to \(N, 1\)"),
        (torch.randn(60, 4).index_fill_(0, torch.tensor([7]), float("nan")),
         r"`train_data\[0\]` holds non-finite inputs .*sample 7"),
    ],
)  # fmt: skip
def test_fit_refuses_inputs_the_model_cannot_take_naming_the_argument(tmp_path, x, match):
    import cogcal

    y = torch.arange(60) % 3
    with pytest.raises(ValueError, match=match):
        cogcal.fit(_net(), (x, y), epochs=1, progress=False, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_fit_refuses_a_model_with_more_outputs_than_classes(tmp_path):
    import cogcal

    with pytest.raises(ValueError, match=r"`model` has 5 outputs but .* classes 0..2"):
        cogcal.fit(_net(5), _data(), epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"`model` gives outputs of shape \(2, 5\).* 3 classes"):
        cogcal.fit(_net(5), _data(), epochs=1, progress=False, num_classes=3)
    result = cogcal.fit(_net(5), _data(), epochs=1, progress=False, num_classes=5)  # explicit
    assert result.model(torch.zeros(1, 4)).shape == (1, 5)


@pytest.mark.slow
def test_load_run_names_what_is_wrong(tmp_path):
    import pickle

    import cogcal
    from cogcal import load_run

    out = tmp_path / "run"
    assert main(_train(out, "--method", "ts")) == 0
    torch.save({"x": Path("p")}, out / "calibrator.pt")  # not weights only
    with pytest.raises(ValueError, match=r"calibrator.pt holds more than tensors") as exc:
        load_run(out)
    assert not isinstance(exc.value, pickle.UnpicklingError)
    (out / "config.json").unlink()
    with pytest.raises(ValueError, match="has a metrics.json but no config.json"):
        load_run(out)
    assert cogcal  # the public API imports


# --------------------------------------------------------------------------- items 1, 5 (bench, report)


@pytest.mark.slow
def test_the_bench_retrains_beside_a_users_file_on_every_rerun(tmp_path):
    """Item 5: an unfinished run folder holding the user's notes.txt is cleared of
    cogcal's files and trained again (not refused after the clearing), every time."""
    from cogcal.commands.bench import run_bench

    suite, out = _suite(tmp_path / "s.yaml"), tmp_path / "o"
    common = dict(out=out, jobs=1, data_root=tmp_path / "d", progress=False, report=False)
    assert run_bench(suite, **common).failed == 0
    run = RunDir(out / "runs/paper/digits/ce/seed0")
    for _ in range(2):
        run.metrics_path.unlink()
        (run.path / "notes.txt").write_text("mine")
        summary = run_bench(suite, **common)
        assert summary.failed == 0 and summary.counts["trained"] == 1
        assert run.is_complete() and (run.path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_report_takes_the_lock_before_reading(tmp_path, capsys, lock_holder):
    from cogcal.train.config import TrainConfig

    out = tmp_path / "run"
    RunDir(out).path.mkdir()
    RunDir(out).write_config(TrainConfig().resolved())
    holder = lock_holder(out)
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"in use by process {holder.pid}" in err and err.count("\n") == 1
    holder.kill()
    holder.wait()
    assert sorted(p.name for p in out.iterdir()) == [".cogcal.lock", "config.json"]
