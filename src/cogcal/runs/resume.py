"""Whether a run may start or resume in a folder, and the checkpoints a resumed run reads.

The rules (:meth:`Resume.prepare`): a folder holding a finished run is never overwritten
without ``overwrite``; an unfinished one is continued only with ``resume`` and the same
configuration, and only from checkpoints trained with it; a folder cogcal did not write is
never used if it holds anything (``overwrite`` does not change that).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cogcal.runs.checkpoints import CheckpointError, load_checkpoint
from cogcal.runs.identity import MARK, config_diff, config_digest
from cogcal.runs.layout import BOUND_FILES, FORMAT, RunFolderError

__all__ = ["Resume"]


class Resume:
    """Starting and resuming a run in a folder (a part of :class:`cogcal.runs.RunDir`, which
    provides the paths, the readers and :meth:`~cogcal.runs.RunDir.clear`)."""

    path: Path
    config_path: Path

    def read_history(self, *, two_stage: bool = False) -> list[dict[str, float]]:
        """The per-epoch log rows of stage 1 (``epoch``, ``val_brier``, ``val_nll``, ...)
        saved in its ``last.ckpt``, the state a resumed run continues from (its CSV log may
        lag or lead it after a kill); ``[]`` when there is no checkpoint yet.

        Raises
        ------
        cogcal.runs.CheckpointError
            ``last.ckpt`` is empty, truncated or not a cogcal checkpoint (names it).
        """
        path = self.stage_dir(two_stage) / "last.ckpt"
        if not path.is_file():
            return []
        return [dict(row) for row in load_checkpoint(path).get("history") or []]

    def prepare(self, config: Any, resolved: Mapping[str, Any], *, resume: bool,
                overwrite: bool) -> bool:  # fmt: skip
        """Check that a run of ``config`` (resolved: ``resolved``) may start (or resume)
        here; returns whether an unfinished run will be resumed.

        The rules: a folder holding a finished run is never overwritten without
        ``overwrite``; an unfinished one is continued only with ``resume`` and the same
        configuration; a folder cogcal did not write is never used if it holds anything
        (``overwrite`` does not change that); ``resume`` on a folder without a run to
        resume is an error; ``resume`` of a run that stopped before its first checkpoint
        (same configuration) starts it over, since nothing of it was kept.
        """
        if resume and overwrite:
            raise RunFolderError(
                "`resume` and `overwrite` contradict each other; pass one of them.",
                cli_message="--resume and --overwrite contradict each other; pass one of them.",
            )
        path = self.path
        self.check_path()
        if not self.entries():
            if resume:
                raise RunFolderError(
                    f"`resume`: {path} holds no run to resume; start it without `resume`.",
                    cli_message=f"--resume: {path} holds no run to resume; start it without "
                    "--resume.",
                )
            return False
        if self.config_path.is_file():
            self.read_config()  # a damaged one is named
        if not self.is_marked():
            self._refuse_foreign(resume)
            return False
        if overwrite:
            self.clear()
            return False
        self._refuse_finished()
        saved = self.read_config()
        if not resume:
            self._refuse_unfinished()
            self.clear()  # stopped before its first checkpoint
            return False
        return self._check_resume(saved, resolved)

    def _refuse_foreign(self, resume: bool) -> None:
        """A folder cogcal did not write: refused when it holds anything (or on resume)."""
        foreign = [e for e in self.entries() if e != "run.log"]
        if self.has_state():
            why = (
                "holds checkpoints but no config.json written by cogcal, so what they "
                "were trained with cannot be checked"
            )
        else:
            why = f"is not a cogcal run folder and is not empty ({', '.join(foreign[:5])})"
        if foreign or resume:
            raise RunFolderError(
                f"`out` {self.path} {why}; cogcal writes runs only into new or empty folders "
                "and never deletes files it did not write: choose another `out`.",
                cli_message=f"--out {self.path} {why}; cogcal writes runs only into new or "
                "empty folders and never deletes files it did not write: choose another --out.",
            )

    def _refuse_finished(self) -> None:
        if self.is_complete():
            raise RunFolderError(
                f"`out` {self.path} already holds a finished run (metrics.json); choose another "
                "folder or pass `overwrite=True` to replace it.",
                cli_message=f"--out {self.path} already holds a finished run (metrics.json); "
                "choose another --out or pass --overwrite to replace it.",
            )

    def _refuse_unfinished(self) -> None:
        if self.has_state():
            raise RunFolderError(
                f"`out` {self.path} holds an unfinished run (checkpoints/); pass `resume=True` "
                "to continue it or `overwrite=True` to start over.",
                cli_message=f"--out {self.path} holds an unfinished run (checkpoints/); pass "
                "--resume to continue it or --overwrite to start over.",
            )

    def _check_resume(self, saved: dict[str, Any] | None, resolved: Mapping[str, Any]) -> bool:
        """``resume`` of a marked, unfinished run: the same configuration and data, and
        checkpoints of that configuration; returns whether there is a state to resume."""
        path = self.path
        state = self.has_state()
        if state and (saved is None or saved.get(MARK) != FORMAT):
            raise RunFolderError(
                f"`resume`: {path} has checkpoints but no config.json of this cogcal version, "
                "so its configuration cannot be checked; start over with `overwrite=True`.",
                cli_message=f"--resume: {path} has checkpoints but no config.json of this "
                "cogcal version, so its configuration cannot be checked; start over with "
                "--overwrite.",
            )
        diff = _resume_diff(saved, resolved)
        changed = [
            d.partition(": ")[2].replace("the run started", f"the run in {path} started")
            for d in diff
            if "changed since the run started" in d
        ]
        if diff and len(changed) == len(diff):  # only the data's content: say so in words
            raise RunFolderError(
                f"`resume`: {'; '.join(changed)}; resume with the data the run started with, "
                "or start over with `overwrite=True`.",
                cli_message=f"--resume: {'; '.join(changed)}; restore it to resume the run, or "
                "start over on the new data with --overwrite (or use another --out).",
            )
        if diff:
            raise RunFolderError(
                f"`resume`: the run in {path} was started with other settings "
                f"({'; '.join(diff)}); resume with the same settings, or use another folder.",
                cli_message=f"--resume: the run in {path} was started with other settings "
                f"({'; '.join(diff)}); resume with the same flags, or use another --out.",
            )
        if not state:  # stopped before its first checkpoint: resuming is starting over
            self.clear()
            return False
        self.check_checkpoints(saved or {})
        return True

    def damaged_checkpoints(self) -> list[str]:
        """One line per checkpoint of the folder that cannot be loaded: ``"<path> is empty
        (0 bytes)"`` or ``"<path> is truncated or corrupt"``."""
        found = []
        for name in BOUND_FILES:
            path = self.path / name
            if not name.endswith(".ckpt") or path.is_symlink() or not path.is_file():
                continue
            if path.stat().st_size == 0:
                found.append(f"{path} is empty (0 bytes)")
                continue
            try:
                load_checkpoint(path)
            except CheckpointError:
                found.append(f"{path} is truncated or corrupt")
        return found

    def check_checkpoints(self, saved: Mapping[str, Any]) -> None:
        """Check, before a run resumes, that each of its checkpoints loads and was trained
        with the configuration ``saved`` (its ``config.json``).

        Raises
        ------
        cogcal.runs.CheckpointError
            A checkpoint is empty, truncated or not a cogcal checkpoint (names it).
        RunFolderError
            A checkpoint was trained with another configuration (copied from another run)
            or written by an older cogcal.
        """
        digest = config_digest(saved)
        for name in BOUND_FILES:
            path = self.path / name
            if not name.endswith(".ckpt") or not path.is_file():
                continue
            if load_checkpoint(path).get("config_sha256") != digest:
                raise RunFolderError(
                    f"`resume`: {path} was not trained with the configuration in "
                    f"{self.config_path} (it was copied from another run, or written by an "
                    "older cogcal); start over with `overwrite=True`.",
                    cli_message=f"--resume: {path} was not trained with the configuration in "
                    f"{self.config_path} (it was copied from another run, or written by an "
                    "older cogcal); start over with --overwrite.",
                )


def _resume_diff(saved: Mapping[str, Any] | None, resolved: Mapping[str, Any]) -> list[str]:
    """How the configuration to resume differs from the recorded one (the data's content
    included, when both record a fingerprint)."""
    diff = config_diff(saved, resolved) if saved is not None else []
    if saved and saved.get("data") and resolved.get("data"):
        before = (saved["data"] or {}).get("fingerprint")
        now = (resolved["data"] or {}).get("fingerprint")
        if before != now and not any(d.startswith("dataset:") for d in diff):
            digests = [str((f or {}).get("sha256", ""))[:12] for f in (before, now)]
            diff.append(
                f"data: the content of {resolved.get('dataset')} changed since the run "
                f"started (sha256 {digests[0]}... -> {digests[1]}...)"
            )
    return diff
