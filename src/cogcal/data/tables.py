"""Tables: ``csv:PATH`` datasets and the tables ``cogcal predict`` reads, through one reader.

:func:`read_table` reads a UTF-8 file (a byte-order mark is ignored) with a header row,
comma-separated (tab-separated for ``.tsv``/``.tab``), with :func:`pandas.read_csv`: every
cell stays text (stripped), blank lines are skipped, and each data row keeps the number of
the line it ends on, so that every error can name a line and a column. A plain table (no
quotes, complete rows, numbers but for named text columns) is read faster by
:func:`read_plain_table`, pandas' C parser straight into numbers; whatever it might read
differently it leaves to :func:`read_table`. :func:`load_csv` turns a table into a
:class:`~cogcal.data.Dataset`.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cogcal._errors import ArgumentError
from cogcal.data.base import (
    SPLIT_SEED,
    Dataset,
    DatasetCorruptError,
    Split,
    apply_normalization,
    feature_scaling,
)
from cogcal.data.custom import (
    USER_SPLIT_RULE,
    _check_every_class_in_every_split,
    _check_split_sizes,
    _class_counts,
    _err,
    _not_found,
    split_indices,
)

__all__ = [
    "MISSING_TOKENS",
    "ONE_SCALE_MIN_COLUMNS",
    "PlainTable",
    "Table",
    "load_csv",
    "one_scale",
    "read_plain_table",
    "read_table",
]

#: Cell values of a CSV file read as missing (compared lower-case, after stripping).
MISSING_TOKENS = ("", "na", "n/a", "nan", "null", "none", "?")

_INT64 = np.iinfo(np.int64)

#: The feature columns of a table share one scale, and ``normalization="auto"`` standardises
#: them with one mean/std over all the training split's cells instead of per column, when
#: there are at least this many and every training value is an integer in [0, 255] (8-bit
#: pixels) or every one lies in [0, 1] (pixels already scaled): an image written as a
#: table (:func:`one_scale`).
ONE_SCALE_MIN_COLUMNS = 64


def one_scale(x_train: np.ndarray) -> bool:
    """Whether a table's training features (rows x columns) are pixels of one scale
    (:data:`ONE_SCALE_MIN_COLUMNS`). Standardised per column, a pixel dark on all but a
    few training images gets a tiny std, and a test image that lights it lands tens or
    hundreds of stds away: on MNIST as a table, the default path's test NLL was 0.115 per
    column and is 0.065 with one scale (docs/defaults.md, "Real MNIST as a table").

    >>> one_scale(np.tile(np.arange(64.0), (3, 1))), one_scale(np.full((3, 64), 0.5))
    (True, True)
    >>> one_scale(np.full((3, 64), 2.5)), one_scale(np.zeros((3, 63)))
    (False, False)
    """
    if x_train.ndim != 2 or x_train.shape[1] < ONE_SCALE_MIN_COLUMNS or x_train.size == 0:
        return False
    low, high = float(x_train.min()), float(x_train.max())
    if low >= 0.0 and high <= 1.0:
        return True
    return low >= 0.0 and high <= 255.0 and bool(np.array_equal(x_train, np.round(x_train)))


_LEADING_BLANK_LINES = re.compile(r"(?:[ \t\r\f\v]*\n)*")
_RAGGED = "\0ragged"


@dataclass(frozen=True)
class Table:
    """A table as read by :func:`read_table`.

    ``header``: the stripped column names (empty for an empty file); ``rows``: the data
    rows, one list of stripped cells per row, each as long as the header; ``lines``: the
    line each data row ends on (1-based); ``raw``: the file's bytes.
    """

    path: Path
    raw: bytes
    delimiter: str
    header: list[str]
    header_line: int
    rows: list[list[str]]
    lines: list[int]

    def column(self, j: int) -> list[str]:
        """The cells of column ``j`` (0-based), one per data row."""
        return [r[j] for r in self.rows]


def read_table(path: Path, *, what: str, error: Callable[[str], Exception]) -> Table:
    """Read the table at ``path`` (see the module docstring).

    ``what`` starts the message of a row whose number of fields is not the header's;
    ``error`` makes the exception raised for an unreadable or malformed file.
    """
    # pandas costs ~0.3 s to import (estimated under load): only commands reading a table pay it
    import pandas as pd

    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise error(
            f"cannot read {path}: {type(err).__name__}: {err} (a UTF-8 text file is expected)."
        ) from None
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    skipped = _LEADING_BLANK_LINES.match(text)
    first_line = 1 + skipped.group().count("\n") if skipped else 1
    text = text[skipped.end() :] if skipped else text
    empty = Table(path, raw, delimiter, [], first_line, [], [])
    if not text.strip():
        return empty

    options = {"sep": delimiter, "header": None, "dtype": object, "keep_default_na": False}
    options.update(skip_blank_lines=False, engine="python")  # short rows get None cells

    def ragged(fields: list[str]) -> list[str]:  # a row longer than the header: mark it
        newlines = sum(f.count("\n") for f in fields)
        return [f"{_RAGGED}\0{len(fields)}\0{newlines}", *fields[1:width]]

    try:
        width = pd.read_csv(io.StringIO(text, newline=""), nrows=1, **options).shape[1]
        frame = pd.read_csv(io.StringIO(text, newline=""), on_bad_lines=ragged, **options)
    except pd.errors.EmptyDataError:
        return empty
    except (pd.errors.ParserError, csv.Error) as err:
        raise error(
            f"cannot parse {path}: {err} (is a quote left open? A field that starts with a "
            'quote ends at the next quote; write a quote inside a field as "").'
        ) from None
    rows: list[list[str]] = []
    lines: list[int] = []
    line = first_line - 1
    for record in frame.itertuples(index=False, name=None):
        cells = [c for c in record if c is not None]
        if cells and cells[0].startswith(_RAGGED):
            n, newlines = (int(v) for v in cells[0].split("\0")[2:])
            line += 1 + newlines
        else:
            n, line = len(cells), line + 1 + sum(c.count("\n") for c in cells)
            if all(not c.strip() for c in cells):
                continue  # a blank line
        if n != width:
            raise _err(
                f"{what}: line {line} has {n} fields, the header {width}; every row needs one "
                f"value per column ({', '.join(rows[0])})."
            )
        rows.append([c.strip() for c in cells])
        lines.append(line)
    _check_records(text, delimiter, first_line, lines, what=what, error=error)
    if not rows:
        return empty
    return Table(path, raw, delimiter, rows[0], lines[0], rows[1:], lines[1:])


def _check_records(
    text: str,
    delimiter: str,
    first_line: int,
    lines: list[int],
    *,
    what: str,
    error: Callable[[str], Exception],
) -> None:
    """Check the rows read against a second, independent reading with Python's
    :mod:`csv` module, so that no row is dropped or merged without a word: a quote left
    open to the end of the file is an error naming the line it opens on (pandas drops
    such a row), and any other difference in the number of rows names the first line
    where the two readings part. ``lines``: the line each non-blank row (header included)
    ends on, as :func:`read_table` counted them."""
    ends: list[int] = []
    end = 0
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        for record in reader:
            end = reader.line_num
            if any(field.strip() for field in record):
                ends.append(first_line - 1 + end)
    except csv.Error as err:
        if "unexpected end of data" not in str(err):
            return  # a quoting pandas reads leniently (`"a"b`); its rows were checked above
        start = first_line + end
        raise error(
            f"{what}: line {start} opens a quoted field that is never closed: it runs to the "
            f"end of the file (line {first_line - 1 + reader.line_num}) and would swallow the "
            "rows below it; close the quote (a field that starts with a quote ends at the "
            'next quote; write a quote inside a field as "").'
        ) from None
    if len(ends) != len(lines):
        n = min(len(ends), len(lines))
        parted = [min(a, b) for a, b in zip(ends, lines, strict=False) if a != b]
        part = parted[0] if parted else max(ends, lines, key=len)[n]
        raise error(
            f"{what}: the file holds {len(ends)} rows (header included) but {len(lines)} were "
            f"read, from line {part} on; check the quoting there (a field that starts with a "
            'quote ends at the next quote; write a quote inside a field as "").'
        )


def _is_missing(value: str) -> bool:
    return value.strip().lower() in MISSING_TOKENS


def _parse_numeric(values: list[str]) -> tuple[np.ndarray | None, int | None]:
    """Floats of a column, or (None, first bad row index) if a value is not a finite number."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except ValueError:
        arr = None
    if arr is not None and np.isfinite(arr).all():
        return arr, None
    for i, v in enumerate(values):
        try:
            f = float(v)
        except ValueError:
            return None, i
        if not np.isfinite(f):
            return None, i
    return None, 0  # pragma: no cover - numpy and float() disagree


