"""From a run to predictions: `cogcal predict`, exports that take raw inputs, `load_run`."""

from __future__ import annotations

import csv
import json
import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import cogcal
from cogcal.cli import main

CLASSES = ("barolo", "grignolino", "barbera")


def _wine(path, rows=None):
    from sklearn.datasets import load_wine

    d = load_wine()
    cols = [c.replace("/", "_") for c in d.feature_names]
    idx = range(len(d.target)) if rows is None else rows
    lines = [",".join([*cols, "cultivar"])]
    lines += [",".join(f"{v:g}" for v in d.data[i]) + f",{CLASSES[d.target[i]]}" for i in idx]
    path.write_text("\n".join(lines) + "\n")
    return cols


def _digit_pngs(root, per_class=25):
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for k in range(10):
        (root / f"digit{k}").mkdir(parents=True)
        for n, i in enumerate(np.flatnonzero(d.target == k)[:per_class]):
            pixels = np.rint(d.images[i] * 255 / 16).astype(np.uint8)
            Image.fromarray(pixels, "L").save(root / f"digit{k}" / f"{n}.png")


def _read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    root = tmp_path_factory.mktemp("wine")
    cols = _wine(root / "wine.csv")
    argv = ["train", "--dataset", f"csv:{root / 'wine.csv'}", "--target", "cultivar"]
    argv += ["--method", "ts", "--epochs", "2", "--lr", "1e-2", "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a separable validation split: documented warning
        assert main([*argv, "--out", str(root / "run")]) == 0
    return root, cols


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("pngs")
    _digit_pngs(root / "digits")
    argv = ["train", "--dataset", f"folder:{root / 'digits'}", "--image-size", "8"]
    argv += ["--method", "ms", "--epochs", "2", "--lr", "1e-2", "--no-progress"]
    assert main([*argv, "--out", str(root / "run")]) == 0
    return root


def _export_probs(run_dir, x):
    exported = cogcal.load_run(run_dir).model.export()
    with torch.no_grad():
        return exported(x).double().softmax(1).numpy(), exported


@pytest.mark.slow
def test_predict_a_csv_matches_the_export_on_raw_rows(wine, tmp_path):
    root, cols = wine
    new = tmp_path / "new.csv"
    _wine(new, rows=range(0, 178, 7))
    out = tmp_path / "p.csv"
    assert main(["predict", str(root / "run"), "--input", str(new), "--out", str(out)]) == 0
    header, rows = _read(out)
    assert header[0] == "prediction" and sorted(header[1:]) == sorted(CLASSES)
    probs = np.array([[float(v) for v in r[1:]] for r in rows])
    assert len(rows) == 26
    np.testing.assert_allclose(probs.sum(1), 1, atol=1e-6)
    assert [r[0] for r in rows] == [header[1:][i] for i in probs.argmax(1)]
    # the export takes the raw rows (its standardisation inside) and gives the same numbers
    from sklearn.datasets import load_wine

    raw = torch.tensor(load_wine().data[0:178:7], dtype=torch.float32)
    expected, exported = _export_probs(root / "run", raw)
    assert exported.class_names == header[1:]
    np.testing.assert_allclose(probs, expected, atol=1e-5)
    assert (probs.argmax(1) == expected.argmax(1)).all()
    # the raw rows are not standardised by the user: accuracy is that of the run
    truth = [CLASSES[t] for t in load_wine().target[0:178:7]]
    assert np.mean([r[0] == t for r, t in zip(rows, truth, strict=True)]) > 0.8


@pytest.mark.slow
def test_predict_an_image_folder_and_one_image(digits_folder, tmp_path, capsys):
    from PIL import Image

    root = digits_folder
    out = tmp_path / "p.csv"
    assert main(["predict", str(root / "run"), "--input", str(root / "digits"),
                 "--out", str(out)]) == 0  # fmt: skip
    header, rows = _read(out)
    assert header[:2] == ["file", "prediction"] and header[2:] == [f"digit{k}" for k in range(10)]
    assert len(rows) == 250 and rows[0][0] == "digit0/0.png"
    probs = np.array([[float(v) for v in r[2:]] for r in rows])
    np.testing.assert_allclose(probs.sum(1), 1, atol=1e-6)
    # the export on the decoded pixels (uint8, as stored) gives the same probabilities
    pixels = torch.from_numpy(
        np.stack([np.asarray(Image.open(root / "digits" / r[0]))[None] for r in rows])
    )
    expected, exported = _export_probs(root / "run", pixels)
    np.testing.assert_allclose(probs, expected, atol=1e-5)
    assert isinstance(exported[0], cogcal.data.Preprocess)
    # post-hoc matrix scaling folded into the last layer: no appended calibrator
    assert not any(type(m).__module__.startswith("cogcal.calibrators") for m in exported.modules())
    # one image, to stdout
    capsys.readouterr()
    assert main(["predict", str(root / "run"), "--input", str(root / "digits/digit3/0.png")]) == 0
    header1, *row = capsys.readouterr().out.splitlines()
    assert header1.split(",")[:2] == ["file", "prediction"]
    one = [float(v) for v in row[0].split(",")[2:]]
    np.testing.assert_allclose(one, probs[75], atol=1e-6)  # batch size changes float rounding
    # an .npy of the same pixels, and of larger images (resized inside the export)
    npy = tmp_path / "x.npy"
    np.save(npy, pixels[:5].numpy())
    assert (
        main(["predict", str(root / "run"), "--input", str(npy), "--out", str(tmp_path / "n.csv")])
        == 0
    )
    from_npy = np.array([[float(v) for v in r[1:]] for r in _read(tmp_path / "n.csv")[1]])
    np.testing.assert_allclose(from_npy, probs[:5], atol=1e-6)
    big = torch.nn.functional.interpolate(pixels[:5].float(), size=(16, 16), mode="nearest")
    with torch.no_grad():
        assert exported(big).shape == (5, 10)


@pytest.mark.slow
def test_predict_errors_name_the_column_file_or_shape(wine, digits_folder, tmp_path, capsys):
    root, cols = wine
    run = str(root / "run")

    def error(path):
        capsys.readouterr()
        assert main(["predict", run if "png" not in str(path) else str(digits_folder / "run"),
                     "--input", str(path)]) == 2  # fmt: skip
        return capsys.readouterr().err

    missing = tmp_path / "missing.csv"
    missing.write_text(",".join(cols[1:]) + "\n" + ",".join(["1"] * 12) + "\n")
    assert f"missing feature column(s) '{cols[0]}'" in error(missing)
    extra = tmp_path / "extra.csv"
    extra.write_text(",".join([*cols, "id"]) + "\n" + ",".join(["1"] * 14) + "\n")
    assert "extra column(s) 'id'" in error(extra)
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(cols) + "\n" + ",".join(["x"] + ["1"] * 12) + "\n")
    assert f"line 2, column '{cols[0]}': 'x' is not a finite number" in error(bad)
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((4, 12)))
    assert "an array of shape (4, 12); this run takes (N, 13)" in error(npy)
    assert "not image files" in error(tmp_path)
    assert "no such file" in error(tmp_path / "nope.csv")
    from PIL import Image

    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "rgb.png")
    assert "trained on grey images" in error(tmp_path / "rgb.png")
    np.save(tmp_path / "png_last.npy", np.zeros((2, 8, 8, 1), np.uint8))
    assert "channels last" in error(tmp_path / "png_last.npy")
    np.save(tmp_path / "png_unit.npy", np.full((2, 1, 8, 8), 0.5, np.float32))
    assert "multiply by 255" in error(tmp_path / "png_unit.npy")
    out = tmp_path / "taken.csv"
    out.write_text("mine\n")
    good = tmp_path / "good.csv"
    _wine(good, rows=range(3))
    assert main(["predict", run, "--input", str(good), "--out", str(out)]) == 2
    assert out.read_text() == "mine\n"  # nothing the user has is replaced


