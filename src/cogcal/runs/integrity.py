"""Integrity: a run's record and its files are bound together.

:func:`~cogcal.runs.config_digest` hashes what a configuration computes (every field that
can change results, the model, the classes and the input preprocessing; not where the run
lies or how it was shown). Every checkpoint carries the digest of the configuration it was
trained with; ``metrics.json`` carries, under ``"integrity"``, that digest and the sha256 of
each checkpoint and of ``calibrator.pt`` (:meth:`RunDir.write_record
<cogcal.runs.RunDir.write_record>` computes them, once every file is on the disk).
:meth:`~Integrity.check_record` and :meth:`~Integrity.check_file` refuse a ``config.json``
edited after the run, a checkpoint copied from another run, a replaced calibrator;
:meth:`~Integrity.finished_with` (what ``cogcal bench`` and ``cogcal tune`` reuse) counts a
run whose record does not check as not finished, so it is trained again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cogcal.runs.identity import (
    config_diff,
    config_digest,
    file_digest,
    record_diff,
    resolved_config,
)
from cogcal.runs.layout import BOUND_FILES, RunFolderError
from cogcal.runs.record import RunRecord

__all__ = ["Integrity"]


class Integrity:
    """The integrity checks of a run folder (a part of :class:`cogcal.runs.RunDir`, which
    provides the paths and the readers)."""

    path: Path
    config_path: Path
    metrics_path: Path

    def finished_with(self, config: Any) -> bool:
        """Whether the folder holds a finished run of the same configuration (a resolved
        mapping or a :class:`cogcal.train.TrainConfig`), whose record
        checks (:meth:`check_record`: an edited ``config.json`` or ``metrics.json`` is never
        trusted; the checkpoints are checked by whoever loads them)."""
        record = self.read_record()
        if record is None or config_diff(record.config, resolved_config(config)):
            return False
        try:
            self.check_record(record)
        except RunFolderError:
            return False
        return True

    def check_record(self, record: RunRecord, saved: Mapping[str, Any] | None = None) -> None:
        """Check that ``config.json`` (``saved``, read if not given) and the record
        ``metrics.json`` describe the same run, the one the record's integrity names.

        Raises
        ------
        RunFolderError
            ``config.json`` is missing or differs from the record (the message names the
            fields), or either was edited after the run (its digest is not the recorded
            one), or the record carries no integrity (an older cogcal wrote it).
        """
        saved = self.read_config() if saved is None else saved
        if saved is None:
            raise RunFolderError(f"{self.path} has a metrics.json but no config.json.")
        fix = "restore the file or train the run again"
        diff = record_diff(record.config, saved)
        if diff:
            raise RunFolderError(
                f"{self.config_path} differs from the run's record {self.metrics_path.name} "
                f"({'; '.join(diff[:4])}{' ...' if diff[4:] else ''}): it was edited after the "
                f"run, so it does not describe the checkpoints; {fix}."
            )
        integrity = record.integrity if isinstance(record.integrity, Mapping) else {}
        recorded = integrity.get("config")
        if not isinstance(recorded, str):
            raise RunFolderError(
                f"{self.metrics_path} carries no integrity record (the hashes binding it to "
                "config.json and the checkpoints): it was written by an older cogcal or "
                "edited; train the run again."
            )
        if config_digest(saved) != recorded:
            raise RunFolderError(
                f"{self.config_path} and {self.metrics_path.name} were edited after the run: "
                "they no longer hash to the configuration the checkpoints were trained with; "
                f"{fix}."
            )

    def check_file(self, name: str, record: RunRecord) -> None:
        """Check that the file ``name`` (relative to the folder, one of
        :data:`BOUND_FILES`) is the one the record was written with (its sha256).

        Raises
        ------
        RunFolderError
            The record does not list the file, or its content differs (e.g. a checkpoint
            copied from another run).
        """
        files = (record.integrity or {}).get("files")
        expected = files.get(name) if isinstance(files, Mapping) else None
        path = self.path / name
        if not isinstance(expected, str):
            raise RunFolderError(
                f"{path} is not part of the run's record ({self.metrics_path.name} lists no "
                "hash for it): it was added after the run; remove it or train the run again."
            )
        try:
            actual = file_digest(path)
        except FileNotFoundError:
            raise RunFolderError(f"{path} is missing; the run folder is incomplete.") from None
        if actual != expected:
            raise RunFolderError(
                f"{path} is not the file the run wrote (its sha256 differs from the one in "
                f"{self.metrics_path.name}): it was replaced, e.g. copied from another run; "
                "restore it or train the run again."
            )

    def _integrity(self, record: RunRecord) -> dict[str, Any]:
        files: dict[str, str] = {}
        seen: dict[tuple[int, int], str] = {}  # best.ckpt is often last.ckpt (a hard link)
        for name in BOUND_FILES:
            path = self.path / name
            if path.is_symlink() or not path.is_file():
                continue
            stat = path.stat()
            key = (stat.st_dev, stat.st_ino)
            if key not in seen:
                seen[key] = file_digest(path)
            files[name] = seen[key]
        return {"config": config_digest(record.config), "files": files}
