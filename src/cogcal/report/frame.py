"""The report's one normalised view of a bench folder's tables, and its one set of filters.

:func:`load_results` reads ``results.csv`` once, checks it (columns, splits, protocols,
seeds, numeric values, no duplicate rows) and normalises it: ``task``, ``condition`` and
``severity`` are strings with ``""`` for an empty cell, ``seed`` is an ``int``, ``value``
a float. A value that is not a number is an error naming the line and the value; it is
never dropped. ``nan`` (a run's non-finite value) stays ``NaN`` and is not counted as a
seed, so a cell that has it shows fewer seeds than planned.

:func:`load_runs`, :func:`load_tuning` and :func:`load_effect` do the same for
``runs.csv``, ``tuning.csv`` and ``effect.csv`` (:mod:`cogcal.report.schema`), and
:func:`rows` is the only row filter the report's sections use.

>>> import pandas as pd
>>> df = pd.DataFrame({"dataset": "d", "method": ["ce", "ce"], "split": "test",
...                    "task": ["", "t0"], "condition": "", "severity": "", "value": [1.0, 2.0]})
>>> rows(df, split="test", task=AGGREGATE)["value"].tolist()
[1.0]
>>> rows(df, task=INDIVIDUAL)["task"].tolist()
['t0']
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cogcal.report import schema as S

_SHOWN = 5  # bad rows quoted in one error message
_NAN_TEXT = frozenset({"nan", "NaN", "NAN", "inf", "-inf", "Infinity", "-Infinity"})


class _Selector:
    """A row selection that is not an equality test (see :func:`rows`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Keep every value of the column (the default of :func:`rows`).
ANY = _Selector("ANY")
#: ``task``: the aggregate rows (empty, or ``"mean"`` of a multi-task run).
AGGREGATE = _Selector("AGGREGATE")
#: ``task``: the rows of one individual task (neither empty nor ``"mean"``).
INDIVIDUAL = _Selector("INDIVIDUAL")


def blank(s: pd.Series) -> pd.Series:
    """Whether each cell is empty (NaN or whitespace only)."""
    return s.isna() | (s.astype(str).str.strip() == "")


def _mask(df: pd.DataFrame, column: str, want: Any) -> pd.Series:
    if want is ANY:
        return pd.Series(True, index=df.index)
    if column not in df.columns:
        if want is AGGREGATE or want is None or (isinstance(want, str) and want == ""):
            return pd.Series(True, index=df.index)  # an absent optional column is blank
        raise ValueError(f"cannot select on {column!r}: the table has no such column.")
    col = df[column]
    if want is AGGREGATE or want is INDIVIDUAL:
        if column != "task":
            raise ValueError(f"{want!r} selects task rows only, not {column!r}.")
        agg = blank(col) | (col.astype(str).str.strip() == "mean")
        return agg if want is AGGREGATE else ~agg
    if want is None or want == "":
        return blank(col)
    if isinstance(want, Collection) and not isinstance(want, str):
        return col.isin(list(want))
    return col == want


def rows(df: pd.DataFrame, **selection: Any) -> pd.DataFrame:
    """The rows of ``df`` matching every selection ``column=want``.

    ``want`` is :data:`ANY` (no selection), a value (equality), a collection of values
    (membership) or ``""`` (the empty cell); ``task`` also takes :data:`AGGREGATE` (empty
    or ``"mean"``) and :data:`INDIVIDUAL` (a task name). The result is a selection of
    ``df``: copy it before assigning to it.
    """
    keep = pd.Series(True, index=df.index)
    for column, want in selection.items():
        keep &= _mask(df, column, want)
    return df[keep]


def aggregate(df: pd.DataFrame, **selection: Any) -> pd.DataFrame:
    """:func:`rows` of the aggregate kind: ``task`` empty or ``mean``, no condition or
    severity (the in-distribution numbers of a run)."""
    selection.setdefault("task", AGGREGATE)
    selection.setdefault("condition", "")
    selection.setdefault("severity", "")
    return rows(df, **selection)


#: The measures :func:`seed_values` reads, by name.
MEASURES: tuple[str, ...] = ("test", "ood", "shift")
_SUMMARY = ("mean", "pooled")  # conditions the runner adds on top of the individual ones


def seed_values(df: pd.DataFrame, measure: str, **selection: Any) -> pd.DataFrame:
    """One value per (dataset, protocol, method, metric, seed) of a measure, finite only.

    ``"test"``: the aggregate test rows. ``"ood"``: the ``pooled`` OOD condition (every OOD
    set scored together), or the mean over the OOD sets per seed when no run wrote it.
    ``"shift"``: per seed the unweighted mean over every individual (condition, severity),
    or over the runner's ``mean`` condition when none is recorded. ``selection`` narrows
    the rows first (:func:`rows`).
    """
    keys = ["dataset", "protocol", "method", "metric", "seed"]
    if measure == "test":
        d = aggregate(df, split="test", **selection)
    elif measure in ("ood", "shift"):
        d = rows(df, split=measure, task=AGGREGATE, **selection)
        cond = d["condition"].astype(str)
        if measure == "ood":
            d = d[cond == "pooled"] if (cond == "pooled").any() else d[~cond.isin(_SUMMARY)]
        else:
            d = d[~cond.isin(_SUMMARY)] if (~cond.isin(_SUMMARY)).any() else d[cond == "mean"]
    else:
        raise ValueError(f"unknown measure {measure!r}; expected one of {', '.join(MEASURES)}.")
    d = d[np.isfinite(d["value"].astype(float))]
    return d.groupby(keys, as_index=False)["value"].mean()


def protocol_order(protocols: Collection[str]) -> list[str]:
    """``paper``, ``fair``, then any other protocol sorted."""
    present = set(protocols)
    return [p for p in S.PROTOCOLS if p in present] + sorted(present - set(S.PROTOCOLS))


# --------------------------------------------------------------------------- reading


def _read_csv(path: Path, required: tuple[str, ...], what: str) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[])
    except pd.errors.EmptyDataError:
        raise ValueError(
            f"{path} is empty; expected a header line with the columns {', '.join(required)}."
        ) from None
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {path} as a CSV table ({err}).") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path} lacks the column(s) {', '.join(missing)}; {what} has the columns "
            f"{', '.join(required)} (docs/method.md §6; cogcal.report.schema)."
        )
    return df.apply(lambda c: c.str.strip())


