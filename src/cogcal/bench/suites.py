"""Benchmark suites: small YAML files naming datasets, methods, seeds, budgets and grids.

A suite is either the name of a file shipped in ``cogcal/bench/suites/`` (see
:func:`cogcal.bench.list_suites`) or the path of a user YAML file with the same schema::

    name: quick                     # optional for user files (default: the file stem)
    description: one line shown by `cogcal bench --list`
    requires: {gpu: false}          # true: refuse to start without torch.cuda
    datasets:                       # dataset name -> options
      mnist1d: {model: cnn1d}
      digits: {model: cnn, train: {batch_size: 64}}   # per-dataset TrainConfig fields
      csv:data/wine.csv: {target: label}  # a csv: table names its label column
      mnist1d-mtl: {model: mlp, methods: [ce, cog-fc]}  # a subset of the methods below
    methods: [ce, ts, cog-fc]       # docs/method.md §6 names (any case)
    seeds: 3                        # 3 -> seeds 0, 1, 2 (at most 1000); or a list [0, 4]
    protocols: [paper, fair]
    train: {batch_size: 256}        # TrainConfig fields shared by every run
    budget:                         # epochs, schedule and early stopping, stated per family
      paper:
        baselines: {lr: 1.0e-4, epochs: 15, schedule: none, patience: null, stage2_epochs: 8}
        cog: {epochs: 15, schedule: step, step_size: 5, patience: null}
      fair:                         # one budget for every method (isolates the calibrator)
        {epochs: 15, schedule: step, step_size: 5, patience: null, stage2_epochs: 8}
    tune:
      seed: 0                       # tuning runs use this seed only
      lrs: [1.0e-3, 3.0e-3, 1.0e-2]   # COG lambda_f: half-decade steps (or a constant factor)
      ratios: [0.03, 0.1, 0.3]      # COG lambda_c / lambda_f, the same kind of axis, < 1
      baseline_lrs: [1.0e-3, 2.0e-3]  # lambda_f of the baselines that are tuned
      max_extensions: 2             # times a grid may grow outward from an edge choice
    reuse: true                     # train identical configurations once, copy the rest
    effect: true                    # the "where COG's effect comes from" runs (fair)

A dataset named ``package.module:function`` is a plugin, code the bench would import and
call: a suite naming one loads only with ``allow_plugins=True`` (``cogcal bench
--allow-plugins``); checking a suite never imports or calls anything.

docs/bench.md ("Suites") describes the budgets (``budget.<protocol>``: per method family,
``baselines`` and ``cog``, in the ``paper`` protocol; one mapping for every method in the
``fair`` one; never implied, never set in ``train``), the protocols and the tuning rule
(:class:`cogcal.train.search.Search`: lowest validation cross-entropy, grids grown
outward from an edge choice at most ``max_extensions`` times).

Validation is :class:`~cogcal.train.config.TrainConfig`'s: a ``train`` section, a budget
and every planned run are checked by building their ``TrainConfig``, whose error is
reported once with the suite key it came from; this module checks only the suite's own
structure (keys, families, protocols, seeds, grids). Unknown keys anywhere raise
``ValueError`` naming the key and the allowed ones. Budgets are parsed by
:mod:`cogcal.bench.budget`; suite files are found and read by :mod:`cogcal.bench.suite_yaml`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cogcal._constraints import LR_GRID, NON_NEGATIVE, SEED, check
from cogcal._errors import ArgumentError
from cogcal.bench.budget import BUDGET_FIELDS, FAMILIES, Budget, family_of, parse_budgets
from cogcal.bench.suite_yaml import (
    MAX_SEEDS,
    as_mapping,
    check_flag,
    check_keys,
    check_name,
    check_protocols,
    check_seeds,
    read_suite,
    yaml_number,
)
from cogcal.data import list_datasets
from cogcal.runs.columns import PROTOCOLS
from cogcal.runs.methods import get_method, list_methods
from cogcal.train.config import TrainConfig
from cogcal.train.tuning import Grid, GridSearch, point_config

__all__ = [
    "MAX_SEEDS",
    "PROTOCOLS",
    "DatasetEntry",
    "Suite",
    "TuneSpec",
    "load_suite",
    "parse_suite",
]


#: TrainConfig fields the bench sets for every run itself.
BENCH_FIELDS: tuple[str, ...] = (
    "dataset",
    "model",
    "method",
    "seed",
    "out",
    "data_root",
    "progress",
    "download",
    "mirror",
    "extra",
)

_TOP_KEYS = (
    "name",
    "description",
    "requires",
    "datasets",
    "methods",
    "seeds",
    "protocols",
    "train",
    "budget",
    "tune",
    "reuse",
    "effect",
)
_REQUIRED_TOP = ("datasets", "methods", "budget")
_REQUIRES_KEYS = ("gpu",)
_DATASET_KEYS = ("model", "target", "train", "methods")

#: The flag (and ``run_bench`` argument) that lets a suite import dataset plugins.
PLUGIN_FLAG = "--allow-plugins"


@dataclass(frozen=True)
class TuneSpec:
    """The grids of a suite (see the module docstring)."""

    seed: int = 0
    lrs: tuple[float, ...] = ()
    ratios: tuple[float, ...] = ()
    baseline_lrs: tuple[float, ...] = ()
    max_extensions: int = 2

    def grid(self, family: str, *, allow_fast_calibrator: bool = False) -> Grid:
        """The starting grid of a family (``cog``: lrs x ratios; ``baselines``: baseline_lrs)."""
        if family == "cog":
            return Grid(self.lrs, self.ratios, allow_fast_calibrator=allow_fast_calibrator)
        return Grid(self.baseline_lrs)

    def search(self, family: str, *, allow_fast_calibrator: bool = False) -> GridSearch:
        """A fresh :class:`GridSearch` over the family's grid."""
        return GridSearch(
            self.grid(family, allow_fast_calibrator=allow_fast_calibrator),
            max_extensions=self.max_extensions,
        )


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset of a suite: its name, backbone, TrainConfig fields and, when it runs
    only some of the suite's methods, those (``None``: all of them)."""

    name: str
    model: str | None = None
    train: dict[str, Any] = field(default_factory=dict)
    methods: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Suite:
    """A validated benchmark suite (see the module docstring for the YAML schema).

    Attributes
    ----------
    name, description : str
    datasets : tuple of DatasetEntry
    methods : tuple of str
    seeds : tuple of int
    protocols : tuple of str
        The protocols run (a subset of :data:`PROTOCOLS` with a budget each).
    train : dict
        TrainConfig fields of every run (never budget fields).
    budgets : dict
        ``{protocol: {family: Budget}}`` for every protocol the suite states.
    tune : TuneSpec
    reuse : bool
        Train identical configurations once and copy the run.
    effect : bool
        Plan the runs of the "where COG's effect comes from" comparison (fair protocol).
    requires_gpu : bool
    source : str
    """

    name: str
    description: str
    datasets: tuple[DatasetEntry, ...]
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    protocols: tuple[str, ...]
    train: dict[str, Any]
    budgets: dict[str, dict[str, Budget]]
    tune: TuneSpec
    reuse: bool
    effect: bool
    requires_gpu: bool
    source: str

    def replace(self, **changes: Any) -> Suite:
        """A copy with some fields changed, validated like the YAML values (an invalid
        change is the caller's input: :class:`~cogcal._errors.ArgumentError`).

        >>> load_suite("quick").replace(seeds=1).seeds
        (0,)
        """
        try:
            if "seeds" in changes:
                changes["seeds"] = check_seeds(changes["seeds"], "seeds")
            if "protocols" in changes:
                changes["protocols"] = check_protocols(changes["protocols"], "protocols", PROTOCOLS)
            new = dataclasses.replace(self, **changes)
            _check_budgets_cover(new, f"suite {new.source}")
            _check_configs(new, f"suite {new.source}")
        except ArgumentError:
            raise
        except ValueError as err:
            raise ArgumentError(str(err)) from None
        return new

    def methods_of(self, entry: DatasetEntry) -> tuple[str, ...]:
        """The methods run on ``entry``: its own ``methods`` (a subset of the suite's, in
        the suite's order) or all of the suite's.

        >>> s = load_suite("claims")
        >>> [e.name for e in s.datasets if s.methods_of(e) != s.methods]
        ['mnist1d-mtl']
        """
        if entry.methods is None:
            return self.methods
        return tuple(m for m in self.methods if m in entry.methods)

    def budget(self, protocol: str, method: str) -> Budget:
        """The budget of ``method`` in ``protocol``."""
        return self.budgets[protocol][family_of(method)]

    def run_fields(self, protocol: str, entry: DatasetEntry, method: str) -> dict[str, Any]:
        """TrainConfig fields of ``method`` on ``entry`` in ``protocol``: the ``train``
        sections, the budget (without the learning rates when they are tuned), the dataset,
        model and method (no seed, out or data root)."""
        return {
            "preset": "paper",  # a field a suite leaves out keeps the paper's value (batch 256)
            **self.train,
            **entry.train,
            **self.budget(protocol, method).config_fields(),
            "dataset": entry.name,
            "model": entry.model,
            "method": method,
        }

    @property
    def allow_fast_calibrator(self) -> bool:
        return bool(self.train.get("allow_fast_calibrator", False))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (recorded in ``bench.json``; ``budgets`` as
        ``budget``, its YAML key)."""
        fields = dataclasses.asdict(self)
        return {("budget" if k == "budgets" else k): v for k, v in fields.items()}


def load_suite(name_or_path: str | Path, *, allow_plugins: bool = False) -> Suite:
    """Load and validate a suite by shipped name or YAML path.

    Parameters
    ----------
    name_or_path : str or Path
        A name from :func:`cogcal.bench.list_suites`, or the path of a YAML file
        (anything ending in ``.yaml``/``.yml`` or containing a path separator is a path).
    allow_plugins : bool, default False
        Accept ``package.module:function`` datasets (see :func:`parse_suite`).

    Returns
    -------
    Suite

    Raises
    ------
    ValueError
        Unknown suite name (the message lists the names and suggests the closest), a
        missing file, invalid YAML, or an invalid or unknown key (the message names it
        and the allowed ones), or a planned run whose TrainConfig is invalid.

    Examples
    --------
    >>> s = load_suite("cpu")
    >>> s.name, s.protocols, s.budget("paper", "ce").schedule
    ('cpu', ('paper', 'fair'), 'none')
    """
    raw, source, default_name = read_suite(name_or_path)
    return parse_suite(raw, source=source, default_name=default_name, allow_plugins=allow_plugins)


# --------------------------------------------------------------------------- validation


def _check_train(
    value: Any, where: str, *, context: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A ``train`` section: TrainConfig fields, never budget or bench-owned ones.

    ``context`` holds the bench-owned fields the section's values are checked with: a
    dataset's own section (``datasets.<name>.train``) is checked with that dataset (and its
    model and target), so options that apply to some datasets only (``target`` for a
    ``csv:`` table) are accepted where they apply; the suite-wide section is checked without
    a dataset and takes no ``target``.
    """
    d = as_mapping(value, where)
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    allowed = [n for n in names if n not in BUDGET_FIELDS and n not in BENCH_FIELDS]
    for key in d:
        if key in BUDGET_FIELDS:
            raise ValueError(
                f"{where}: {key!r} is part of the training budget; state it under "
                "budget.<protocol> (per method family), not in a train section."
            )
        if key in BENCH_FIELDS:
            raise ValueError(
                f"{where}: {key!r} is set by cogcal bench itself"
                + (" (give a dataset's model as datasets.<name>.model)" if key == "model" else "")
                + "."
            )
    check_keys(d, allowed, where)
    if context is None and "target" in d:
        raise ValueError(
            f"{where}: 'target' names the class column of one csv: dataset; give it on that "
            "dataset's entry (datasets: {csv:PATH: {target: COLUMN}})."
        )
    try:  # types and values: the TrainConfig rules
        TrainConfig.from_dict({**d, **(context or {})})
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return d


