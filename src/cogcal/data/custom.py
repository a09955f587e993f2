"""User data: the split rule, plugins and in-memory splits; the readers of files build on it.

- :func:`split_indices`: the user-data split rule (:data:`USER_SPLIT_RULE`), shared by
  ``folder:PATH`` (:mod:`cogcal.data.folders`) and ``csv:PATH`` (:mod:`cogcal.data.tables`);
- :func:`load_plugin`: ``package.module:function`` returning a :class:`Dataset` or a mapping
  of splits;
- :func:`dataset_from_splits`: in-memory splits (tensors, arrays, torch datasets) to a
  :class:`Dataset`.

Splits that the data does not fix are drawn with the digits rule: stratified by class,
fixed seed :data:`~cogcal.data.SPLIT_SEED`, 20% of the samples as test, then 20% of the rest
as validation. Statistics (normalisation) come from the training split only. ``info``
records the split rule and a content fingerprint, so a run can tell that its data changed.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import keyword
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torch.utils.data import Dataset as TorchDataset

from cogcal._constraints import Integer
from cogcal._errors import ArgumentError
from cogcal.data.base import (
    SPLIT_SEED,
    TASKS,
    Dataset,
    DatasetNotFoundError,
    Split,
    apply_normalization,
    stratified_split,
)

__all__ = [
    "USER_SPLIT_RULE",
    "DatasetPluginError",
    "dataset_from_splits",
    "load_plugin",
    "split_indices",
]

#: Held-out fractions of the user-data split rule (those of ``digits``).
USER_TEST_FRACTION = 0.2
USER_VAL_FRACTION = 0.2
#: The split rule, as recorded in ``Dataset.info["split_rule"]``.
USER_SPLIT_RULE = (
    f"stratified by class with the fixed seed {SPLIT_SEED}: 20% of the samples as test "
    f"(seed {SPLIT_SEED}), then 20% of the rest as validation (seed {SPLIT_SEED + 1}); "
    "the same rule as digits"
)


class DatasetPluginError(ArgumentError):
    """A dataset plugin cannot be imported, raised, or returned the wrong thing (a ValueError)."""


def _err(
    py: str, cli: str | None = None, cls: type[ArgumentError] = ArgumentError
) -> ArgumentError:
    return cls(py, cli_message=cli if cli is not None else py)


def _not_found(dataset: str, path: Path, kind: str) -> ArgumentError:
    """``dataset``'s ``path`` is missing, or is not ``kind`` ("a file", "a folder")."""
    what = f"is not {kind}" if path.exists() else "does not exist"
    return _err(
        f"dataset {dataset!r}: {path.resolve()} {what} (paths are relative to the working "
        f"directory {os.getcwd()}).",
        cls=DatasetNotFoundError,
    )


# =========================================================================== splits