def _lines(index: pd.Index) -> list[int]:
    """CSV line numbers of frame rows (line 1 is the header)."""
    return [int(i) + 2 for i in index]


def _bad(path: Path, column: str, df: pd.DataFrame, bad: pd.Series, expected: str) -> ValueError:
    """An error quoting the first offending lines of ``column`` and their values."""
    where = df.index[bad.to_numpy()]
    shown = ", ".join(
        f"line {line}: {df.at[i, column]!r}"
        for line, i in zip(_lines(where[:_SHOWN]), where[:_SHOWN], strict=True)
    )
    more = f" (and {len(where) - _SHOWN} more)" if len(where) > _SHOWN else ""
    return ValueError(f"{path}: column {column!r} must hold {expected}; found {shown}{more}.")


def _numbers(
    path: Path, df: pd.DataFrame, column: str, *, allow_blank: bool, expected: str = "numbers"
) -> pd.Series:
    """``column`` as floats; a non-numeric cell is an error naming its line and value."""
    text = df[column]
    out = pd.to_numeric(text.where(text != "", None), errors="coerce").astype(float)
    bad = out.isna() & ~text.isin(_NAN_TEXT)
    if allow_blank:
        bad &= text != ""
    if bad.any():
        what = expected + (" (or an empty cell)" if allow_blank else "")
        raise _bad(path, column, df, bad, what)
    return out


def _integers(
    path: Path, df: pd.DataFrame, column: str, *, allow_blank: bool, minimum: int = 0
) -> pd.Series:
    """``column`` as integers (``"3"`` or ``"3.0"``); blank cells become ``<NA>``."""
    text = df[column]
    num = pd.to_numeric(text.where(text != "", None), errors="coerce")
    ok = num.notna() & np.isfinite(num.astype(float)) & (num.astype(float) % 1 == 0)
    ok &= num.astype(float) >= minimum
    bad = ~ok & ((text != "") | (not allow_blank))
    if bad.any():
        raise _bad(path, column, df, bad, f"integers >= {minimum}")
    return num.astype("Int64")


_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f", ""}


def _booleans(path: Path, df: pd.DataFrame, column: str) -> pd.Series:
    low = df[column].str.lower()
    bad = ~low.isin(_TRUE | _FALSE)
    if bad.any():
        raise _bad(path, column, df, bad, "true/false (or 1/0)")
    return low.isin(_TRUE)


def _choices(path: Path, df: pd.DataFrame, column: str, allowed: Collection[str]) -> None:
    bad = ~df[column].isin(list(allowed))
    if bad.any():
        raise _bad(path, column, df, bad, f"one of {', '.join(allowed)}")


def _nonempty(path: Path, df: pd.DataFrame, column: str) -> None:
    bad = df[column] == ""
    if bad.any():
        raise _bad(path, column, df, bad, "a name (it is empty)")