@pytest.mark.slow
def test_onnx_export_takes_raw_rows_and_carries_the_class_names(wine, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from sklearn.datasets import load_wine

    root, _ = wine
    loaded = cogcal.load_run(root / "run")
    with pytest.raises(ValueError, match="`model=` is for runs of cogcal.fit"):
        cogcal.load_run(root / "run", model=_net())
    path = loaded.to_onnx(tmp_path / "wine.onnx")
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(meta["class_names"]) == sorted(CLASSES)
    assert json.loads(meta["input"])["features"][0] == "alcohol"
    raw = load_wine().data[:10].astype(np.float32)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": raw})[
        0
    ]
    with torch.no_grad():
        expected = loaded.model(torch.from_numpy(raw)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def _net():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ms", "cog-fc", "tst"])
def test_load_run_into_your_own_model(tmp_path, method):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    out = tmp_path / "run"
    fitted = cogcal.fit(_net(), (x, y), method=method, epochs=2, out=out, progress=False,
                        stage2_epochs=1)  # fmt: skip
    with pytest.raises(ValueError, match=r"model given in Python .*model=Sequential"):
        cogcal.load_run(out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the export folds without a warning
        loaded = cogcal.load_run(out, model=_net())
        exported = loaded.model.export()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), fitted.model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(exported(x), fitted.model(x), rtol=1e-5, atol=1e-5)
    if method == "ms":  # folded: the network's own architecture
        assert [type(m) for m in exported.modules()] == [type(m) for m in _net().modules()]
    assert exported.class_names == ["0", "1", "2"]


@pytest.mark.slow
def test_load_run_names_the_parameter_that_does_not_fit(tmp_path):
    x, y = torch.randn(200, 6), torch.randint(0, 3, (200,))
    out = tmp_path / "run"
    cogcal.fit(_net(), (x, y), method="ce", epochs=1, out=out, progress=False)
    wider = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
    with pytest.raises(ValueError, match=r"0\.weight: the run has shape \(16, 6\), `model` has "
                       r"\(32, 6\)"):  # fmt: skip
        cogcal.load_run(out, model=wider)
    deeper = nn.Sequential(*_net(), nn.ReLU(), nn.Linear(3, 3))
    with pytest.raises(ValueError, match=r"the run has no 4\.weight"):
        cogcal.load_run(out, model=deeper)
    with pytest.raises(ValueError, match="`model` must be an nn.Module"):
        cogcal.load_run(out, model="net")


def test_predictions_table_multilabel_and_name_clashes(tmp_path):
    from cogcal.commands.predict import Predictions

    p = np.array([[0.9, 0.2, 0.7], [0.1, 0.4, 0.3]])
    multi = Predictions(p, ["smiling", "young", "glasses"], "multilabel")
    assert multi.labels == ["smiling;glasses", ""]
    multi.write_csv(tmp_path / "m.csv")
    header, rows = _read(tmp_path / "m.csv")
    assert header == ["prediction", "smiling", "young", "glasses"]
    assert rows[0] == ["smiling;glasses", "0.9", "0.2", "0.7"]
    clash = Predictions(np.array([[0.5, 0.5]]), ["prediction", "other"], "multiclass")
    with pytest.raises(ValueError, match="clash"):
        clash.write_csv(tmp_path / "c.csv")
    assert not (tmp_path / "c.csv").exists()


@pytest.mark.slow
def test_reading_a_run_excludes_writing_it(tmp_path, lock_holder, capsys):
    """load_run / predict hold the run folder shared: a process writing it (training,
    --overwrite) refuses them, and they refuse it; readers share."""
    from cogcal._io import LockedError
    from cogcal.runs import RunDir

    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    holder = lock_holder(out)  # another process writing the folder
    with pytest.raises(LockedError, match=f"being written by process {holder.pid}"):
        cogcal.load_run(out)
    (tmp_path / "x.npy").write_bytes(b"")
    assert main(["predict", str(out), "--input", str(tmp_path / "x.npy")]) == 2
    err = capsys.readouterr().err
    assert f"being written by process {holder.pid}" in err and err.count("\n") == 1
    holder.kill()
    holder.wait()
    folder = RunDir(out)
    refused = pytest.raises(LockedError, match=f"in use by process {os.getpid()}")
    # readers share the folder; a writer is refused while it is read
    with folder.read_lock(), folder.read_lock(), refused, folder.lock():
        pass
    with folder.lock():  # and takes it once the readers are done
        pass
    assert (out / "notes.txt").read_text() == "keep"


def test_a_read_only_run_folder_is_read_without_its_lock(tmp_path, monkeypatch):
    """A deployed run in a folder the reader cannot write: the shared lock falls back to
    an existing lock file opened read-only, or to no lock at all."""
    from cogcal import _io

    real_open = os.open

    def read_only(path, flags, *args):
        if flags & (os.O_CREAT | os.O_RDWR | os.O_WRONLY):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(_io.os, "open", read_only)
    lock = tmp_path / ".cogcal.lock"
    with _io.shared_lock(lock, what="run folder"):
        assert not lock.exists()  # nothing created, nothing locked
    lock.write_text("")
    with _io.shared_lock(lock, what="run folder"), _io.shared_lock(lock, what="run folder"):
        pass  # the existing file, locked shared through read-only descriptors


def test_reading_a_folder_this_process_writes_is_allowed(tmp_path):
    """Inside the writer's own lock (e.g. a selection adopting its chosen run), the
    shared lock is a no-op instead of refusing the process itself."""
    from cogcal.runs import RunDir

    folder = RunDir(tmp_path / "run")
    with folder.lock(), folder.read_lock():
        assert (tmp_path / "run" / ".cogcal.lock").read_text().strip() == str(os.getpid())


@pytest.mark.parametrize("with_target", [True, False])
@pytest.mark.parametrize("order", ["as trained", "shuffled"])
def test_plain_tables_are_read_as_the_careful_reader_reads_them(
    tmp_path, monkeypatch, with_target, order
):
    """``cogcal predict`` reads a plain table (no quotes, complete rows, numbers) with
    pandas' C parser: the same inputs, bit for bit, and the same target cells as the
    cell-by-cell reader; the columns may come in any order, the target may be absent."""
    from types import SimpleNamespace

    from cogcal.commands import predict as predict_command

    cols = _wine(tmp_path / "w.csv", rows=range(0, 178, 5))
    features = list(cols)
    text = (tmp_path / "w.csv").read_text().splitlines()
    table = [line.split(",") for line in text]
    keep = list(range(len(cols) + 1)) if with_target else list(range(len(cols)))
    if order == "shuffled":
        keep = keep[::-1]
    (tmp_path / "in.csv").write_text("\n".join(",".join(r[i] for i in keep) for r in table) + "\n")
    run = SimpleNamespace(
        input={"features": features, "target": "cultivar"}, input_shape=(len(cols),)
    )
    assert predict_command._read_plain_inputs(tmp_path / "in.csv", run) is not None
    fast = predict_command._read_table(tmp_path / "in.csv", run)
    monkeypatch.setattr(predict_command, "_read_plain_inputs", lambda *args: None)
    careful = predict_command._read_table(tmp_path / "in.csv", run)
    assert torch.equal(fast.x, careful.x) and fast.target == careful.target
    assert (fast.target is not None) == with_target


@pytest.mark.parametrize(
    "text",
    [
        "a,b\n1,2\n3,x\n",  # a word in a number column
        "a,b\n1,2\n3,\n",  # an empty cell
        "a,b\n1,2\n3,inf\n",  # not finite
        "a,b,c\n1,2,3\n",  # an extra column
        "a\n1\n",  # a missing column
        'a,b\n1,"2"\n',  # quotes
    ],
)
def test_irregular_tables_are_left_to_the_careful_reader(tmp_path, text):
    from types import SimpleNamespace

    from cogcal.commands import predict as predict_command

    (tmp_path / "in.csv").write_text(text)
    run = SimpleNamespace(input={"features": ["a", "b"], "target": "y"}, input_shape=(2,))
    assert predict_command._read_plain_inputs(tmp_path / "in.csv", run) is None
