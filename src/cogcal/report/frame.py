"""The report's one reader of a bench folder's tables, and its one row filter (:func:`rows`).

:func:`load_results` reads ``results.csv`` (the file a user points ``cogcal report`` at)
and checks it: a missing column, a bad cell (named by line and value) or a duplicate row
is an error, never dropped. ``task``, ``condition`` and ``severity`` become strings
(``""`` when empty), ``seed`` an ``int``, ``value`` a float; ``nan`` stays ``NaN`` and is
not counted as a seed. The tables the bench writes for itself (``runs.csv``,
``tuning.csv``, ``effect.csv``, ``bench.json``) are read as written (:func:`load_bench_csv`).

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
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cogcal._errors import ArgumentError
from cogcal.runs import columns as S

_SHOWN = 5  # bad rows quoted in one error message
_NAN_TEXT = frozenset({"nan", "NaN", "NAN", "inf", "-inf", "Infinity", "-Infinity"})


class _Selector(str):
    """A ``task`` selection that is not an equality test (see :func:`rows`)."""


#: ``task``: the aggregate rows (empty, or ``"mean"`` of a multi-task run).
AGGREGATE = _Selector("AGGREGATE")
#: ``task``: the rows of one individual task (neither empty nor ``"mean"``).
INDIVIDUAL = _Selector("INDIVIDUAL")


def _mask(df: pd.DataFrame, column: str, want: Any) -> pd.Series:
    if column not in df.columns:
        if want is AGGREGATE or want == "":
            return pd.Series(True, index=df.index)  # an absent optional column is blank
        raise ArgumentError(f"cannot select on {column!r}: the table has no such column.")
    col = df[column].astype(str).str.strip()
    blank = df[column].isna() | (col == "")
    if isinstance(want, _Selector):
        return (blank | (col == "mean")) == (want is AGGREGATE)
    if isinstance(want, Collection) and not isinstance(want, str):
        return df[column].isin(list(want))
    return blank if want == "" else df[column] == want


def rows(df: pd.DataFrame, **selection: Any) -> pd.DataFrame:
    """The rows of ``df`` matching every selection ``column=want``.

    ``want`` is a value (equality), a collection of values (membership) or ``""`` (the
    empty cell); ``task`` also takes :data:`AGGREGATE` (empty or ``"mean"``) and
    :data:`INDIVIDUAL` (a task name). Copy the result before assigning to it.
    """
    keep = pd.Series(True, index=df.index)
    for column, want in selection.items():
        keep &= _mask(df, column, want)
    return df[keep]


def aggregate(df: pd.DataFrame, **selection: Any) -> pd.DataFrame:
    """:func:`rows` of a run's in-distribution numbers (``task`` empty or ``mean``)."""
    selection.setdefault("task", AGGREGATE)
    selection.setdefault("condition", "")
    selection.setdefault("severity", "")
    return rows(df, **selection)


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
        raise ArgumentError(f"unknown measure {measure!r}; expected test, ood or shift.")
    d = d[np.isfinite(d["value"].astype(float))]
    return d.groupby(keys, as_index=False)["value"].mean()


def protocol_order(protocols: Collection[str]) -> list[str]:
    """``paper``, ``fair``, then any other protocol sorted."""
    present = set(protocols)
    return [p for p in S.PROTOCOLS if p in present] + sorted(present - set(S.PROTOCOLS))


# --------------------------------------------------------------------------- reading


def _check(path: Path, df: pd.DataFrame, column: str, bad: pd.Series, expected: str) -> None:
    """An error quoting the first ``bad`` lines (line 1 is the header) and their values."""
    where = df.index[bad.to_numpy()]
    if len(where):
        shown = ", ".join(f"line {i + 2}: {df.at[i, column]!r}" for i in where[:_SHOWN])
        more = f" (and {len(where) - _SHOWN} more)" if len(where) > _SHOWN else ""
        raise ArgumentError(f"{path}: column {column!r} must hold {expected}; found {shown}{more}.")