def _check_budgets_cover(suite: Suite, where: str) -> None:
    for protocol in suite.protocols:
        if protocol not in suite.budgets:
            raise ValueError(
                f"{where} has no budget for the {protocol} protocol; add budget.{protocol} "
                f"or run the protocols it has ({', '.join(suite.budgets) or 'none'})."
            )
    for protocol in suite.protocols:  # a budget for each family the suite has (only those)
        for fam in FAMILIES:
            members = [m for m in suite.methods if family_of(m) == fam]
            if members and fam not in suite.budgets[protocol]:
                raise ValueError(
                    f"{where}: budget.{protocol} has no budget for the {fam} family "
                    f"({', '.join(members)}); add budget.{protocol}.{fam}."
                )
    two_stage = [m for m in suite.methods if get_method(m).stage2]
    for protocol in suite.protocols:
        budget = suite.budgets[protocol]["baselines"] if two_stage else None
        if budget is not None and budget.stage2_epochs is None:
            raise ValueError(
                f"{where}: budget.{protocol} must state stage2_epochs for "
                f"{', '.join(two_stage)} (the TST / V-TST head's epochs)."
            )
    tuned = {
        family_of(m) for protocol in suite.protocols for m in suite.methods
        if suite.budget(protocol, m).tuned
    }  # fmt: skip
    if "cog" in tuned and not (suite.tune.lrs and suite.tune.ratios):
        raise ValueError(f"{where}: COG methods are tuned, so tune.lrs and tune.ratios are needed.")
    if "baselines" in tuned and not suite.tune.baseline_lrs:
        raise ValueError(f"{where}: baselines are tuned, so tune.baseline_lrs is needed.")
    effect = suite.effect and "fair" in suite.protocols and {"ce", "cog-fc"} <= set(suite.methods)
    if effect and suite.budgets["fair"]["baselines"].schedule != "step":
        raise ValueError(
            f"{where}: effect compares ce with and without the step schedule, but the fair "
            "budget has schedule none; use schedule step there or set effect: false."
        )


