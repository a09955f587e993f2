"""Benchmark suites: small YAML files naming datasets, methods, seeds, protocols and grids.

A suite is either the name of a file shipped in ``cogcal/bench/suites/`` (see
:func:`list_suites`) or the path of a user YAML file with the same schema::

    name: quick                     # optional for user files (default: the file stem)
    description: one line shown by `cogcal bench --list`
    requires: {gpu: false}          # true: refuse to start without torch.cuda
    datasets:                       # dataset name -> options
      mnist1d:
        model: mlp                  # a name of cogcal.models.list_models()
        train: {epochs: 20}         # optional TrainConfig overrides for this dataset
    methods: [ce, ts, cog-fc]       # SPEC section 6 names
    seeds: 3                        # 3 -> seeds 0, 1, 2; or an explicit list [0, 4]
    protocols: [paper, fair]
    train: {epochs: 20, step_size: 7}   # TrainConfig fields shared by every run
    method_train:                   # optional per-method TrainConfig overrides
      tst: {stage2_epochs: 10}
    tune:
      seed: 0                       # tuning runs use this seed only
      cog: [{lr: 1.0e-3, calibrator_lr: 1.0e-4}]   # COG (lambda_f, lambda_c) grid
      baseline: [{lr: 1.0e-3}, {lr: 1.0e-4}]       # learning rates tried by `fair`
      reuse: true                   # share runs whose configuration is identical

Protocols
---------
``paper``
    Baselines (every non-COG method) train at ``lr`` 1e-4 (``paper_baseline_lr``) as in
    the paper; COG methods pick (lambda_f, lambda_c) from ``tune.cog`` by validation
    cross-entropy.
``fair``
    Every method's learning rate(s) are picked by validation cross-entropy: COG from
    ``tune.cog``, the others from ``tune.baseline``. The post-hoc methods (``ts``, ``vs``,
    ``ms``) train a plain cross-entropy network, so their base learning rate is the one
    chosen for ``ce`` (validation cross-entropy *before* calibration, SPEC section 2).

Unknown keys anywhere raise ``ValueError`` naming the key and the allowed ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "PROTOCOLS",
    "Suite",
    "DatasetEntry",
    "list_suites",
    "load_suite",
    "suite_description",
]

#: The two protocols, in report order.
PROTOCOLS: tuple[str, ...] = ("paper", "fair")

#: Method names of SPEC section 6 (used when the methods registry is not importable).
SPEC_METHODS: tuple[str, ...] = (
    "ce",
    "ls",
    "focal",
    "ts",
    "vs",
    "ms",
    "tst",
    "vtst",
    "cog-fc",
    "cog-ts",
    "cog-vs",
    "cog-ms",
    "cog-tst",
    "cog-ls",
    "cog-focal",
)

#: Multi-label (multi-task) datasets (SPEC section 4): only methods with a multi-task form
#: (``cogcal.train.METHODS[m].supports_multilabel``) can run on them.
MULTILABEL_DATASETS: tuple[str, ...] = ("celeba", "mnist1d-mtl", "digits-mtl")

#: Post-hoc methods whose base network is a plain cross-entropy network.
POST_HOC_ON_CE: tuple[str, ...] = ("ts", "vs", "ms")

#: TrainConfig fields of the pinned ``cogcal.train`` API (used to validate ``train``
#: sections when ``cogcal.train`` is not importable); the bench sets the last five itself.
TRAIN_FIELDS: tuple[str, ...] = (
    "epochs",
    "stage2_epochs",
    "batch_size",
    "lr",
    "calibrator_lr",
    "allow_fast_calibrator",
    "step_size",
    "patience",
    "accelerator",
    "devices",
    "model",
    "dataset",
    "method",
    "seed",
    "data_root",
    "out",
    "progress",
)
_BENCH_OWNED = ("dataset", "method", "seed", "data_root", "out", "progress")

_TOP_KEYS = (
    "name",
    "description",
    "requires",
    "datasets",
    "methods",
    "seeds",
    "protocols",
    "train",
    "method_train",
    "tune",
    "paper_baseline_lr",
)
_REQUIRED_TOP = ("datasets", "methods")
_REQUIRES_KEYS = ("gpu",)
_DATASET_KEYS = ("model", "train")
_TUNE_KEYS = ("seed", "cog", "baseline", "reuse")


def _suites_dir() -> Any:
    return importlib.resources.files("cogcal.bench") / "suites"


def list_suites() -> list[str]:
    """Return the names of the suites shipped with cogcal, sorted.

    Returns
    -------
    list of str
        Names accepted by :func:`load_suite` (e.g. ``"quick"``).

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


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset of a suite: its name, backbone and TrainConfig overrides."""

    name: str
    model: str | None = None
    train: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    """A validated benchmark suite (see the module docstring for the YAML schema).

    Attributes
    ----------
    name, description : str
        Identification, shown in the report.
    datasets : tuple of DatasetEntry
    methods : tuple of str
    seeds : tuple of int
    protocols : tuple of str
        Subset of :data:`PROTOCOLS`.
    train : dict
        TrainConfig overrides for every run.
    method_train : dict of str to dict
        Per-method TrainConfig overrides (applied after ``train`` and the dataset's).
    tune_seed : int
        Seed of the tuning runs.
    cog_grid, baseline_grid : tuple of dict
        Learning-rate grids (see the module docstring).
    reuse : bool
        Train once, then copy, runs whose configurations are identical.
    requires_gpu : bool
        Refuse to start without ``torch.cuda.is_available()``.
    paper_baseline_lr : float
        Learning rate of the baselines in the ``paper`` protocol.
    source : str
        Where the suite came from (shipped name or file path).
    """

    name: str
    description: str
    datasets: tuple[DatasetEntry, ...]
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    protocols: tuple[str, ...]
    train: dict[str, Any]
    method_train: dict[str, dict[str, Any]]
    tune_seed: int
    cog_grid: tuple[dict[str, float], ...]
    baseline_grid: tuple[dict[str, float], ...]
    reuse: bool
    requires_gpu: bool
    paper_baseline_lr: float
    source: str

    def replace(self, **changes: Any) -> Suite:
        """Return a copy with some fields changed (validated like the YAML values)."""
        if "seeds" in changes:
            changes["seeds"] = _check_seeds(changes["seeds"], "seeds")
        if "protocols" in changes:
            changes["protocols"] = _check_protocols(changes["protocols"])
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (recorded in ``bench.json``)."""
        d = dataclasses.asdict(self)
        d["datasets"] = [dataclasses.asdict(e) for e in self.datasets]
        return d


def suite_description(name: str) -> str:
    """The one-line description of a shipped suite (for ``cogcal bench --list``)."""
    return load_suite(name).description


def load_suite(name_or_path: str | Path) -> Suite:
    """Load and validate a suite by shipped name or YAML path.

    Parameters
    ----------
    name_or_path : str or Path
        A name from :func:`list_suites`, or the path of a YAML file (anything ending in
        ``.yaml``/``.yml`` or containing a path separator is treated as a path).

    Returns
    -------
    Suite

    Raises
    ------
    ValueError
        Unknown suite name (the message lists the names and suggests the closest), a
        missing file, invalid YAML, or an invalid or unknown key (the message names it
        and the allowed ones).

    Examples
    --------
    >>> s = load_suite("quick")
    >>> s.name, s.protocols
    ('quick', ('paper', 'fair'))
    """
    text, source, default_name = _read_suite_text(name_or_path)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"suite {source} is not valid YAML: {err}") from None
    return parse_suite(raw, source=source, default_name=default_name)


