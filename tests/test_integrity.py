"""A run's record and its files are bound together (issue 34 items 2-4, issue 33 item 4).

``metrics.json`` holds the digest of the run's configuration and the sha256 of each
checkpoint and of ``calibrator.pt``; every checkpoint holds the configuration digest.
A ``config.json`` edited after the run, a checkpoint or calibrator copied from another
run, a damaged value: one line naming the file (and the field), exit 2; the bench trains
an edited run again instead of reusing it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import cogcal
from cogcal.cli import main
from cogcal.runs import RunDir, config_digest
from cogcal.runs.identity import RECORD_KEYS
from cogcal.train.config import TrainConfig


def _argv(out: Path, data: Path, *extra: str, seed: int = 0) -> list[str]:
    return [
        "train", "--dataset", "digits", "--model", "mlp", "--method", "ts", "--lr", "1e-2",
        "--epochs", "1", "--seed", str(seed), "--data-root", str(data), "--out", str(out),
        "--no-progress", "--checkpoint-seconds", "0", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished ``ts`` runs of the same architecture (seeds 0 and 1)."""
    root = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        assert main(_argv(root / f"seed{seed}", root / "data", seed=seed)) == 0
    return root


@pytest.fixture
def run(runs, tmp_path):
    """A fresh copy of the seed-0 run (tests edit it)."""
    out = tmp_path / "run"
    shutil.copytree(runs / "seed0", out)
    return out


def _predict(run: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((3, 1, 8, 8), np.uint8))
    capsys.readouterr()
    code = main(["predict", str(run), "--input", str(x)])
    return code, capsys.readouterr().err


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


@pytest.mark.slow
def test_the_record_holds_the_hashes_of_the_configuration_and_the_files(runs):
    out = runs / "seed0"
    record = json.loads((out / "metrics.json").read_text())
    integrity = record["integrity"]
    assert integrity["config"] == config_digest(json.loads((out / "config.json").read_text()))
    assert sorted(integrity["files"]) == [
        "calibrator.pt", "checkpoints/best.ckpt", "checkpoints/last.ckpt",
    ]  # fmt: skip
    import hashlib

    for name, digest in integrity["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    ckpt = torch.load(out / "checkpoints" / "best.ckpt", weights_only=True)
    assert ckpt["config_sha256"] == integrity["config"]
    # a moved or copied run keeps its digest; any field that changes results does not
    saved = json.loads((out / "config.json").read_text())
    assert config_digest({**saved, "out": "elsewhere", "progress": True}) == integrity["config"]
    assert config_digest({**saved, "seed": 1}) != integrity["config"]
    # what the run recorded besides its settings is what the run contract names as such
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(saved) - fields - {"cogcal_run", "cogcal_version"} == set(RECORD_KEYS)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["best.ckpt", "last.ckpt"])
def test_a_checkpoint_copied_from_another_run_is_refused(runs, run, tmp_path, capsys, name):
    shutil.copyfile(runs / "seed1" / "checkpoints" / name, run / "checkpoints" / name)
    which = name.removesuffix(".ckpt")
    with pytest.raises(ValueError, match=rf"{name} is not the file the run wrote"):
        cogcal.load_run(run, which=which)
    if which == "best":
        code, err = _predict(run, tmp_path, capsys)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert f"checkpoints/{name} is not the file the run wrote" in err


