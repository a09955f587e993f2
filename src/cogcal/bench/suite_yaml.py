"""Suite YAML: the files shipped in ``cogcal/bench/suites/`` or given by path, and the
structural checks every section of a suite shares.

:func:`read_suite` finds a suite by shipped name or path and reads its YAML;
:func:`cogcal.bench.suites.parse_suite` validates what it returns, section by section,
with :func:`as_mapping`, :func:`check_keys`, :func:`yaml_number` and the checks of
seeds, protocols and switches (:func:`check_seeds`, :func:`check_protocols`,
:func:`check_flag`).
"""

from __future__ import annotations

import difflib
import importlib.resources
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cogcal._constraints import SEED, SEED_MAX, Boolean, Integer

__all__ = [
    "MAX_NODES",
    "MAX_SEEDS",
    "NAME_PATTERN",
    "as_mapping",
    "check_flag",
    "check_keys",
    "check_name",
    "check_protocols",
    "check_seeds",
    "list_suites",
    "read_suite",
    "yaml_number",
]

#: The most seeds a suite may list (each seed is one run per method and dataset).
MAX_SEEDS = 1000
#: A suite's seed count.
SEED_COUNT = Integer(1, MAX_SEEDS)

#: The most YAML values a suite may hold with its aliases expanded (the shipped suites
#: hold a few hundred): a nested alias ("billion laughs") is refused before it is used.
MAX_NODES = 10_000

#: What a suite's ``name`` may be: a short identifier (letters, digits, ``.``, ``_``,
#: ``-``), as it names the bench's folders and reports.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: Keys of the earlier suite schema, with what replaced them.
_MOVED = {
    "paper_baseline_lr": "the paper's baseline learning rate is now budget.paper.baselines.lr",
    "method_train": "per-method overrides are gone: budgets are stated per family under "
    "budget.<protocol> (see docs/bench.md)",
    "cog": "COG grids are now tune.lrs x tune.ratios (log-spaced lists)",
    "baseline": "the baselines' grid is now tune.baseline_lrs (a log-spaced list)",
    "reuse": "reuse is now a top-level key (reuse: true)",
}


def _suites_dir() -> Any:
    return importlib.resources.files("cogcal.bench") / "suites"


def list_suites() -> list[str]:
    """Return the names of the suites shipped with cogcal, sorted.

    Examples
    --------
    >>> "quick" in list_suites()
    True
    """
    names = [
        entry.name[: -len(".yaml")]
        for entry in _suites_dir().iterdir()
        if entry.name.endswith(".yaml")
    ]
    return sorted(names)


def read_suite(name_or_path: str | Path) -> tuple[Any, str, str]:
    """Read a suite by shipped name or YAML path: ``(raw, source, default_name)``.

    ``raw`` is the parsed YAML (not yet validated), ``source`` names the suite in messages
    (the quoted name or the path) and ``default_name`` is the name a suite without one
    takes (the name, or the file's stem). Anything ending in ``.yaml``/``.yml`` or
    containing a path separator is a path.

    Raises
    ------
    ValueError
        An unknown name (the message lists the shipped ones and suggests the closest), a
        missing file, or invalid YAML.
    """
    if not isinstance(name_or_path, str | Path):
        raise ValueError(
            f"a suite is a shipped name or a YAML path, got {type(name_or_path).__name__}."
        )
    text_name = str(name_or_path)
    looks_like_path = (
        isinstance(name_or_path, Path)
        or text_name.endswith((".yaml", ".yml"))
        or "/" in text_name
        or "\\" in text_name
    )
    if looks_like_path:
        path = Path(text_name).expanduser()
        if not path.is_file():
            raise ValueError(
                f"suite file {str(path)!r} does not exist; pass an existing YAML file or "
                f"one of the shipped suites: {', '.join(list_suites())}."
            )
        text, source, default_name = path.read_text(encoding="utf-8"), str(path), path.stem
    else:
        names = list_suites()
        if text_name not in names:
            close = difflib.get_close_matches(text_name, names, n=1, cutoff=0.4)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown suite {text_name!r}.{hint} Shipped suites: {', '.join(names)} "
                "(or pass the path of a suite YAML file)."
            )
        entry = _suites_dir() / f"{text_name}.yaml"
        text, source, default_name = entry.read_text(encoding="utf-8"), repr(text_name), text_name
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        size = _expanded_size(node, {})
        if size > MAX_NODES:
            raise ValueError(
                f"suite {source} expands to more than {MAX_NODES} YAML values (its aliases "
                "repeat anchored sections); write the values out or shorten the suite."
            )
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"suite {source} is not valid YAML: {err}") from None
    return raw, source, default_name


