"""Atomic file writes: every file cogcal writes goes through here.

Each writer writes a temporary file in the destination directory, flushes it to disk, then
moves it into place with :func:`os.replace`, so a crash never leaves a half-written file
that a later run would trust.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

__all__ = [
    "LockedError",
    "atomic_write",
    "pid_lock",
    "read_json",
    "write_bytes",
    "write_text",
    "write_json",
    "save_npz",
    "save_torch",
]


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", *, fsync: bool = True) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success move it onto ``path``.

    The data is flushed to the disk (``fsync``) before the rename and the rename itself is
    flushed (``fsync`` of the folder), so the new file survives a power loss too.
    ``fsync=False`` skips both: the file is still never seen half-written after a crash of
    the process (the rename is atomic), but a power loss may lose it.
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
    if fsync:
        fsync_dir(path.parent)


def fsync_dir(folder: str | Path) -> None:
    """Flush a folder's entries (a rename into it) to the disk, where the OS allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows: folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LockedError(ValueError):
    """Another live process holds a lock (the message names it and the process)."""


@contextlib.contextmanager
def pid_lock(path: str | Path, *, what: str) -> Iterator[None]:
    """Hold ``path`` as a lock file recording this process's PID while the block runs.

    A lock whose process no longer exists (killed) is taken over; a live holder raises
    :class:`LockedError` naming ``what`` and its PID. The lock is removed on exit.
    """
    path = Path(path)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and _alive(pid):
                raise LockedError(
                    f"{what} is in use by process {pid} (lock file {path}); wait for it to "
                    "finish or stop it, or use another folder."
                ) from None
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        break
    else:  # pragma: no cover - another process keeps re-creating the lock
        raise LockedError(f"{what} is in use (lock file {path} keeps reappearing).")
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text().strip() or 0) == os.getpid():
                path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write(
    path: str | Path, mode: str, writer: Callable[[IO[Any]], Any], *, fsync: bool = True
) -> Path:
    try:
        with atomic_write(path, mode, fsync=fsync) as f:
            writer(f)
    except OSError as err:
        if err.filename is None:  # name the file the user will look for
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
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


def read_json(path: str | Path) -> Any:
    """Read a JSON file written by :func:`write_json`."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def save_npz(path: str | Path, **arrays: np.ndarray) -> Path:
    """Save arrays as an ``.npz`` atomically (load with ``np.load(..., allow_pickle=False)``)."""
    return _write(path, "wb", lambda f: np.savez(f, **arrays))


def save_torch(path: str | Path, obj: Any, *, fsync: bool = True) -> Path:
    """``torch.save`` atomically (load with ``torch.load(..., weights_only=True)``).

    The object is serialised in memory first, so a failing disk (full, read-only) raises a
    plain ``OSError`` naming the file rather than an error from inside torch's writer.
    """
    buf = io.BytesIO()
    torch.save(obj, buf)
    return _write(path, "wb", lambda f: f.write(buf.getbuffer()), fsync=fsync)
