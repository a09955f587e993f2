"""Download the image datasets and CIFAR-10-C / CIFAR-100-C, resumably, checksums verified.

:func:`download` fetches the official files of a dataset into the data root, in the
layouts the loaders read (torchvision's), unless they are already there:

- every file is checked against the MD5 sum pinned in :data:`RESOURCES` (the sums
  torchvision pins for CIFAR-10/100, SVHN and CelebA; the Zenodo sums for CIFAR-C); a file
  that does not match is removed and reported;
- a download is written to ``<file>.part`` and resumed with an HTTP ``Range`` request after
  an interruption (retried automatically, and again on the next call);
- a progress bar (tqdm) goes to stderr;
- archives are extracted into a temporary folder beside the destination and moved into
  place, then deleted;
- ``mirror=URL`` (or the ``COGCAL_DATA_MIRROR`` environment variable) fetches the same
  file names from ``URL/<file name>`` instead of the official hosts (an ``http(s)://`` or
  ``file://`` URL, or a local directory).

Nothing here runs unless asked (``download=True`` / ``cogcal.data.download``).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cogcal import _io
from cogcal._errors import ArgumentError
from cogcal._version import __version__
from cogcal.data.corruptions import CIFAR_C_CORRUPTIONS

__all__ = [
    "MIRROR_ENV",
    "RESOURCES",
    "ChecksumError",
    "DownloadError",
    "RemoteFile",
    "describe",
    "download",
    "download_names",
    "resolve_mirror",
]

#: Environment variable read when ``mirror`` is not given.
MIRROR_ENV = "COGCAL_DATA_MIRROR"

# Seconds without data before a connection counts as stalled; attempts per file; the
# pause before retry i is _RETRY_BACKOFF * i seconds.
_TIMEOUT = 60.0
# A connection that delivers fewer than _STALL_BYTES in _STALL_SECONDS (a trickle that
# keeps every single read within _TIMEOUT) counts as stalled too.
_STALL_SECONDS = 60.0
_STALL_BYTES = 64 * 1024
_ATTEMPTS = 4
_RETRY_BACKOFF = 1.0
_CHUNK = 1 << 20


class DownloadError(ArgumentError):
    """A download failed: network unreachable, HTTP error, interrupted too often.

    A ``ValueError``; ``str(err)`` names ``root=`` and ``mirror=``, ``err.cli_message``
    names ``--data-root`` and ``--mirror``.
    """


class ChecksumError(DownloadError):
    """A downloaded file does not have the pinned MD5 sum (the file has been removed)."""


@dataclass(frozen=True)
class RemoteFile:
    """One file to download.

    Attributes
    ----------
    filename : str
        File name, on the official host and on a mirror (``MIRROR/<filename>``).
    url : str
        Official URL.
    md5 : str
        Pinned MD5 sum of the file.
    target_dir : str
        Folder under the data root where the file is saved (``""``: the root itself) and,
        for archives, extracted.
    extract : bool
        The file is an archive (``.tar``, ``.tar.gz``/``.tgz``, ``.zip``): extract it,
        then delete it.
    provides : tuple of str
        Paths under the data root that exist once the file is in place (extracted); when
        they all exist the file is not downloaded.
    alternatives : tuple of str
        Another set of paths that counts as present (e.g. torchvision's SVHN layout).
    size : str
        Approximate download size, for messages and docs.
    """

    filename: str
    url: str
    md5: str
    target_dir: str = ""
    extract: bool = False
    provides: tuple[str, ...] = ()
    alternatives: tuple[str, ...] = ()
    size: str = ""

    def present(self, root: Path) -> bool:
        """Whether what this file provides is already under ``root``."""
        if self.provides and all((root / p).exists() for p in self.provides):
            return True
        return bool(self.alternatives) and all((root / p).exists() for p in self.alternatives)


_CIFAR10_FILES = tuple(
    f"cifar-10-batches-py/{f}"
    for f in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta")
)
_CIFAR100_FILES = tuple(f"cifar-100-python/{f}" for f in ("train", "test", "meta"))
# Google Drive ids of the CelebA files, as torchvision pins them (datasets/celeba.py).
_GDRIVE = "https://drive.usercontent.google.com/download?id={}&export=download&confirm=t"


def _celeba_file(
    filename: str, drive_id: str, md5: str, size: str, extracts_to: str = ""
) -> RemoteFile:
    """A CelebA file from Google Drive, saved under ``celeba/`` (an archive is extracted)."""
    return RemoteFile(
        filename,
        _GDRIVE.format(drive_id),
        md5,
        target_dir="celeba",
        extract=bool(extracts_to),
        provides=(f"celeba/{extracts_to or filename}",),
        size=size,
    )


def _cifar_c_files(dirname: str) -> tuple[str, ...]:
    return tuple(f"{dirname}/{c}.npy" for c in (*CIFAR_C_CORRUPTIONS, "labels"))


#: What :func:`download` fetches, per name. MD5 sources: torchvision's ``datasets/cifar.py``,
#: ``svhn.py`` and ``celeba.py`` (CIFAR, SVHN, CelebA) and the Zenodo records 2535967 and
#: 3555552 (CIFAR-10-C, CIFAR-100-C); see ``docs/data.md``.
RESOURCES: dict[str, tuple[RemoteFile, ...]] = {
    "cifar10": (
        RemoteFile(
            "cifar-10-python.tar.gz",
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
            "c58f30108f718f92721af3b95e74349a",
            extract=True,
            provides=_CIFAR10_FILES,
            size="163 MiB",
        ),
    ),
    "cifar100": (
        RemoteFile(
            "cifar-100-python.tar.gz",
            "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
            "eb9058c3a382ffc7106e4002c42a8d85",
            extract=True,
            provides=_CIFAR100_FILES,
            size="161 MiB",
        ),
    ),
    "svhn": (
        RemoteFile(
            "train_32x32.mat",
            "http://ufldl.stanford.edu/housenumbers/train_32x32.mat",
            "e26dedcc434d2e4c54c9b2d4a06d8373",
            target_dir="svhn",
            provides=("svhn/train_32x32.mat",),
            alternatives=("train_32x32.mat",),
            size="174 MiB",
        ),
        RemoteFile(
            "test_32x32.mat",
            "http://ufldl.stanford.edu/housenumbers/test_32x32.mat",
            "eb5a983be6a315427106f1b164d9cef3",
            target_dir="svhn",
            provides=("svhn/test_32x32.mat",),
            alternatives=("test_32x32.mat",),
            size="61 MiB",
        ),
    ),
    "celeba": (
        _celeba_file(
            "img_align_celeba.zip",
            "0B7EVK8r0v71pZjFTYXZWM3FlRnM",
            "00d2c5bc6d35e252742224ab0c1e8fcb",
            "1.3 GiB",
            "img_align_celeba",
        ),
        _celeba_file(
            "list_attr_celeba.txt",
            "0B7EVK8r0v71pblRyaVFSWGxPY0U",
            "75e246fa4810816ffd6ee81facbd244c",
            "25 MiB",
        ),
        _celeba_file(
            "list_eval_partition.txt",
            "0B7EVK8r0v71pY0NSMzRuSXJEVkk",
            "d32c9cbf5e040fd4025c592c306e6668",
            "2.7 MiB",
        ),
    ),  # fmt: skip
    "cifar10-c": (
        RemoteFile(
            "CIFAR-10-C.tar",
            "https://zenodo.org/records/2535967/files/CIFAR-10-C.tar?download=1",
            "56bf5dcef84df0e2308c6dcbcbbd8499",
            extract=True,
            provides=_cifar_c_files("CIFAR-10-C"),
            size="2.7 GiB",
        ),
    ),
    "cifar100-c": (
        RemoteFile(
            "CIFAR-100-C.tar",
            "https://zenodo.org/records/3555552/files/CIFAR-100-C.tar?download=1",
            "11f0ed0f1191edbf9fa23466ae6021d3",
            extract=True,
            provides=_cifar_c_files("CIFAR-100-C"),
            size="2.7 GiB",
        ),
    ),
}


def download_names() -> list[str]:
    """Names :func:`download` accepts, sorted."""
    return sorted(RESOURCES)


def describe(name: str) -> str:
    """One line naming the files of ``name`` and their sizes, e.g. for error messages."""
    return ", ".join(f"{f.filename}, {f.size}" if f.size else f.filename for f in RESOURCES[name])


# --------------------------------------------------------------------------- mirror


def resolve_mirror(mirror: str | os.PathLike[str] | None) -> str | None:
    """The mirror base URL to use: ``mirror``, else ``$COGCAL_DATA_MIRROR``, else None.

    A local directory is turned into a ``file://`` URL; the result has no trailing slash.

    Raises
    ------
    ArgumentError
        Not an ``http://``, ``https://`` or ``file://`` URL nor an existing directory.
    """
    source = "mirror"
    if mirror is None:
        mirror = os.environ.get(MIRROR_ENV) or None
        source = MIRROR_ENV
        if mirror is None:
            return None
    text = os.fspath(mirror).strip()
    scheme = urllib.parse.urlsplit(text).scheme.lower()
    if scheme in ("http", "https", "file"):
        return text.rstrip("/")
    if Path(text).expanduser().is_dir():
        return Path(text).expanduser().resolve().as_uri()
    what = f"mirror={text!r}" if source == "mirror" else f"{MIRROR_ENV}={text!r}"
    cli = f"--mirror {text}" if source == "mirror" else f"{MIRROR_ENV}={text!r}"
    expected = (
        "an http://, https:// or file:// URL or an existing local directory holding the "
        "official file names (e.g. https://mirror.example.org/datasets)"
    )
    raise ArgumentError(f"{what} is not {expected}.", cli_message=f"{cli} is not {expected}.")


def _url_for(entry: RemoteFile, mirror: str | None) -> str:
    if mirror is None:
        return entry.url
    return f"{mirror}/{urllib.parse.quote(entry.filename)}"


# --------------------------------------------------------------------------- errors


def _fail(
    name: str, entry: RemoteFile, url: str, root: Path, mirror: str | None, problem: str
) -> DownloadError:
    layout = ", ".join(entry.provides[:3]) + (", ..." if len(entry.provides) > 3 else "")
    head = f"could not download {entry.filename} (dataset {name!r}) from {url}: {problem}. "
    if mirror:
        py_src = (
            f"Check that the mirror (mirror={mirror!r}) is reachable and serves the official "
            f"file names in one folder ({mirror}/{entry.filename}); or use the official hosts "
            f"(mirror=None and no {MIRROR_ENV})"
        )
        cli_src = (
            f"Check that the mirror (--mirror {mirror}) is reachable and serves the official "
            f"file names in one folder ({mirror}/{entry.filename}); or use the official hosts "
            f"(no --mirror and no {MIRROR_ENV})"
        )
    else:
        py_src = (
            "Check the network connection; or fetch the files from an internal mirror with "
            f"mirror='https://HOST/PATH' (or the {MIRROR_ENV} environment variable), which "
            "serves the official file names"
        )
        cli_src = (
            "Check the network connection; or fetch the files from an internal mirror with "
            f"--mirror https://HOST/PATH (or the {MIRROR_ENV} environment variable), which "
            "serves the official file names"
        )
    tail = "; a partial download is resumed on the next run. Or put the files under the data root "
    return DownloadError(
        f"{head}{py_src}{tail}yourself (root={str(root)!r}; expected there: {layout}).",
        cli_message=f"{head}{cli_src}{tail}yourself (--data-root {root}; expected there: "
        f"{layout}).",
    )


def _reason(err: BaseException) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        inner = err.reason
        return (
            f"{type(inner).__name__}: {inner}" if isinstance(inner, BaseException) else str(inner)
        )
    return f"{type(err).__name__}: {err}"


class _Retry(Exception):
    """A transient failure: try again (resuming)."""


class _Fatal(Exception):
    """A failure that retrying will not fix (refused, unknown host, HTTP 404, ...)."""


# --------------------------------------------------------------------------- transfer


def md5sum(path: Path) -> str:
    """MD5 hex digest of a file, read in 1 MiB blocks."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _user_agent() -> str:
    return f"cogcal/{__version__} (python urllib)"


def _progress_bar(total: int | None, initial: int, desc: str, enabled: bool) -> Any:
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not enabled,
        leave=True,
        dynamic_ncols=True,
    )


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    if not value or not value.startswith("bytes "):
        return None
    try:
        return int(value[6:].split("-", 1)[0])
    except ValueError:
        return None


