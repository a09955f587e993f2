"""The run-folder contract: one rule for "same configuration", nothing foreign deleted, locks."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from cogcal.runs import RunDir, RunFolderError, RunRecord, config_diff
from cogcal.runs import result_fields as runs_result_fields
from cogcal.runs.identity import RECORD_KEYS, UNBOUND_SETTINGS
from cogcal.runs.methods import list_methods
from cogcal.train.config import TrainConfig, result_fields
from cogcal.train.identity import same_config

# A value different from the default for every field (what "every field" means below).
OTHER = {
    "dataset": "digits",
    "model": "cnn1d",
    "method": "cog-ms",
    "seed": 3,
    "preset": "paper",
    "epochs": 7,
    "stage2_epochs": 9,
    "batch_size": 64,
    "lr": 3e-3,
    "calibrator_lr": 3e-5,
    "selection": "full",
    "allow_fast_calibrator": True,
    "schedule": "none",
    "step_size": 4,
    "patience": 5,
    "target": "y",
    "image_size": 28,
    "normalization": "none",
    "augment": "flip",
    "accelerator": "auto",
    "devices": 2,
    "num_nodes": 2,
    "strategy": "ddp",
    "precision": "bf16-mixed",
    "channels_last": True,
    "compile": True,
    "data_root": "elsewhere",
    "download": True,
    "mirror": "http://127.0.0.1:1/",
    "out": "other/out",
    "progress": False,
    "checkpoint_seconds": 0.0,
    "extra": {"note": "x"},
}
#: Fields that never change results, and fields a method or dataset does not use.
NO_EFFECT = {"data_root", "download", "mirror", "out", "progress", "checkpoint_seconds", "extra"}


def test_every_field_is_covered_by_this_test():
    assert set(OTHER) == {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.mark.parametrize("name", sorted(OTHER))
def test_same_config_compares_every_field_that_can_change_results(name):
    base = {"method": "tst", "dataset": "mnist1d"}
    if name == "target":
        base, change = {"dataset": "csv:d.csv", "target": "label"}, {"target": "y"}
    elif name == "image_size":
        base, change = {"dataset": "folder:imgs"}, {"image_size": 28}
    elif name == "normalization":
        base, change = {"dataset": "folder:imgs"}, {"normalization": "none"}
    elif name in ("calibrator_lr", "allow_fast_calibrator"):
        base, change = {"method": "cog-ms", "lr": 1e-3}, {name: OTHER[name]}
    elif name == "step_size":
        base, change = {"method": "cog-fc"}, {"step_size": 4}
    elif name == "stage2_epochs":
        base, change = {"method": "tst"}, {"stage2_epochs": 9}
    elif name in ("devices", "num_nodes"):
        change = {name: 2, "batch_size": 256}
    elif name == "precision":
        change = {"precision": "bf16-mixed"}
    elif name == "schedule":
        change = {"schedule": "none"}  # the automatic preset's is "step"
    else:
        change = {name: OTHER[name]}
    a = TrainConfig(**base)
    b = TrainConfig(**{**base, **change})
    assert same_config(a, b) == (name in NO_EFFECT), config_diff(a.resolved(), b.resolved())


def test_a_field_left_to_its_default_is_compared_too():
    recorded = TrainConfig(method="ce", preset="paper", batch_size=32).resolved()
    planned = {"method": "ce", "preset": "paper"}  # batch_size dropped: back to 256
    assert not same_config(recorded, planned)
    assert config_diff(recorded, TrainConfig(**planned).resolved()) == ["batch_size: 32 -> 256"]
    paper = {"method": "ce", "preset": "paper", "lr": 1e-4, "schedule": "none"}
    assert same_config(TrainConfig(method="ce", preset="paper"), paper)
    # the automatic preset leaves the budget to the data: unset until the run sees it
    assert TrainConfig(method="ce").resolved()["batch_size"] is None


def test_fields_a_method_does_not_use_do_not_make_runs_differ():
    assert same_config(TrainConfig(method="ce", stage2_epochs=3), TrainConfig(method="ce"))
    no_schedule = {"method": "ce", "schedule": "none"}
    assert same_config(TrainConfig(**no_schedule, step_size=3), TrainConfig(**no_schedule))
    assert not same_config(
        TrainConfig(method="ce", schedule="step", step_size=3),
        TrainConfig(method="ce", schedule="step"),
    )
    assert "stage2_epochs" not in result_fields(TrainConfig(method="ce").resolved())
    # how the learning rates are chosen matters only when they are chosen: a point of a
    # selection (lr given) is the same run whichever way the points were compared
    given = {"method": "cog-fc", "lr": 1e-3}
    assert same_config(TrainConfig(**given, selection="full"), TrainConfig(**given))
    assert not same_config(TrainConfig(selection="full"), TrainConfig())


def _finished(folder: RunDir, config: TrainConfig) -> None:
    folder.path.mkdir(parents=True, exist_ok=True)
    folder.write_config(config.resolved())
    folder.write_record(RunRecord(config=config.resolved(), val={"nll": 0.5}, test={"nll": 0.6}))


def test_finished_with_uses_the_recorded_configuration(tmp_path):
    folder = RunDir(tmp_path / "run")
    _finished(folder, TrainConfig(method="ce", epochs=2))
    assert folder.finished_with(TrainConfig(method="ce", epochs=2, out="x"))
    assert not folder.finished_with(TrainConfig(method="ce", epochs=3))
    assert not folder.finished_with(TrainConfig(method="ls", epochs=2))


def test_selection_nll_is_before_calibration_for_post_hoc_methods():
    ts = TrainConfig(method="ts").resolved()
    record = RunRecord(config=ts, val={"nll": 0.2}, test={}, val_uncalibrated={"nll": 0.9})
    assert record.selection_nll == 0.9
    ce = TrainConfig(method="ce").resolved()
    assert RunRecord(config=ce, val={"nll": 0.2}, test={}).selection_nll == 0.2
    assert RunRecord(config=ce, val={"nll": None}, test={}).selection_nll == float("inf")


def test_clear_deletes_only_what_cogcal_wrote(tmp_path):
    folder = RunDir(tmp_path / "run")
    _finished(folder, TrainConfig())
    (folder.checkpoints).mkdir()
    (folder.checkpoints / "last.ckpt").write_bytes(b"x")
    (folder.checkpoints / "notes.txt").write_text("mine")
    (folder.logs).mkdir()
    (folder.logs / "stage1.csv").write_text("epoch\n")
    (folder.path / "mine.txt").write_text("mine")
    folder.clear()
    left = sorted(str(p.relative_to(folder.path)) for p in folder.path.rglob("*"))
    assert left == ["checkpoints", "checkpoints/notes.txt", "mine.txt"]


def test_clear_refuses_foreign_folders_and_links(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data.txt").write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(precious)
    with pytest.raises(RunFolderError, match="symbolic link"):
        RunDir(link).clear()
    with pytest.raises(RunFolderError, match="not a cogcal run folder"):
        RunDir(precious).clear()
    assert (precious / "data.txt").read_text() == "keep"
    folder = RunDir(tmp_path / "run")
    _finished(folder, TrainConfig())
    (folder.path / "checkpoints").symlink_to(precious)
    with pytest.raises(RunFolderError, match="checkpoints is a symbolic link"):
        folder.clear()
    assert (precious / "data.txt").read_text() == "keep"


def test_prepare_rules(tmp_path):
    cfg = TrainConfig(method="ce", out=str(tmp_path / "run"))
    folder = RunDir(cfg.out)
    with pytest.raises(RunFolderError, match="no run to resume"):
        folder.prepare(cfg, cfg.resolved(), resume=True, overwrite=False)
    assert folder.prepare(cfg, cfg.resolved(), resume=False, overwrite=False) is False
    _finished(folder, TrainConfig(method="ce"))
    with pytest.raises(RunFolderError, match="already holds a finished run") as exc:
        folder.prepare(cfg, cfg.resolved(), resume=False, overwrite=False)
    assert "--overwrite" in exc.value.cli_message and "overwrite=True" in str(exc.value)
    (tmp_path / "file").write_text("x")
    bad = TrainConfig(out=str(tmp_path / "file"))
    with pytest.raises(RunFolderError, match="is an existing file"):
        RunDir(bad.out).prepare(bad, bad.resolved(), resume=False, overwrite=False)
    below = TrainConfig(out=str(tmp_path / "file" / "run"))
    with pytest.raises(RunFolderError, match="lies below .*which is a file"):
        RunDir(below.out).prepare(below, below.resolved(), resume=False, overwrite=False)
    corrupt = RunDir(tmp_path / "corrupt")
    corrupt.path.mkdir()
    corrupt.config_path.write_text("{not json")
    with pytest.raises(RunFolderError, match=r"corrupt/config.json is not valid JSON"):
        corrupt.read_config()
    cfg = TrainConfig(out=str(corrupt.path))
    with pytest.raises(RunFolderError, match=r"corrupt/config.json is not valid JSON"):
        corrupt.prepare(cfg, cfg.resolved(), resume=True, overwrite=False)


def test_resuming_a_run_stopped_before_its_first_checkpoint_starts_it_over(tmp_path):
    cfg = TrainConfig(method="ce", epochs=30, out=str(tmp_path / "run"))
    folder = RunDir(cfg.out)
    folder.path.mkdir()
    folder.write_config(cfg.resolved())  # what a run writes before its first epoch
    (folder.logs).mkdir()
    (folder.logs / "stage1.csv").write_text("epoch\n")
    other = cfg.replace(epochs=3)
    with pytest.raises(RunFolderError, match="started with other settings .*epochs: 30 -> 3"):
        folder.prepare(other, other.resolved(), resume=True, overwrite=False)
    assert folder.config_path.is_file()  # refused: nothing touched
    assert folder.prepare(cfg, cfg.resolved(), resume=True, overwrite=False) is False
    assert not folder.config_path.exists() and not (folder.logs / "stage1.csv").exists()


@pytest.mark.slow
def test_lock_names_the_holder_and_recovers_from_a_killed_one(tmp_path, lock_holder):
    folder = RunDir(tmp_path / "run")
    holder = lock_holder(folder.path)
    with pytest.raises(ValueError, match=f"in use by process {holder.pid}"), folder.lock():
        pass
    holder.kill()  # SIGKILL: its lock file stays behind
    holder.wait()
    assert (folder.path / ".cogcal.lock").exists()
    with folder.lock():  # the holder is gone: its lock is stale and taken over
        assert (folder.path / ".cogcal.lock").read_text().strip() == str(os.getpid())
    assert not (folder.path / ".cogcal.lock").exists()


@pytest.mark.parametrize("content", ["1", "garbage \x00", "", str(2**40)])
def test_a_lock_file_of_no_live_holder_never_blocks(tmp_path, content):
    """A reused PID (1 is always alive), garbage or an empty lock file: not a holder."""
    cfg = TrainConfig(method="ce", out=str(tmp_path / "run"))
    folder = RunDir(cfg.out)
    folder.path.mkdir()
    (folder.path / ".cogcal.lock").write_text(content)
    with folder.lock():  # a folder holding only a stale lock counts as empty
        assert folder.prepare(cfg, cfg.resolved(), resume=False, overwrite=False) is False
    assert list(folder.path.iterdir()) == []


def test_a_refused_lock_creates_nothing_and_a_refusal_leaves_no_folder(tmp_path):
    folder = RunDir(tmp_path / "new" / "deeper" / "run")
    with pytest.raises(RunFolderError), folder.lock():
        raise RunFolderError("refused")
    assert list(tmp_path.iterdir()) == []  # created for the lock, removed again: empty


def test_only_this_versions_mark_makes_a_folder_cogcals(tmp_path):
    """A config.json with method/dataset/seed keys (issue: 'earlier cogcal version') is
    the user's: nothing in the folder is deleted or replaced, even with overwrite."""
    cfg = TrainConfig(method="ce", out=str(tmp_path / "run"))
    folder = RunDir(cfg.out)
    folder.path.mkdir()
    mine = {"method": "ce", "dataset": "digits", "seed": 0}
    folder.config_path.write_text(json.dumps(mine))
    for name in ("report.md", "run.log", "metrics.json"):
        (folder.path / name).write_text("mine")
    assert not folder.is_marked()
    for resume, overwrite in ((False, False), (False, True), (True, False)):
        with pytest.raises(RunFolderError, match="not a cogcal run folder"):
            folder.prepare(cfg, cfg.resolved(), resume=resume, overwrite=overwrite)
    with pytest.raises(RunFolderError, match="not a cogcal run folder"):
        folder.clear()
    assert json.loads(folder.config_path.read_text()) == mine
    assert all((folder.path / n).read_text() == "mine" for n in ("report.md", "metrics.json"))
    folder.config_path.write_text(json.dumps({**cfg.resolved(), "cogcal_run": 1}))
    assert not folder.is_marked()  # another format is not this version's mark


