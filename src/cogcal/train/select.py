"""The default path of ``cogcal train`` and :func:`cogcal.fit` when no learning rate is
given: choose it by validation cross-entropy, as the paper does (docs/method.md §1,
"defaults").

COG methods choose λ_f and the ratio λ_c/λ_f one axis at a time on small log grids that
grow while the choice is at an edge (:class:`~cogcal.train.tuning.GridSearch`):

1. λ_f on :data:`COG_LRS` at the ratio :data:`BASE_RATIO` (one extension at most);
2. the ratio on :data:`COG_RATIOS` at the chosen λ_f (the point of step 1 is reused; one
   extension at most, never to 1).

Other methods choose λ on :data:`BASELINE_LRS` (one extension at most). So at most
:data:`MAX_RUNS` runs of the same budget are trained (3 for one-rate methods), each one
exactly the run ``lr=`` would train; the chosen run *is* the result (it is not trained
again). The points live in ``<out>.select/`` (a ``cogcal tune`` folder: ``tune.json``,
``tune.csv``, one run folder per point), the chosen run is copied into ``out`` (hard links
where the file system allows) with the selection recorded under ``selection`` in its
``metrics.json``. Running the same command again reuses finished points and resumes an
unfinished one. The test split plays no part in the choice.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cogcal.cog import CalibratedModel
from cogcal.train.assemble import (
    final_model,
    load_run,
    posthoc_calibrator,
    stage1_model,
)
from cogcal.train.checkpoints import load_checkpoint
from cogcal.train.checkup import SELECTED
from cogcal.train.config import ConfigError, TrainConfig
from cogcal.train.loop import NonFiniteLossError
from cogcal.train.methods import get_method
from cogcal.train.rundir import RunDir, RunFolderError, RunRecord
from cogcal.train.sources import DataSource
from cogcal.train.tuning import (
    SELECTION_RULE,
    Grid,
    GridSearch,
    check_tune_folder,
    mark_tune_folder,
    open_edges,
    point_label,
    write_tables,
)

__all__ = [
    "describe_budget",
    "train_size",
    "BASELINE_LRS",
    "BASE_RATIO",
    "COG_LRS",
    "COG_RATIOS",
    "MAX_RUNS",
    "select_and_train",
    "selection_folder",
]

COG_LRS = (1e-3, 3e-3)  # λ_f, step 1 (one extension, half-decade: 3e-4 or 1e-2)
BASE_RATIO = 0.1  # λ_c/λ_f during step 1: the paper's default
COG_RATIOS = (0.1, 0.3)  # step 2 (one extension: 0.03; 1 is the bound)
BASELINE_LRS = (3e-4, 1e-3)  # λ of one-rate methods (one extension: 1e-4 or 3e-3)
MAX_EXTENSIONS = 1
MAX_RUNS = 5  # COG: 2 + 1 (λ_f) + 1 + 1 (ratio); one-rate methods: 3


def selection_folder(out: str | Path) -> Path:
    """Where the points of a run's selection are trained: ``<out>.select``."""
    out = Path(out)
    return out.with_name(out.name + ".select")


def train_size(source: DataSource) -> int:
    """Samples in the training split of ``source``."""
    if source.dataset is not None:
        return len(source.dataset.train)
    return int(source.info["train_size"])


def describe_budget(resolved: dict[str, Any], n_train: int) -> str:
    """One line stating a run's resolved budget and learning rates (printed at its start)."""
    batch, epochs = int(resolved["batch_size"]), int(resolved["epochs"])
    per_epoch = max(1, math.ceil(n_train / batch))
    schedule = (
        f"rates /10 every {resolved['step_size']} epochs"
        if resolved["schedule"] == "step"
        else "constant rates"
    )
    rates = (
        "chosen by validation cross-entropy"
        if resolved.get("lr") is None
        else f"lr {resolved['lr']:g}"
        + (
            f", calibrator lr {resolved['calibrator_lr']:g}"
            if resolved.get("calibrator_lr")
            else ""
        )
    )
    return (
        f"{resolved['method']} on {resolved['dataset']} (preset {resolved['preset']}): "
        f"{n_train} training samples, batch {batch} ({per_epoch} steps/epoch), {epochs} "
        f"epochs = {per_epoch * epochs} optimizer steps at most, {schedule}; {rates}"
    )


