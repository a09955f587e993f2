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
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock
    fcntl = None  # type: ignore[assignment]

import numpy as np
import torch

from cogcal._errors import ArgumentError

__all__ = [
    "LockedError",
    "atomic_write",
    "file_lock",
    "link_or_copy",
    "temp_target",
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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
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


def link_or_copy(src: str | Path, dst: str | Path, *, atomic: bool = False) -> Path:
    """Make ``dst`` hold the same bytes as ``src``: a hard link, else a copy.

    An existing ``dst`` is replaced. With ``atomic=True`` the link (or a durable copy) is
    made under a temporary name beside ``dst`` and renamed onto it, so a reader never sees
    a partial file, and the folder entry is flushed to the disk.
    """
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() and os.path.samefile(src, dst):
        return dst  # already one file (and rename(2) of one link onto another does nothing)
    target = dst.with_name(f".{dst.name}.{os.getpid()}link{TMP_SUFFIX}") if atomic else dst
    target.unlink(missing_ok=True)
    try:
        os.link(src, target)
    except OSError:  # no hard links on this file system
        if atomic:
            write_bytes(target, src.read_bytes())
        else:
            shutil.copy2(src, target)
    if atomic:
        os.replace(target, dst)
        fsync_dir(dst.parent)
    return dst


class LockedError(ArgumentError):
    """Another live process holds a lock (the message names it and the process)."""


#: The suffix of every temporary file cogcal writes (``.<name>.<random>.cogcal-tmp``).
TMP_SUFFIX = ".cogcal-tmp"
_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]+" + re.escape(TMP_SUFFIX) + r"$")


def temp_target(name: str) -> str | None:
    """The file a temporary file of cogcal's stands for, or None when ``name`` is not one.

    >>> temp_target(".metrics.json.k2j4_x9q.cogcal-tmp")
    'metrics.json'
    >>> temp_target(".notes.txt.tmp") is None
    True
    """
    match = _TMP_NAME.match(name)
    return match.group("name") if match else None


_HELD: dict[str, int] = {}  # lock files this process holds (re-entrant within the process)


def _locked(
    path: Path,
    operation: int,
    *,
    read_only: bool,
    refusal: tuple[str, str],
    wait: Callable[[], None] | None = None,
) -> int | None:
    """A descriptor of ``path`` holding the ``flock`` ``operation`` (``LOCK_EX``/``LOCK_SH``).

    The file is created if missing; with ``read_only``, where it cannot be, an existing one
    is opened read-only, and without one ``None`` is returned (nothing to lock). A lock
    held by another process raises :class:`LockedError`: ``"<refusal[0]> process N (lock
    file ...); <refusal[1]>"``, unless ``wait`` is given: then ``wait()`` is called once
    (to tell the user) and the lock is waited for. A file removed between the open and the
    lock (its holder releasing it) is opened again.
    """
    told = False
    for _ in range(20):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            if not read_only:
                raise
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return None
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
        except OSError:
            if wait is None:
                holder = _holder(fd)
                os.close(fd)
                raise LockedError(
                    f"{refusal[0]} {holder} (lock file {path}); {refusal[1]}"
                ) from None
            if not told:
                wait()
                told = True
            fcntl.flock(fd, operation)  # blocks until the holder releases it
        try:  # the holder before us may have removed the file we locked: lock the new one
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise LockedError(  # pragma: no cover - another process keeps re-creating the lock
        f"{refusal[0]} another process (lock file {path} keeps reappearing)"
    )


def _record_pid(fd: int) -> None:
    """Write this process's PID into a held lock file (the refusal names it)."""
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())


@contextlib.contextmanager
def file_lock(
    path: str | Path, *, what: str, wait: Callable[[], None] | None = None
) -> Iterator[None]:
    """Hold ``path`` as an exclusive lock file while the block runs (POSIX ``flock``).

    The operating system releases a ``flock`` when its process ends, however it ends, so a
    lock file left by a killed process, one holding garbage, or one naming a PID that was
    reused by another process never blocks: it is simply locked again. A lock held by a
    live process raises :class:`LockedError` naming ``what`` and that process. The lock
    file records the holder's PID (for that message) and is removed on release. A process
    may take a lock it already holds (nested blocks). With ``wait`` (a callable, e.g. one
    that prints "waiting for ..."), a held lock is waited for instead: ``wait()`` is called
    once, then the lock is taken when its holder releases it.

    Raises
    ------
    LockedError
        Another process holds the lock (and ``wait`` is not given).
    OSError
        The lock file cannot be created (e.g. the folder is not writable).
    """
    path = Path(path)
    key = os.path.abspath(path)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    if fcntl is None:  # pragma: no cover - Windows: no flock, no cross-process lock
        yield
        return

    advice = "wait for it to finish or stop it, or use another folder."
    refusal = (f"{what} is in use by", advice)
    fd = _locked(path, fcntl.LOCK_EX, read_only=False, refusal=refusal, wait=wait)
    assert fd is not None  # only read_only gives None
    try:
        _record_pid(fd)
    except OSError:
        os.close(fd)
        raise
    _HELD[key] = 1
    try:
        yield
    finally:
        del _HELD[key]
        with contextlib.suppress(OSError):
            path.unlink()  # still held: nobody else can have locked this file meanwhile
        os.close(fd)


@contextlib.contextmanager
def shared_lock(path: str | Path, *, what: str) -> Iterator[None]:
    """Hold ``path`` as a shared lock file while the block reads: readers at once, but no
    :func:`file_lock` holder (a writer), which is refused while a reader holds it.

    The file is created if missing and left in place (another reader may hold it); where
    it cannot be created (a read-only folder, which nobody can write to either) an
    existing one is locked read-only, and without one nothing is locked. Within a process
    that holds ``path`` with :func:`file_lock` this is a no-op.

    Raises
    ------
    LockedError
        A writer holds the lock.
    """
    path = Path(path)
    if os.path.abspath(path) in _HELD:  # this process writes the folder: reading is safe
        yield
        return
    if fcntl is None:  # pragma: no cover - Windows: no flock, no cross-process lock
        yield
        return

    advice = "wait for it to finish or stop it."
    fd = _locked(
        path, fcntl.LOCK_SH, read_only=True, refusal=(f"{what} is being written by", advice)
    )
    if fd is not None:
        with contextlib.suppress(OSError):  # a refused writer names a reader (read-only: none)
            _record_pid(fd)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _holder(fd: int) -> str:
    """``process N`` from a held lock file (or ``another process`` if unreadable)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        return f"process {int(text)}"
    except (OSError, ValueError):
        return "another process"


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
        if err.filename is None or temp_target(Path(str(err.filename)).name) is not None:
            # name the file the user will look for, never the temporary file
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
