"""The layout of a run folder, its mark, and the lock every reader and writer takes.

Layout of a run folder (everything cogcal writes there, and nothing else is ever
deleted)::

    config.json          the resolved configuration; its "cogcal_run" key marks the folder
    metrics.json         the record (RunRecord), written last: its presence with
                         "status": "complete" means the run finished
    val_logits.npz       calibrated logits and labels of the validation split
    test_logits.npz      ... of the test split
    calibrator.pt        the fitted post-hoc calibrator (post-hoc methods)
    reliability.png      the reliability diagram written by `cogcal train`
    report.md, .html     the one-run report (`cogcal report RUN_FOLDER`)
    run.log              stdout/stderr of the run when `cogcal bench` ran it
    checkpoints/         last.ckpt, best.ckpt, done.json (stage1/ for two-stage methods)
    logs/                stage1.csv, stage2.csv: one row per epoch
    .cogcal.lock         the lock (``flock``) a process holds while it uses the folder
    .NAME.*.cogcal-tmp   a file being written atomically (the only temporary files)

A folder is cogcal's only when its ``config.json`` carries the mark :data:`MARK` with
this version's format :data:`FORMAT`; nothing else in a folder is ever deleted or
replaced (``overwrite`` included). Every command takes the folder's lock
(:func:`lock_folder`) before it reads, clears or writes anything there; bench and
calibration folders use the same lock file.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from cogcal import _io
from cogcal._errors import ArgumentError
from cogcal.runs.identity import MARK

__all__ = [
    "BOUND_FILES",
    "FORMAT",
    "LOCK_NAME",
    "MARK",
    "RUN_DIRS",
    "RUN_FILES",
    "STAGE_DIR",
    "RunFolderError",
    "lock_folder",
]

#: The format of ``config.json`` this version writes (the value of :data:`MARK`).
FORMAT = 2
#: The lock file of a run, bench or calibration folder.
LOCK_NAME = ".cogcal.lock"

#: Top-level files a run folder may hold (all written by cogcal).
RUN_FILES = (
    "config.json",
    "metrics.json",
    "val_logits.npz",
    "test_logits.npz",
    "calibrator.pt",
    "reliability.png",
    "report.md",
    "report.html",
    "run.log",
    ".cogcal.lock",
)
#: Folders of a run folder, and the file names cogcal writes inside them.
RUN_DIRS = {
    "checkpoints": ("last.ckpt", "best.ckpt", "done.json"),
    "logs": ("stage1.csv", "stage2.csv"),
}
#: ``checkpoints/stage1/``: where stage 1 of a two-stage method keeps its checkpoints.
STAGE_DIR = "stage1"
#: The files whose sha256 the record carries (relative to the run folder), in the order a
#: resumed run reads them.
BOUND_FILES = tuple(
    f"checkpoints/{stage}{name}"
    for stage in (f"{STAGE_DIR}/", "")
    for name in ("last.ckpt", "best.ckpt")
) + ("calibrator.pt",)


class RunFolderError(ArgumentError):
    """A run folder cannot be used as asked (names the folder and the fix)."""


@contextlib.contextmanager
def lock_folder(path: str | os.PathLike[str], *, what: str, create: bool = True) -> Iterator[None]:
    """Hold ``path/.cogcal.lock`` (an ``flock``: released by the system when the process
    ends, so a lock left by a killed process, a reused PID or a garbage lock file never
    blocks). A second process gets a ``ValueError`` naming ``what`` and the holder.

    ``create`` makes the folder (and removes it again on release if it is still empty,
    i.e. the command was refused before it wrote anything); without it a missing folder
    is left alone and nothing is locked.

    Raises
    ------
    cogcal._io.LockedError
        Another process holds the folder.
    OSError
        The folder cannot be created or is not writable.
    """
    path = Path(path)
    created: list[Path] = []  # the folders made here, deepest first
    if not path.is_dir():
        if not create:
            yield
            return
        _parent_writable(path)
        created = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
    try:
        with _io.file_lock(path / LOCK_NAME, what=what):
            yield
    finally:
        for folder in created:  # only empty ones: refused before anything was written
            try:
                folder.rmdir()
            except OSError:
                break


def _parent_writable(path: Path) -> None:
    for parent in path.parents:
        if parent.exists():
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "Permission denied", str(parent))
            return


def is_own_temp(name: str, known: tuple[str, ...]) -> bool:
    """A temporary file cogcal writes for one of the files ``known``."""
    return _io.temp_target(name) in known


def foreign_in(folder: Path, known: tuple[str, ...]) -> list[str]:
    out = []
    for entry in sorted(folder.iterdir()):
        if entry.name == STAGE_DIR and entry.is_dir() and not entry.is_symlink():
            out += [f"{STAGE_DIR}/{p}" for p in foreign_in(entry, known)]
        elif entry.name not in known and not is_own_temp(entry.name, known):
            out.append(entry.name)
    return out


def remove_known(folder: Path, known: tuple[str, ...]) -> None:
    """Remove cogcal's files from ``folder`` (and its stage1/), then the folder if empty."""
    for entry in list(folder.iterdir()):
        if entry.is_symlink():
            continue
        if entry.name == STAGE_DIR and entry.is_dir():
            remove_known(entry, known)
        elif entry.is_file() and (entry.name in known or is_own_temp(entry.name, known)):
            entry.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # only when empty: anything foreign stays