def normalise_results(df: pd.DataFrame, source: str | Path = "results.csv") -> pd.DataFrame:
    """Check and normalise a ``results.csv`` table given as strings (see the module doc):
    the :data:`~cogcal.report.schema.RESULT_COLUMNS` (others dropped), ``seed`` int,
    ``value`` float, ``severity`` a string without a ``.0`` suffix. ``source`` is named in
    errors.

    Raises
    ------
    ValueError
        A missing column, an empty dataset/method/metric, an unknown split or protocol, a
        seed that is not a non-negative integer, a value that is not a number, a condition
        or severity on a val/test row, a severity that is not an integer, or the same result
        twice; the message names the file, the line(s) and the value(s).
    """
    path = Path(source)
    missing = [c for c in S.RESULT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{path} lacks the column(s) {', '.join(missing)}; results.csv has the columns "
            f"{', '.join(S.RESULT_COLUMNS)} (docs/method.md §6)."
        )
    df = df[list(S.RESULT_COLUMNS)].copy()
    for col in S.RESULT_COLUMNS:
        df[col] = df[col].fillna("").astype(str).str.strip()
    for col in ("dataset", "method", "metric"):
        _nonempty(path, df, col)
    _choices(path, df, "split", S.SPLITS)
    _choices(path, df, "protocol", S.PROTOCOLS)
    seeds = _integers(path, df, "seed", allow_blank=False)
    values = _numbers(path, df, "value", allow_blank=False)
    in_dist = df["split"].isin(["val", "test"])
    for col in ("condition", "severity"):
        bad = in_dist & (df[col] != "")
        if bad.any():
            raise _bad(path, col, df, bad, "an empty cell on val/test rows")
    bad = (df["split"] == "ood") & (df["condition"] == "")
    if bad.any():
        raise _bad(path, "condition", df, bad, "the OOD set's name on ood rows")
    sev = _integers(path, df, "severity", allow_blank=True, minimum=1)
    df["severity"] = sev.astype(str).where(sev.notna(), "")
    df["seed"] = seeds.astype(int)
    df["value"] = values
    key = [c for c in S.RESULT_COLUMNS if c != "value"]
    dup = df.duplicated(key, keep=False)
    if dup.any():
        first = df[dup].iloc[0]
        same = df.index[dup & (df[key] == first[key]).all(axis=1)]
        raise ValueError(
            f"{path}: lines {', '.join(map(str, _lines(same)))} hold the same result "
            f"({', '.join(f'{k}={first[k]!r}' for k in key if first[k] != '')}) more than once; "
            "each (dataset, method, protocol, seed, split, metric, task, condition, severity) "
            "must appear once. Rebuild results.csv with `cogcal bench`."
        )
    return df.reset_index(drop=True)


def load_results(folder: str | Path) -> pd.DataFrame:
    """Read, check and normalise ``folder/results.csv`` (:func:`normalise_results`);
    ``ValueError`` naming the line when it is missing, unreadable or malformed."""
    path = Path(folder) / "results.csv"
    if not path.is_file():
        raise ValueError(
            f"{str(path)!r} does not exist; run `cogcal bench --out {folder}` first, or pass "
            "the folder that holds results.csv."
        )
    return normalise_results(_read_csv(path, S.RESULT_COLUMNS, "results.csv"), path)


def _optional_csv(
    folder: str | Path, name: str, columns: tuple[str, ...], nonempty: tuple[str, ...]
) -> tuple[Path, pd.DataFrame] | None:
    """``folder/name`` read with its ``columns`` checked and ``nonempty`` ones filled, or
    None when the file is absent."""
    path = Path(folder) / name
    if not path.is_file():
        return None
    df = _read_csv(path, columns, name)
    for col in nonempty:
        _nonempty(path, df, col)
    return path, df


def load_runs(folder: str | Path) -> pd.DataFrame | None:
    """``folder/runs.csv`` checked (status, seed, seconds), or None when absent."""
    found = _optional_csv(folder, "runs.csv", S.RUN_COLUMNS, ("dataset", "method"))
    if found is None:
        return None
    path, df = found
    _choices(path, df, "protocol", S.PROTOCOLS)
    _choices(path, df, "status", S.RUN_STATUSES)
    df["seed"] = _integers(path, df, "seed", allow_blank=False).astype(int)
    for col in ("train_seconds", "total_seconds", "lr", "calibrator_lr"):
        df[col] = _numbers(path, df, col, allow_blank=True)
    df["epochs"] = _integers(path, df, "epochs", allow_blank=True, minimum=0)
    return df