def _say(config: TrainConfig, text: str) -> None:
    if config.progress:
        print(text, file=sys.stderr, flush=True)


def select_and_train(
    config: TrainConfig,
    source: DataSource,
    model: nn.Module | None,
    *,
    resume: bool = False,
    overwrite: bool = False,
) -> tuple[dict[str, Any], CalibratedModel | None]:
    """Choose the learning rates of ``config`` (no ``lr``, budget resolved) by validation
    cross-entropy, and return the chosen run as :func:`cogcal.train.runner.execute` does.

    ``resume`` continues an interrupted selection (finished points are reused in any case);
    ``overwrite`` replaces a finished run in ``config.out`` and points of another
    configuration.
    """
    # here: an import cycle (runner.run calls select_and_train, whose points train via run)
    from cogcal.train.runner import DEFER_ROBUSTNESS, add_robustness, search_points

    if config.devices * config.num_nodes > 1:
        raise ConfigError(
            lambda n: (
                f"choosing the learning rates (no {n('lr')} given) runs in one process; for "
                f"{n('devices')}/{n('num_nodes')} > 1 pass {n('lr')} (chosen with `cogcal "
                f"tune`) or {n('preset')} paper."
            )
        )
    method = get_method(config.method)
    out = RunDir(config.out)
    folder = selection_folder(config.out)
    with out.lock():  # the lock before anything in the folder is read, cleared or written
        if resume and out.is_marked() and not out.is_complete():
            for problem in out.damaged_checkpoints():  # named, then made again (README)
                print(
                    f"cogcal: warning: {problem}; {out.path} holds a copy of the chosen run "
                    f"of the learning-rate selection in {folder}: it is copied again",
                    file=sys.stderr,
                )
            out.clear()  # a copy of the chosen run that was interrupted: copied again below
        if not (resume and not out.is_complete()):
            out.prepare(config, config.resolved(), resume=False, overwrite=overwrite)
    config = config.replace(extra={**config.extra, SELECTED: SELECTION_RULE})
    _say(config, describe_budget(config.resolved(), train_size(source)))
    _say(
        config,
        f"choosing the learning rates by validation cross-entropy: at most "
        f"{MAX_RUNS if method.is_cog else 3} runs of this budget in {folder} (pass --lr to "
        "train one configuration)",
    )
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def on_point(row: dict[str, Any]) -> None:
        point = ", ".join(f"{k} {row[k]:g}" for k in ("lr", "ratio") if row.get(k) is not None)
        nll = "diverged" if row["val_nll"] is None else f"validation NLL {row['val_nll']:.4f}"
        _say(
            config, f"  {point}: {nll} ({len(rows)} of at most {MAX_RUNS if method.is_cog else 3})"
        )

    common = dict(overwrite=overwrite, data=source, model=model, on_point=on_point)
    # the points skip the OOD and shift sets; the chosen one is evaluated on them below
    points = config.replace(extra={**config.extra, DEFER_ROBUSTNESS: True})
    with RunDir(folder).lock(), out.lock():
        check_tune_folder(folder)  # a `cogcal tune` folder: the same rule
        mark_tune_folder(folder)
        if method.is_cog:
            first = GridSearch(
                Grid(COG_LRS, (BASE_RATIO,), fixed=("ratio",)), max_extensions=MAX_EXTENSIONS
            )
            runs = search_points(points, first, folder, rows, **common)
            edges = first.at_edge  # λ_f still at an edge after its extension (or none)
            if first.best is None:
                search = first
            else:
                search = GridSearch(
                    Grid((first.best["lr"],), COG_RATIOS, fixed=("lr",)),
                    max_extensions=MAX_EXTENSIONS,
                )
                runs.update(search_points(points, search, folder, rows, known=runs, **common))
        else:
            edges = []
            search = GridSearch(Grid(BASELINE_LRS), max_extensions=MAX_EXTENSIONS)
            runs = search_points(points, search, folder, rows, **common)
        summary = search.summary(rows)
        summary["edges"] = sorted(set(edges) | set(summary["edges"]))
        # an edge the run cap kept the search from moving past; a bound alone (the ratio's 1)
        # is not one (as in `cogcal tune`)
        summary["at_edge"] = bool(set(edges) | set(search.at_edge))
        summary["grid"] = {
            axis: sorted({r[axis] for r in rows if r.get(axis) is not None})
            for axis in ("lr", "ratio")
            if any(r.get(axis) is not None for r in rows)
        }
        summary["runs"] = len(rows)
        summary["max_runs"] = MAX_RUNS if method.is_cog else 3
        summary["seconds"] = time.perf_counter() - started
        summary["folder"] = str(folder)
        write_tables(folder, summary)
        if search.best is None:
            raise NonFiniteLossError(
                f"every learning rate tried in {folder} diverged "
                f"({', '.join(r['run'] for r in rows)}); pass a smaller --lr."
            )
        label = point_label(search.best)
        record, trained = runs[label]
        edge = (
            f" (at the edge of the grid: {', '.join(open_edges(summary))})"
            if summary["at_edge"]
            else ""
        )
        _say(
            config,
            f"chosen: {summary['best_config']}{edge}; {len(rows)} runs, "
            f"{summary['seconds']:.0f} s in all",
        )
        selection = {
            key: summary[key]
            for key in (
                "selection",
                "best",
                "best_config",
                "at_edge",
                "edges",
                "grid",
                "runs",
                "max_runs",
                "seconds",
                "folder",
            )  # fmt: skip
        }
        selection["table"] = rows
        record = _adopt(folder / label, out, config, selection)
        if trained is None:  # the chosen run was finished before: load it back
            trained = _load_back(folder / label, model)
        elif model is not None and not method.stage2:  # the caller's model gets the weights
            model.load_state_dict(trained.network.state_dict())
        if source.dataset is not None and trained is not None:
            add_robustness(record, out, trained, source.dataset, config)
        out.write_record(record)  # metrics.json last: only now is the run complete
    return record.to_dict(), trained


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:  # no hard links here
        shutil.copy2(src, dst)