def _int_like(values: list[str]) -> tuple[np.ndarray | None, int | None]:
    """Integer labels as int64, else None; and the index of the first label that is an
    integer beyond int64 (or a float too large to be an exact integer), else None."""
    try:
        exact = [int(v) for v in values]  # exact at any size ("10**30" digits included)
    except ValueError:
        exact = None
    if exact is not None:
        for i, v in enumerate(exact):
            if not _INT64.min <= v <= _INT64.max:
                return None, i
        return np.asarray(exact, dtype=np.int64), None
    try:
        arr = np.asarray(values, dtype=np.float64)
    except ValueError:
        return None, None
    if not np.isfinite(arr).all() or not np.array_equal(arr, np.round(arr)):
        return None, None
    big = np.flatnonzero(np.abs(arr) >= 2.0**53)  # not every integer is a float there
    if big.size:
        return None, int(big[0])
    return arr.astype(np.int64), None


def load_csv(
    path: str | os.PathLike[str], *, target: str | None, normalization: str = "auto"
) -> Dataset:
    """Load a classification table: a header row, numeric feature columns, a class column.

    The file is UTF-8 (a byte-order mark is ignored), comma-separated (tab-separated for
    ``.tsv``/``.tab`` files), with one header row naming the columns. ``target`` names the
    class column; its values may be strings or integers (class names are the sorted distinct
    values). Every other column is a feature and must be numeric. Splits follow
    :data:`USER_SPLIT_RULE`. Features are stored raw (float32) and standardised per column
    by :meth:`Dataset.transform` with the mean/std of the *training split only* (a column
    constant on it gets std 1), or, where the columns are pixels of one scale
    (:func:`one_scale`), with one mean/std over all its cells.

    Parameters
    ----------
    path : str or Path
        The file (relative to the working directory).
    target : str
        Name of the class column.
    normalization : {"auto", "none", "per-column", "one-scale"}
        ``"auto"``: standardisation as above; ``"none"``: raw values; ``"per-column"``,
        ``"one-scale"``: one of the two rules whatever :func:`one_scale` says.

    Raises
    ------
    ArgumentError
        ``target`` missing or not a column; non-numeric feature columns; missing values;
        a target with fewer than 2 classes or non-integer numbers; a ragged row.
    DatasetNotFoundError
        The file does not exist.
    """
    spec = os.fspath(path)
    file = Path(spec).expanduser()
    name = f"csv:{spec}"
    if not file.is_file():
        raise _not_found(name, file, "a file")
    plain = _read_plain_numeric(name, file, target)
    if plain is not None:
        raw, delimiter, features, x, labels = plain
    else:  # the careful reader, which names the line and column of whatever is wrong
        table = read_table(file, what=f"dataset {name!r}", error=DatasetCorruptError)
        target = _check_header(name, file, table, target)
        cols = {h: table.column(j) for j, h in enumerate(table.header)}
        data_lines = table.lines
        _check_no_missing(name, cols, data_lines)
        features = [h for h in table.header if h != target]
        if not features:
            raise _err(f"dataset {name!r}: no feature columns besides the target {target!r}.")
        x = _feature_matrix(name, cols, features, data_lines)
        labels = _class_labels(name, target, cols[target], data_lines)
        raw, delimiter = table.raw, table.delimiter
    assert target is not None  # (both readers refuse a table without it)
    ds = _table_dataset(
        name, file, raw, delimiter, x, labels, features=features, target=target.strip()
    )  # fmt: skip
    return apply_normalization(ds, normalization)