def normalise_results(df: pd.DataFrame, source: str | Path = "results.csv") -> pd.DataFrame:
    """Check and normalise a ``results.csv`` table given as strings (see the module doc);
    ``ValueError`` naming ``source``, the line(s) and the value(s) of a missing column, an
    unknown split or protocol, a bad seed or value, a condition or severity on a val/test
    row, an OOD row without its set, or the same result twice."""
    path = Path(source)
    missing = [c for c in S.RESULT_COLUMNS if c not in df.columns]
    if missing:
        raise ArgumentError(
            f"{path} lacks the column(s) {', '.join(missing)}; results.csv has the columns "
            f"{', '.join(S.RESULT_COLUMNS)} (docs/method.md §6), as `cogcal bench` writes it."
        )
    df = df[list(S.RESULT_COLUMNS)].fillna("").astype(str).apply(lambda c: c.str.strip())
    _check(path, df, "split", ~df["split"].isin(S.SPLITS), f"one of {', '.join(S.SPLITS)}")
    _check(path, df, "protocol", ~df["protocol"].isin(S.PROTOCOLS), " or ".join(S.PROTOCOLS))
    seed = pd.to_numeric(df["seed"], errors="coerce")
    _check(path, df, "seed", ~(seed >= 0) | (seed % 1 != 0), "integers >= 0")
    value = pd.to_numeric(df["value"].where(df["value"] != ""), errors="coerce")
    _check(path, df, "value", value.isna() & ~df["value"].isin(_NAN_TEXT), "numbers")
    severity = pd.to_numeric(df["severity"].where(df["severity"] != ""), errors="coerce")
    bad = (df["severity"] != "") & (~(severity >= 1) | (severity % 1 != 0))
    _check(path, df, "severity", bad, "integers >= 1")
    in_dist = df["split"].isin(["val", "test"])
    for col in ("condition", "severity"):
        _check(path, df, col, in_dist & (df[col] != ""), "an empty cell on val/test rows")
    ood = (df["split"] == "ood") & (df["condition"] == "")
    _check(path, df, "condition", ood, "the OOD set's name on ood rows")
    df["seed"], df["value"] = seed.astype(int), value.astype(float)
    df["severity"] = severity.map(lambda v: "" if pd.isna(v) else str(int(v)))
    key = [c for c in S.RESULT_COLUMNS if c != "value"]
    dup = df.duplicated(key, keep=False)
    if dup.any():
        first = df[dup].iloc[0]
        same = df.index[dup & (df[key] == first[key]).all(axis=1)] + 2
        raise ArgumentError(
            f"{path}: lines {', '.join(map(str, same))} hold the same result; each (dataset, "
            "method, protocol, seed, split, metric, task, condition, severity) must appear "
            "once. Rebuild results.csv with `cogcal bench`."
        )
    return df.reset_index(drop=True)


def load_results(folder: str | Path) -> pd.DataFrame:
    """Read, check and normalise ``folder/results.csv`` (:func:`normalise_results`);
    ``ValueError`` when it is missing, unreadable or malformed."""
    path = Path(folder) / "results.csv"
    if not path.is_file():
        raise ArgumentError(
            f"{str(path)!r} does not exist; run `cogcal bench --out {folder}` first, or pass "
            "the folder that holds results.csv."
        )
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[])
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ArgumentError(f"cannot read {path} as a CSV table ({err}).") from None
    return normalise_results(df.rename(columns=lambda c: str(c).strip()), path)


#: The text columns of the tables the bench writes (the others are numbers or flags).
_TEXT = {
    "runs.csv": ("dataset method protocol status model schedule copied_from run_dir log"),
    "tuning.csv": "protocol dataset group used_by schedule status edges",
    "effect.csv": "dataset variant schedule split metric",
}


def load_bench_csv(folder: str | Path, name: str) -> pd.DataFrame | None:
    """``runs.csv``, ``tuning.csv`` or ``effect.csv`` of a bench folder as the bench wrote
    it (:mod:`cogcal.runs.columns`; not re-checked), empty text cells ``""``; None when
    the file is absent."""
    path = Path(folder) / name
    if not path.is_file():
        return None
    text = _TEXT[name].split()
    df = pd.read_csv(path, dtype=dict.fromkeys(text, str))
    df[text] = df[text].fillna("")
    for flag in ("chosen", "at_edge", "cap_reached"):
        if flag in df.columns:
            df[flag] = df[flag].eq(True)
    return df


def read_bench_json(folder: str | Path) -> dict[str, Any] | None:
    """``folder/bench.json`` as written by the bench, None when absent."""
    path = Path(folder) / "bench.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


# --------------------------------------------------------------------------- seeds


@dataclass
class SeedPlan:
    """How many seeds each (dataset, protocol, method) cell was planned with.

    From ``runs.csv`` when present, else from the suite's ``seeds`` in ``bench.json``.
    """

    cells: Mapping[tuple[str, str, str], int]
    default: int | None = None

    @classmethod
    def from_bench(cls, runs: pd.DataFrame | None, meta: Mapping[str, Any] | None) -> SeedPlan:
        cells: dict[tuple[str, str, str], int] = {}
        if runs is not None and not runs.empty:
            counts = runs.groupby(["dataset", "protocol", "method"])["seed"].nunique()
            cells = {tuple(map(str, k)): int(v) for k, v in counts.items()}  # type: ignore[misc]
        seeds = ((meta or {}).get("suite") or {}).get("seeds")  # a list in bench.json
        default = len(seeds) if seeds else None
        return cls(cells, default)

    def planned(self, dataset: str, protocol: str, method: str) -> int | None:
        """The planned seed count of a cell (None: unknown)."""
        return self.cells.get((dataset, protocol, method), self.default)
