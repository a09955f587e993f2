"""A run folder: its paths, its readers and writers, clearing it, and its locks.

Every reader and writer of a run folder goes through :class:`RunDir`: ``cogcal train`` (new
run, ``--resume``, ``--overwrite``), ``cogcal tune`` (reusing a grid point), ``cogcal
bench`` (skipping, reusing, clearing), the results collection and the report. The layout is
:mod:`cogcal.runs.layout`'s; the integrity checks (:mod:`cogcal.runs.integrity`) and the
rules of starting and resuming a run (:mod:`cogcal.runs.resume`) are parts of it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cogcal import _io
from cogcal._version import __version__
from cogcal.runs.identity import MARK
from cogcal.runs.integrity import Integrity
from cogcal.runs.layout import (
    FORMAT,
    LOCK_NAME,
    RUN_DIRS,
    RUN_FILES,
    STAGE_DIR,
    RunFolderError,
    foreign_in,
    is_own_temp,
    lock_folder,
    remove_known,
)
from cogcal.runs.record import RunRecord
from cogcal.runs.resume import Resume

__all__ = ["RunDir"]


class RunDir(Integrity, Resume):
    """One run folder.

    Its layout, mark and lock are :mod:`cogcal.runs.layout`'s (``config.json`` marked as a
    cogcal run, ``metrics.json`` written last, the logits, ``calibrator.pt``,
    ``checkpoints/``, ``logs/``, ``.cogcal.lock``; nothing else in the folder is ever deleted).
    Its integrity checks (:class:`~cogcal.runs.integrity.Integrity`: :meth:`check_record`,
    :meth:`check_file`, :meth:`finished_with`) and the rules of starting and resuming a run
    (:class:`~cogcal.runs.resume.Resume`: :meth:`prepare`) are parts of it.

    Parameters
    ----------
    path : str or Path
        The folder (it need not exist yet).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- paths ---------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def stage_dir(self, two_stage: bool) -> Path:
        """Where stage 1 keeps its checkpoints (``checkpoints/stage1`` for two-stage methods)."""
        return self.checkpoints / STAGE_DIR if two_stage else self.checkpoints

    # -- reading -------------------------------------------------------------------------
    def read_config(self) -> dict[str, Any] | None:
        """The recorded configuration, or None when there is no ``config.json``.

        Raises
        ------
        RunFolderError
            ``config.json`` exists but is not readable JSON (names the file).
        """
        try:
            text = self.config_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as err:
            raise RunFolderError(f"cannot read {self.config_path}: {err.strerror}.") from None
        try:
            data = json.loads(text)
        except ValueError as err:
            raise RunFolderError(
                f"{self.config_path} is not valid JSON ({err}); the run folder is damaged: "
                "delete it or use another output folder."
            ) from None
        if not isinstance(data, dict):
            raise RunFolderError(f"{self.config_path} is not a JSON object: not a cogcal run.")
        return data

    def is_marked(self) -> bool:
        """Whether cogcal wrote this folder: its ``config.json`` carries the mark of this
        version's format (nothing that merely looks like a configuration counts)."""
        try:
            cfg = self.read_config()
        except RunFolderError:
            return False
        return cfg is not None and cfg.get(MARK) == FORMAT

    def read_outcome(self) -> dict[str, Any] | None:
        """The raw ``metrics.json`` (status ``"complete"`` or ``"diverged"``), or None."""
        try:
            data = json.loads(self.metrics_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def read_record(self) -> RunRecord | None:
        """The record of a finished run, or None when the run is not complete."""
        data = self.read_outcome()
        if data is None or data.get("status") != "complete":
            return None
        try:
            return RunRecord.from_dict(data, source=str(self.metrics_path))
        except ValueError:
            return None

    def read_logits(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The saved (calibrated) logits and labels of ``"val"`` or ``"test"``.

        Raises
        ------
        RunFolderError
            The file is missing, or damaged: unreadable, or not (N, K) float logits with N
            labels (names it, and says which).
        """
        path = self.path / f"{split}_logits.npz"
        if not path.is_file():
            raise RunFolderError(f"cannot read {path}: no such file; the run is incomplete.")
        try:
            with np.load(path, allow_pickle=False) as f:
                logits, labels = f["logits"], f["labels"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise RunFolderError(
                f"{path} is damaged ({type(err).__name__}: {str(err).split('. ')[0]}); it is "
                "not the .npz of logits and labels that cogcal wrote: train the run again "
                "(--overwrite)."
            ) from None
        if logits.ndim != 2 or len(labels) != len(logits) or logits.dtype.kind != "f":
            raise RunFolderError(
                f"{path} is damaged: logits of shape {logits.shape} ({logits.dtype}) and "
                f"labels of shape {labels.shape} are not the (N, K) logits and N labels that "
                "cogcal wrote: train the run again (--overwrite)."
            )
        return logits, labels

    def is_complete(self) -> bool:
        """Whether the folder holds a finished run."""
        return self.read_record() is not None

    def has_state(self) -> bool:
        """Whether an unfinished run left checkpoints to resume from."""
        return self.checkpoints.is_dir() and any(self.checkpoints.rglob("*.ckpt"))

    def foreign_entries(self) -> list[str]:
        """Entries of the folder that cogcal did not write (never deleted)."""
        if not self.path.is_dir():
            return []
        found = []
        for entry in sorted(self.path.iterdir()):
            name = entry.name
            if name in RUN_FILES or is_own_temp(name, RUN_FILES):
                continue
            if name in RUN_DIRS and entry.is_dir() and not entry.is_symlink():
                found += [f"{name}/{p}" for p in foreign_in(entry, RUN_DIRS[name])]
                continue
            found.append(name + ("/" if entry.is_dir() else ""))
        return found

    # -- writing -------------------------------------------------------------------------
    def write_config(self, resolved: Mapping[str, Any]) -> None:
        """Record the resolved configuration (and mark the folder as a cogcal run)."""
        _io.write_json(
            self.config_path,
            {MARK: FORMAT, "cogcal_version": __version__, **dict(resolved)},
        )

    def write_record(self, record: RunRecord) -> None:
        """Write ``metrics.json`` (last, atomically, durably), with the integrity of the
        run (``record.integrity``: the digest of its configuration and the sha256 of the
        checkpoints and ``calibrator.pt`` now in the folder)."""
        record.integrity = self._integrity(record)
        _io.write_json(self.metrics_path, record.to_dict())

    def write_outcome(self, outcome: Mapping[str, Any]) -> None:
        """Write a ``metrics.json`` mapping (complete or diverged; checked first)."""
        if outcome.get("status") == "diverged":  # may have measured nothing
            outcome = {"val": {}, "test": {}, **outcome}
        record = RunRecord.from_dict(outcome, source=str(self.metrics_path))
        if record.status not in ("complete", "diverged"):
            raise ValueError(f"unknown run status {record.status!r}.")
        self.write_record(record)

    def check_clearable(self) -> None:
        """Check, before anything is deleted, that :meth:`clear` can empty this folder of
        cogcal's files and a run can then be written here.

        Raises
        ------
        RunFolderError
            The folder is a symbolic link or a file, is not a cogcal run folder but holds
            files, or a folder cogcal would clear (``checkpoints/``, ``logs/``) is a link.
        OSError
            The folder (or one of its subfolders) is not writable.
        """
        if self.path.is_symlink():
            raise RunFolderError(
                f"{self.path} is a symbolic link; cogcal never writes or deletes through "
                "links: remove the link or choose another output folder."
            )
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise RunFolderError(f"{self.path} is a file, not a run folder.")
        entries = [e for e in self.path.iterdir() if e.name != LOCK_NAME]
        if entries and not self.is_marked() and any(e.name != "run.log" for e in entries):
            shown = ", ".join(sorted(e.name for e in entries)[:5])
            raise RunFolderError(
                f"{self.path} is not a cogcal run folder (no config.json written by cogcal) and "
                f"holds {shown}: refusing to delete anything there; choose another output folder."
            )
        folders = [self.path]
        for name in RUN_DIRS:
            sub = self.path / name
            if sub.is_symlink():
                raise RunFolderError(
                    f"{sub} is a symbolic link; cogcal never deletes through links: remove "
                    "the link yourself or choose another output folder."
                )
            if sub.is_dir():
                folders.append(sub)
                if (sub / STAGE_DIR).is_dir() and not (sub / STAGE_DIR).is_symlink():
                    folders.append(sub / STAGE_DIR)
        for folder in folders:
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "Permission denied", str(folder))

    def clear(self, *, keep_config: bool = False) -> None:
        """Delete what cogcal wrote here, and nothing else; never follow a link.

        Everything is checked first (:meth:`check_clearable`), so a refusal deletes
        nothing. ``keep_config`` keeps ``config.json`` (the folder's mark), so that a run
        can be written again into a folder that also holds the user's own files.

        Raises
        ------
        RunFolderError, OSError
            See :meth:`check_clearable`.
        """
        self.check_clearable()
        if not self.path.exists():
            return
        for name, inside in RUN_DIRS.items():
            sub = self.path / name
            if sub.is_dir():
                remove_known(sub, inside)
        for name in RUN_FILES:
            if name == LOCK_NAME or (keep_config and name == "config.json"):
                continue
            target = self.path / name
            if target.is_symlink() or target.is_file():
                target.unlink()
        for tmp in self.path.iterdir():
            if is_own_temp(tmp.name, RUN_FILES) and tmp.is_file() and not tmp.is_symlink():
                tmp.unlink()

    def entries(self) -> list[str]:
        """The names in the folder, sorted, except its lock file (a lock left by a killed
        process does not make a folder non-empty)."""
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir() if p.name != LOCK_NAME)

    def check_path(self) -> None:
        """Refuse an output path that is a link, a file, or lies below a file."""
        path = self.path
        if path.is_symlink():
            raise RunFolderError(
                f"output folder {path} is a symbolic link; cogcal never writes through links: "
                "pass the real folder."
            )
        if path.exists() and not path.is_dir():
            raise RunFolderError(f"output folder {path} is an existing file; choose a folder path.")
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise RunFolderError(
                        f"output folder {path} lies below {parent}, which is a file; choose "
                        "another path."
                    )
                break

    @contextlib.contextmanager
    def read_lock(self) -> Iterator[None]:
        """Hold the folder shared while reading a finished run (:func:`cogcal.load_run`,
        ``cogcal predict``): readers at once, but a process that would clear or write the
        folder (:meth:`lock`) is refused meanwhile, and a folder being written is refused
        to the reader (:class:`cogcal._io.LockedError`). A missing folder is not locked."""
        if not self.path.is_dir():
            yield
            return
        with _io.shared_lock(self.path / LOCK_NAME, what=f"run folder {self.path}"):
            yield

    @contextlib.contextmanager
    def lock(self, *, create: bool = True) -> Iterator[None]:
        """Hold the folder for this process (:func:`lock_folder`); take it before reading,
        clearing or writing anything in the folder."""
        self.check_path()
        with lock_folder(self.path, what=f"run folder {self.path}", create=create):
            yield