def _check_tune(value: Any, where: str, allow_fast: bool) -> TuneSpec:
    """The grids: the :class:`~cogcal.train.tuning.Grid` rules (positive, log-spaced,
    ratios < 1), whose axes come back sorted."""
    d = as_mapping(value, where)
    check_keys(d, [f.name for f in dataclasses.fields(TuneSpec)], where)
    suite = where.removesuffix(": tune")
    try:
        seed = check(d.get("seed", 0), SEED, "tune.seed")
        max_ext = check(d.get("max_extensions", 2), NON_NEGATIVE, "tune.max_extensions")
        axes = {
            key: tuple(map(yaml_number, v)) if isinstance(v, list) else v
            for key, v in d.items()
            if key in ("lrs", "ratios", "baseline_lrs")
        }
        for key, v in axes.items():  # each axis named as the user wrote it
            check(v, LR_GRID, f"tune.{key}")
    except ArgumentError as err:
        raise ValueError(f"{suite}: {err}") from None
    if bool(axes.get("lrs")) != bool(axes.get("ratios")):
        raise ValueError(f"{where}: lrs and ratios (the COG grid) are given together.")
    spec = TuneSpec(seed=seed, max_extensions=max_ext, **axes)
    try:
        if "lrs" in axes:
            grid = spec.grid("cog", allow_fast_calibrator=allow_fast)
            spec = dataclasses.replace(spec, lrs=grid.lrs, ratios=grid.ratios or ())
        if "baseline_lrs" in axes:
            spec = dataclasses.replace(spec, baseline_lrs=spec.grid("baselines").lrs)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return spec