def _open(url: str, offset: int) -> Any:
    request = urllib.request.Request(url, headers={"User-Agent": _user_agent()})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        return urllib.request.urlopen(request, timeout=_TIMEOUT)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing left to send: the .part is complete
            return None
        if err.code >= 500 or err.code in (408, 429):
            raise _Retry(_reason(err)) from None
        raise _Fatal(_reason(err)) from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError | ConnectionResetError | ConnectionAbortedError):
            raise _Retry(_reason(err)) from None
        raise _Fatal(_reason(err)) from None
    except (TimeoutError, http.client.HTTPException, ConnectionError) as err:
        raise _Retry(_reason(err)) from None
    except (OSError, ValueError) as err:  # bad URL, unreachable network
        raise _Fatal(_reason(err)) from None


def _attempt(url: str, part: Path, desc: str, progress: bool) -> None:
    """One request: append to (or restart) ``part``; raise ``_Retry`` on interruption."""
    offset = part.stat().st_size if part.exists() else 0
    response = _open(url, offset)
    if response is None:
        return
    with response:
        status = response.getcode()
        if offset and not (
            status == 206 and _content_range_start(response.headers.get("Content-Range")) == offset
        ):
            offset = 0  # the server ignored the range: start over
        ctype = (response.headers.get("Content-Type") or "").lower()
        if ctype.startswith("text/html"):
            raise _Fatal(
                "the server sent an HTML page instead of the file (a login, quota or "
                "confirmation page; Google Drive does this when a file's download quota is "
                "exceeded: try again later or use a mirror)"
            )
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.strip().isdigit() else None
        written = offset
        with (
            open(part, "ab" if offset else "wb") as f,
            _progress_bar(total, offset, desc, progress) as bar,
        ):
            window, window_bytes = time.monotonic(), 0
            while True:
                try:  # read1: what has arrived (written as it comes, resumable)
                    chunk = response.read1(_CHUNK)
                except (http.client.HTTPException, OSError) as err:
                    raise _Retry(_reason(err)) from None
                if not chunk:
                    break
                f.write(chunk)
                written += len(chunk)
                bar.update(len(chunk))
                window_bytes += len(chunk)
                now = time.monotonic()
                if now - window >= _STALL_SECONDS:
                    if window_bytes < _STALL_BYTES and (total is None or written < total):
                        f.flush()
                        raise _Retry(
                            f"stalled: {window_bytes} bytes in {now - window:.0f} s (less than "
                            f"{_STALL_BYTES} bytes per {_STALL_SECONDS:g} s)"
                        )
                    window, window_bytes = now, 0
    if total is not None and written < total:
        raise _Retry(f"connection closed after {written} of {total} bytes")