@dataclass(frozen=True)
class PlainTable:
    """A table as read by :func:`read_plain_table`: its bytes and delimiter, the stripped
    header, every column but the ``text`` ones as float64 numbers (header order; not yet
    checked finite), and the ``text`` columns' stripped cells."""

    raw: bytes
    delimiter: str
    header: list[str]
    numbers: np.ndarray
    text: dict[str, list[str]]


def read_plain_table(file: Path, text: Sequence[str] = ()) -> PlainTable | None:
    """A plain table read by pandas' C parser straight into numbers (70,000 rows of 785
    integers in about 5 s where :func:`read_table`, which keeps every cell as text with its
    line number, takes 30): every column a number but the ``text`` columns present.

    ``None`` for anything :func:`read_table` might read differently, so that the caller
    reads it that way and names what is wrong with its line: quotes (a quoted field can
    hold a delimiter or a line break), NUL bytes, text that is not UTF-8, a header with an
    empty or repeated name, no data rows, rows of another length, a cell of a number column
    that is not one (a word, an empty cell, ``NA``; ``nan`` and ``inf`` do read, as numbers
    the caller refuses).
    """
    import pandas as pd  # (as read_table: only commands reading a table pay its import)

    try:
        raw = file.read_bytes()
        content = raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return None
    if '"' in content or "\0" in content:
        return None
    delimiter = "\t" if file.suffix.lower() in (".tsv", ".tab") else ","
    skipped = _LEADING_BLANK_LINES.match(content)
    start = skipped.end() if skipped else 0
    end = content.find("\n", start)
    if end < 0:
        return None
    header = [h.strip() for h in content[start:end].split(delimiter)]
    if "" in header or len(set(header)) < len(header):
        return None
    words = [j for j, h in enumerate(header) if h in text]
    columns = list(range(len(header)))
    try:  # the rows after the header, columns by position (no name to mangle)
        frame = pd.read_csv(
            io.StringIO(content[end + 1 :]), sep=delimiter, header=None, names=columns,
            dtype={j: (str if j in words else np.float64) for j in columns},
            keep_default_na=False, engine="c",
        )  # fmt: skip
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None  # a cell that is not a number, a row of another length, ...
    # (a first row one field longer than the header would become pandas' index)
    if frame.empty or not isinstance(frame.index, pd.RangeIndex):
        return None
    if words and bool(frame[words].isna().any(axis=None)):
        return None  # a short row
    numbers = frame[[j for j in columns if j not in words]].to_numpy(np.float64)
    cells = {header[j]: [v.strip() for v in frame[j].tolist()] for j in words}
    return PlainTable(raw, delimiter, header, numbers, cells)


