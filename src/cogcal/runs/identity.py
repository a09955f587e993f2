"""When two runs are the same, and the digest that binds a run's files to its configuration.

A run's resolved configuration (``config.json``) holds its *settings* (the fields of
:class:`cogcal.train.TrainConfig`, every default filled in) and its *record*
(:data:`RECORD_KEYS`: what the run found in the data). Two runs are the same when every
setting that can change results is equal (:func:`result_fields`: not those of
:data:`UNBOUND_SETTINGS`, which say where a run lies or how it is shown, nor those the method
does not use). :func:`config_digest` hashes those settings and the record, so that a run
moved, copied or resumed with another ``--no-progress`` keeps its digest, and every
checkpoint and ``metrics.json`` name the configuration they belong to.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from cogcal.runs.methods import get_method

__all__ = [
    "MARK",
    "RECORD_KEYS",
    "UNBOUND_SETTINGS",
    "config_diff",
    "config_digest",
    "file_digest",
    "record_diff",
    "resolved_config",
    "result_fields",
]

#: The key of ``config.json`` that marks a folder as a cogcal run (its value: the format).
MARK = "cogcal_run"
#: Settings that never change results: where a run and its data lie, and how it is shown
#: (the fields of :class:`cogcal.train.TrainConfig` documented as such).
UNBOUND_SETTINGS = frozenset(
    {"data_root", "download", "mirror", "out", "progress", "checkpoint_seconds", "extra"}
)
#: What a run records in ``config.json`` besides its settings: what it found in the data.
RECORD_KEYS = frozenset({"task", "num_classes", "input_shape", "data", "input", "class_names"})
#: Keys of ``config.json`` that say where a run lies or how it was shown.
_UNBOUND = frozenset({MARK, "cogcal_version"}) | UNBOUND_SETTINGS
#: Keys of a run's ``data`` record that say where the data lies, not what it is.
_DATA_PLACE = ("dataset", "path", "source_files")


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a configuration that can change results (all of them, defaults
    included, before the method's unused ones are dropped)."""
    return {k: v for k, v in config.items() if k not in RECORD_KEYS and k not in _UNBOUND}


def result_fields(resolved: Mapping[str, Any], *, fingerprint: bool = True) -> dict[str, Any]:
    """The part of a resolved configuration that can change a run's results.

    Drops the settings documented as not changing results (:data:`UNBOUND_SETTINGS`), the
    record (:data:`RECORD_KEYS`) and the fields the method does not use (``stage2_epochs``
    without a second stage, ``step_size`` without the step schedule, ``target`` /
    ``image_size`` for datasets they do not apply to, ``selection`` when the learning rates
    are given), so that two runs computing the same thing compare equal. Every other field
    is kept, defaults included; ``normalization`` counts for every dataset.

    A ``csv:`` or ``folder:`` dataset counts by its data, not by the spelling of its path:
    by the content fingerprint when ``resolved`` records one (``data.fingerprint``, what a
    run writes into ``config.json``) and ``fingerprint`` is true, else by the absolute,
    link-free path, so ``csv:d.csv`` and ``csv:/abs/d.csv`` are the same dataset.

    >>> result_fields({"method": "ce", "stage2_epochs": 40, "lr": 0.1, "out": "x"})
    {'method': 'ce', 'lr': 0.1}
    """
    out = _settings(resolved)
    if not get_method(str(out.get("method"))).stage2:
        out.pop("stage2_epochs", None)
    if out.get("schedule") != "step":
        out.pop("step_size", None)
    if resolved.get("lr") is not None:  # the learning rates are given: nothing is selected
        out.pop("selection", None)
    dataset = str(out.get("dataset", ""))
    if not dataset.startswith("csv:"):
        out.pop("target", None)
    if not dataset.startswith("folder:"):
        out.pop("image_size", None)
    if dataset.startswith(("folder:", "csv:")):
        out["dataset"] = _data_identity(resolved, dataset, fingerprint=fingerprint)
    return out


def _data_identity(resolved: Mapping[str, Any], dataset: str, *, fingerprint: bool) -> str:
    """``csv:sha256:<hex>`` (the recorded content fingerprint) or ``csv:<absolute path>``."""
    kind, _, path = dataset.partition(":")
    data = resolved.get("data")
    recorded = data.get("fingerprint") if isinstance(data, Mapping) else None
    if fingerprint and isinstance(recorded, Mapping) and isinstance(recorded.get("sha256"), str):
        return f"{kind}:sha256:{recorded['sha256']}"
    return f"{kind}:{os.path.realpath(os.path.expanduser(path))}"


