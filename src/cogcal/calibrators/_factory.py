"""The registry of calibrator kinds (:data:`KINDS`) and :func:`make_calibrator`.

A kind is a short name (``"ts"``, ``"dirichlet"``) mapped to the builders of its calibrator
for multiclass and, where one exists, multi-label logits. Every registered kind is a
post-hoc method: :data:`cogcal.posthoc.POSTHOC_METHODS` lists them in registration order
(simplest first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from cogcal._registry import Registry
from cogcal.calibrators._base import Calibrator
from cogcal.calibrators.affine import MatrixScaling, TaskAffine, VectorScaling
from cogcal.calibrators.dirichlet import Dirichlet
from cogcal.calibrators.nonparametric import HistogramBinning, Isotonic
from cogcal.calibrators.temperature import TaskTemperature, Temperature

#: A builder: the number of outputs (classes or tasks; ``None`` defers it to ``fit``) to a
#: new calibrator.
Builder = Callable[[int | None], Calibrator]


class CalibratorKind(NamedTuple):
    """The builders of one kind: for (N, K) multiclass logits, and for (N, T) multi-label
    logits (``None``: multiclass only)."""

    multiclass: Builder
    multilabel: Builder | None = None


#: The calibrator kinds, in registration order (simplest first; it breaks ties in
#: :func:`cogcal.posthoc.calibrate`).
KINDS: Registry[CalibratorKind] = Registry("calibrator", argument="kind", sort=False)
KINDS.register("ts", CalibratorKind(lambda k: Temperature(), TaskTemperature))
KINDS.register("vs", CalibratorKind(VectorScaling, TaskAffine))
KINDS.register("ms", CalibratorKind(MatrixScaling, TaskAffine))
KINDS.register("dirichlet", CalibratorKind(Dirichlet))
KINDS.register("isotonic", CalibratorKind(Isotonic))
KINDS.register("histogram", CalibratorKind(HistogramBinning))


def make_calibrator(
    kind: str, task: str = "multiclass", num_outputs: int | None = None
) -> Calibrator:
    """A new calibrator of ``kind`` for ``task``.

    Multiclass kinds: ``"ts"`` (:class:`Temperature`), ``"vs"`` (:class:`VectorScaling`),
    ``"ms"`` (:class:`MatrixScaling`), ``"dirichlet"`` (:class:`Dirichlet`), and the
    non-parametric ``"isotonic"`` (:class:`Isotonic`) and ``"histogram"``
    (:class:`HistogramBinning`, 15 bins). For ``task="multilabel"``, ``"ts"`` is one
    temperature per task and ``"vs"``/``"ms"`` one affine map per task; the other kinds are
    multiclass only.

    ``num_outputs`` (classes, or tasks) builds the parameters now; ``None`` defers them
    to :meth:`Calibrator.fit`.

    >>> make_calibrator("ms", num_outputs=3)
    MatrixScaling(num_classes=3)
    >>> make_calibrator("isotonic")
    Isotonic(num_classes=None)
    """
    names = KINDS.names()
    if kind not in names:  # exact names only (the registry would also match "TS")
        raise ValueError(f"`kind` must be one of {', '.join(map(repr, names))}, got {kind!r}.")
    entry = KINDS.get(kind)
    if task == "multilabel":
        if entry.multilabel is None:
            multilabel = [n for n, e in KINDS.items() if e.multilabel is not None]
            raise ValueError(
                f"`kind` {kind!r} is multiclass only; for task='multilabel' use one of "
                f"{', '.join(map(repr, multilabel))}."
            )
        return entry.multilabel(num_outputs)
    return entry.multiclass(num_outputs)
