"""Atomic file writes: every file cogcal writes goes through here.

Each writer writes a temporary file in the destination directory, flushes it to disk, then
moves it into place with :func:`os.replace`, so a crash never leaves a half-written file
that a later run would trust.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

__all__ = ["atomic_write", "write_bytes", "write_text", "write_json", "save_npz", "save_torch"]


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", *, fsync: bool = True) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success move it onto ``path``.

    ``fsync=False`` skips flushing the data to the disk before the rename: the file is still
    never seen half-written after a crash of the process (the rename is atomic), but a power
    loss may lose it. Used for checkpoints that are rewritten every epoch.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files: give them the usual mode
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write(
    path: str | Path, mode: str, writer: Callable[[IO[Any]], Any], *, fsync: bool = True
) -> Path:
    with atomic_write(path, mode, fsync=fsync) as f:
        writer(f)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return _write(path, "wb", lambda f: f.write(data))


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return _write(path, "w", lambda f: f.write(text))


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically (NaN/Inf are refused: they are not JSON)."""
    text = json.dumps(obj, indent=2, sort_keys=False, allow_nan=False)
    return write_text(path, text + "\n")


def save_npz(path: str | Path, **arrays: np.ndarray) -> Path:
    """Save arrays as an ``.npz`` atomically (load with ``np.load(..., allow_pickle=False)``)."""
    return _write(path, "wb", lambda f: np.savez(f, **arrays))


def save_torch(path: str | Path, obj: Any, *, fsync: bool = True) -> Path:
    """``torch.save`` atomically (load with ``torch.load(..., weights_only=True)``)."""
    return _write(path, "wb", lambda f: torch.save(obj, f), fsync=fsync)