def _fetch(name: str, entry: RemoteFile, root: Path, mirror: str | None, progress: bool) -> Path:
    """Download ``entry`` to ``root/target_dir/filename`` (verified), return the path."""
    folder = root / entry.target_dir
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / entry.filename
    if final.is_file() and md5sum(final) == entry.md5:
        return final  # e.g. an archive whose extraction was interrupted
    part = folder / (entry.filename + ".part")
    url = _url_for(entry, mirror)
    resumed = part.exists() and part.stat().st_size > 0
    while True:
        problem = ""
        for attempt in range(_ATTEMPTS):
            if attempt:
                time.sleep(_RETRY_BACKOFF * attempt)
            try:
                _attempt(url, part, entry.filename, progress)
                break
            except _Retry as err:
                problem = str(err)
            except _Fatal as err:
                raise _fail(name, entry, url, root, mirror, str(err)) from None
        else:
            raise _fail(
                name, entry, url, root, mirror, f"interrupted {_ATTEMPTS} times ({problem})"
            )
        got = md5sum(part)
        if got == entry.md5:
            os.replace(part, final)
            return final
        part.unlink(missing_ok=True)
        if not resumed:
            break
        resumed = False  # the old .part may have held another file: once more from scratch
    msg = (
        f"{entry.filename} downloaded from {url} has MD5 {got}, expected {entry.md5} (pinned "
        "for the official file); the download has been removed."
    )
    if mirror:
        return_py = " Check that the mirror (mirror=) serves the official, unmodified file."
        return_cli = " Check that the mirror (--mirror) serves the official, unmodified file."
    else:
        return_py = return_cli = ""
    raise ChecksumError(
        f"{msg}{return_py} Run again to retry.", cli_message=f"{msg}{return_cli} Run again."
    )