def test_overwrite_deletes_no_user_file_that_looks_temporary(tmp_path):
    cfg = TrainConfig(method="ce", out=str(tmp_path / "run"))
    folder = RunDir(cfg.out)
    _finished(folder, cfg)
    folder.checkpoints.mkdir()
    folder.logs.mkdir()
    users = [
        folder.path / ".notes.tmp",
        folder.path / ".metrics.json.x.tmp",
        folder.logs / ".draft.tmp",
        folder.checkpoints / ".a.tmp",
        folder.path / ".mine.abc.cogcal-tmp",  # cogcal's pattern, but not one of its files
    ]
    for path in users:
        path.write_text("mine")
    ours = [
        folder.path / ".metrics.json.k2_x9.cogcal-tmp",
        folder.logs / ".stage1.csv.q.cogcal-tmp",
    ]
    for path in ours:
        path.write_text("half-written")
    assert folder.prepare(cfg, cfg.resolved(), resume=False, overwrite=True) is False
    assert all(p.read_text() == "mine" for p in users)
    assert not any(p.exists() for p in ours)


def test_atomic_writes_use_cogcals_temporary_pattern(tmp_path, monkeypatch):
    from cogcal import _io

    seen = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (seen.append(a), real(a, b))[1])
    _io.write_text(tmp_path / "metrics.json", "{}")
    assert _io.temp_target(os.path.basename(seen[0])) == "metrics.json"