def split_indices(
    labels: np.ndarray, *, test: bool = True, val: bool = True
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Indices (train, val, test) of the user-data split rule (:data:`USER_SPLIT_RULE`).

    ``test=False`` / ``val=False`` when the data already has that split (``None`` is
    returned for it). With both, this is exactly the split of ``digits``.

    Examples
    --------
    >>> import numpy as np
    >>> tr, va, te = split_indices(np.repeat(np.arange(2), 10))
    >>> len(tr), len(va), len(te)
    (12, 4, 4)
    """
    labels = np.asarray(labels)
    rest = np.arange(labels.shape[0])
    test_idx = val_idx = None
    if test:
        rest, test_idx = stratified_split(labels, USER_TEST_FRACTION, SPLIT_SEED)
    if val:
        tr_rel, val_rel = stratified_split(labels[rest], USER_VAL_FRACTION, SPLIT_SEED + 1)
        rest, val_idx = rest[tr_rel], rest[val_rel]
    return rest, val_idx, test_idx


def _check_split_sizes(what: str, sizes: dict[str, int], total: int, cli: str) -> None:
    empty = [s for s, n in sizes.items() if n == 0]
    if empty:
        msg = (
            f"{what}: {total} samples are too few: the split rule leaves the "
            f"{' and '.join(empty)} split(s) empty (sizes {sizes}); give more samples, or "
            "explicit train/val/test splits"
        )
        raise _err(f"{msg}.", f"{msg} ({cli}).")


def _check_every_class_in_every_split(
    what: str, y: np.ndarray, idx: dict[str, np.ndarray], names: list[str], unit: str
) -> None:
    """Refuse drawn splits that leave a class out of validation or test (its metrics and
    calibration there would silently ignore that class)."""
    total = np.bincount(y, minlength=len(names))
    absent = []
    for c, n in enumerate(names):
        missing = [s for s, i in idx.items() if not np.any(y[i] == c)]
        if missing:
            absent.append(f"{n!r} ({int(total[c])} {unit}; none in {'/'.join(missing)})")
    if absent:
        raise _err(
            f"{what}: class(es) {', '.join(absent[:5])} have too few {unit} to appear in the "
            f"train, val and test splits; give each class at least 4 {unit} (what the split "
            "rule needs for one in each split), or drop those classes."
        )


def _class_counts(y: torch.Tensor, k: int) -> list[int]:
    return [int(v) for v in torch.bincount(y, minlength=k).tolist()]


# =========================================================================== in-memory splits


def _shape_default_model(input_shape: tuple[int, ...]) -> str:
    return "cnn" if len(input_shape) == 3 else "mlp"


def _to_array(value: Any, what: str) -> np.ndarray | torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if type(value).__module__.startswith("PIL."):
        raise _err(
            f"{what} is a PIL image; give the dataset a transform that makes tensors, e.g. "
            "torchvision.transforms.ToTensor()."
        )
    try:
        arr = np.asarray(value)
    except Exception as err:  # anything that numpy cannot take
        raise _err(
            f"{what} cannot be converted to an array: {type(err).__name__}: {err}."
        ) from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise _err(
            f"{what} has {arr.dtype} values (type {type(value).__name__}); inputs and labels "
            "must be numbers (tensors or numpy arrays)."
        )
    return arr


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    arr = _to_array(value, what)
    return arr if isinstance(arr, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(arr))


def _materialise(obj: Any, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) tensors from one split in any of the accepted kinds."""
    what = f"split {split!r}"
    if isinstance(obj, Split):
        return obj.x, obj.y
    if isinstance(obj, Dataset):
        raise _err(
            f"{what} is a whole cogcal Dataset; give one split (e.g. its .train), or return the "
            "Dataset itself from a plugin."
        )
    if isinstance(obj, DataLoader):
        obj = obj.dataset  # batching, shuffling and collate_fn do not matter here
        what += " (the DataLoader's dataset)"
    if isinstance(obj, tuple | list) and len(obj) == 2 and not isinstance(obj, TorchDataset):
        return _as_tensor(obj[0], f"{what} inputs"), _as_tensor(obj[1], f"{what} labels")
    if isinstance(obj, TensorDataset):
        if len(obj.tensors) != 2:
            raise _err(
                f"{what} is a TensorDataset of {len(obj.tensors)} tensors; expected 2 (X, y)."
            )
        return obj.tensors[0], obj.tensors[1]
    if isinstance(obj, IterableDataset):
        raise _err(
            f"{what} is an iterable-style dataset, which cannot be materialised safely; give a "
            "map-style dataset, a TensorDataset or an (X, y) pair."
        )
    if isinstance(obj, TorchDataset) or (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")):
        n = len(obj)
        if n == 0:
            raise _err(f"{what} is empty.")
        xs, ys = [], []
        for i in range(n):
            item = obj[i]
            if not isinstance(item, tuple | list) or len(item) != 2:
                got = (
                    f"{len(item)} elements"
                    if isinstance(item, tuple | list)
                    else type(item).__name__
                )
                raise _err(f"{what}: item {i} must be an (input, label) pair, got {got}.")
            xs.append(_as_tensor(item[0], f"{what} item {i} input"))
            ys.append(_as_tensor(item[1], f"{what} item {i} label"))
        for i, t in enumerate(xs):
            if t.shape != xs[0].shape:
                raise _err(
                    f"{what}: item {i}'s input has shape {tuple(t.shape)}, item 0's "
                    f"{tuple(xs[0].shape)}; all inputs must have the same shape (resize them)."
                )
        for i, t in enumerate(ys):
            if t.shape != ys[0].shape:
                raise _err(
                    f"{what}: item {i}'s label has shape {tuple(t.shape)}, item 0's "
                    f"{tuple(ys[0].shape)}; labels must all have the same shape."
                )
        return torch.stack(xs), torch.stack(ys)
    raise _err(
        f"{what} is a {type(obj).__name__}; expected an (X, y) pair of tensors/arrays, a "
        "TensorDataset, a map-style torch Dataset of (input, label) pairs, or a DataLoader "
        "over one."
    )


def _labels(y: torch.Tensor, task: str, split: str) -> torch.Tensor:
    what = f"split {split!r} labels"
    if task == "multiclass" and y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    expected = "(N,) class indices" if task == "multiclass" else "(N, T) 0/1 values"
    if (task == "multiclass" and y.ndim != 1) or (task == "multilabel" and y.ndim != 2):
        raise _err(f"{what} have shape {tuple(y.shape)}; task={task!r} expects {expected}.")
    if y.dtype == torch.bool:
        y = y.to(torch.int64)
    if y.is_floating_point():
        if not torch.isfinite(y).all() or not torch.equal(y, y.round()):
            raise _err(
                f"{what} are {y.dtype} numbers that are not all whole; task={task!r} expects "
                f"{expected} (integers)."
            )
    elif y.is_complex():
        raise _err(f"{what} have dtype {y.dtype}; expected integers.")
    y = y.to(torch.int64)
    if task == "multilabel" and y.numel() and not ((y == 0) | (y == 1)).all():
        raise _err(f"{what} must be 0 or 1 (one binary task per column), got other values.")
    return y


def dataset_from_splits(
    train: Any,
    val: Any,
    test: Any,
    *,
    num_classes: int | None = None,
    name: str = "custom",
    task: str = "multiclass",
    class_names: Sequence[str] | None = None,
    info: Mapping[str, Any] | None = None,
    default_model: str | None = None,
) -> Dataset:
    """Build an in-memory :class:`Dataset` from three splits you already have.

    Each split may be an ``(X, y)`` pair of tensors or numpy arrays, a ``TensorDataset``
    of two tensors, a map-style torch ``Dataset`` whose items are ``(input, label)`` pairs
    (each item is read once and stacked: for data that does not fit in memory write your
    own training loop with the Python API instead), or a ``DataLoader`` over such a
    dataset (its ``dataset`` is read; batching and ``collate_fn`` are ignored).

    Inputs become ``float32`` with their values unchanged (``uint8`` images keep 0..255),
    and the dataset's normalisation is the identity (``mean=(0.0,)``, ``std=(1.0,)``):
    standardising is left to the caller (``load_dataset`` standardises plugin data with the
    training split's statistics). Labels become ``int64``: class indices ``(N,)`` (an
    ``(N, 1)`` column is flattened; whole-number floats and bools are accepted) for
    ``task="multiclass"``, 0/1 ``(N, T)`` for ``task="multilabel"``.

    Parameters
    ----------
    train, val, test
        The three splits (none may be empty).
    num_classes : int, optional
        Multiclass: number of classes (default: largest label + 1, at least 2); multilabel:
        number of tasks T (default: the label width).
    name : str, default "custom"
        Dataset name.
    task : {"multiclass", "multilabel"}
    class_names : sequence of str, optional
        One name per class (task); default ``"0"``, ``"1"``, ...
    info : mapping, optional
        Extra JSON-serialisable entries for :attr:`Dataset.info`.
    default_model : str, optional
        Default backbone; by default ``"cnn"`` for ``(C, H, W)`` inputs, else ``"mlp"``.

    Returns
    -------
    Dataset
        ``info`` holds the split sizes and a content fingerprint (sha256 of the tensors).

    Raises
    ------
    ArgumentError
        Unsupported split kinds, mismatched shapes, non-finite inputs, labels out of range.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> make = lambda n: (rng.normal(size=(n, 5)), rng.integers(0, 3, n))
    >>> ds = dataset_from_splits(make(60), make(20), make(20), num_classes=3)
    >>> ds.input_shape, ds.num_classes, ds.train.x.dtype, ds.default_model
    ((5,), 3, torch.float32, 'mlp')
    """
    if task not in TASKS:
        raise _err(f"`task` must be one of {TASKS}, got {task!r}.")
    if not isinstance(name, str) or not name:
        raise _err(f"`name` must be a non-empty string, got {name!r}.")
    raw = {"train": train, "val": val, "test": test}
    xs, ys = {}, {}
    for s, obj in raw.items():
        xs[s], ys[s] = _split_tensors(obj, s, task)
    shape = tuple(xs["train"].shape[1:])
    for s in ("val", "test"):
        if tuple(xs[s].shape[1:]) != shape:
            raise _err(
                f"split {s!r} inputs have per-sample shape {tuple(xs[s].shape[1:])}, the "
                f"training split {shape}; they must match."
            )
    num_classes = _num_classes(ys, task, num_classes)
    names = _class_names(class_names, num_classes, task)
    splits = {s: Split(xs[s], ys[s]) for s in raw}
    record = _splits_record(name, task, splits, num_classes, info)
    return Dataset(
        name=name,
        task=task,
        num_classes=num_classes,
        input_shape=shape,
        class_names=names,
        **splits,
        mean=(0.0,),
        std=(1.0,),
        augment=None,
        info=record,
        default_model=default_model if default_model is not None else _shape_default_model(shape),
    )


def _split_tensors(obj: Any, split: str, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One split's checked ``(float32 inputs, int64 labels)``."""
    s = split
    x, y = _materialise(obj, s)
    if x.ndim < 2:
        raise _err(
            f"split {s!r} inputs have shape {tuple(x.shape)}; expected (N, *input_shape) "
            "with at least one feature axis (reshape a single feature to (N, 1))."
        )
    if x.shape[0] == 0:
        raise _err(f"split {s!r} is empty; every split needs at least one sample.")
    if y.shape[0] != x.shape[0]:
        raise _err(f"split {s!r} has {x.shape[0]} inputs but {y.shape[0]} labels; they must match.")
    if x.is_complex() or not (x.is_floating_point() or x.dtype in _INT_DTYPES):
        raise _err(f"split {s!r} inputs have dtype {x.dtype}; expected real numbers.")
    x = x.to(torch.float32)
    if not torch.isfinite(x).all():
        raise _err(f"split {s!r} inputs hold NaN or infinite values; clean them first.")
    return x.contiguous(), _labels(y, task, s)


def _num_classes(ys: Mapping[str, torch.Tensor], task: str, num_classes: Any) -> int:
    """The number of classes (tasks): given and checked against the labels, or inferred."""
    if task == "multiclass":
        lo = min(int(y.min()) for y in ys.values())
        hi = max(int(y.max()) for y in ys.values())
        if lo < 0:
            raise _err(f"labels must be class indices >= 0, got {lo}.")
        if num_classes is None:
            num_classes = hi + 1
            if num_classes < 2:
                raise _err(
                    f"the labels hold {num_classes} class; a classifier needs at least 2 "
                    "(pass num_classes= if some classes are absent from the data)."
                )
    else:
        widths = {int(y.shape[1]) for y in ys.values()}
        if len(widths) != 1:
            raise _err(f"multilabel splits have different numbers of tasks: {sorted(widths)}.")
        hi = widths.pop() - 1
        if num_classes is None:
            num_classes = hi + 1
    if Integer().problem(num_classes) is not None:
        raise _err(f"`num_classes` {Integer().problem(num_classes)}")
    num_classes = int(num_classes)
    if task == "multiclass" and (num_classes < 2 or hi >= num_classes):
        raise _err(
            f"`num_classes` is {num_classes} but the labels go up to {hi}; labels must lie in "
            f"[0, num_classes) and num_classes >= 2."
        )
    if task == "multilabel" and num_classes != hi + 1:
        raise _err(f"`num_classes` is {num_classes} but the labels have {hi + 1} task columns.")
    return num_classes


def _class_names(class_names: Sequence[str] | None, num_classes: int, task: str) -> list[str]:
    """One name per class (task): the given ones, checked, or ``"0"``, ``"1"``, ..."""
    if class_names is None:
        return [str(i) for i in range(num_classes)]
    names = [str(n) for n in class_names]
    if len(names) != num_classes:
        raise _err(
            f"`class_names` has {len(names)} entries but there are {num_classes} "
            f"{'classes' if task == 'multiclass' else 'tasks'}."
        )
    return names


def _splits_record(
    name: str,
    task: str,
    splits: Mapping[str, Split],
    num_classes: int,
    info: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """:attr:`Dataset.info` of in-memory splits, updated with the caller's ``info``."""
    sizes = {s: len(sp) for s, sp in splits.items()}
    record: dict[str, Any] = {
        "dataset": name,
        "kind": "in-memory splits",
        "split_rule": "given: train, val and test passed in as they are",
        "sizes": sizes,
        "normalization": "none (identity; left to the caller)",
        "mean": [0.0],
        "std": [1.0],
        "fingerprint": _tensor_fingerprint(splits),
    }
    if task == "multiclass":
        record["class_counts"] = {s: _class_counts(sp.y, num_classes) for s, sp in splits.items()}
    record.update(dict(info or {}))
    return record


_INT_DTYPES = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)


def _tensor_fingerprint(splits: Mapping[str, Split]) -> dict[str, Any]:
    h = hashlib.sha256()
    for s in ("train", "val", "test"):
        for t in (splits[s].x, splits[s].y):
            t = t.contiguous()
            h.update(f"{s}:{t.dtype}:{tuple(t.shape)}\n".encode())
            h.update(t.numpy().tobytes())
    return {"sha256": h.hexdigest(), "method": "sha256 of the split tensors (dtype, shape, bytes)"}


# =========================================================================== plugins

_MAPPING_REQUIRED = ("train", "val", "test", "num_classes")
_MAPPING_OPTIONAL = ("task", "class_names", "default_model", "info")
_EXPECTED = (
    "a cogcal.data.Dataset, or a mapping with the keys 'train', 'val', 'test' (each an (X, y) "
    "pair, a TensorDataset or a map-style torch Dataset) and 'num_classes' (int), optionally "
    "'task', 'class_names', 'default_model', 'info'"
)


def _plugin_error(spec: str, problem: str) -> DatasetPluginError:
    return DatasetPluginError(f"dataset plugin {spec!r}: {problem}")


def _valid_dotted(text: str) -> bool:
    parts = text.split(".")
    return bool(text) and all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


def _import_plugin(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not _valid_dotted(module_name) or not _valid_dotted(attr):
        raise _plugin_error(
            spec,
            "expected 'package.module:function' (a dotted module path, a colon, a function "
            "name); for files use 'folder:PATH' or 'csv:PATH'.",
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise _plugin_error(
                spec,
                f"cannot import the module {module_name!r} ({err}). Install the package that "
                f"provides it, or add its folder to PYTHONPATH (the working directory is "
                f"{os.getcwd()}).",
            ) from None
        raise _plugin_error(
            spec,
            f"importing the module {module_name!r} failed because it imports {missing!r}, "
            f"which is not installed ({err}).",
        ) from err
    except (Exception, SystemExit) as err:  # a plugin's sys.exit() is an error, never an exit
        raise _plugin_error(
            spec, f"importing the module {module_name!r} raised {type(err).__name__}: {err}"
        ) from err
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            public = sorted(n for n in dir(obj) if not n.startswith("_"))
            close = difflib.get_close_matches(part, public, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise _plugin_error(
                spec,
                f"{owner!r} has no attribute {part!r}.{hint} It defines: {', '.join(public[:20])}.",
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise _plugin_error(
            spec, f"{attr!r} is a {type(obj).__name__}, not a function returning {_EXPECTED}."
        )
    return module, obj


def _accepts_root(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.name == "root" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params
    )


def _file_sha256(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def load_plugin(spec: str, *, root: Path, normalization: str = "auto") -> Dataset:
    """Load a dataset from a plugin function ``package.module:function``.

    The module is imported with :func:`importlib.import_module` and the function is called
    with no arguments, or with ``root=`` (the data root, a :class:`~pathlib.Path`) when its
    signature has a ``root`` parameter. It returns either

    - a :class:`Dataset`: used as is (``normalization`` other than ``"auto"`` replaces its
      statistics; a missing ``default_model`` is set from the input shape), or
    - a mapping ``{"train": ..., "val": ..., "test": ..., "num_classes": int}`` with
      optional ``"task"``, ``"class_names"``, ``"default_model"``, ``"info"``: converted
      with :func:`dataset_from_splits`; ``normalization="auto"`` then standardises with
      the global mean/std of the training split (one value over all entries).

    Raises
    ------
    DatasetPluginError
        Module not found, attribute missing or not callable, the plugin raised, or it
        returned something else (each message names the plugin and what was expected).
    """
    module, fn = _import_plugin(spec)
    try:
        result = fn(root=root) if _accepts_root(fn) else fn()
    except (Exception, SystemExit) as err:  # sys.exit(0) in a plugin must not end `train` with 0
        raise _plugin_error(
            spec, f"the plugin raised {type(err).__name__}: {err} (see the chained traceback)"
        ) from err
    meta = {
        "plugin": spec,
        "plugin_file": getattr(module, "__file__", None),
        "plugin_file_sha256": _file_sha256(getattr(module, "__file__", None)),
    }
    if isinstance(result, Dataset):
        ds = result
        info = {**meta, **ds.info}
        info.setdefault(
            "fingerprint", _tensor_fingerprint({s: ds.split(s) for s in ("train", "val", "test")})
        )
        ds = replace(
            ds, info=info, default_model=ds.default_model or _shape_default_model(ds.input_shape)
        )
        return apply_normalization(ds, normalization)
    if not isinstance(result, Mapping):
        raise _plugin_error(spec, f"returned a {type(result).__name__}; expected {_EXPECTED}.")
    keys = set(map(str, result))
    absent = [k for k in _MAPPING_REQUIRED if k not in keys]
    unknown = sorted(keys - set(_MAPPING_REQUIRED) - set(_MAPPING_OPTIONAL))
    if absent or unknown:
        problems = []
        if absent:
            problems.append(f"lacks the key(s) {', '.join(map(repr, absent))}")
        if unknown:
            problems.append(f"has unknown key(s) {', '.join(map(repr, unknown))}")
        raise _plugin_error(
            spec, f"returned a mapping that {' and '.join(problems)}; expected {_EXPECTED}."
        )
    try:
        ds = dataset_from_splits(
            result["train"],
            result["val"],
            result["test"],
            num_classes=result["num_classes"],
            name=spec,
            task=result.get("task", "multiclass"),
            class_names=result.get("class_names"),
            info={**meta, **dict(result.get("info") or {})},
            default_model=result.get("default_model"),
        )
    except ArgumentError as err:
        raise _plugin_error(spec, f"returned unusable splits: {err}") from None
    if normalization == "auto":
        x = ds.train.x.numpy().astype(np.float64)
        m, s = float(x.mean()), float(x.std())
        s = s if s > 0 else 1.0
        info = dict(ds.info)
        info.update(
            {
                "mean": [m],
                "std": [s],
                "normalization": "global mean/std of the training split (all entries)",
            }
        )
        return replace(ds, mean=(m,), std=(s,), info=info)
    return apply_normalization(ds, normalization)
