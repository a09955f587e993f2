"""Start-up cost of ``cogcal train`` against the floor every torch program pays.

    python bench/startup.py [--repeats 5] [--data-root DATA] [--breakdown]

Times, as fresh processes, interleaved, best and median of the repeats (wall seconds, and
the processes' CPU seconds, user + system, which a shared machine disturbs less):

* ``import torch``: the interpreter and torch;
* ``torch + Adam``: the same plus building one ``torch.optim.Adam`` and taking one step
  (the first optimizer step imports ``torch._dynamo``, which every training program pays);
* ``cogcal train``: ``cogcal train --dataset mnist1d --model mlp --epochs 2 --lr 1e-3`` (one
  configuration: without ``--lr`` the learning rates would be chosen on a grid) into a fresh
  folder, with the run's own time (``timing.total_seconds`` of its metrics.json).

The first two are the floor no training command on this machine can go below; the
difference ``cogcal train - (torch + Adam)`` is everything cogcal adds. The dataset cache
is built once before timing (``--data-root``), and so are the compiled bytecode files of
cogcal's modules: the timed processes run without ``PYTHONDONTWRITEBYTECODE`` (which some
containers set, making every start compile cogcal from source), as on a user's machine.

``--breakdown`` instead pays the floor in this process, then runs the same ``cogcal train``
in it and prints the CPU milliseconds of its parts (one torch thread, so that the CPU time is
the work): importing cogcal, building the parser, loading the dataset, the 2 epochs (with
their validation), the predictions of every set, the metrics of the validation and test sets
and of the shift sets, the OOD metrics, loading the OOD and shift sets, the health check,
the fsyncs, and the rest (building the model, the files, the configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stamp import stamp  # noqa: E402

FLOOR = {
    "import torch": "import torch",
    "torch + Adam": (
        "import torch\n"
        "p = torch.zeros(3, requires_grad=True)\n"
        "opt = torch.optim.Adam([p], lr=1e-3)\n"
        "p.sum().backward()\n"
        "opt.step()"
    ),
}


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
#: The console script beside this interpreter (as a virtual environment's bin/ holds it), not
#: one found through PATH, which may be a wrapper such as a pyenv shim (~65 ms of bash).
COGCAL = str(Path(sys.executable).with_name("cogcal"))
if not Path(COGCAL).is_file():
    COGCAL = "cogcal"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wall(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of the process ``cmd``."""
    cpu, start = _cpu(), time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - start, _cpu() - cpu


def _train(root: str) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [COGCAL, "train", "--dataset", "mnist1d", "--model", "mlp", "--epochs", "2"]
        cmd += ["--lr", "1e-3"]
        wall, cpu = _wall([*cmd, "--data-root", root, "--out", str(out)])
        run = json.loads((out / "metrics.json").read_text())["timing"]["total_seconds"]
    return wall, cpu, run


def _timed(module: object, name: str, part: str, parts: dict[str, float]) -> None:
    """Replace ``module.name`` by a wrapper adding its CPU seconds to ``parts[part]`` (an
    inner call of the same part is not counted twice)."""
    inner = getattr(module, name)
    running: list[bool] = []

    def wrapper(*args: object, **kwargs: object) -> object:
        if running:
            return inner(*args, **kwargs)
        running.append(True)
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            parts[part] = parts.get(part, 0.0) + time.process_time() - start
            running.pop()

    setattr(module, name, wrapper)


def breakdown(root: str) -> None:
    """CPU milliseconds of the parts of one ``cogcal train`` run after the floor."""
    import contextlib
    import io

    import torch

    exec(FLOOR["torch + Adam"], {})
    torch.set_num_threads(1)
    parts: dict[str, float] = {}
    start = time.process_time()
    import cogcal.cli
    import cogcal.train.robustness as robustness
    import cogcal.train.runner as runner

    parts["import cogcal"] = time.process_time() - start
    _timed(cogcal.cli, "build_parser", "parser", parts)
    _timed(runner, "load_dataset", "load the dataset", parts)
    _timed(runner, "fit_stage", "2 epochs (with validation)", parts)
    _timed(runner, "predict_logits", "predictions (val, test, OOD, shift)", parts)
    _timed(runner, "evaluate", "metrics: val, test", parts)
    _timed(robustness, "evaluate", "metrics: 20 shift sets", parts)
    _timed(robustness, "ood", "metrics: OOD", parts)
    _timed(robustness, "shift_sets", "load the shift sets", parts)
    _timed(robustness, "ood_sets", "load the OOD sets", parts)
    _timed(runner, "run_health", "health check", parts)
    _timed(os, "fsync", "fsync", parts)
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["train", "--dataset", "mnist1d", "--model", "mlp", "--epochs", "2"]
        argv += ["--lr", "1e-3", "--data-root", root, "--out", str(Path(tmp) / "run")]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cogcal.cli.main([*argv, "--no-progress"])
    total = time.process_time() - start
    if code != 0:
        raise SystemExit(f"cogcal train failed (exit status {code})")
    print(f"# bench/startup.py --breakdown | {stamp()}")
    print("# CPU milliseconds of cogcal train after the floor (torch + Adam), one torch thread")
    for part, seconds in parts.items():
        print(f"{part:38s} {seconds * 1e3:6.0f}")
    print(f"{'rest (model, files, configuration)':38s} {(total - sum(parts.values())) * 1e3:6.0f}")
    print(f"{'total':38s} {total * 1e3:6.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--breakdown", action="store_true", help="CPU time of the parts")
    args = parser.parse_args()
    if args.breakdown:
        _train(args.data_root)  # the dataset cache and the bytecode files
        breakdown(args.data_root)
        return
    _train(args.data_root)  # builds the dataset cache and the bytecode files; not timed
    names = (*FLOOR, "cogcal train")
    times: dict[str, list[float]] = {name: [] for name in (*names, "its run")}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name, code in FLOOR.items():
            wall, cpu = _wall([sys.executable, "-c", code])
            times[name].append(wall)
            cpus[name].append(cpu)
        wall, cpu, run = _train(args.data_root)
        times["cogcal train"].append(wall)
        cpus["cogcal train"].append(cpu)
        times["its run"].append(run)
    best = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"# bench/startup.py | {stamp()}")
    print(f"# {args.repeats} interleaved repeats of fresh processes: wall seconds, and CPU seconds")
    print(f"{'':14s} {'best':>8s} {'median':>8s} {'CPU best':>9s} {'median':>8s}")
    for name in med:
        cpu = (
            f" {min(cpus[name]):7.2f} s {statistics.median(cpus[name]):6.2f} s"
            if name in cpus
            else ""
        )
        print(f"{name:14s} {best[name]:6.2f} s {med[name]:6.2f} s{cpu}")
    over = best["cogcal train"] - best["torch + Adam"]
    over_cpu = min(cpus["cogcal train"]) - min(cpus["torch + Adam"])
    print(
        f"cogcal train - (torch + Adam), best of {args.repeats} = {over:.2f} s (target <= 0.30 s), "
        f"{over_cpu:.2f} s of CPU: everything the command does beyond "
        "the floor (its imports, data, 2 epochs, evaluation, files); 'its run' includes "
        "the first optimizer step's import of torch._dynamo, which the floor also pays"
    )


if __name__ == "__main__":
    main()