def _adopt(point: Path, out: RunDir, config: TrainConfig, selection: dict[str, Any]) -> RunRecord:
    """Copy the chosen point's run into ``out``, all but its ``metrics.json``, and return
    its record, with ``out`` as its folder and the selection added, for the caller to
    write last."""
    src = RunDir(point)
    record = src.read_record()
    if record is None:
        raise RunFolderError(f"{point} holds no finished run to adopt; run the command again.")
    for path in sorted(point.rglob("*")):
        rel = path.relative_to(point)
        if path.is_file() and not path.is_symlink() and rel.name not in (
            "metrics.json", "config.json", ".cogcal.lock",
        ):  # fmt: skip
            _link_or_copy(path, out.path / rel)
    saved = src.read_config() or {}
    saved = {k: v for k, v in saved.items() if k not in ("cogcal_run", "cogcal_version")}
    # the chosen run as the user asked for it: its own folder, progress and extra
    own = {"out": str(out.path), "progress": config.progress, "extra": config.extra}
    out.write_config({**saved, **own})
    record.config = {**record.config, **own}
    record.selection = selection
    return record


def _load_back(path: Path, model: nn.Module | None) -> CalibratedModel | None:
    """The model of a finished run folder (a reused chosen point)."""
    if model is None:
        return load_run(path).model
    saved = RunDir(path).read_config() or {}
    method = get_method(str(saved["method"]))
    task = str(saved.get("task", "multiclass"))
    if method.stage2:  # the head is rebuilt by load_run only for registry backbones
        raise RunFolderError(
            f"{path} holds a finished {method.name} run of a model given in Python; load "
            "checkpoints/best.ckpt into your model yourself, or train again with overwrite=True."
        )
    stage1 = stage1_model(method, model, task)
    stage1.load_state_dict(load_checkpoint(Path(path) / "checkpoints" / "best.ckpt")["model"])
    calibrator = None
    if method.posthoc:
        calibrator = posthoc_calibrator(method.posthoc, task)
        calibrator.load_state_dict(torch.load(Path(path) / "calibrator.pt", weights_only=True))
        calibrator.requires_grad_(False)
    return final_model(method, model, stage1, task=task, calibrator=calibrator).eval()
