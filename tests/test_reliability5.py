"""Reliability round 5 (issue 40, items 2, 3, 6, 7, 8): calibration folders bound to their
contents, damaged values named, signals honoured from the first moment, scores read by
name, partial benches that say so."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import cogcal
from cogcal._errors import QUIET_EXIT, Interrupted
from cogcal.bench.results import run_rows
from cogcal.cli import main
from cogcal.commands.calibrate import calibrate_files
from cogcal.report.overview import unfinished_notice
from cogcal.runs.bench import NOT_STARTED
from cogcal.train import devices

SRC = Path(__file__).resolve().parents[1] / "src"


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _write_scores(path: Path, n: int, seed: int, k: int = 3) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    np.savez(path, logits=3 * np.eye(k)[y] + rng.normal(size=(n, k)), labels=y)


@pytest.fixture(scope="module")
def calibrations(tmp_path_factory) -> Path:
    """Two vector-scaling calibrations of the same K (``a`` with a test split, ``b``)."""
    root = tmp_path_factory.mktemp("cal")
    for name, seed in (("val", 0), ("test", 1), ("other", 2)):
        _write_scores(root / f"{name}.npz", 300, seed)
    calibrate_files(root / "val.npz", root / "test.npz", method="vs", out=root / "a")
    calibrate_files(root / "other.npz", None, method="vs", out=root / "b", report=False)
    return root


def _copy(calibrations: Path, tmp_path: Path) -> Path:
    out = tmp_path / "cal"
    shutil.copytree(calibrations / "a", out)
    (out / "report.md").unlink()
    (out / "report.html").unlink()
    return out


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def _refused(out: Path, capsys, name: str, *words: str) -> None:
    """Both `load_calibrator` and `cogcal report` refuse in one line naming ``name``; no
    report is rendered."""
    with pytest.raises(ValueError, match=name) as exc:
        cogcal.load_calibrator(out)
    assert "\n" not in str(exc.value)
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    line = _err_line(capsys)
    assert line.startswith("cogcal: error: ") and f"{out / name}" in line, line
    assert all(w in line for w in words), line
    assert not (out / "report.md").exists() and not (out / "report.html").exists()


# --------------------------------------------------------------------------- 40.2 integrity


def test_an_intact_calibration_loads_and_reports(calibrations, tmp_path, capsys):
    out = _copy(calibrations, tmp_path)
    meta = json.loads((out / "calibration.json").read_text())
    assert set(meta["integrity"]["files"]) == {"calibrator.pt", "metrics.json", "test_logits.npz"}
    assert cogcal.load_calibrator(out).method == "vs"
    assert main(["report", str(out)]) == 0 and (out / "report.md").is_file()


def _swap(calibrations: Path):
    return lambda out: shutil.copyfile(calibrations / "b" / "calibrator.pt", out / "calibrator.pt")


def _link(calibrations: Path):
    def change(out: Path) -> None:
        (out / "calibration.json").unlink()
        (out / "calibration.json").symlink_to(calibrations / "b" / "calibration.json")

    return change


def _nan(out: Path) -> None:
    state = torch.load(out / "calibrator.pt", weights_only=True)
    state = {k: v * float("nan") for k, v in state.items()}
    torch.save(state, out / "calibrator.pt")


def _truncate(name: str):
    def change(out: Path) -> None:
        data = (out / name).read_bytes()
        (out / name).write_bytes(data[: len(data) // 2])

    return change


@pytest.mark.parametrize(
    ("change", "name", "words"),
    [
        (lambda out: _edit(out / "calibration.json", lambda d: d.update(method="ms")),
         "calibration.json", ("edited",)),
        ("swap", "calibrator.pt", ("copied from another calibration",)),
        ("link", "calibration.json", ("symbolic link",)),
        (_nan, "calibrator.pt", ("non-finite",)),
        (_truncate("calibrator.pt"), "calibrator.pt", ("cannot be loaded",)),
        (_truncate("metrics.json"), "metrics.json", ("cannot be read",)),
        (_truncate("calibration.json"), "calibration.json", ("damaged or truncated",)),
        (_truncate("test_logits.npz"), "test_logits.npz", ("truncated",)),
        (lambda out: _edit(out / "metrics.json", lambda d: d["test"].update(nll=0.001)),
         "metrics.json", ("edited",)),
        (lambda out: _edit(out / "calibration.json", lambda d: d.pop("integrity")),
         "calibration.json", ("older cogcal", "cogcal calibrate again")),
    ],
    ids=["edit", "swap", "link", "nan", "trunc-pt", "trunc-metrics", "trunc-json", "trunc-npz",
         "edit-metrics", "no-digests"],
)  # fmt: skip
def test_an_altered_calibration_is_refused(calibrations, tmp_path, capsys, change, name, words):
    out = _copy(calibrations, tmp_path)
    change = {"swap": _swap(calibrations), "link": _link(calibrations)}.get(change, change)
    change(out)
    _refused(out, capsys, name, *words)
    # the advice works: calibrate again with --overwrite; the user's other files stay
    (out / "notes.txt").write_text("mine")
    root = calibrations
    args = ["calibrate", "--val", str(root / "val.npz"), "--test", str(root / "test.npz"),
            "--method", "vs", "--out", str(out), "--overwrite"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    assert cogcal.load_calibrator(out).method == "vs"
    assert (out / "notes.txt").read_text() == "mine"


# --------------------------------------------------------------------------- 40.3 damaged values


@pytest.mark.parametrize(
    ("name", "change", "key"),
    [
        ("calibration.json", lambda d: d.update(cv_nll=[1, 2]), "cv_nll"),
        ("calibration.json", lambda d: d.update(cv_nll={"ts": "x"}), "cv_nll"),
        ("calibration.json", lambda d: d.update(nll_before="abc"), "nll_before"),
        ("calibration.json", lambda d: d.update(folds="x"), "folds"),
        ("calibration.json", lambda d: d.update(num_classes="3"), "num_classes"),
        ("metrics.json", lambda d: d.pop("test"), "test"),
        ("metrics.json", lambda d: d["test"].update(ece_15="x"), "ece_15"),
        ("metrics.json", lambda d: d.update(test=[1]), "test"),
    ],
)
def test_a_damaged_value_is_named_with_its_file_and_key(calibrations, tmp_path, capsys, name,
                                                        change, key):  # fmt: skip
    out = _copy(calibrations, tmp_path)
    _edit(out / name, change)
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    line = _err_line(capsys)
    assert f"{out / name}" in line and key in line, line
    assert not (out / "report.md").exists()
    if name == "calibration.json":
        with pytest.raises(ValueError, match=key):
            cogcal.load_calibrator(out)


def test_an_empty_calibrator_is_named(calibrations, tmp_path, capsys):
    out = _copy(calibrations, tmp_path)
    (out / "calibrator.pt").write_bytes(b"")
    _refused(out, capsys, "calibrator.pt", "cannot be loaded")


# --------------------------------------------------------------------------- 40.6 signals


def _handles_sigterm(pid: int) -> bool:
    """Whether the process catches SIGTERM (its handler is installed)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("rank", ["0", "1"])
