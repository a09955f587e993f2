"""The methods registry: every method of the paper, each defined once (docs/method.md §1-§2).

A run folder names its method (``config.json``'s ``method``); this catalog says what the name
means, for the trainer (:mod:`cogcal.train`, whose :func:`cogcal.train.methods.loss_function`
turns a method into its loss), the run contract (which fields a method uses, what its
learning rate is chosen by) and the report (families, counterparts, extra parameters).

A :class:`Method` says which loss trains the network, which calibrator (if any) is trained
jointly on the slower learning rate (COG), which post-hoc calibrator (if any) is fitted on
validation logits afterwards, and which second stage (TST / V-TST) follows. Everything the
runner, the tuner and the report need is derived from these few fields, so a new method is
one :func:`register_method` call. The methods are a :class:`~cogcal._registry.Registry`
(:data:`REGISTRY`), listed in registration order; :data:`METHODS` is a read-only view of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from cogcal._registry import Registry
from cogcal.calibrators import KINDS, default_latent_dim
from cogcal.calibrators.binary import MULTICLASS_ALTERNATIVES

__all__ = [
    "COG_PAIRS",
    "Method",
    "METHODS",
    "REGISTRY",
    "get_method",
    "is_cog",
    "list_methods",
    "register_method",
]

LOSSES = ("ce", "ls", "focal")
SMOOTHING = 0.1  # label smoothing ε of `ls` and `cog-ls` (docs/method.md §2)
HISTOGRAM_BINS = 15  # equal-mass bins of `histogram` (HistogramBinning's default)


@dataclass(frozen=True)
class Method:
    """One training method.

    Attributes
    ----------
    name : str
        Registry name (docs/method.md §6).
    description : str
        One line for tables and ``--help``.
    loss : {"ce", "ls", "focal"}
        Training loss (for COG: at both levels).
    cog : {"fc", "ts", "vs", "ms", "tst"} or None
        Calibrator trained jointly on the slower learning rate (``CalibratedModel``).
    posthoc : str or None
        Calibrator kind (:data:`cogcal.calibrators.KINDS`: ``"ts"``, ``"vs"``, ``"ms"``,
        ``"dirichlet"``, ``"isotonic"``, ``"histogram"``, ``"ts-laplace"``, ``"svs"``,
        ``"sms"``, ``"bbq"``, ``"platt"``, ``"beta"``) fitted on the validation logits of the
        trained network (:func:`cogcal.calibrators.make_calibrator`).
    stage2 : {"tst", "vtst"} or None
        Second stage on the frozen body: a new TST / V-TST head on the training split.
    """

    name: str
    description: str
    loss: str = "ce"
    cog: str | None = None
    posthoc: str | None = None
    stage2: str | None = None

    @property
    def is_cog(self) -> bool:
        """Whether a calibrator is trained jointly on the slower learning rate."""
        return self.cog is not None

    @property
    def family(self) -> str:
        if self.cog:
            return "cog"
        if self.posthoc:
            return "post-hoc"
        if self.stage2:
            return "two-stage"
        return "train-time"

    @property
    def default_lr(self) -> float:
        """λ_f when ``--lr`` is not given: 1e-3 for COG, 1e-4 for the baselines (docs/method.md §1)."""
        return 1e-3 if self.cog else 1e-4

    @property
    def default_schedule(self) -> str:
        """The paper's schedule: ``"step"`` (both rates /10 every ``step_size`` epochs) for
        COG, ``"none"`` for the baselines (docs/method.md §1). The fair protocol sets
        ``"step"`` for every method."""
        return "step" if self.cog is not None else "none"

    @property
    def selects_before_calibration(self) -> bool:
        """Whether the learning rate is chosen by the validation NLL of the network *before*
        its post-hoc calibrator is fitted (post-hoc methods: the calibrator is fitted on
        that same split, so its calibrated NLL would be an optimistic choice criterion)."""
        return self.posthoc is not None

    @property
    def stages(self) -> int:
        """Training stages: 1, or 2 with a post-hoc fit or a TST stage 2."""
        return 2 if (self.posthoc or self.stage2) else 1

    @property
    def needs_calibration_data(self) -> bool:
        """Whether a held-out split is consumed by fitting (post-hoc calibrators only)."""
        return self.posthoc is not None

    @property
    def supports_multilabel(self) -> bool:
        """Whether the method has a multi-task form (docs/method.md §4: per-task temperature/affine)."""
        kind = self.cog or self.posthoc or self.stage2
        return self.loss in ("ce", "ls") and kind in (None, "fc", "ts", "ms")

    @property
    def two_class(self) -> bool:
        """Whether the method takes two classes only: its post-hoc calibrator is a two-class
        kind (``two_class`` of :data:`cogcal.calibrators.KINDS`: Platt, Beta)."""
        return self.posthoc is not None and KINDS.get(self.posthoc).two_class

    def classes_problem(self, num_classes: int, dataset: str) -> str | None:
        """Why the method cannot train on ``dataset`` of ``num_classes`` classes, as the end
        of a sentence that starts with its name (``None``: it can).

        >>> get_method("platt").classes_problem(10, "digits")
        "is for two classes only (its post-hoc calibrator needs K = 2) and the dataset 'digits' has K = 10; use ts, svs or sms (post-hoc, any K), or a two-class dataset"
        >>> get_method("platt").classes_problem(2, "breast-cancer") is None
        True
        """
        if not self.two_class or num_classes == 2:
            return None
        *first, last = MULTICLASS_ALTERNATIVES  # methods of the same names
        return (
            "is for two classes only (its post-hoc calibrator needs K = 2) and the dataset "
            f"{dataset!r} has K = {num_classes}; use {', '.join(first)} or {last} (post-hoc, "
            "any K), or a two-class dataset"
        )

    @property
    def extra_hyperparameters(self) -> tuple[str, ...]:
        extra: list[str] = []
        if self.cog:
            extra.append("calibrator lr λ_c")
        if self.loss == "ls":
            extra.append(f"smoothing ε={SMOOTHING}")
        if self.loss == "focal":
            extra.append("focal γ (FLSD-53)")
        if self.stage2:
            extra += ["latent Z", "stage-2 epochs"]
        if self.stage2 == "vtst":
            extra.append("MC samples M=10")
        if self.posthoc in ("vs", "ms", "dirichlet"):
            extra.append("penalty (cross-validated on validation)")
        if self.posthoc in ("svs", "sms", "platt", "beta"):
            extra.append("penalty λ=1 toward the identity")
        if self.posthoc == "histogram":
            extra.append(f"bins B={HISTOGRAM_BINS}")
        return tuple(extra)

    def extra_parameters(
        self, num_classes: int, feature_dim: int, *, task: str = "multiclass"
    ) -> int | None:
        """Trainable parameters added to the base network (K classes, d features); ``None``
        for isotonic regression, whose number of fitted values depends on the data."""
        k, d = num_classes, feature_dim
        kind = self.cog or self.posthoc or self.stage2
        if kind in (None, "fc"):
            return 0
        if kind in ("isotonic", "bbq"):
            return None
        if kind in ("platt", "beta"):
            return 2 if kind == "platt" else 3
        if kind == "ts-laplace":
            return 1
        if kind in ("svs", "sms"):
            return 1 + (2 * k if kind == "svs" else k * k + k)
        if kind == "histogram":
            return k * HISTOGRAM_BINS
        if kind == "dirichlet":
            return k * k + k
        if kind == "ts":
            return k if task == "multilabel" else 1
        if kind == "vs" or (kind == "ms" and task == "multilabel"):
            return 2 * k
        if kind == "ms":
            return k * k + k
        z = default_latent_dim(k)
        head = d * 3 * z + 3 * z + 3 * z * z + z + z * k + k - (d * k + k)
        if kind == "vtst":
            head += d * 3 * z + 3 * z + 3 * z * z + z
        return head

    def extra_parameters_formula(self) -> str:
        kind = self.cog or self.posthoc or self.stage2
        return {
            None: "0",
            "fc": "0",
            "ts": "1",
            "vs": "2K",
            "ms": "K²+K",
            "dirichlet": "K²+K",
            "isotonic": "≤ 2K per distinct validation score (non-parametric)",
            "histogram": "K·B bin frequencies (non-parametric)",
            "ts-laplace": "1",
            "svs": "1 + 2K",
            "sms": "1 + K²+K",
            "bbq": "K histograms over all the models' edges (non-parametric)",
            "platt": "2",
            "beta": "3",
            "tst": "TST head − final layer",
            "vtst": "TST + variance head − final layer",
        }[kind]


REGISTRY: Registry[Method] = Registry(
    "method",
    sort=False,
    unknown="{who} {name!r} is unknown; choose one of: {known}.{hint}",
)


class _MethodsView(Mapping[str, Method]):
    """A read-only mapping over :data:`REGISTRY` (exact names, registration order)."""

    def __getitem__(self, name: str) -> Method:
        if REGISTRY.key(name) != name:
            raise KeyError(name)
        return REGISTRY.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY.names())

    def __len__(self) -> int:
        return len(REGISTRY)

    def __repr__(self) -> str:
        return f"METHODS({REGISTRY.names()!r})"


#: The registered methods as a read-only mapping ``name -> Method``.
METHODS: Mapping[str, Method] = _MethodsView()


def register_method(method: Method) -> Method:
    """Add ``method`` to :data:`REGISTRY` (names must be new)."""
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered.")
    if method.loss not in LOSSES:
        raise ValueError(f"method {method.name!r}: loss must be one of {LOSSES}.")
    return REGISTRY.register(method.name, method)


for _m in (
    Method("ce", "cross-entropy", "ce"),
    Method("ls", "label smoothing ε=0.1", "ls"),
    Method("focal", "focal loss (FLSD-53)", "focal"),
    Method("ts", "cross-entropy + post-hoc temperature scaling", "ce", posthoc="ts"),
    Method("vs", "cross-entropy + post-hoc vector scaling", "ce", posthoc="vs"),
    Method("ms", "cross-entropy + post-hoc matrix scaling", "ce", posthoc="ms"),
    Method(
        "dirichlet",
        "cross-entropy + post-hoc Dirichlet calibration (ODIR, diagonal toward TS)",
        "ce",
        posthoc="dirichlet",
    ),
    Method(
        "isotonic",
        "cross-entropy + post-hoc isotonic regression (one-vs-rest)",
        "ce",
        posthoc="isotonic",
    ),
    Method(
        "histogram",
        "cross-entropy + post-hoc histogram binning (equal-mass, top-label)",
        "ce",
        posthoc="histogram",
    ),
    Method(
        "ts-laplace",
        "cross-entropy + post-hoc temperature scaling with Laplace smoothing",
        "ce",
        posthoc="ts-laplace",
    ),
    Method("svs", "cross-entropy + post-hoc structured vector scaling (SVS)", "ce", posthoc="svs"),
    Method("sms", "cross-entropy + post-hoc structured matrix scaling (SMS)", "ce", posthoc="sms"),
    Method(
        "bbq",
        "cross-entropy + post-hoc Bayesian binning into quantiles (BBQ, top-label)",
        "ce",
        posthoc="bbq",
    ),
    Method("platt", "cross-entropy + post-hoc Platt scaling (two classes)", "ce", posthoc="platt"),
    Method("beta", "cross-entropy + post-hoc Beta calibration (two classes)", "ce", posthoc="beta"),
    Method("tst", "two-stage training (new TST head on the frozen body)", "ce", stage2="tst"),
    Method("vtst", "variational two-stage training (V-TST, 10 samples)", "ce", stage2="vtst"),
    Method("cog-fc", "COG: final linear layer as calibrator", "ce", cog="fc"),
    Method("cog-ts", "COG: temperature", "ce", cog="ts"),
    Method("cog-vs", "COG: vector scaling", "ce", cog="vs"),
    Method("cog-ms", "COG: matrix scaling", "ce", cog="ms"),
    Method("cog-tst", "COG: TST head as calibrator", "ce", cog="tst"),
    Method("cog-ls", "COG-FC with label smoothing at both levels", "ls", cog="fc"),
    Method("cog-focal", "COG-FC with the focal loss (FLSD-53) at both levels", "focal", cog="fc"),
):
    register_method(_m)

#: The post-hoc method each COG variant is paired with (paper §4.1, Tab. 9-11).
COG_PAIRS = {"cog-ts": "ts", "cog-vs": "vs", "cog-ms": "ms", "cog-tst": "tst", "cog-fc": "ce"}


def list_methods() -> list[str]:
    """Registered method names, in registration order."""
    return REGISTRY.names()


def get_method(name: str) -> Method:
    """The method called ``name`` (case-insensitive); an unknown name suggests the closest."""
    return REGISTRY.get(name.strip() if isinstance(name, str) else name)


def is_cog(name: str) -> bool:
    """Whether the registered method ``name`` is a COG variant."""
    return get_method(name).is_cog
