"""The calibration folder that ``cogcal calibrate`` writes, and :func:`load_calibrator`,
which reads its calibrator back in one call::

    calibration.json     what was fitted and how it was chosen; its "cogcal_calibration"
                         key marks the folder, "status": "complete" that it is finished
    calibrator.pt        the fitted calibrator's state (tensors only)
    metrics.json         validation and test metrics before and after calibration
    test_logits.npz      the test logits as given, calibrated, and the labels
    reliability.png      reliability diagrams of the test split before and after
    report.md, .html     the report (`cogcal report FOLDER` writes it again)

:class:`CalibrationFolder` is the only reader and writer of those files; writers hold its
lock (the run folders' lock file, :func:`cogcal.runs.lock_folder`) first. The calibrator is
loaded with ``torch.load(weights_only=True)``: nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cogcal import _io
from cogcal._errors import ArgumentError
from cogcal.calibrators import make_calibrator
from cogcal.posthoc import POSTHOC_METHODS, Calibration
from cogcal.runs.layout import LOCK_NAME, lock_folder

__all__ = [
    "CALIBRATION_FILES",
    "CALIBRATION_FORMAT",
    "CALIBRATION_MARK",
    "CalibrationFolder",
    "is_calibration_folder",
    "load_calibrator",
]

#: The key of ``calibration.json`` that marks a folder as written by ``cogcal calibrate``.
CALIBRATION_MARK = "cogcal_calibration"
CALIBRATION_FORMAT = 1
#: Every file ``cogcal calibrate`` writes into its folder (nothing else is ever deleted).
CALIBRATION_FILES = (
    "calibration.json",
    "calibrator.pt",
    "metrics.json",
    "test_logits.npz",
    "reliability.png",
    "report.md",
    "report.html",
)


def _err(path: Path, what: str) -> ArgumentError:
    return ArgumentError(f"{path}: {what}")


def is_calibration_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a ``calibration.json`` with the mark of ``cogcal calibrate``."""
    return CalibrationFolder(path).read_meta() is not None


class CalibrationFolder:
    """The folder ``cogcal calibrate`` writes (the module docstring lists its files): the
    only reader and writer of those files. Writers hold :meth:`lock` first."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read_meta(self) -> dict[str, Any] | None:
        """``calibration.json`` if it carries the mark, else ``None``."""
        try:
            data = _io.read_json(self.path / "calibration.json")
        except (OSError, ValueError):
            return None
        return (
            data
            if isinstance(data, dict) and data.get(CALIBRATION_MARK) == CALIBRATION_FORMAT
            else None
        )

    def read_metrics(self) -> dict[str, Any]:
        data = _io.read_json(self.path / "metrics.json")
        if not isinstance(data, dict):
            raise _err(
                self.path / "metrics.json", "is not a JSON object; run cogcal calibrate again."
            )
        return data

    def read_test(self) -> dict[str, np.ndarray] | None:
        """The saved test logits (``logits``, ``calibrated``, ``labels``), if any."""
        path = self.path / "test_logits.npz"
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in ("logits", "calibrated", "labels")}
        except (ValueError, OSError, KeyError, zipfile.BadZipFile, EOFError) as err:
            raise _err(
                path, f"is damaged ({type(err).__name__}); run cogcal calibrate again."
            ) from None

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder (``.cogcal.lock``) for this process."""
        if self.path.is_symlink():
            raise ArgumentError(
                f"output folder {self.path} is a symbolic link; pass the real folder."
            )
        if self.path.exists() and not self.path.is_dir():
            raise ArgumentError(
                f"output folder {self.path} is an existing file; choose a folder path."
            )
        with lock_folder(self.path, what=f"calibration folder {self.path}"):
            yield

    def prepare(self, *, overwrite: bool, remove: bool = True) -> None:
        """Make the folder ready for a new calibration (hold :meth:`lock`): refuse one that
        holds anything not written by ``cogcal calibrate``, and one that holds a calibration
        unless ``overwrite`` (then only the files of :data:`CALIBRATION_FILES` are removed; with
        ``remove=False`` nothing is, the folder is only checked)."""
        entries = sorted(p.name for p in self.path.iterdir() if p.name != LOCK_NAME)
        if not entries:
            return
        if self.read_meta() is None:
            shown = ", ".join(entries[:6]) + (" ..." if len(entries) > 6 else "")
            raise ArgumentError(
                f"output folder {self.path} holds files not written by cogcal calibrate "
                f"({shown}); nothing was changed: choose a new or empty folder."
            )
        foreign = [
            e
            for e in entries
            if e not in CALIBRATION_FILES and _io.temp_target(e) not in CALIBRATION_FILES
        ]
        if not overwrite:
            raise ArgumentError(
                f"output folder {self.path} holds a calibration already; pass --overwrite to "
                "replace it, or choose another --out."
            )
        for name in entries if remove else ():
            p = self.path / name
            if name not in foreign and p.is_file() and not p.is_symlink():
                p.unlink()

    def write(self, name: str, obj: Any) -> None:
        """Write one of :data:`CALIBRATION_FILES` atomically (JSON for ``.json``, a state dict for
        ``.pt``, arrays for ``.npz``)."""
        if name not in CALIBRATION_FILES:  # pragma: no cover - a bug in cogcal
            raise ValueError(f"{name} is not a file of a calibration folder")
        path = self.path / name
        if name.endswith(".json"):
            _io.write_json(path, obj)
        elif name.endswith(".pt"):
            _io.save_torch(path, obj)
        else:
            _io.save_npz(path, **obj)


