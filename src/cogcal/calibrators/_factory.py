"""The registry of calibrator kinds (:data:`KINDS`) and :func:`make_calibrator`.

A kind is a short name (``"ts"``, ``"dirichlet"``) mapped to the builders of its calibrator
for multiclass and, where one exists, multi-label logits, with the numbers of classes it
takes and those for which ``method="auto"`` tries it (:func:`auto_candidates`). Every
registered kind is a post-hoc method: :data:`cogcal.posthoc.POSTHOC_METHODS` lists them in
registration order (simplest first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from cogcal._registry import Registry
from cogcal.calibrators._base import Calibrator
from cogcal.calibrators.affine import BLOCK_MAX_CLASSES, MatrixScaling, TaskAffine, VectorScaling
from cogcal.calibrators.bbq import BBQ
from cogcal.calibrators.binary import BetaCalibration, Platt, two_class_error
from cogcal.calibrators.dirichlet import Dirichlet
from cogcal.calibrators.nonparametric import HistogramBinning, Isotonic
from cogcal.calibrators.structured import (
    LaplaceTemperature,
    StructuredMatrixScaling,
    StructuredVectorScaling,
)
from cogcal.calibrators.temperature import TaskTemperature, Temperature

#: A builder: the number of outputs (classes or tasks; ``None`` defers it to ``fit``) to a
#: new calibrator.
Builder = Callable[[int | None], Calibrator]


class CalibratorKind(NamedTuple):
    """The builders of one kind: for (N, K) multiclass logits, and for (N, T) multi-label
    logits (``None``: multiclass only).

    ``two_class``: the multiclass builder takes ``K = 2`` only. ``auto_max_classes``: the
    largest ``K`` for which ``method="auto"`` tries the kind (``None``: any ``K``; ``0``:
    never).
    """

    multiclass: Builder
    multilabel: Builder | None = None
    two_class: bool = False
    auto_max_classes: int | None = None


def _two_class(cls: Callable[[], Calibrator]) -> Builder:
    """A builder of the two-class calibrator ``cls`` that refuses any other width."""

    def build(num_outputs: int | None) -> Calibrator:
        if num_outputs is not None and num_outputs != 2:
            raise two_class_error(cls.__name__, num_outputs)
        return cls()

    return build


#: The calibrator kinds, in registration order (simplest first; it breaks ties in
#: :func:`cogcal.posthoc.calibrate`).
KINDS: Registry[CalibratorKind] = Registry("calibrator", argument="kind", sort=False)
# The full K x (K+1) maps (matrix scaling, Dirichlet, SMS): ``"auto"`` tries them up to
# BLOCK_MAX_CLASSES classes, as far as their fits are conditioned (beyond, a fit needs
# hours on one core and the many classes leave few samples a parameter); by name they
# take any K.
_FULL = BLOCK_MAX_CLASSES
KINDS.register("ts", CalibratorKind(lambda k: Temperature(), TaskTemperature))
KINDS.register("vs", CalibratorKind(VectorScaling, TaskAffine))
KINDS.register("ms", CalibratorKind(MatrixScaling, TaskAffine, auto_max_classes=_FULL))
KINDS.register("dirichlet", CalibratorKind(Dirichlet, auto_max_classes=_FULL))
KINDS.register("isotonic", CalibratorKind(Isotonic))
KINDS.register("histogram", CalibratorKind(HistogramBinning))
KINDS.register("ts-laplace", CalibratorKind(lambda k: LaplaceTemperature()))
KINDS.register("svs", CalibratorKind(StructuredVectorScaling))
KINDS.register("sms", CalibratorKind(StructuredMatrixScaling, auto_max_classes=_FULL))

# BBQ (dozens of binnings per class, and one more of the confidence: 2-5 s for 100
# classes) and the two-class calibrators: ``"auto"`` tries them for two classes only.
KINDS.register("bbq", CalibratorKind(BBQ, auto_max_classes=2))
KINDS.register("platt", CalibratorKind(_two_class(Platt), two_class=True, auto_max_classes=2))
KINDS.register(
    "beta", CalibratorKind(_two_class(BetaCalibration), two_class=True, auto_max_classes=2)
)


def auto_candidates(num_classes: int) -> tuple[str, ...]:
    """The kinds of :data:`KINDS` that ``method="auto"`` tries on ``num_classes`` classes,
    in registration order: those whose ``auto_max_classes`` admits ``num_classes`` (and, if
    two-class, only for 2).

    >>> auto_candidates(10)
    ('ts', 'vs', 'ms', 'dirichlet', 'isotonic', 'histogram', 'ts-laplace', 'svs', 'sms')
    >>> auto_candidates(1000)
    ('ts', 'vs', 'isotonic', 'histogram', 'ts-laplace', 'svs')
    """
    return tuple(
        name
        for name, entry in KINDS.items()
        if (entry.auto_max_classes is None or num_classes <= entry.auto_max_classes)
        and (not entry.two_class or num_classes == 2)
    )


def make_calibrator(
    kind: str, task: str = "multiclass", num_outputs: int | None = None
) -> Calibrator:
    """A new calibrator of ``kind`` for ``task``.

    Multiclass kinds: ``"ts"`` (:class:`Temperature`), ``"vs"`` (:class:`VectorScaling`),
    ``"ms"`` (:class:`MatrixScaling`), ``"dirichlet"`` (:class:`Dirichlet`), the
    non-parametric ``"isotonic"`` (:class:`Isotonic`) and ``"histogram"``
    (:class:`HistogramBinning`, 15 bins), ``"ts-laplace"`` (:class:`LaplaceTemperature`),
    ``"svs"`` (:class:`StructuredVectorScaling`), ``"sms"``
    (:class:`StructuredMatrixScaling`), ``"bbq"`` (:class:`BBQ`) and, for two classes only, ``"platt"`` (:class:`Platt`) and
    ``"beta"`` (:class:`BetaCalibration`), which refuse ``num_outputs`` other than 2. For ``task="multilabel"``, ``"ts"`` is one
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