def _safe_members(tar: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """Members of ``tar`` that stay inside ``dest`` (used where tarfile lacks filters)."""
    out = []
    base = dest.resolve()
    for m in tar.getmembers():
        target = (dest / m.name).resolve()
        if base not in (target, *target.parents) or m.issym() or m.islnk() or m.isdev():
            raise tarfile.TarError(f"refusing to extract {m.name!r} (outside the folder or a link)")
        out.append(m)
    return out


def _extract(archive: Path, dest: Path) -> None:
    name = archive.name.lower()
    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)  # zipfile drops absolute paths and '..' components
        return
    mode = "r:gz" if name.endswith((".tar.gz", ".tgz")) else "r:"
    with tarfile.open(archive, mode) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python < 3.10.12 / 3.11.4
            tar.extractall(dest, members=_safe_members(tar, dest))


def _merge_move(src: Path, dest: Path) -> None:
    """Move ``src``'s entries into ``dest``: whole folders when new, else file by file."""
    for item in sorted(src.iterdir()):
        target = dest / item.name
        if item.is_dir() and target.is_dir():
            _merge_move(item, target)
        else:
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(item, target)


def _install(entry: RemoteFile, path: Path, progress: bool) -> None:
    if not entry.extract:
        return
    dest = path.parent
    if progress:
        print(f"extracting {path.name} into {dest} ...", file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.extract-", dir=dest))
    try:
        try:
            _extract(path, tmp)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError) as err:
            path.unlink(missing_ok=True)
            raise DownloadError(
                f"cannot extract {path}: {type(err).__name__}: {err}; the archive has been "
                "removed, run again to download it anew."
            ) from None
        _merge_move(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    path.unlink(missing_ok=True)


def _lock(path: Path, what: str, progress: bool) -> contextlib.AbstractContextManager[None]:
    """Hold the download lock ``path`` (:func:`cogcal._io.file_lock`), waiting for another
    process downloading the same dataset into the same data root (e.g. the parallel runs of
    a benchmark all started with ``--download``) rather than refusing."""

    def tell() -> None:
        if progress:
            print(
                f"waiting for another process downloading {what} into {path.parent} ...",
                file=sys.stderr,
                flush=True,
            )

    path.parent.mkdir(parents=True, exist_ok=True)
    return _io.file_lock(path, what=f"the download of {what}", wait=tell)


def download(
    name: str,
    root: str | os.PathLike[str] = "data",
    *,
    mirror: str | None = None,
    progress: bool = True,
) -> list[str]:
    """Download a dataset's official files into ``root`` (only those that are missing).

    Parameters
    ----------
    name : str
        One of :func:`download_names` (case-insensitive): ``cifar10``, ``cifar100``,
        ``svhn``, ``celeba``, ``cifar10-c``, ``cifar100-c``.
    root : str or Path, default "data"
        Data root; the files land in the layouts :func:`~cogcal.data.load_dataset` and
        :func:`~cogcal.data.shift_sets` read (``docs/data.md``).
    mirror : str, optional
        Base URL of a mirror serving the same file names (``MIRROR/<file name>``), a
        ``file://`` URL or a local directory. Default: ``$COGCAL_DATA_MIRROR``, else the
        official hosts.
    progress : bool, default True
        Progress bars on stderr.

    Returns
    -------
    list of str
        The file names downloaded (empty when everything was already in place).

    Raises
    ------
    DownloadError
        Network unreachable, HTTP error, or too many interruptions (the partial download is
        kept and resumed next time); the data root is not writable.
    ChecksumError
        The file does not have the pinned MD5 sum (it is removed).
    ArgumentError
        Unknown name or bad mirror.

    Notes
    -----
    Concurrent calls for the same dataset and data root (several processes) wait for each
    other through a lock file ``ROOT/.cogcal-download-<name>.lock`` (POSIX ``flock``), so
    the files are fetched once.
    """
    key = str(name).strip().lower()
    if key not in RESOURCES:
        raise ArgumentError(
            f"nothing to download for dataset {name!r}; downloadable: "
            f"{', '.join(download_names())} (mnist1d and digits need no download).",
        )
    root_path = Path(root).expanduser()
    base = resolve_mirror(mirror)
    if all(entry.present(root_path) for entry in RESOURCES[key]):
        return []
    fetched = []
    try:
        with _lock(root_path / f".cogcal-download-{key}.lock", key, progress):
            for entry in RESOURCES[key]:
                if entry.present(root_path):  # possibly fetched meanwhile by another process
                    continue
                path = _fetch(key, entry, root_path, base, progress)
                _install(entry, path, progress)
                fetched.append(entry.filename)
    except OSError as err:  # local file system: the network errors are DownloadErrors
        problem = f"{type(err).__name__}: {err}"
        raise DownloadError(
            f"cannot write the files of {key!r} under the data root {str(root_path)!r} "
            f"({problem}); free some space or choose a writable data root (root=...).",
            cli_message=f"cannot write the files of {key!r} under the data root {root_path} "
            f"({problem}); free some space or choose a writable data root (--data-root DIR).",
        ) from err
    return fetched


def ensure(names: Sequence[str], root: Path, *, mirror: str | None, progress: bool) -> None:
    """:func:`download` each of ``names`` that is downloadable."""
    for n in names:
        if n in RESOURCES:
            download(n, root, mirror=mirror, progress=progress)