def _expanded_size(node: Any, sizes: dict[int, int]) -> int:
    """How many YAML values ``node`` holds once every alias is expanded (an alias counts
    its anchored node in full; sizes of shared nodes are remembered, so the count is
    cheap even where the expansion is huge)."""
    if node is None:
        return 0
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = MAX_NODES + 1  # a node inside itself (a recursive alias) is too big
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    sizes[id(node)] = min(total, MAX_NODES + 1)
    return sizes[id(node)]


# --------------------------------------------------------------------------- structure


def check_keys(d: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    """Refuse a key of ``d`` (a section at ``where``) not in ``allowed``: the message
    suggests the closest allowed key, or says what replaced a key of the earlier schema."""
    for key in d:
        if key not in allowed:
            if key in _MOVED:
                raise ValueError(f"{where}: {key!r} is no longer a suite key: {_MOVED[key]}.")
            close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown key {key!r} in {where}.{hint} Allowed keys: {', '.join(allowed)}."
            )


def as_mapping(value: Any, where: str) -> dict[str, Any]:
    """A section as a dict with string keys (``None``, an empty section: ``{}``)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping (key: value), got {type(value).__name__}.")
    return {str(k): v for k, v in value.items()}


def yaml_number(value: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string: read it as the number it is (anything
    else is left for the validators to refuse)."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def check_seeds(value: Any, where: str) -> tuple[int, ...]:
    """A seed count (``3`` -> ``(0, 1, 2)``) or a list of distinct seeds, at most
    :data:`MAX_SEEDS` of them, each in ``0 .. 2**32 - 1`` (numpy's seeding range)."""
    usage = f"a count from 1 to {MAX_SEEDS} (e.g. 5) or a list of seeds such as [0, 4, 7]"
    if Integer().problem(value) is None:  # a count (not a bool)
        if SEED_COUNT.problem(value) is not None:
            raise ValueError(
                f"{where} must be {usage}, got {value}"
                + (" (each seed is one run per method and dataset)." if value > 0 else ".")
            )
        return tuple(range(int(value)))
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        if len(value) > MAX_SEEDS:
            raise ValueError(
                f"{where} lists {len(value)} seeds; the most a suite runs is {MAX_SEEDS}."
            )
        seeds = []
        for s in value:
            if SEED.problem(s) is not None:
                raise ValueError(
                    f"{where} must hold integers from 0 to {SEED_MAX} (numpy's seeding range), "
                    f"got {s!r}."
                )
            seeds.append(int(s))
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{where} has repeated seeds: {value!r}.")
        return tuple(seeds)
    raise ValueError(f"{where} must be {usage}, got {value!r}.")


def check_name(value: Any, where: str) -> str:
    """A suite's ``name``: a string of at most 64 letters, digits, ``.``, ``_`` or ``-``
    (starting with a letter or digit)."""
    if not isinstance(value, str) or NAME_PATTERN.fullmatch(value) is None:
        shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:77]}..."
        raise ValueError(
            f"{where} must be a short name (at most 64 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit), got {shown}."
        )
    return value


def check_protocols(value: Any, where: str, known: Sequence[str]) -> tuple[str, ...]:
    """A non-empty list (or comma-separated string) of the ``known`` protocols, returned
    in their order, each once."""
    if isinstance(value, str):
        value = [p.strip() for p in value.split(",") if p.strip()]
    if not isinstance(value, Sequence) or not value:
        raise ValueError(f"{where} must be a non-empty list of {tuple(known)}, got {value!r}.")
    out = []
    for p in value:
        if p not in known:
            raise ValueError(
                f"unknown protocol {p!r} in {where}; expected one or both of: {', '.join(known)}."
            )
        if p not in out:
            out.append(p)
    return tuple(p for p in known if p in out)


def check_flag(d: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    """``d[key]`` (``default`` when absent), which must be true or false."""
    value = d.get(key, default)
    if Boolean().problem(value) is not None:
        raise ValueError(f"{where}{key} must be true or false, got {value!r}.")
    return value