def parse_suite(
    raw: Any, *, source: str = "<dict>", default_name: str = "custom", allow_plugins: bool = False
) -> Suite:
    """Validate a suite given as a mapping (the parsed YAML).

    Parameters
    ----------
    raw : mapping
        The suite (see the module docstring).
    source : str
        Where it came from, for messages.
    default_name : str
        Name used when ``raw`` has none.
    allow_plugins : bool, default False
        Accept datasets named ``package.module:function`` (plugins: code that runs when
        the bench loads the data). Without it such a suite is refused before anything is
        imported; checking a suite never imports or calls a plugin.

    Returns
    -------
    Suite

    Raises
    ------
    ValueError
        For any invalid or unknown key, a planned run with an invalid TrainConfig, or a
        plugin dataset without ``allow_plugins``.
    """
    where = f"suite {source}"
    d = as_mapping(raw, where)
    check_keys(d, _TOP_KEYS, where)
    for key in _REQUIRED_TOP:
        if key not in d:
            raise ValueError(f"{where} lacks the required key {key!r}.")

    name = default_name if d.get("name") is None else check_name(d["name"], f"{where}: name")
    description = str(d.get("description") or "")
    requires = as_mapping(d.get("requires"), f"{where}: requires")
    check_keys(requires, _REQUIRES_KEYS, f"{where}: requires")
    requires_gpu = check_flag(requires, "gpu", False, f"{where}: requires.")

    datasets_raw = as_mapping(d["datasets"], f"{where}: datasets")
    if not datasets_raw:
        raise ValueError(f"{where}: datasets is empty; name at least one dataset.")
    datasets = [
        _check_dataset(str(ds_name), opts, f"{where}: datasets", allow_plugins=allow_plugins)
        for ds_name, opts in datasets_raw.items()
    ]

    methods = _check_methods(d["methods"], f"{where}: methods")
    for entry in datasets:
        extra = [m for m in entry.methods or () if m not in methods]
        if extra:
            raise ValueError(
                f"{where}: datasets.{entry.name}.methods names {', '.join(extra)}, which the "
                f"suite's methods ({', '.join(methods)}) do not list; a dataset runs a subset "
                "of them."
            )

    train = _check_train(d.get("train"), f"{where}: train")
    allow_fast = bool(train.get("allow_fast_calibrator", False))
    suite = Suite(
        name=name,
        description=description,
        datasets=tuple(datasets),
        methods=methods,
        seeds=check_seeds(d.get("seeds", 3), f"{where}: seeds"),
        protocols=check_protocols(
            d.get("protocols", list(PROTOCOLS)), f"{where}: protocols", PROTOCOLS
        ),
        train=train,
        budgets=parse_budgets(d["budget"], f"{where}: budget"),
        tune=_check_tune(d.get("tune"), f"{where}: tune", allow_fast),
        reuse=check_flag(d, "reuse", True, f"{where}: "),
        effect=check_flag(d, "effect", True, f"{where}: "),
        requires_gpu=requires_gpu,
        source=source,
    )
    _check_budgets_cover(suite, where)
    _check_configs(suite, where)
    return suite