def load_tuning(folder: str | Path) -> pd.DataFrame | None:
    """``folder/tuning.csv`` checked (numbers, flags), or None when absent."""
    found = _optional_csv(folder, "tuning.csv", S.TUNING_COLUMNS, ("dataset", "group", "status"))
    if found is None:
        return None
    path, df = found
    _choices(path, df, "protocol", S.TUNING_PROTOCOLS)
    df["lr"] = _numbers(path, df, "lr", allow_blank=False)
    for col in ("ratio", "calibrator_lr", "val_nll", "val_brier", "val_acc"):
        df[col] = _numbers(path, df, col, allow_blank=True)
    for col in ("chosen", "at_edge", "cap_reached"):
        df[col] = _booleans(path, df, col)
    df["extensions"] = _integers(path, df, "extensions", allow_blank=True).fillna(0).astype(int)
    df["edges"] = pd.Series(
        [", ".join(p.strip() for p in re.split(r"[;,|]", e) if p.strip()) for e in df["edges"]],
        index=df.index,
        dtype=object,
    )
    return df


_RATIO = re.compile(r"^cog-fc \(ratio ([^)]+)\)$")


def effect_ratio(variant: str) -> float | None:
    """The ratio λ_c/λ_f of an ``effect.csv`` variant ``"cog-fc (ratio R)"`` (else None).

    >>> effect_ratio("cog-fc (ratio 0.1)"), effect_ratio("ce (step schedule)")
    (0.1, None)
    """
    m = _RATIO.match(variant)
    if not m:
        return None
    try:
        value = float(m.group(1))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def load_effect(folder: str | Path) -> pd.DataFrame | None:
    """``folder/effect.csv`` checked (variants, seeds, numbers), or None when absent."""
    found = _optional_csv(folder, "effect.csv", S.EFFECT_COLUMNS, ("dataset", "metric"))
    if found is None:
        return None
    path, df = found
    fixed = set(S.EFFECT_VARIANTS) - {"cog-fc (ratio R)"}
    ratio_ok = df["variant"].map(lambda v: effect_ratio(v) is not None).astype(bool)
    ok = df["variant"].isin(fixed) | ratio_ok
    if not ok.all():
        raise _bad(
            path,
            "variant",
            df,
            ~ok,
            "'ce (no schedule)', 'ce (step schedule)' or 'cog-fc (ratio R)' with R a positive "
            "number",
        )
    _choices(path, df, "split", S.SPLITS)
    df["seed"] = _integers(path, df, "seed", allow_blank=False).astype(int)
    df["value"] = _numbers(path, df, "value", allow_blank=False)
    for col in ("lr", "calibrator_lr"):
        df[col] = _numbers(path, df, col, allow_blank=True)
    dup = df.duplicated(["dataset", "variant", "seed", "split", "metric"], keep=False)
    if dup.any():
        raise _bad(path, "variant", df, dup, "one row per (dataset, variant, seed, split, metric)")
    return df


def read_bench_json(folder: str | Path) -> dict[str, Any] | None:
    """``folder/bench.json`` as a dict, None when absent.

    Raises
    ------
    ValueError
        The file exists but is not a JSON object.
    """
    path = Path(folder) / "bench.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {path} as JSON ({err}).") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object (found {type(data).__name__}).")
    return data


# --------------------------------------------------------------------------- seeds


@dataclass
class SeedPlan:
    """How many seeds each (dataset, protocol, method) cell was planned with.

    From ``runs.csv`` (one row per planned run) when present, else from the suite's
    ``seeds`` in ``bench.json``; :meth:`planned` returns None when neither says.
    """

    cells: Mapping[tuple[str, str, str], int]
    default: int | None = None

    @classmethod
    def from_bench(cls, runs: pd.DataFrame | None, meta: Mapping[str, Any] | None) -> SeedPlan:
        cells: dict[tuple[str, str, str], int] = {}
        if runs is not None and not runs.empty:
            counts = runs.groupby(["dataset", "protocol", "method"])["seed"].nunique()
            cells = {tuple(map(str, k)): int(v) for k, v in counts.items()}  # type: ignore[misc]
        default = None
        suite = (meta or {}).get("suite")
        seeds = suite.get("seeds") if isinstance(suite, Mapping) else None
        if isinstance(seeds, list | tuple) and seeds:
            default = len(seeds)
        elif isinstance(seeds, int) and not isinstance(seeds, bool) and seeds > 0:
            default = seeds
        return cls(cells, default)

    def planned(self, dataset: str, protocol: str, method: str) -> int | None:
        """The planned seed count of a cell (None: unknown)."""
        return self.cells.get((dataset, protocol, method), self.default)