def _read_plain_numeric(
    name: str, file: Path, target: str | None
) -> tuple[bytes, str, list[str], np.ndarray, tuple[np.ndarray, list[str], str]] | None:
    """:func:`load_csv`'s table read by :func:`read_plain_table`: its bytes, delimiter,
    feature names, float32 features and class labels; ``None`` (read it with
    :func:`read_table`, which names the problem with its line) for whatever that reader
    leaves, no or an unknown ``target``, no feature column, missing, non-finite or
    beyond-float32 features, missing target cells, a label :func:`_class_labels` refuses.
    Where both readers accept a table they give the same dataset (tests)."""
    if not isinstance(target, str):
        return None
    target = target.strip()
    plain = read_plain_table(file, text=[target])
    if plain is None or target not in plain.text or len(plain.header) < 2:
        return None
    with np.errstate(over="ignore"):
        x = plain.numbers.astype(np.float32)
    t_values = plain.text[target]
    if not np.isfinite(x).all() or any(v.lower() in MISSING_TOKENS for v in t_values):
        return None
    try:
        # (the lines only go into its messages, which the careful reader then gives)
        labels = _class_labels(name, target, t_values, [0] * len(t_values))
    except ArgumentError:
        return None
    features = [h for h in plain.header if h != target]
    return plain.raw, plain.delimiter, features, x, labels