def test_the_bench_checks_a_folder_can_be_rewritten_before_deleting(tmp_path):
    """Item 5: clearing keeps the mark when asked, so that a run can be written again
    beside the user's files; a folder that cannot be cleared loses nothing."""
    cfg = TrainConfig(method="ce", out=str(tmp_path / "run"))
    folder = RunDir(cfg.out)
    _finished(folder, cfg)
    (folder.path / "notes.txt").write_text("mine")
    folder.clear(keep_config=True)
    assert folder.is_marked() and not folder.metrics_path.exists()
    assert folder.prepare(cfg, cfg.resolved(), resume=False, overwrite=False) is False
    assert (folder.path / "notes.txt").read_text() == "mine"
    _finished(folder, cfg)
    (folder.path / "logs").symlink_to(tmp_path)
    with pytest.raises(RunFolderError, match="logs is a symbolic link"):
        folder.clear()
    assert folder.metrics_path.exists() and folder.config_path.exists()  # nothing deleted


def test_record_round_trip_and_non_finite_values(tmp_path):
    folder = RunDir(tmp_path / "run")
    cfg = TrainConfig().resolved()
    folder.write_record(
        RunRecord(config=cfg, val={"nll": float("inf")}, test={"nll": 0.1}, timing={"s": 1.0})
    )
    data = json.loads(folder.metrics_path.read_text())
    assert data["val"]["nll"] is None  # valid JSON: non-finite values are null
    record = folder.read_record()
    assert record is not None and record.test == {"nll": 0.1}


# --------------------------------------------------------------------------- identity


def test_the_run_contract_knows_the_settings_that_never_change_results():
    """cogcal.runs states which settings say where a run lies or how it is shown, and what a
    run records besides its settings; TrainConfig's fields must agree with it."""
    unbound = {f.name for f in dataclasses.fields(TrainConfig) if not f.metadata["results"]}
    assert unbound == set(UNBOUND_SETTINGS)
    assert not RECORD_KEYS & {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.mark.parametrize("method", list_methods())
def test_the_run_contract_and_train_agree_on_the_fields_that_change_results(method):
    for extra in ({}, {"schedule": "step", "step_size": 3}, {"lr": 1e-3}, {"preset": "paper"},
                  {"dataset": "csv:x.csv", "target": "y"}, {"dataset": "folder:imgs"}):  # fmt: skip
        resolved = TrainConfig(method=method, **extra).resolved()
        assert runs_result_fields(resolved) == result_fields(resolved)
        recorded = {"cogcal_run": 2, **resolved, "task": "multiclass", "class_names": ["a"]}
        assert runs_result_fields(recorded) == result_fields(recorded)