def load_calibrator(path: str | os.PathLike[str]) -> Calibration:
    """The calibrator that ``cogcal calibrate --out PATH`` fitted, ready to use.

    Only tensors are loaded (``torch.load(weights_only=True)``).

    >>> import numpy as np, tempfile, cogcal
    >>> from cogcal.commands.calibrate import calibrate_files
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 300)
    >>> d = tempfile.mkdtemp()
    >>> np.savez(f"{d}/val.npz", logits=3 * np.eye(3)[y] + rng.normal(size=(300, 3)), labels=y)
    >>> _ = calibrate_files(f"{d}/val.npz", None, method="ts", out=f"{d}/cal", report=False)
    >>> cal = cogcal.load_calibrator(f"{d}/cal")
    >>> cal.method, cal.num_classes, cal.predict_proba(np.zeros((1, 3))).round(3).tolist()
    ('ts', 3, [[0.333, 0.333, 0.333]])
    """
    folder = CalibrationFolder(path)
    meta = folder.read_meta()
    if meta is None:
        raise ArgumentError(
            f"{folder.path} is not a folder written by cogcal calibrate (no calibration.json "
            "with its mark); pass the --out folder of `cogcal calibrate`."
        )
    if meta.get("status") != "complete":
        raise ArgumentError(
            f"{folder.path}: the calibration did not finish (calibration.json status "
            f"{meta.get('status')!r}); run cogcal calibrate again with --overwrite."
        )
    method, k = meta.get("method"), meta.get("num_classes")
    if method not in POSTHOC_METHODS or not isinstance(k, int) or k < 2:
        raise _err(folder.path / "calibration.json", f"method {method!r} / num_classes {k!r} are "
                   "not a calibration this version can load; run cogcal calibrate again.")  # fmt: skip
    cal = make_calibrator(method, num_outputs=None if method == "ts" else k)
    try:
        state = torch.load(folder.path / "calibrator.pt", weights_only=True, map_location="cpu")
        cal.load_state_dict(state)
    except pickle.UnpicklingError:  # weights-only loading refused it: never unpickled
        raise _err(
            folder.path / "calibrator.pt", "cannot be loaded: it is damaged or holds more than "
            "tensors (cogcal never unpickles objects); run cogcal calibrate again with --overwrite."
        ) from None  # fmt: skip
    except (RuntimeError, KeyError, OSError, EOFError) as err:  # damaged, or another shape
        raise _err(
            folder.path / "calibrator.pt", f"cannot be loaded ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:160]}); run cogcal calibrate again with --overwrite."
        ) from None  # fmt: skip
    cal.requires_grad_(False)
    cv = meta.get("cv_nll") or {}
    return Calibration(
        method=method, calibrator=cal, num_classes=k,
        cv_nll={m: math.inf if v is None else float(v) for m, v in cv.items()}, folds=meta.get("folds"),
        nll_before=float(meta.get("nll_before", math.nan)),
        nll_after=float(meta.get("nll_after", math.nan)),
    )  # fmt: skip
