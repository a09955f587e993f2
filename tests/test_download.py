"""Tests of cogcal.data.downloads against a local HTTP server on 127.0.0.1 (no internet).

The server serves tiny synthetic archives in the official formats (a CIFAR-10/100
tar.gz of small pickled batches, SVHN .mat files, a CIFAR-10-C tar of small .npy files, a
CelebA zip), honours HTTP Range requests, and can drop the connection halfway through a
response. The URL/checksum table is patched in each test only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import pickle
import socket
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from cogcal._errors import ArgumentError, cli_message
from cogcal.data import (
    ChecksumError,
    DatasetNotFoundError,
    DownloadError,
    download,
    load_dataset,
    ood_sets,
    shift_sets,
)
from cogcal.data import downloads as dl
from cogcal.data import multitask as mt
from cogcal.data.corruptions import CIFAR_C_CORRUPTIONS

# ----------------------------------------------------------------------------- server


class FileServer:
    """Serves ``files`` (URL path -> bytes) with Range support; records every request."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.content_types: dict[str, str] = {}
        self.drops: dict[str, int] = {}  # path -> responses still to cut halfway
        self.trickle: dict[str, float] = {}  # path -> seconds between single bytes
        self.ignore_range = False
        self.log: list[tuple[str, str | None, int]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # silence
                pass

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                rng = self.headers.get("Range")
                data = server.files.get(path)
                if data is None:
                    server.log.append((path, rng, 404))
                    self.send_error(404)
                    return
                start = 0
                if rng and not server.ignore_range:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        server.log.append((path, rng, 416))
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                status = 206 if start else 200
                body = data[start:]
                server.log.append((path, rng, status))
                self.send_response(status)
                self.send_header(
                    "Content-Type", server.content_types.get(path, "application/octet-stream")
                )
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if server.drops.get(path, 0) > 0:
                    server.drops[path] -= 1
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if path in server.trickle:
                    for i in range(len(body)):
                        try:
                            self.wfile.write(body[i : i + 1])
                            self.wfile.flush()
                        except OSError:  # the client gave up
                            return
                        time.sleep(server.trickle[path])
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def add(self, path: str, data: bytes, content_type: str | None = None) -> str:
        self.files[path] = data
        if content_type:
            self.content_types[path] = content_type
        return self.url + path

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FileServer]:
    s = FileServer()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _fast_and_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dl, "_RETRY_BACKOFF", 0.0)
    monkeypatch.setattr(dl, "_TIMEOUT", 10.0)
    monkeypatch.delenv(dl.MIRROR_ENV, raising=False)


def refused_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/file"