def _check_methods(raw: Any, where: str) -> tuple[str, ...]:
    """A non-empty list of distinct method names (any case), lower-cased."""
    if isinstance(raw, str) or not isinstance(raw, Sequence) or not raw:
        raise ValueError(f"{where} must be a non-empty list of method names.")
    known = list_methods()
    methods: list[str] = []
    for m in raw:
        key = m.strip().lower() if isinstance(m, str) else m  # case-insensitive, as the CLI
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{where}: unknown method {m!r}.{hint} Known: {', '.join(known)}.")
        if key in methods:
            raise ValueError(f"{where}: method {m!r} is listed twice.")
        methods.append(str(key))
    return tuple(methods)


def _check_dataset(name: str, opts: Any, where: str, *, allow_plugins: bool) -> DatasetEntry:
    """One ``datasets`` entry: its name (a plugin only with ``allow_plugins``), model,
    ``target`` (csv: datasets), ``train`` fields and ``methods`` (a subset of the suite's,
    checked by :func:`parse_suite`). Nothing is imported or loaded."""
    here = f"{where}.{name}"
    o = as_mapping(opts, here)
    check_keys(o, _DATASET_KEYS, here)
    if _is_plugin(name) and not allow_plugins:
        module, _, function = name.strip().partition(":")
        raise ValueError(
            f"{here}: {name!r} is a dataset plugin: running this suite would import the "
            f"Python module {module!r} and call its function {function!r}. A suite runs no "
            f"code unless you say so: if you trust this suite file, pass {PLUGIN_FLAG} "
            "(run_bench(..., allow_plugins=True) in Python)."
        )
    train = as_mapping(o.get("train"), f"{here}.train")
    target = o.get("target")
    if target is not None and "target" in train and train["target"] != target:
        raise ValueError(f"{here}: target is given twice ({target!r} and train.target).")
    if target is None:
        target = train.get("target")  # datasets.<name>.train.target: the same field
    if target is not None and (not isinstance(target, str) or not target.strip()):
        key = "target" if "target" in o else "train.target"
        raise ValueError(f"{here}.{key} must be a column name, got {target!r}.")
    model = o.get("model")
    try:  # the dataset itself (a csv: table needs its target, others take none)
        TrainConfig(dataset=name, model=model, target=target)
    except ValueError as err:
        hint = (
            f" (give it on the entry: {name}: {{target: COLUMN}})"
            if name.strip().lower().startswith("csv:") and not target
            else ""
        )
        raise ValueError(f"{here}: {err}{hint}") from None
    # the entry's train section, checked with this dataset: its csv:-only fields apply
    context = {"dataset": name, "model": model, "target": target}
    train = _check_train(train, f"{here}.train", context=context)
    if target is not None:
        train = {**train, "target": target}
    methods = o.get("methods")
    return DatasetEntry(
        name, model, train, None if methods is None else _check_methods(methods, f"{here}.methods")
    )


def _is_plugin(name: str) -> bool:
    """Whether a dataset name is a ``package.module:function`` plugin (see
    :func:`cogcal.data.load_dataset`): a colon, and not a registered, ``folder:`` or
    ``csv:`` name."""
    key = name.strip().lower()
    return ":" in key and not key.startswith(("folder:", "csv:")) and key not in list_datasets()


def _check_configs(suite: Suite, where: str) -> None:
    """Build the TrainConfig of every (protocol, dataset, method), at a grid point when
    tuned (the fields the plan runs), so that an invalid combination is refused before
    anything runs."""
    for protocol in suite.protocols:
        for entry in suite.datasets:
            for method in suite.methods_of(entry):
                fields = suite.run_fields(protocol, entry, method)
                if suite.budget(protocol, method).tuned:
                    grid = suite.tune.grid(
                        family_of(method), allow_fast_calibrator=suite.allow_fast_calibrator
                    )
                    fields.update(point_config(grid.points()[-1]))
                try:
                    TrainConfig.from_dict(fields)
                except ValueError as err:
                    raise ValueError(
                        f"{where}: the runs {protocol}/{entry.name}/{method} would have an "
                        f"invalid training configuration: {err}"
                    ) from None