def _read_suite_text(name_or_path: str | Path) -> tuple[str, str, str]:
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
        return path.read_text(encoding="utf-8"), str(path), path.stem
    names = list_suites()
    if text_name not in names:
        close = difflib.get_close_matches(text_name, names, n=1, cutoff=0.4)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown suite {text_name!r}.{hint} Shipped suites: {', '.join(names)} "
            "(or pass the path of a suite YAML file)."
        )
    entry = _suites_dir() / f"{text_name}.yaml"
    return entry.read_text(encoding="utf-8"), f"{text_name!r}", text_name


# --------------------------------------------------------------------------- validation


def _unknown_keys(d: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    for key in d:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown key {key!r} in {where}.{hint} Allowed keys: {', '.join(allowed)}."
            )


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping (key: value), got {type(value).__name__}.")
    return {str(k): v for k, v in value.items()}


def _check_seeds(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise ValueError(f"{where} must be a count (e.g. 3) or a list of seeds, got {value!r}.")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{where} must be at least 1, got {value}.")
        return tuple(range(value))
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        seeds = []
        for s in value:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ValueError(f"{where} must hold non-negative integers, got {value!r}.")
            seeds.append(int(s))
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{where} has repeated seeds: {value!r}.")
        return tuple(seeds)
    raise ValueError(f"{where} must be a count (e.g. 3) or a list of seeds, got {value!r}.")


def _check_protocols(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [p.strip() for p in value.split(",") if p.strip()]
    if not isinstance(value, Sequence) or not value:
        raise ValueError(f"protocols must be a non-empty list of {PROTOCOLS}, got {value!r}.")
    out = []
    for p in value:
        if p not in PROTOCOLS:
            raise ValueError(
                f"unknown protocol {p!r}; expected one or both of: {', '.join(PROTOCOLS)}."
            )
        if p not in out:
            out.append(p)
    return tuple(p for p in PROTOCOLS if p in out)


def known_methods() -> tuple[str, ...]:
    """Method names: the registry's when ``cogcal.train`` is importable, else SPEC's."""
    try:
        from cogcal.train.methods import METHODS
    except ImportError:
        return SPEC_METHODS
    return tuple(METHODS)


def train_fields() -> tuple[str, ...]:
    """TrainConfig field names (from the dataclass when importable)."""
    try:
        from cogcal.train import TrainConfig
    except ImportError:
        return TRAIN_FIELDS
    return tuple(f.name for f in dataclasses.fields(TrainConfig))


def _check_multilabel(datasets: Sequence[DatasetEntry], methods: Sequence[str], where: str) -> None:
    """Refuse methods without a multi-task form on the multi-label datasets."""
    multi = [e.name for e in datasets if e.name in MULTILABEL_DATASETS]
    if not multi:
        return
    try:
        from cogcal.train.methods import METHODS
    except ImportError:
        return
    bad = [m for m in methods if m in METHODS and not METHODS[m].supports_multilabel]
    if bad:
        ok = [m for m, spec in METHODS.items() if spec.supports_multilabel]
        raise ValueError(
            f"{where}: the multi-label dataset(s) {', '.join(multi)} need methods with a "
            f"multi-task form; {', '.join(bad)} have none. Use some of: {', '.join(ok)} "
            "(or move the others to a suite of single-task datasets)."
        )


def _check_train(value: Any, where: str) -> dict[str, Any]:
    d = _mapping(value, where)
    allowed = [f for f in train_fields() if f not in _BENCH_OWNED]
    _unknown_keys(d, allowed, where)
    for key in ("epochs", "stage2_epochs", "batch_size", "step_size", "patience", "devices"):
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{where}.{key} must be a positive integer, got {v!r}.")
    for key in ("lr", "calibrator_lr"):
        if key in d:
            d[key] = _positive_float(d[key], f"{where}.{key}")
    return d


def _positive_float(v: Any, where: str) -> float:
    # YAML 1.1 reads "1e-3" (no dot) as a string: accept it.
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a positive number, got {v!r}.") from None
    if isinstance(v, bool) or not f > 0:
        raise ValueError(f"{where} must be a positive number, got {v!r}.")
    return f


def _check_grid(value: Any, allowed: Sequence[str], where: str) -> tuple[dict[str, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(
            f"{where} must be a list of points such as [{{lr: 1.0e-3}}], got {value!r}."
        )
    grid = []
    for i, point in enumerate(value):
        p = _mapping(point, f"{where}[{i}]")
        if not p:
            raise ValueError(f"{where}[{i}] is empty; give at least `lr`.")
        _unknown_keys(p, allowed, f"{where}[{i}]")
        q = {k: _positive_float(p[k], f"{where}[{i}].{k}") for k in allowed if k in p}
        if q in grid:
            raise ValueError(f"{where} repeats the point {q}.")
        grid.append(q)
    return tuple(grid)


def parse_suite(raw: Any, *, source: str = "<dict>", default_name: str = "custom") -> Suite:
    """Validate a suite given as a mapping (the parsed YAML).

    Parameters
    ----------
    raw : mapping
        The suite (see the module docstring).
    source : str
        Where it came from, for messages.
    default_name : str
        Name used when ``raw`` has none.

    Returns
    -------
    Suite

    Raises
    ------
    ValueError
        For any invalid or unknown key.
    """
    where = f"suite {source}"
    d = _mapping(raw, where)
    _unknown_keys(d, _TOP_KEYS, where)
    for key in _REQUIRED_TOP:
        if key not in d:
            raise ValueError(f"{where} lacks the required key {key!r}.")

    name = str(d.get("name") or default_name)
    description = str(d.get("description") or "")
    requires = _mapping(d.get("requires"), f"{where}: requires")
    _unknown_keys(requires, _REQUIRES_KEYS, f"{where}: requires")
    requires_gpu = requires.get("gpu", False)
    if not isinstance(requires_gpu, bool):
        raise ValueError(f"{where}: requires.gpu must be true or false, got {requires_gpu!r}.")

    datasets_raw = _mapping(d["datasets"], f"{where}: datasets")
    if not datasets_raw:
        raise ValueError(f"{where}: datasets is empty; name at least one dataset.")
    from cogcal.data import list_datasets
    from cogcal.models import list_models

    known_datasets = list_datasets()
    known_models = list_models()
    datasets = []
    for ds_name, opts in datasets_raw.items():
        if ds_name not in known_datasets:
            close = difflib.get_close_matches(ds_name, known_datasets, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{where}: unknown dataset {ds_name!r}.{hint} Known: {', '.join(known_datasets)}."
            )
        o = _mapping(opts, f"{where}: datasets.{ds_name}")
        _unknown_keys(o, _DATASET_KEYS, f"{where}: datasets.{ds_name}")
        model = o.get("model")
        if model is not None and model not in known_models:
            raise ValueError(
                f"{where}: datasets.{ds_name}.model {model!r} is unknown; known models: "
                f"{', '.join(known_models)}."
            )
        datasets.append(
            DatasetEntry(
                ds_name,
                model,
                _check_train(o.get("train"), f"{where}: datasets.{ds_name}.train"),
            )
        )

    methods_raw = d["methods"]
    if isinstance(methods_raw, str) or not isinstance(methods_raw, Sequence) or not methods_raw:
        raise ValueError(f"{where}: methods must be a non-empty list of method names.")
    known = known_methods()
    methods: list[str] = []
    for m in methods_raw:
        if m not in known:
            close = difflib.get_close_matches(str(m), list(known), n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{where}: unknown method {m!r}.{hint} Known: {', '.join(known)}.")
        if m in methods:
            raise ValueError(f"{where}: method {m!r} is listed twice.")
        methods.append(str(m))

    _check_multilabel(datasets, methods, where)

    seeds = _check_seeds(d.get("seeds", 3), f"{where}: seeds")
    protocols = _check_protocols(d.get("protocols", list(PROTOCOLS)))
    train = _check_train(d.get("train"), f"{where}: train")
    method_train_raw = _mapping(d.get("method_train"), f"{where}: method_train")
    method_train = {}
    for m, overrides in method_train_raw.items():
        if m not in methods:
            raise ValueError(
                f"{where}: method_train names {m!r}, which is not in methods ({', '.join(methods)})."
            )
        method_train[m] = _check_train(overrides, f"{where}: method_train.{m}")

    tune = _mapping(d.get("tune"), f"{where}: tune")
    _unknown_keys(tune, _TUNE_KEYS, f"{where}: tune")
    tune_seed = tune.get("seed", 0)
    if isinstance(tune_seed, bool) or not isinstance(tune_seed, int) or tune_seed < 0:
        raise ValueError(f"{where}: tune.seed must be a non-negative integer, got {tune_seed!r}.")
    cog_grid = _check_grid(tune.get("cog"), ("lr", "calibrator_lr"), f"{where}: tune.cog")
    baseline_grid = _check_grid(tune.get("baseline"), ("lr",), f"{where}: tune.baseline")
    reuse = tune.get("reuse", True)
    if not isinstance(reuse, bool):
        raise ValueError(f"{where}: tune.reuse must be true or false, got {reuse!r}.")
    for point in cog_grid:
        lr, clr = point.get("lr"), point.get("calibrator_lr")
        if lr is not None and clr is not None and clr >= lr:
            raise ValueError(
                f"{where}: tune.cog point {point} has calibrator_lr >= lr, which breaks COG's "
                "hierarchy (the calibrator must be slower); lower calibrator_lr."
            )
    paper_lr = _positive_float(d.get("paper_baseline_lr", 1e-4), f"{where}: paper_baseline_lr")
    return Suite(
        name=name,
        description=description,
        datasets=tuple(datasets),
        methods=tuple(methods),
        seeds=seeds,
        protocols=protocols,
        train=train,
        method_train=method_train,
        tune_seed=int(tune_seed),
        cog_grid=cog_grid,
        baseline_grid=baseline_grid,
        reuse=reuse,
        requires_gpu=requires_gpu,
        paper_baseline_lr=paper_lr,
        source=source,
    )