def _check_header(name: str, file: Path, table: Table, target: str | None) -> str:
    """Check the header row and that ``target`` names one of its columns; return it stripped."""
    if not table.header:
        raise _err(f"dataset {name!r}: {file} is empty; expected a header row, then data rows.")
    header = table.header
    if any(not h for h in header):
        raise _err(
            f"dataset {name!r}: the header row (line {table.header_line}) has an empty column "
            f"name (column {header.index('') + 1}); name every column."
        )
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise _err(f"dataset {name!r}: duplicate column name(s) {', '.join(dupes)}.")
    columns = ", ".join(header)
    if target is None:
        raise _err(
            f"dataset {name!r} needs `target`, the name of the class column; columns: {columns}.",
            f"--dataset {name} needs --target COLUMN, the class column; columns: {columns}.",
        )
    if not isinstance(target, str) or target.strip() not in header:
        close = difflib.get_close_matches(str(target), header, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise _err(
            f"dataset {name!r}: no column target={target!r}; columns: {columns}.{hint}",
            f"dataset {name!r}: no column --target {target}; columns: {columns}.{hint}",
        )
    if not table.rows:
        raise _err(f"dataset {name!r}: {file} has a header but no data rows.")
    return target.strip()


def _check_no_missing(name: str, cols: dict[str, list[str]], data_lines: list[int]) -> None:
    """Refuse missing values (cogcal does not impute), naming the columns and first lines."""
    missing = []
    for h, values in cols.items():
        bad = [i for i, v in enumerate(values) if _is_missing(v)]
        if bad:
            missing.append(
                f"{h!r} ({len(bad)} value(s), first on line {data_lines[bad[0]]}: "
                f"{values[bad[0]]!r})"
            )
    if missing:
        raise _err(
            f"dataset {name!r}: missing values in column(s) {'; '.join(missing)}. cogcal does "
            "not impute: fill or drop those rows (empty cells and "
            f"{', '.join(t for t in MISSING_TOKENS if t)} count as missing)."
        )


def _feature_matrix(
    name: str, cols: dict[str, list[str]], features: list[str], data_lines: list[int]
) -> np.ndarray:
    """The feature columns as a float32 matrix (rows x features); non-numbers are refused."""
    x_cols = []
    non_numeric = []
    for h in features:
        arr, bad = _parse_numeric(cols[h])
        if arr is None:
            non_numeric.append(f"{h!r} (line {data_lines[bad]}: {cols[h][bad]!r})")
        else:
            x_cols.append(arr)
    if non_numeric:
        raise _err(
            f"dataset {name!r}: non-numeric feature column(s) {'; '.join(non_numeric)}. Every "
            "column but the target must hold finite numbers: encode categories as numbers "
            "(e.g. one-hot) or drop those columns."
        )
    x64 = np.stack(x_cols, axis=1)
    with np.errstate(over="ignore"):
        x = x64.astype(np.float32)
    if not np.isfinite(x).all():  # finite float64 values beyond the float32 range
        r, c = (int(v[0]) for v in np.nonzero(~np.isfinite(x)))
        raise _err(
            f"dataset {name!r}: column {features[c]!r} holds {cols[features[c]][r]!r} (line "
            f"{data_lines[r]}), beyond the float32 range (|x| <= {np.finfo(np.float32).max:.3g}) "
            "that features are stored in; rescale that column (e.g. to other units or a log)."
        )
    return x


def _class_labels(
    name: str, target: str, t_values: list[str], data_lines: list[int]
) -> tuple[np.ndarray, list[str], str]:
    """``(y, class_names, kind)``: class indices, the sorted class names, integers/strings."""
    ints, too_big = _int_like(t_values)
    if too_big is not None:
        raise _err(
            f"dataset {name!r}: the target column {target!r} holds the label "
            f"{t_values[too_big]!r} (line {data_lines[too_big]}), an integer beyond the range "
            f"cogcal can store exactly ({_INT64.min}..{_INT64.max}, and 2**53 for labels "
            "written as decimals); use smaller integers or class names."
        )
    if ints is not None:
        uniq_int = np.unique(ints)
        class_names = [str(int(v)) for v in uniq_int]
        y = np.searchsorted(uniq_int, ints).astype(np.int64)
        target_kind = "integers"
    else:
        as_float, _ = _parse_numeric(t_values)
        if as_float is not None:
            i = int(np.flatnonzero(as_float != np.round(as_float))[0])
            raise _err(
                f"dataset {name!r}: the target column {target!r} holds non-integer numbers "
                f"(line {data_lines[i]}: {t_values[i]!r}); cogcal trains classifiers: give "
                "class labels (integers or names)."
            )
        uniq_str = np.unique(np.asarray(t_values, dtype=object).astype(str))
        class_names = [str(v) for v in uniq_str]
        y = np.searchsorted(uniq_str, np.asarray(t_values, dtype=str)).astype(np.int64)
        target_kind = "strings"
    if len(class_names) < 2:
        raise _err(
            f"dataset {name!r}: the target column {target!r} has {len(class_names)} class "
            f"({', '.join(class_names)}); a classifier needs at least 2."
        )
    return y, class_names, target_kind


def _table_dataset(
    name: str,
    file: Path,
    raw: bytes,
    delimiter: str,
    x: np.ndarray,
    labels: tuple[np.ndarray, list[str], str],
    *,
    features: list[str],
    target: str,
) -> Dataset:
    """The :class:`Dataset` of a checked table: fixed splits, training-split statistics."""
    y, class_names, target_kind = labels
    tr, va, te = split_indices(y)
    idx: dict[str, np.ndarray] = {"train": tr, "val": va, "test": te}  # type: ignore[dict-item]
    sizes = {s: int(len(i)) for s, i in idx.items()}
    _check_split_sizes(f"dataset {name!r}", sizes, len(y), "add rows")
    _check_every_class_in_every_split(f"dataset {name!r}", y, idx, class_names, "rows")
    splits = {
        s: Split(torch.from_numpy(np.ascontiguousarray(x[i])), torch.from_numpy(y[i]))
        for s, i in idx.items()
    }
    x_tr = x[tr].astype(np.float64)
    col_std = x_tr.std(axis=0)
    constant = [h for h, s in zip(features, col_std, strict=True) if not s > 0]
    rule = "one-scale" if one_scale(x_tr) else "per-column"  # (ONE_SCALE_MIN_COLUMNS)
    mean, std, normalization = feature_scaling(x_tr, rule, column_std=col_std)
    if rule == "one-scale":
        values = "in [0, 1]" if x_tr.max() <= 1.0 else "an integer in [0, 255]"
        normalization += (
            f": its {len(features)} feature columns share one scale (every value {values}: "
            "pixels written as a table)"
        )
    info = {
        "dataset": name,
        "kind": "csv",
        "path": str(file.resolve()),
        "delimiter": delimiter,
        "rows": len(y),
        "target": target,
        "target_values": target_kind,
        "features": features,
        "class_names": class_names,
        "split_rule": USER_SPLIT_RULE,
        "split_seed": SPLIT_SEED,
        "sizes": sizes,
        "class_counts": {s: _class_counts(sp.y, len(class_names)) for s, sp in splits.items()},
        "mean": list(mean),
        "std": list(std),
        "constant_columns": constant,
        "normalization": normalization,
        "fingerprint": {
            "sha256": hashlib.sha256(raw).hexdigest(),
            "method": "sha256 of the file's bytes",
        },
    }
    return Dataset(
        name=name,
        task="multiclass",
        num_classes=len(class_names),
        input_shape=(len(features),),
        class_names=class_names,
        **splits,
        mean=mean,
        std=std,
        augment=None,
        info=info,
        default_model="mlp",
    )