@pytest.mark.parametrize("delay", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_importing_is_one_line_and_its_exit_status(signum, delay, rank):
    """``python -m cogcal`` (the console script's entry, cogcal.__main__:main) handles both
    signals while torch is still being imported: the one line and 128 + n; a process of a
    multi-process run other than rank 0 (``RANK`` set, as Lightning sets it) ends quietly
    with ``QUIET_EXIT + n``, its main process printing the line."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "RANK": rank}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "cogcal", "bench", "--list"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:  # at `delay`, once the handler is in place (Python itself starts first)
        while time.monotonic() - start < 10 and not _handles_sigterm(proc.pid):
            time.sleep(0.01)
        time.sleep(max(0.0, delay - (time.monotonic() - start)))
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if rank == "0":
        assert proc.returncode == 128 + signum, err
        assert err == f"cogcal: interrupted ({signal.Signals(signum).name})\n"
    else:
        assert (proc.returncode, err) == (QUIET_EXIT + signum, "")


def test_the_console_script_is_the_early_entry():
    text = (SRC.parent / "pyproject.toml").read_text()
    assert 'cogcal = "cogcal.__main__:main"' in text
    code = "import sys, cogcal; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)}, check=True)  # fmt: skip
    assert out.stdout.strip() == "False"  # handlers go in before torch is imported
    assert cogcal.calibrate is cogcal.posthoc.calibrate  # the public names still load


# --------------------------------------------------------------------------- 40.7 scores


def _csv(path: Path, names: list[str], z: np.ndarray, labels) -> Path:
    rows = [",".join([*names, "label"])]
    rows += [",".join([*(f"{v:.6f}" for v in r), str(y)]) for r, y in zip(z, labels, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_score_columns_named_by_the_labels_are_matched_by_name(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    z = 2 * np.eye(2)[y] + rng.normal(size=(200, 2))
    plain = _csv(tmp_path / "plain.csv", ["0", "1"], z, y)
    swapped = _csv(tmp_path / "swapped.csv", ["1", "0"], z[:, ::-1], y)
    a = calibrate_files(plain, None, method="ts", out=tmp_path / "a", report=False)
    b = calibrate_files(swapped, None, method="ts", out=tmp_path / "b", report=False)
    assert a["val_before"]["acc"] == b["val_before"]["acc"] > 0.8
    assert a["val"]["nll"] == pytest.approx(b["val"]["nll"])


def test_numbered_columns_that_are_not_the_labels_are_ambiguous(tmp_path, capsys):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 100)
    path = _csv(tmp_path / "s.csv", ["1", "2"], rng.normal(size=(100, 2)), y)
    assert main(["calibrate", "--val", str(path), "--method", "ts", "--out", str(tmp_path / "o")]) == 2  # fmt: skip
    line = _err_line(capsys)
    assert "s.csv" in line and "ambiguous" in line
    assert not (tmp_path / "o").exists()


def test_rounded_probabilities_stored_as_logits_are_refused_and_read_as_probs(tmp_path, capsys):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 200)
    z = 2 * np.eye(3)[y] + rng.normal(size=(200, 3))
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    path = _csv(tmp_path / "p.csv", ["a", "b", "c"], p.round(2), y)
    assert (np.abs(p.round(2).sum(1) - 1) > 1e-3).any()  # rounding: sums off by up to 0.01
    args = ["calibrate", "--val", str(path), "--method", "ts", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    assert "look like probabilities" in _err_line(capsys)
    assert main([*args, "--scores", "probs"]) == 0


def test_a_huge_float_label_is_named_as_written_and_nothing_else(tmp_path, capsys):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 100).astype(float)
    y[7] = 1e20
    np.savez(tmp_path / "v.npz", logits=rng.normal(size=(100, 3)), labels=y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail the command
        code = main(["calibrate", "--val", str(tmp_path / "v.npz"), "--method", "ts",
                     "--out", str(tmp_path / "o")])  # fmt: skip
    assert code == 2
    line = _err_line(capsys)
    assert "row 7: label 1e+20 is outside [0, 2]" in line and "-9223372036854775808" not in line


# --------------------------------------------------------------------------- 40.8 partial bench


class _Job:
    kind, final, status = "seed", False, "queued"


def test_runs_csv_lists_planned_runs_not_started(tmp_path):
    planned = [("paper", "blobs", m, s, tmp_path / "runs" / m / f"seed{s}")
               for m in ("ce", "cog-fc") for s in (0, 1)]  # fmt: skip
    rows = run_rows([_Job()], [], tmp_path, planned)
    assert [(r["method"], r["seed"], r["status"]) for r in rows] == [
        ("ce", 0, NOT_STARTED), ("ce", 1, NOT_STARTED),
        ("cog-fc", 0, NOT_STARTED), ("cog-fc", 1, NOT_STARTED),
    ]  # fmt: skip
    assert rows[0]["run_dir"] == "runs/ce/seed0"


def test_the_notice_of_an_unfinished_bench():
    runs = pd.DataFrame(
        [("blobs", "ce", "paper", 0, "complete"), ("blobs", "ce", "paper", 1, "interrupted"),
         ("blobs", "cog-fc", "paper", 0, NOT_STARTED), ("blobs", "cog-fc", "paper", 1, NOT_STARTED)],
        columns=["dataset", "method", "protocol", "seed", "status"],
    )  # fmt: skip
    meta = {"sessions": [{"interrupted": "SIGTERM", "not_started": 2}]}
    text = " ".join(map(str, unfinished_notice(runs, meta).items))
    assert text.startswith("This bench is unfinished: it was stopped by SIGTERM")
    assert "3 of its 4 planned runs have no result yet" in text
    assert "No results yet: blobs (paper): cog-fc" in text
    assert "Some seeds without results: blobs (paper): ce" in text
    assert "verdict" in text and "only the runs that finished" in text
    done = runs.assign(status="complete")
    assert unfinished_notice(done, {"sessions": [{"interrupted": None}]}) is None


@pytest.mark.slow
def test_a_bench_stopped_part_way_says_so_first(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_bench import _bench_script, _read_csv, _suite, _wait_for, _write_suite

    suite = _write_suite(tmp_path, _suite(methods=["ce", "cog-fc"], protocols=["paper"], seeds=2))
    out = tmp_path / "out"
    env = {**os.environ, "FAKE_SLOW": "ce/seed0", "FAKE_PIDFILE": str(tmp_path / "pid")}
    proc = subprocess.Popen([sys.executable, "-c", _bench_script(suite, out, tmp_path / "d")],
                            env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for(lambda: (tmp_path / "pid").exists(), timeout=120)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    runs = {(r["method"], r["seed"]): r["status"] for r in _read_csv(out / "runs.csv")}
    assert set(runs) == {(m, s) for m in ("ce", "cog-fc") for s in ("0", "1")}, runs
    assert runs[("ce", "0")] == "interrupted" and NOT_STARTED in runs.values()
    report = (out / "report.md").read_text()
    text = [line for line in report.splitlines() if line.strip() and line[0] not in "#<"]
    first = text[0]
    assert "This bench is unfinished: it was stopped by SIGTERM" in first, report[:800]
    assert "No results yet: digits (paper):" in text[1] and "cog-fc" in text[1]


# --------------------------------------------------------------------------- 40.6: DDP


class _Child:
    """A child process as the watcher sees it (``poll``, ``send_signal``)."""

    def __init__(self, code: int | None) -> None:
        self.code, self.signals = code, []

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)


@pytest.mark.parametrize(
    ("code", "printed"), [(130, True), (143, True), (-2, False), (devices._QUIET + 2, False)]
)
def test_an_interrupted_child_ends_the_main_process_as_an_interruption(monkeypatch, capsys,
                                                                       code, printed):  # fmt: skip
    """Lightning's watcher would SIGKILL the main process; cogcal's stops the other
    children, prints the one line once (unless the child printed it) and exits 128 + n."""
    monkeypatch.setattr(devices, "_STATE", devices._Interruption())
    monkeypatch.setattr(devices, "_GRACE", 0.05)
    monkeypatch.setattr(devices, "_POLL", 0.01)
    other, exits = _Child(None), []

    def lightning_check() -> bool:  # pragma: no cover - must not be reached
        raise AssertionError("Lightning's watcher was asked")

    watcher = devices._ChildWatcher([_Child(code), other], lightning_check, exits.append)
    watcher.run()
    signum = devices._INTERRUPTED[code][0]
    assert exits == [128 + signum] and other.signals == [signal.SIGTERM]
    line = f"cogcal: interrupted ({signal.Signals(signum).name})\n"
    assert capsys.readouterr().err == ("" if printed else line)


def test_a_main_process_that_handles_the_signal_prints_alone(monkeypatch, capsys):
    monkeypatch.setattr(devices, "_STATE", devices._Interruption())
    monkeypatch.setattr(devices, "_GRACE", 0.05)
    monkeypatch.setattr(devices, "_HANDLED_LIMIT", 0.0)
    devices._STATE.handled = True
    exits: list[int] = []
    devices._ChildWatcher([_Child(devices._QUIET + 2)], lambda: True, exits.append).run()
    assert capsys.readouterr().err == "" and exits == [130]


def test_a_child_keeps_ignoring_the_signals_the_run_was_started_ignoring():
    """`nohup cogcal train --devices 2 ... &`: the main process ignores SIGINT, so the
    children must too (else Ctrl-C to the group ends them and the main fails alone)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devices._quiet_when_interrupted()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert callable(signal.getsignal(signal.SIGTERM))  # the quiet exit
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def test_a_failed_child_is_left_to_lightnings_watcher(monkeypatch):
    monkeypatch.setattr(devices, "_POLL", 0.01)
    calls: list[int] = []
    watcher = devices._ChildWatcher([_Child(None)], lambda: calls.append(1) or True, calls.append)
    monkeypatch.setattr(devices.time, "monotonic", itertools.count(0, 5).__next__)
    watcher.run()
    assert calls == [1]


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("delay", [0.5, 8.0])
def test_ctrl_c_to_a_two_process_run_is_one_line_and_130(tmp_path, delay):
    """`cogcal train --devices 2 --strategy ddp` (no --lr: the default path) on CPU (gloo):
    Ctrl-C to the process group at ``delay`` s after the second process started (0.5: it is
    still importing and the main process waits for it in C code; 8: both are training)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cogcal", "train", "--dataset", "digits", "--epochs", "50",
           "--no-progress", "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "run"),
           "--devices", "2", "--strategy", "ddp", "--accelerator", "cpu"]  # fmt: skip
    # Ctrl-C must reach it even when this session runs with SIGINT ignored (started in the
    # background of a script), which the run would inherit (and then rightly ignore)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        start = time.monotonic()
        while time.monotonic() - start < 120 and not _children(proc.pid):
            time.sleep(0.05)
        assert _children(proc.pid), "the second process never started"
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Forcefully terminating" not in err, err
    assert err.count("cogcal: interrupted") == 1, err
    assert "cogcal: interrupted (SIGINT)" in err and "Traceback" not in err, err


@pytest.mark.parametrize("rank", ["0", "1"])
@pytest.mark.parametrize("raised", [KeyboardInterrupt, lambda: Interrupted(signal.SIGTERM)])
def test_an_interrupted_command_at_another_rank_ends_quietly(rank, raised, monkeypatch, capsys):
    """A command interrupted in a process other than rank 0 before that process was made
    quiet for training (still loading its data: Ctrl-C 8 s into a two-process default path
    printed the line twice): the status ``QUIET_EXIT + n`` and no word; rank 0 prints it."""
    from cogcal import cli
    from cogcal.commands import bench as bench_command

    def interrupted(args):
        raise raised()

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(bench_command, "run", interrupted)
    status = cli.main(["bench", "--list"])
    signum = signal.SIGINT if raised is KeyboardInterrupt else signal.SIGTERM
    err = capsys.readouterr().err
    if rank == "0":
        assert status == 128 + signum and err.startswith("cogcal: interrupted")
    else:
        assert (status, err) == (QUIET_EXIT + signum, "")
