"""Predictions of a finished run on new inputs (``cogcal predict``).

:func:`read_inputs` reads what a user has: a CSV table with the run's feature columns, an
image file or a folder of images, or an ``.npy`` array; :func:`predict` runs the loaded
run's model on them (its recorded preprocessing inside, :func:`cogcal.load_run`) and
returns class probabilities named by class; :meth:`Predictions.write_csv` writes one row
per input: ``prediction`` (the class name), then one probability column per class.

Every problem with the input is a ``ValueError`` naming the file, the column or the shape
and what the run expects.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from cogcal import _io
from cogcal._constraints import COUNT, check
from cogcal._errors import ArgumentError
from cogcal.commands._common import UserError, on_free_cpus
from cogcal.conformal import ALPHA, DEFAULT_METHOD, ConformalSets
from cogcal.data.folders import image_files
from cogcal.data.images import GRAYSCALE_MODES, IMAGE_EXTENSIONS, resize_center_crop
from cogcal.data.tables import read_plain_table, read_table
from cogcal.report.run_report import choice_line
from cogcal.runs.methods import get_method
from cogcal.train.assemble import LoadedRun, load_run
from cogcal.train.sources import EVAL_BATCH

__all__ = ["Inputs", "Predictions", "predict", "read_inputs", "run"]

#: Inputs at least this large show a progress bar (stderr) when ``progress`` is on.
PROGRESS_IMAGES = 200
PROGRESS_ROWS = 50_000
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class PredictInputError(ArgumentError):
    """The inputs given to :func:`predict` do not fit the run (names the file or column)."""


@dataclass
class Inputs:
    """Raw inputs read for a run: ``x`` ``(N, *input_shape)`` and where each row came from.

    Attributes
    ----------
    x : torch.Tensor
        Raw inputs as the run's data stores them (``uint8`` pixels, float features).
    ids : list of str or None
        One name per input (the image files, relative to the folder given); None for
        tables and arrays, whose rows keep their order.
    target : tuple of (str, list of str) or None
        A CSV's target column, when present: its name and values (not used to predict).
    source : str
        What was read, for messages.
    """

    x: torch.Tensor
    ids: list[str] | None = None
    target: tuple[str, list[str]] | None = None
    source: str = ""


@dataclass
class Predictions:
    """Class probabilities of a run on new inputs (:func:`predict`).

    Attributes
    ----------
    probabilities : numpy.ndarray
        ``(N, K)`` float64: softmax of the calibrated logits (multi-label: one sigmoid per
        task).
    class_names : list of str
        One name per column of ``probabilities``.
    task : str
        ``"multiclass"`` or ``"multilabel"``.
    ids : list of str or None
        One name per input (image files), else None.
    notes : list of str
        Things the caller should tell the user (an unused target column and the accuracy
        against it).
    sets : numpy.ndarray or None
        ``(N, K)`` booleans: the conformal prediction set of each input (``predict(...,
        sets=)``), else None.
    """

    probabilities: np.ndarray
    class_names: list[str]
    task: str
    ids: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    sets: np.ndarray | None = None

    @property
    def labels(self) -> list[str]:
        """The predicted class name of each input (multi-label: the tasks with p >= 0.5,
        joined by ``;``)."""
        if self.task == "multilabel":
            return [
                ";".join(n for n, p in zip(self.class_names, row, strict=True) if p >= 0.5)
                for row in self.probabilities
            ]
        return [self.class_names[i] for i in self.probabilities.argmax(axis=1)]

    def columns(self) -> list[str]:
        """Header of :meth:`write_csv`: ``file`` (images), ``prediction``, with prediction
        sets ``set_size`` and ``set``, then one per class."""
        lead = (["file"] if self.ids is not None else []) + ["prediction"]
        lead += ["set_size", "set"] if self.sets is not None else []
        clash = sorted(set(lead) & set(self.class_names))
        if clash or len(set(self.class_names)) != len(self.class_names):
            raise PredictInputError(
                f"class names {', '.join(map(repr, clash or self.class_names))} clash with "
                "the output's other columns or with each other; cannot name one column per "
                "class."
            )
        return lead + list(self.class_names)

    def write_csv(self, out: str | os.PathLike[str] | TextIO | None = None) -> None:
        """Write one row per input (``out``: a path, written atomically; a text stream;
        None: stdout). Probabilities with 9 significant digits."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(self.columns())
        ids = self.ids if self.ids is not None else [None] * len(self.probabilities)
        for i, (name, label, row) in enumerate(
            zip(ids, self.labels, self.probabilities, strict=True)
        ):
            lead = [name] if name is not None else []
            lead.append(label)
            if self.sets is not None:  # the set's classes, most probable first
                members = [k for k in np.argsort(-row, kind="stable") if self.sets[i, k]]
                lead += [len(members), "|".join(self.class_names[k] for k in members)]
            writer.writerow([*lead, *(f"{p:.9g}" for p in row)])
        if out is None:
            sys.stdout.write(buffer.getvalue())
        elif isinstance(out, str | os.PathLike):
            _io.write_text(out, buffer.getvalue())
        else:
            out.write(buffer.getvalue())