def visible(folder: Path) -> list[str]:
    """Names in ``folder`` except dotfiles (the download lock file)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def patch_entry(
    monkeypatch: pytest.MonkeyPatch, name: str, index: int = 0, **changes: str
) -> dl.RemoteFile:
    entries = list(dl.RESOURCES[name])
    entries[index] = dataclasses.replace(entries[index], **changes)
    monkeypatch.setitem(dl.RESOURCES, name, tuple(entries))
    return entries[index]


# ----------------------------------------------------------------------------- archives


def _pickle(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=2)


def _tar(members: dict[str, bytes], gz: bool) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def cifar10_archive(per_batch: int = 10, n_test: int = 10) -> bytes:
    rng = np.random.default_rng(0)
    members = {}
    for i in range(1, 6):
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = [j % 10 for j in range(per_batch)]
        members[f"cifar-10-batches-py/data_batch_{i}"] = _pickle({"data": data, "labels": labels})
    test = rng.integers(0, 256, (n_test, 3072), dtype=np.uint8)
    members["cifar-10-batches-py/test_batch"] = _pickle(
        {"data": test, "labels": [j % 10 for j in range(n_test)]}
    )
    names = [f"class{i}" for i in range(10)]
    members["cifar-10-batches-py/batches.meta"] = _pickle({"label_names": names})
    return _tar(members, gz=True)


def cifar100_archive(n: int = 100) -> bytes:
    rng = np.random.default_rng(1)
    members = {}
    for split in ("train", "test"):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        members[f"cifar-100-python/{split}"] = _pickle(
            {"data": data, "fine_labels": list(range(100)) * (n // 100)}
        )
    members["cifar-100-python/meta"] = _pickle({"fine_label_names": [f"c{i}" for i in range(100)]})
    return _tar(members, gz=True)


def svhn_mat(n: int, seed: int) -> bytes:
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    buf = io.BytesIO()
    savemat(buf, {"X": x, "y": (np.arange(n) % 10 + 1)[:, None].astype(np.uint8)})
    return buf.getvalue()


def cifar_c_archive(dirname: str = "CIFAR-10-C", n: int = 2) -> bytes:
    members = {}

    def npy(arr: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.save(buf, arr)
        return buf.getvalue()

    for k, cond in enumerate(CIFAR_C_CORRUPTIONS):
        x = np.full((5 * n, 32, 32, 3), k, dtype=np.uint8)
        x[:, 0, 0, 0] = np.repeat(np.arange(1, 6), n) * 10  # severity marker
        members[f"{dirname}/{cond}.npy"] = npy(x)
    members[f"{dirname}/labels.npy"] = npy(np.tile(np.arange(n) % 10, 5).astype(np.int64))
    return _tar(members, gz=False)


def serve_cifar10(server: FileServer, monkeypatch: pytest.MonkeyPatch) -> bytes:
    data = cifar10_archive()
    url = server.add("/cifar-10-python.tar.gz", data)
    patch_entry(monkeypatch, "cifar10", url=url, md5=md5(data))
    return data


# ----------------------------------------------------------------------------- tests


def test_download_cifar10_then_load(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    serve_cifar10(server, monkeypatch)
    ds = load_dataset("cifar10", root=tmp_path, download=True, progress=False)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (40, 10, 10)
    assert ds.class_names[3] == "class3" and ds.train.x.dtype == torch.uint8
    assert ds.default_model == "resnet18"
    # the archive is extracted and removed; nothing temporary is left behind
    assert visible(tmp_path) == ["cifar-10-batches-py"]
    assert len(server.log) == 1
    # everything present: no request at all
    assert download("cifar10", tmp_path, progress=False) == []
    assert load_dataset("CIFAR10", root=tmp_path, download=True, progress=False).num_classes == 10
    assert len(server.log) == 1


def test_progress_bar_on_stderr(
    server: FileServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    serve_cifar10(server, monkeypatch)
    assert download("cifar10", tmp_path, progress=True) == ["cifar-10-python.tar.gz"]
    out = capsys.readouterr()
    assert out.out == ""
    assert "cifar-10-python.tar.gz" in out.err and "extracting" in out.err


def test_checksum_mismatch_removes_the_file(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = cifar10_archive()
    url = server.add("/cifar-10-python.tar.gz", data)
    patch_entry(monkeypatch, "cifar10", url=url, md5="0" * 32)
    with pytest.raises(ChecksumError) as err:
        download("cifar10", tmp_path, progress=False)
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "0" * 32 in msg and md5(data) in msg and "removed" in msg
    assert visible(tmp_path) == []  # neither the file nor its .part is kept
    assert not list(tmp_path.glob("*.part"))


def test_interrupted_download_is_resumed(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = serve_cifar10(server, monkeypatch)
    server.drops["/cifar-10-python.tar.gz"] = 1  # the first response stops halfway
    ds = load_dataset("cifar10", root=tmp_path, download=True, progress=False)
    assert len(ds.test) == 10
    assert [s for _, _, s in server.log] == [200, 206]
    first_range = server.log[1][1]
    assert first_range == f"bytes={len(data) // 2}-"


def test_partial_file_from_an_earlier_run_is_resumed(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = serve_cifar10(server, monkeypatch)
    (tmp_path / "cifar-10-python.tar.gz.part").write_bytes(data[:1000])
    download("cifar10", tmp_path, progress=False)
    assert server.log == [("/cifar-10-python.tar.gz", "bytes=1000-", 206)]
    assert (tmp_path / "cifar-10-batches-py" / "test_batch").is_file()


def test_stale_partial_file_restarts_once_from_scratch(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    serve_cifar10(server, monkeypatch)
    (tmp_path / "cifar-10-python.tar.gz.part").write_bytes(b"garbage from another file")
    download("cifar10", tmp_path, progress=False)
    assert [(r, s) for _, r, s in server.log] == [("bytes=25-", 206), (None, 200)]
    assert (tmp_path / "cifar-10-batches-py" / "batches.meta").is_file()


def test_server_ignoring_range_restarts(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = serve_cifar10(server, monkeypatch)
    server.ignore_range = True
    (tmp_path / "cifar-10-python.tar.gz.part").write_bytes(data[:1000])
    download("cifar10", tmp_path, progress=False)
    assert [s for _, _, s in server.log] == [200]
    assert (tmp_path / "cifar-10-batches-py" / "data_batch_5").is_file()


def test_too_many_interruptions_keep_the_partial_file(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    serve_cifar10(server, monkeypatch)
    server.drops["/cifar-10-python.tar.gz"] = 100
    with pytest.raises(DownloadError, match="interrupted 4 times"):
        download("cifar10", tmp_path, progress=False)
    assert (tmp_path / "cifar-10-python.tar.gz.part").stat().st_size > 0
    server.drops.clear()
    download("cifar10", tmp_path, progress=False)  # resumes from there
    assert server.log[-1][2] == 206


def test_no_network_names_root_and_mirror(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    patch_entry(monkeypatch, "cifar10", url=refused_url())
    with pytest.raises(DownloadError) as err:
        load_dataset("cifar10", root=tmp_path, download=True, progress=False)
    msg, cli = str(err.value), cli_message(err.value)
    assert isinstance(err.value, ArgumentError) and isinstance(err.value, ValueError)
    assert "cifar-10-python.tar.gz" in msg and "ConnectionRefusedError" in msg
    assert f"root={str(tmp_path)!r}" in msg and "mirror=" in msg and "COGCAL_DATA_MIRROR" in msg
    assert f"--data-root {tmp_path}" in cli and "--mirror" in cli
    assert "root=" not in cli and "mirror=" not in cli
    assert not (tmp_path / "cifar-10-batches-py").exists()


def test_mirror_argument_and_environment(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = cifar10_archive()
    server.add("/datasets/cifar-10-python.tar.gz", data)
    patch_entry(monkeypatch, "cifar10", url=refused_url(), md5=md5(data))
    ds = load_dataset(
        "cifar10",
        root=tmp_path / "a",
        download=True,
        mirror=server.url + "/datasets/",
        progress=False,
    )
    assert len(ds.train) == 40
    monkeypatch.setenv(dl.MIRROR_ENV, server.url + "/datasets")
    download("cifar10", tmp_path / "b", progress=False)
    assert (tmp_path / "b" / "cifar-10-batches-py" / "test_batch").is_file()
    assert [p for p, _, _ in server.log] == ["/datasets/cifar-10-python.tar.gz"] * 2
    # a local directory works as a mirror too
    local = tmp_path / "mirror"
    local.mkdir()
    (local / "cifar-10-python.tar.gz").write_bytes(data)
    monkeypatch.delenv(dl.MIRROR_ENV)
    download("cifar10", tmp_path / "c", mirror=str(local), progress=False)
    assert (tmp_path / "c" / "cifar-10-batches-py" / "batches.meta").is_file()


def test_mirror_missing_file_and_bad_mirror(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(DownloadError) as err:
        download("cifar10", tmp_path, mirror=server.url + "/empty", progress=False)
    assert "HTTP 404" in str(err.value)
    assert f"{server.url}/empty/cifar-10-python.tar.gz" in str(err.value)
    assert "--mirror" in err.value.cli_message
    with pytest.raises(ArgumentError, match="mirror='ftp://x'") as bad:
        download("cifar10", tmp_path, mirror="ftp://x", progress=False)
    assert "--mirror ftp://x" in bad.value.cli_message
    monkeypatch.setenv(dl.MIRROR_ENV, "/no/such/dir")
    with pytest.raises(ArgumentError, match="COGCAL_DATA_MIRROR"):
        download("cifar10", tmp_path, progress=False)


def test_html_instead_of_file(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = server.add("/gdrive", b"<html>quota exceeded</html>", content_type="text/html")
    patch_entry(monkeypatch, "celeba", 1, url=url)
    (tmp_path / "celeba" / "img_align_celeba").mkdir(parents=True)  # the zip is "present"
    with pytest.raises(DownloadError, match="HTML page instead of the file"):
        download("celeba", tmp_path, progress=False)
    assert not list((tmp_path / "celeba").glob("*.txt*"))


def test_broken_archive_with_matching_checksum(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = b"this is not a tar file" * 10
    url = server.add("/cifar-10-python.tar.gz", data)
    patch_entry(monkeypatch, "cifar10", url=url, md5=md5(data))
    with pytest.raises(DownloadError, match="cannot extract"):
        download("cifar10", tmp_path, progress=False)
    assert visible(tmp_path) == []


def test_concurrent_downloads_wait_for_each_other(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import fcntl

    serve_cifar10(server, monkeypatch)
    results: list[object] = []
    with open(tmp_path / ".cogcal-download-cifar10.lock", "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # "another process" is downloading
        worker = threading.Thread(
            target=lambda: results.append(download("cifar10", tmp_path, progress=False))
        )
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and server.log == []  # waiting, not downloading
        # the other process finishes: it put the files in place
        serve_root = tmp_path / "elsewhere"
        download("cifar10", serve_root, progress=False)
        (serve_root / "cifar-10-batches-py").rename(tmp_path / "cifar-10-batches-py")
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(10)
    assert results == [[]]  # found the files in place: fetched nothing
    assert len(server.log) == 1


def test_unwritable_root(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    serve_cifar10(server, monkeypatch)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(DownloadError) as err:
        download("cifar10", blocker / "root", progress=False)
    assert "writable data root (root=...)" in str(err.value)
    assert "--data-root" in err.value.cli_message


def test_unknown_download_name(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match=r"downloadable: .*cifar10-c"):
        download("mnist1d", tmp_path)


def test_missing_files_message_names_download(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("cifar10", root=tmp_path)
    msg, cli = str(err.value), err.value.cli_message
    assert (
        str(tmp_path / "cifar-10-batches-py" / "data_batch_1") in msg and "Expected layout" in msg
    )
    assert "download=True" in msg and "root=" in msg and "--download" not in msg
    assert "--download" in cli and "--data-root" in cli
    assert "download=True" not in cli and "root=" not in cli and "load_dataset" not in cli


def test_svhn_download_into_svhn_folder(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for i, (name, n) in enumerate((("train_32x32.mat", 20), ("test_32x32.mat", 10))):
        data = svhn_mat(n, seed=i)
        patch_entry(monkeypatch, "svhn", i, url=server.add("/" + name, data), md5=md5(data))
    ds = load_dataset("svhn", root=tmp_path, download=True, progress=False)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (16, 4, 10)
    assert sorted(p.name for p in (tmp_path / "svhn").iterdir()) == [
        "test_32x32.mat",
        "train_32x32.mat",
    ]
    # torchvision's layout (files directly in the root) counts as present
    other = tmp_path / "tv"
    other.mkdir()
    for name in ("train_32x32.mat", "test_32x32.mat"):
        (other / name).write_bytes((tmp_path / "svhn" / name).read_bytes())
    n_requests = len(server.log)
    assert download("svhn", other, progress=False) == []
    assert len(server.log) == n_requests


def test_cifar10_c_download_and_shift_sets(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    serve_cifar10(server, monkeypatch)
    data = cifar_c_archive()
    patch_entry(monkeypatch, "cifar10-c", url=server.add("/CIFAR-10-C.tar", data), md5=md5(data))
    ds = load_dataset("cifar10", root=tmp_path, download=True, progress=False)
    sets, missing = shift_sets(ds, root=tmp_path, conditions=["fog"])
    assert sets == {} and "download=True" in missing["fog"]
    assert "--download" in missing["fog"].cli_message  # type: ignore[attr-defined]
    sets, missing = shift_sets(
        ds, root=tmp_path, conditions=["fog", "snow"], download=True, progress=False
    )
    assert missing == {} and sorted(sets) == ["fog", "snow"]
    k = CIFAR_C_CORRUPTIONS.index("snow")
    for s in range(1, 6):
        x = sets["snow"][s].x
        assert x.shape == (2, 3, 32, 32) and int(x[0, 0, 0, 0]) == 10 * s
        assert int(x[0, 1, 5, 5]) == k
    assert not (tmp_path / "CIFAR-10-C.tar").exists()
    assert len(list((tmp_path / "CIFAR-10-C").glob("*.npy"))) == len(CIFAR_C_CORRUPTIONS) + 1


def test_ood_sets_download_partners(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    serve_cifar10(server, monkeypatch)
    c100 = cifar100_archive()
    patch_entry(
        monkeypatch, "cifar100", url=server.add("/cifar-100-python.tar.gz", c100), md5=md5(c100)
    )
    for i, (name, n) in enumerate((("train_32x32.mat", 20), ("test_32x32.mat", 7))):
        data = svhn_mat(n, seed=i)
        patch_entry(monkeypatch, "svhn", i, url=server.add("/" + name, data), md5=md5(data))
    ds = load_dataset("cifar10", root=tmp_path, download=True, progress=False)
    sets, missing = ood_sets(ds, root=tmp_path)
    assert sets == {} and set(missing) == {"svhn", "cifar100"}
    assert "--download" in missing["svhn"].cli_message  # type: ignore[attr-defined]
    sets, missing = ood_sets(ds, root=tmp_path, download=True, progress=False)
    assert missing == {}
    assert tuple(sets["svhn"].shape) == (7, 3, 32, 32)
    assert tuple(sets["cifar100"].shape) == (100, 3, 32, 32)


def test_celeba_zip_download(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from PIL import Image

    names = [f"{i:06d}.jpg" for i in range(1, 5)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for i, name in enumerate(names):
            img = io.BytesIO()
            Image.new("RGB", (40, 50), (40 * i, 20 + 30 * i, 200 - 25 * i)).save(img, format="JPEG")
            z.writestr(f"img_align_celeba/{name}", img.getvalue())
    attr = [str(len(names)), " ".join(mt.CELEBA_ATTRIBUTES)]
    attr += [
        f"{n} " + " ".join("1" if (i + j) % 3 else "-1" for j in range(40))
        for i, n in enumerate(names)
    ]
    part = [f"{n} {p}" for n, p in zip(names, (0, 0, 1, 2), strict=True)]
    files = [buf.getvalue(), ("\n".join(attr) + "\n").encode(), ("\n".join(part) + "\n").encode()]
    for i, data in enumerate(files):
        url = server.add(f"/c{i}", data)
        patch_entry(monkeypatch, "celeba", i, url=url, md5=md5(data))
    ds = load_dataset("celeba", root=tmp_path, download=True, progress=False)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (2, 1, 1)
    assert ds.task == "multilabel" and ds.num_classes == 40
    assert not (tmp_path / "celeba" / "img_align_celeba.zip").exists()
    assert len(list((tmp_path / "celeba" / "img_align_celeba").iterdir())) == 4


def test_pinned_checksums_are_the_official_ones() -> None:
    """The MD5 sums of torchvision (CIFAR, SVHN, CelebA) and of the Zenodo records."""
    from torchvision.datasets import CIFAR10, CIFAR100, SVHN, CelebA

    pinned = {f.filename: f.md5 for files in dl.RESOURCES.values() for f in files}
    assert pinned["cifar-10-python.tar.gz"] == CIFAR10.tgz_md5
    assert pinned["cifar-100-python.tar.gz"] == CIFAR100.tgz_md5
    for _, name, md5sum in SVHN.split_list.values():
        if name in pinned:
            assert pinned[name] == md5sum
    tv_celeba = {name: md5sum for _, md5sum, name in CelebA.file_list}
    for name in ("img_align_celeba.zip", "list_attr_celeba.txt", "list_eval_partition.txt"):
        assert pinned[name] == tv_celeba[name]
    assert pinned["CIFAR-10-C.tar"] == "56bf5dcef84df0e2308c6dcbcbbd8499"
    assert pinned["CIFAR-100-C.tar"] == "11f0ed0f1191edbf9fa23466ae6021d3"
    assert all(len(v) == 32 for v in pinned.values())


@pytest.mark.slow
def test_a_trickling_download_is_a_stall_not_a_hang(
    server: FileServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """1 byte every 0.05 s keeps each read under the socket timeout; the stall deadline
    (here 1 s for 1 kB) ends the attempt, and what arrived is kept in the .part file."""
    serve_cifar10(server, monkeypatch)
    server.trickle["/cifar-10-python.tar.gz"] = 0.05
    monkeypatch.setattr(dl, "_STALL_SECONDS", 1.0)
    monkeypatch.setattr(dl, "_STALL_BYTES", 1024)
    monkeypatch.setattr(dl, "_ATTEMPTS", 2)
    started = time.monotonic()
    with pytest.raises(DownloadError, match=r"interrupted 2 times \(stalled: \d+ bytes in 1 s"):
        download("cifar10", tmp_path, progress=False)
    assert time.monotonic() - started < 30
    assert (tmp_path / "cifar-10-python.tar.gz.part").stat().st_size > 0
    server.trickle.clear()
    download("cifar10", tmp_path, progress=False)  # resumes from what arrived
    assert server.log[-1][2] == 206