def config_digest(config: Mapping[str, Any]) -> str:
    """The sha256 (hex) of what a resolved configuration (or ``config.json``) computes.

    It covers every setting that can change results (:func:`result_fields`: a
    ``csv:``/``folder:`` dataset by its content fingerprint) and the run's record (model,
    task, classes and their names, input shape and preprocessing, the data's sizes and
    statistics), but not where the run or its data lie, nor how it was shown (``out``,
    ``data_root``, ``progress``, ``extra``, ...).

    >>> a = {"method": "ce", "lr": 0.1, "out": "a", "task": "multiclass"}
    >>> config_digest(a) == config_digest({**a, "out": "b", "progress": False})
    True
    >>> config_digest(a) == config_digest({**a, "lr": 0.5})
    False
    """
    config = dict(config)
    try:
        fields = result_fields(config)
    except (ValueError, TypeError, KeyError):  # an unknown method: a damaged record as it is
        fields = _settings(config)
    rest = {k: v for k, v in config.items() if k in RECORD_KEYS}
    if isinstance(rest.get("data"), Mapping):
        rest["data"] = {k: v for k, v in rest["data"].items() if k not in _DATA_PLACE}
    text = json.dumps(
        finite({"fields": fields, "record": rest}), sort_keys=True, separators=(",", ":"),
        default=repr,
    )  # fmt: skip
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def finite(obj: Any) -> Any:
    """Non-finite floats become None, so that a record stays valid JSON."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# --------------------------------------------------------------------------- comparison


def equal(a: Any, b: Any) -> bool:
    """Two recorded values are the same: numbers to 12 significant digits, booleans as such."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return a == b


def record_diff(
    recorded: Mapping[str, Any], now: Mapping[str, Any], skip: frozenset[str] = _UNBOUND
) -> list[str]:
    """The keys on which two recorded configurations differ, as ``"key: a -> b"``
    (nested keys as ``input.std``), except those that say where a run or its data lie."""
    out = []
    for key in sorted((set(recorded) | set(now)) - skip):
        a, b = recorded.get(key), now.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            inner = frozenset(_DATA_PLACE) if key == "data" else frozenset()
            out += [f"{key}.{d}" for d in record_diff(a, b, inner)]
        elif not equal(a, b):
            out.append(f"{key}: {_short(a)} -> {_short(b)}")
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The fields (that can change results) on which two resolved configurations differ,
    as ``"field: a -> b"`` lines; empty when they compute the same run.

    >>> config_diff({"method": "ce", "lr": 0.1}, {"method": "ce", "lr": 0.2, "out": "x"})
    ['lr: 0.1 -> 0.2']
    """
    both = _has_fingerprint(a) and _has_fingerprint(b)  # compare data by content then
    ka = result_fields(dict(a), fingerprint=both)
    kb = result_fields(dict(b), fingerprint=both)
    return [
        _data_change(a, b) if k == "dataset" and both else f"{k}: {ka.get(k)!r} -> {kb.get(k)!r}"
        for k in sorted(set(ka) | set(kb))
        if k not in ka or k not in kb or not equal(ka[k], kb[k])
    ]


def _data_change(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """A ``csv:``/``folder:`` dataset whose content fingerprint differs, in words: the same
    file (or folder) whose content changed since the run started, or another one."""
    paths, digests = [], []
    for c in (before, now):
        data = c.get("data") or {}
        spec = str(c.get("dataset", ""))
        paths.append(data.get("path") or os.path.realpath(spec.partition(":")[2]))
        digests.append(str((data.get("fingerprint") or {}).get("sha256", ""))[:12])
    change = f"sha256 {digests[0]}... -> {digests[1]}..."
    if paths[0] == paths[1]:
        return f"dataset: the content of {paths[0]} changed since the run started ({change})"
    return (
        f"dataset: {before.get('dataset')!r} -> {now.get('dataset')!r}, another "
        f"{'folder' if str(now.get('dataset')).startswith('folder:') else 'file'} with other "
        f"content ({change})"
    )


def _has_fingerprint(c: Mapping[str, Any]) -> bool:
    data = c.get("data")
    return isinstance(data, Mapping) and isinstance(data.get("fingerprint"), Mapping)


def resolved_config(config: Any) -> dict[str, Any]:
    """A configuration as ``config.json`` records it: a recorded or resolved mapping as it
    is, or anything with a ``resolved()`` method (a :class:`cogcal.train.TrainConfig`)
    resolved by it."""
    resolve = getattr(config, "resolved", None)
    return dict(resolve()) if callable(resolve) else dict(config)