# --------------------------------------------------------------------------- reading


def _err(message: str) -> PredictInputError:
    return PredictInputError(message)


def _expects(run: LoadedRun) -> str:
    spec = run.input or {}
    shape = tuple(run.input_shape or ())
    if spec.get("features"):
        return f"a CSV with the columns {', '.join(spec['features'])}"
    if _is_image_run(run):
        return (
            f"images ({shape[0]} channel{'s' if shape[0] > 1 else ''}, {shape[1]}x{shape[2]}): "
            f"an image file, a folder of images or an .npy of shape (N, {shape[0]}, H, W), "
            "pixel values 0..255"
        )
    return f"an .npy of shape (N, {', '.join(map(str, shape))})" + (
        f" or a CSV with {shape[0]} numeric columns" if len(shape) == 1 else ""
    )


def _is_image_run(run: LoadedRun) -> bool:
    spec = run.input or {}
    return spec.get("dtype") == "uint8" and len(run.input_shape or ()) == 3


def read_inputs(path: str | os.PathLike[str], run: LoadedRun, *, progress: bool = False) -> Inputs:
    """Read the inputs at ``path`` for ``run``: a ``.csv``/``.tsv`` table, an ``.npy``
    array, an image file or a folder of images (searched recursively, sorted).

    Raises
    ------
    PredictInputError
        The path is missing, of a kind the run cannot take, or its content does not fit
        (a missing or extra column, a non-numeric value, a wrong shape or channel count,
        an unreadable image); the message names the file, column or shape.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise _err(f"--input {p}: no such file or folder.")
    if not run.input_shape:
        raise _err(
            "the run does not record its input shape (a cogcal.fit run fed by a "
            "DataLoader); predict with run.model in Python."
        )
    suffix = p.suffix.lower()
    if p.is_dir() or suffix in IMAGE_EXTENSIONS:
        if not _is_image_run(run):
            raise _err(f"--input {p}: this run takes {_expects(run)}, not image files.")
        return _read_images(p, run, progress=progress)
    if suffix in (".csv", ".tsv", ".tab"):
        return _read_table(p, run)
    if suffix == ".npy":
        return _read_npy(p, run)
    raise _err(
        f"--input {p}: unknown kind of file ({suffix or 'no extension'}); give a .csv/.tsv "
        f"table, an .npy array, an image ({', '.join(IMAGE_EXTENSIONS)}) or a folder of "
        f"images. This run takes {_expects(run)}."
    )


def _read_table(path: Path, run: LoadedRun) -> Inputs:
    spec = run.input or {}
    shape = tuple(run.input_shape or ())
    if len(shape) != 1:
        raise _err(f"--input {path}: this run takes {_expects(run)}, not a table.")
    plain = _read_plain_inputs(path, run)
    if plain is not None:
        return plain
    table = read_table(path, what=str(path), error=_err)
    if not table.header:
        raise _err(f"{path} is empty; expected a header row, then one row per input.")
    header, data = table.header, list(zip(table.lines, table.rows, strict=True))
    if not data:
        raise _err(f"{path} has a header but no rows to predict.")
    features = list(spec.get("features") or [])
    target = spec.get("target")
    if features:
        missing = [f for f in features if f not in header]
        if missing:
            raise _err(
                f"{path}: missing feature column(s) {', '.join(map(repr, missing))}; the run "
                f"was trained on the columns {', '.join(features)}."
            )
        extra = [h for h in header if h not in features and h != target]
        if extra:
            raise _err(
                f"{path}: extra column(s) {', '.join(map(repr, extra))} that the run was not "
                f"trained on (its features: {', '.join(features)}; target: {target}); remove "
                "them."
            )
        dupes = sorted({h for h in header if header.count(h) > 1})
        if dupes:
            raise _err(f"{path}: duplicate column name(s) {', '.join(dupes)}.")
        order = [header.index(f) for f in features]
    else:
        if len(header) != shape[0]:
            raise _err(
                f"{path}: {len(header)} columns; this run takes {shape[0]} numeric features "
                "per row (a header row first, then one row per input)."
            )
        features, order = header, list(range(len(header)))
    x = np.empty((len(data), len(order)), dtype=np.float32)
    with np.errstate(over="ignore"):  # a value beyond float32 is named below
        for i, (line, row) in enumerate(data):
            for j, col in enumerate(order):
                cell = row[col]
                try:
                    value = float(cell)
                except ValueError:
                    value = math.nan
                if not math.isfinite(value):
                    raise _err(
                        f"{path}, line {line}, column {features[j]!r}: {cell!r} is not a finite "
                        "number; every feature must be one (cogcal does not impute)."
                    )
                x[i, j] = value
                if not math.isfinite(x[i, j]):
                    raise _err(
                        f"{path}, line {line}, column {features[j]!r}: {cell!r} is beyond the "
                        f"float32 range (|x| <= {_FLOAT32_MAX:.3g}) that the run's features are "
                        "stored in, so it would become infinite; rescale that column as the "
                        "training data was."
                    )
    found = None
    if target is not None and target in header:
        t = header.index(target)
        found = (target, table.column(t))
    return Inputs(torch.from_numpy(x), target=found, source=str(path))


def _read_plain_inputs(path: Path, run: LoadedRun) -> Inputs | None:
    """The inputs of a plain table whose columns are the run's, read by pandas' C parser
    (:func:`~cogcal.data.tables.read_plain_table`); ``None`` for anything else, which
    :func:`_read_table` reads cell by cell and names with its line and column."""
    spec = run.input or {}
    features = list(spec.get("features") or [])
    target = spec.get("target")
    plain = read_plain_table(path, text=[target] if target else [])
    if plain is None:
        return None
    numeric = [h for h in plain.header if h not in plain.text]
    if features:
        if sorted(numeric) != sorted(features):
            return None  # missing or extra columns
        order = [numeric.index(f) for f in features]
    elif plain.text or len(plain.header) != (run.input_shape or (0,))[0]:
        return None
    else:
        order = list(range(len(numeric)))
    with np.errstate(over="ignore"):
        x = np.ascontiguousarray(plain.numbers[:, order].astype(np.float32))
    if not np.isfinite(x).all():
        return None
    found = (target, plain.text[target]) if target in plain.text else None
    return Inputs(torch.from_numpy(x), target=found, source=str(path))


def _read_npy(path: Path, run: LoadedRun) -> Inputs:
    shape = tuple(run.input_shape or ())
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise _err(f"cannot read {path} as an .npy array: {err}.") from None
    if arr.ndim == len(shape):
        arr = arr[None]
    if arr.dtype.kind not in "biuf":
        raise _err(f"{path}: an array of {arr.dtype}; expected numbers.")
    image = _is_image_run(run)
    fits = arr.ndim == len(shape) + 1 and (
        tuple(arr.shape[1:]) == shape or (image and arr.shape[1] == shape[0])
    )
    if not fits:
        hint = ""
        if image and arr.ndim == 4 and arr.shape[-1] == shape[0]:
            hint = " (channels last? transpose to (N, C, H, W): arr.transpose(0, 3, 1, 2))"
        raise _err(
            f"{path}: an array of shape {arr.shape}; this run takes (N, "
            f"{', '.join(map(str, shape))}){' images of any size' if image else ''}{hint}."
        )
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise _err(f"{path}: the array holds NaN or infinite values.")
    if image and arr.size:
        lo, hi = float(arr.min()), float(arr.max())
        if lo < 0 or hi > 255:
            raise _err(f"{path}: pixel values must lie in 0..255, found {lo:g}..{hi:g}.")
        if arr.dtype.kind == "f" and hi <= 1.0:
            raise _err(
                f"{path}: float pixels all in [0, 1]; this run takes pixel values 0..255 "
                "(as uint8): multiply by 255 first."
            )
    dtype = np.uint8 if image and arr.dtype.kind in "biu" else np.float32
    if dtype == np.float32:
        _check_float32(arr, str(path), run)
    x = arr.astype(dtype)
    return Inputs(torch.from_numpy(np.ascontiguousarray(x)), source=str(path))


def _check_float32(arr: np.ndarray, source: str, run: LoadedRun) -> None:
    """Refuse finite values that become infinite as float32, the dtype a run's inputs are
    stored in (training refuses them too), naming the row and column of the first."""
    if arr.dtype.kind != "f" or arr.dtype.itemsize <= 4:
        return
    with np.errstate(over="ignore"):
        big = ~np.isfinite(arr.astype(np.float32)) & np.isfinite(arr)
    if not big.any():
        return
    where = tuple(int(v[0]) for v in np.nonzero(big))
    features = list((run.input or {}).get("features") or [])
    at = f"row {where[0]} (0-based)"
    if len(where) == 2:
        name = f"{features[where[1]]!r}, " if len(features) == arr.shape[1] else ""
        at += f", column {name}index {where[1]}"
    elif len(where) > 2:
        at += f", position {where[1:]}"
    raise _err(
        f"{source}: {at} holds {arr[where].item()!r}, beyond the float32 range (|x| <= "
        f"{_FLOAT32_MAX:.3g}) that the run's inputs are stored in, so it would become "
        "infinite; rescale those values as the training data was."
    )


def _read_images(path: Path, run: LoadedRun, *, progress: bool) -> Inputs:
    shape = tuple(run.input_shape or ())
    if path.is_dir():
        # the reader of folder: datasets: links only inside, never a loop or an image twice
        found = image_files(path, what=f"--input {path}")
        files = sorted(found, key=lambda f: f.relative_to(path).as_posix())
        if not files:
            raise _err(
                f"--input {path}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in this folder."
            )
        ids = [f.relative_to(path).as_posix() for f in files]
    else:
        files, ids = [path], [path.name]
    channels, size = shape[0], shape[1]
    mode = "L" if channels == 1 else "RGB"
    if channels not in (1, 3):
        raise _err(f"this run takes images of {channels} channels, which PIL cannot give.")
    x = np.empty((len(files), channels, size, size), dtype=np.uint8)
    bar = tqdm(
        files, desc="reading images", unit="img", file=sys.stderr, leave=False,
        disable=not progress or len(files) < PROGRESS_IMAGES,
    )  # fmt: skip
    for i, f in enumerate(bar):
        try:
            with Image.open(f) as img:
                if channels == 1 and img.mode not in GRAYSCALE_MODES:
                    raise _err(
                        f"{f}: a {img.mode} colour image; this run was trained on grey images "
                        "(1 channel)."
                    )
                x[i] = resize_center_crop(img, size, mode=mode)
        except PredictInputError:
            raise
        except Exception as err:  # PIL raises many types for broken files
            raise _err(f"cannot decode image {f}: {type(err).__name__}: {err}.") from None
    return Inputs(torch.from_numpy(x), ids=ids, source=str(path))


# --------------------------------------------------------------------------- predicting


@torch.no_grad()
def predict(
    run: LoadedRun | str | os.PathLike[str],
    inputs: Inputs | np.ndarray | torch.Tensor | str | os.PathLike[str],
    *,
    which: str = "best",
    batch_size: int = EVAL_BATCH,
    progress: bool = False,
    sets: ConformalSets | None = None,
) -> Predictions:
    """Class probabilities of a finished run on new raw inputs.

    Parameters
    ----------
    run : LoadedRun or path
        A run loaded with :func:`cogcal.load_run`, or its folder (loaded with ``which``).
    inputs : Inputs, array, tensor or path
        Raw inputs ``(N, *input_shape)`` as the run's data stores them, or a path read
        with :func:`read_inputs`.
    batch_size : int
        Inputs per forward pass.
    progress : bool
        A progress bar on stderr for large inputs.
    sets : ConformalSets, optional
        Fitted conformal prediction sets (:func:`run_sets` fits them on the run's
        validation split): each input's set is in :attr:`Predictions.sets`.

    Returns
    -------
    Predictions

    Examples
    --------
    >>> import tempfile, torch, cogcal
    >>> from cogcal.commands.predict import predict
    >>> x, y = torch.randn(200, 6), torch.randint(0, 3, (200,))
    >>> net = lambda: torch.nn.Sequential(torch.nn.Linear(6, 3))
    >>> out = tempfile.mkdtemp() + "/run"
    >>> _ = cogcal.fit(net(), (x, y), epochs=1, out=out, progress=False)
    >>> p = predict(cogcal.load_run(out, model=net()), x[:4])
    >>> p.probabilities.shape, p.class_names
    ((4, 3), ['0', '1', '2'])
    """
    if not isinstance(run, LoadedRun):
        run = load_run(run, which=which)
    check(batch_size, COUNT, "batch_size", flag="--batch-size")
    if isinstance(inputs, str | os.PathLike):
        inputs = read_inputs(inputs, run, progress=progress)
    elif not isinstance(inputs, Inputs):
        inputs = Inputs(torch.as_tensor(np.asarray(inputs) if not torch.is_tensor(inputs)
                                        else inputs))  # fmt: skip
        if inputs.x.is_floating_point():
            _check_float32(inputs.x.cpu().numpy(), "inputs", run)
    model = run.model.eval()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    x = inputs.x
    starts = range(0, len(x), batch_size)
    bar = tqdm(
        starts, desc="predicting", unit="batch", file=sys.stderr, leave=False,
        disable=not progress or len(x) < PROGRESS_ROWS,
    )  # fmt: skip
    chunks = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(run.config.seed)  # V-TST's Monte Carlo samples, as the run drew them
        for start in bar:
            try:
                out = model(x[start : start + batch_size].to(device))
            except ValueError as err:  # the preprocessing's shape check
                raise _err(f"{inputs.source or 'inputs'}: {err}") from None
            chunks.append(out.float().cpu())
    logits = torch.cat(chunks) if chunks else torch.empty(0, len(run.class_names))
    z = logits.double()
    probs = torch.sigmoid(z) if run.task == "multilabel" else torch.softmax(z, dim=1)
    names = run.class_names or [str(k) for k in range(z.shape[1])]
    result = Predictions(probs.numpy(), names, run.task, ids=inputs.ids)
    if sets is not None:
        result.sets = np.asarray(sets.predict(probs=probs.numpy()))
    if line := choice_line(run.record.selection):  # the default path's choice
        result.notes.append(f"{run.config.method} model; {line}")
    if inputs.target is not None:
        name, values = inputs.target
        note = f"the target column {name!r} is not used to predict"
        if run.task == "multiclass" and set(values) <= set(names):
            acc = float(np.mean([p == t for p, t in zip(result.labels, values, strict=True)]))
            note += f"; accuracy against it: {acc:.4f} ({len(values)} rows)"
        result.notes.append(note)
    return result


def run_sets(
    folder: str | os.PathLike[str], run: LoadedRun, *, alpha: float, method: str = DEFAULT_METHOD
) -> tuple[ConformalSets, list[str]]:
    """Conformal prediction sets of level ``1 - alpha`` fitted on a run's validation split
    (its calibrated logits, ``val_logits.npz``), and the notes to tell the user.

    Coverage holds for inputs exchangeable with the validation split when nothing of the
    model was fitted on it; a post-hoc method's calibrator was fitted on that split, so
    its sets may cover a little less than ``1 - alpha`` (a note says so; ``cogcal
    calibrate --conformal`` fits the calibrator and the threshold on separate halves).
    """
    if run.task != "multiclass":
        raise UserError("--sets: prediction sets are for multiclass runs; this run is multi-label.")
    path = Path(folder) / "val_logits.npz"
    try:
        with np.load(path) as saved:
            logits, labels = saved["logits"], saved["labels"]
    except (OSError, KeyError, ValueError) as err:
        raise UserError(f"--sets: cannot read the run's validation logits {path}: {err}") from None
    sets = ConformalSets(method=method, alpha=alpha).fit(logits, labels)
    notes = [
        f"prediction sets of level {1 - alpha:g} ({method}), threshold "
        f"{sets.threshold_:.4g} fitted on the run's {len(labels)} validation rows"
    ]
    if get_method(run.config.method).posthoc is not None:
        notes.append(
            f"the {run.config.method!r} calibrator was fitted on those same validation rows, "
            "so the sets may cover a little less than asked; `cogcal calibrate --conformal` "
            "fits the calibrator and the threshold on separate halves"
        )
    return sets, notes


@on_free_cpus
def run(args: Any) -> int:
    """``cogcal predict``: load the run, predict the inputs, write the CSV (or stdout)."""
    out = Path(args.out) if args.out is not None else None
    if out is not None and out.exists() and not args.overwrite:
        raise UserError(f"--out {out} exists; choose another file or pass --overwrite.")
    if out is not None and out.exists() and out.resolve() == Path(args.input).resolve():
        raise UserError(f"--out {out} is the --input file; choose another file.")
    check(args.batch_size, COUNT, "batch_size", flag="--batch-size")
    loaded = load_run(args.run, which=args.which)
    sets, notes = None, []
    if args.sets is not None:
        check(args.sets, ALPHA, "alpha", flag="--sets")
        sets, notes = run_sets(args.run, loaded, alpha=args.sets, method=args.sets_method)
    result = predict(
        loaded, args.input, batch_size=args.batch_size, progress=args.progress, sets=sets
    )
    result.write_csv(out)
    for note in [*notes, *result.notes]:
        print(f"cogcal: {note}", file=sys.stderr)
    if out is not None:
        print(f"wrote {len(result.probabilities)} predictions to {out}", file=sys.stderr)
    return 0