@pytest.mark.slow
def test_a_calibrator_copied_from_another_run_is_refused(runs, run, tmp_path, capsys):
    shutil.copyfile(runs / "seed1" / "calibrator.pt", run / "calibrator.pt")
    code, err = _predict(run, tmp_path, capsys)
    assert code == 2 and err.count("\n") == 1
    assert "calibrator.pt is not the file the run wrote" in err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda c: c.update(class_names=["no", "yes", *c["class_names"][2:]]), "class_names"),
        (lambda c: c.update(lr=0.5), "lr: 0.01 -> 0.5"),
        (lambda c: c.update(epochs="two"), "epochs: 1 -> 'two'"),
        (lambda c: c["input"].update(mean=["a"]), "input.mean"),
        (lambda c: c["input"].update(std=[0.0]), "input.std"),
    ],
)
def test_an_edited_config_json_is_refused_naming_the_file_and_field(
    run, tmp_path, capsys, change, named
):
    _edit(run / "config.json", change)
    code, err = _predict(run, tmp_path, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert f"{run / 'config.json'} differs from the run's record metrics.json" in err
    assert named in err
    with pytest.raises(ValueError, match="edited after the run"):
        cogcal.load_run(run)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda c: c.update(epochs="two"), "`epochs` must be an integer >= 1, got 'two'"),
        (lambda c: c["input"].update(mean=[4.9, "a"]), "'input.mean' must be a list of finite"),
        (lambda c: c["input"].update(std=[0.0]), "'input.std' must be positive"),
        (lambda c: c.update(class_names=["a", "b"]), "'class_names' holds 2 names for 10"),
    ],
)
def test_a_damaged_value_in_a_consistent_record_names_the_field(
    run, tmp_path, capsys, change, named
):
    """Both files edited alike and the record's digest forged: the values are still
    checked before they are used (one line, exit 2, never an internal error)."""
    _edit(run / "config.json", change)
    saved = json.loads((run / "config.json").read_text())

    def forge(record):
        change(record["config"])
        record["integrity"]["config"] = config_digest(saved)

    _edit(run / "metrics.json", forge)
    code, err = _predict(run, tmp_path, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert str(run / "config.json") in err and named in err
    assert "internal error" not in err


@pytest.mark.slow
def test_an_edit_of_both_records_is_refused_by_the_digest(run):
    for name in ("config.json", "metrics.json"):
        _edit(run / name, lambda c: (c.get("config", c)).update(lr=0.5))
    with pytest.raises(ValueError, match="no longer hash to the configuration"):
        cogcal.load_run(run)


@pytest.mark.slow
def test_a_record_without_integrity_is_not_trusted(run):
    _edit(run / "metrics.json", lambda r: r.pop("integrity"))
    with pytest.raises(ValueError, match="carries no integrity record"):
        cogcal.load_run(run)
    config = cogcal.train.TrainConfig.from_record(json.loads((run / "config.json").read_text()))
    assert not RunDir(run).finished_with(config)


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_another_run(runs, run, capsys):
    (run / "metrics.json").unlink()
    (run / "checkpoints" / "done.json").unlink()
    other = runs / "seed1" / "checkpoints" / "last.ckpt"
    shutil.copyfile(other, run / "checkpoints" / "last.ckpt")
    capsys.readouterr()
    assert main([*_argv(run, runs / "data"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "last.ckpt was not trained with the configuration in" in err and "--overwrite" in err
    # its own checkpoint resumes (the finished stage: evaluated again, same numbers)
    shutil.copyfile(runs / "seed0" / "checkpoints" / "last.ckpt", run / "checkpoints" / "last.ckpt")
    shutil.copyfile(runs / "seed0" / "checkpoints" / "done.json", run / "checkpoints" / "done.json")
    assert main([*_argv(run, runs / "data"), "--resume"]) == 0
    got = json.loads((run / "metrics.json").read_text())["test"]
    assert got == json.loads((runs / "seed0" / "metrics.json").read_text())["test"]


def _suite(path: Path) -> Path:
    budget = {"lr": 1e-3, "epochs": 1, "schedule": "none", "patience": None}
    suite = {
        "name": "s",
        "datasets": {"digits": {"model": "mlp"}},
        "methods": ["ce"],
        "seeds": 1,
        "protocols": ["paper"],
        "budget": {"paper": {f: budget for f in ("baselines", "cog")}},
    }
    path.write_text(yaml.safe_dump(suite))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("edited", ["config.json", "metrics.json"])
def test_the_bench_trains_an_edited_run_again(tmp_path, edited):
    """Issue 33 item 4: a bench run whose record was edited (lr 0.5) is never reused."""
    from cogcal.commands.bench import run_bench

    suite, out = _suite(tmp_path / "s.yaml"), tmp_path / "o"
    common = dict(out=out, jobs=1, data_root=tmp_path / "d", progress=False, report=False)
    assert run_bench(suite, **common).failed == 0
    run = RunDir(out / "runs/paper/digits/ce/seed0")
    planned = run.read_config()
    assert run_bench(suite, **common).counts["skipped"] == 1  # intact: reused
    _edit(run.path / edited, lambda c: (c.get("config", c)).update(lr=0.5))
    summary = run_bench(suite, **common)
    assert summary.failed == 0 and summary.counts["trained"] == 1
    assert run.read_config()["lr"] == planned["lr"] == 1e-3
    assert cogcal.load_run(run.path).config.lr == 1e-3


# --------------------------------------------------------------------------- issue 34 item 3


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


@pytest.fixture(scope="module")
def selected(tmp_path_factory):
    """A finished run of the default path (learning rate chosen: a copy of the chosen
    point of ``<out>.select``)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    root = tmp_path_factory.mktemp("selected")
    cogcal.fit(_net(), (x, y), method="ce", epochs=1, out=root / "run", progress=False)
    return root, (x, y)


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_resume_names_a_damaged_copy_of_the_chosen_run_then_copies_it_again(
    selected, tmp_path, capsys, damage
):
    root, data = selected
    shutil.copytree(root / "run", tmp_path / "run")
    shutil.copytree(root / "run.select", tmp_path / "run.select")
    out = tmp_path / "run"
    before = json.loads((out / "metrics.json").read_text())
    (out / "metrics.json").unlink()  # interrupted while the chosen run was copied
    last = out / "checkpoints" / "last.ckpt"
    content = last.read_bytes()
    last.unlink()  # a file of its own (the copy was a hard link to the point's)
    last.write_bytes(b"" if damage == "empty" else content[: len(content) // 2])
    capsys.readouterr()
    cogcal.fit(_net(), data, method="ce", epochs=1, out=out, progress=False, resume=True)
    err = [ln for ln in capsys.readouterr().err.splitlines() if str(last) in ln]
    what = "is empty (0 bytes)" if damage == "empty" else "is truncated or corrupt"
    assert len(err) == 1 and f"{last} {what}" in err[0] and "copied again" in err[0]
    after = json.loads((out / "metrics.json").read_text())
    assert after["test"] == before["test"]
    assert (out / "checkpoints" / "last.ckpt").read_bytes() == content
    cogcal.load_run(out, model=_net())  # whole again, and its record checks
