"""A calibration health check on the validation split: is the model calibrated, and is it
trained enough? (docs/method.md §1, "health check")

:func:`check_calibration` takes a model and a validation loader (any loop: yours, or
:func:`cogcal.fit` / ``cogcal train``, which run it at the end of every run);
:func:`diagnose` takes validation logits and labels directly. Both return a
:class:`HealthReport` whose :attr:`~HealthReport.findings` are plain sentences, each
naming what is wrong, how much, and the fix. They look at two things:

* **under-training**: fewer than :data:`MIN_STEPS` optimizer steps, or the validation NLL
  still falling (by more than :data:`FALLING`, relative) over the last fifth of the
  epochs of a per-epoch history;
* **miscalibration**: the expected calibration error (ECE, 15 equal-width bins: the
  ``ece_15`` of :func:`cogcal.metrics.evaluate`) of the validation predictions, its
  direction (mean confidence above the accuracy: over-confident; below:
  under-confident), and how much one temperature fitted on the validation logits (by
  maximum likelihood, with the calibrators' fit) would lower the validation NLL. The
  temperature is a diagnostic only: nothing is changed. A finding is raised when that
  temperature would lower the NLL by at least :data:`NLL_GAIN` (relative) *and* the ECE
  exceeds :data:`MAX_ECE`, so the noise of a small validation set alone does not raise
  one.

Only validation data is used: never the test split.

>>> import torch
>>> from cogcal.health import diagnose
>>> g = torch.Generator().manual_seed(0)
>>> classes = torch.randint(0, 4, (4000,), generator=g)
>>> logits = torch.randn(4000, 4, generator=g) + 2.5 * torch.nn.functional.one_hot(classes, 4)
>>> probs = logits.softmax(dim=1)
>>> labels = torch.multinomial(probs, 1, generator=g)[:, 0]  # drawn from the predictions
>>> diagnose(logits, labels).ok                      # calibrated by construction
True
>>> report = diagnose(logits * 3, labels)            # three times too confident
>>> report.findings[0].kind, round(report.temperature, 1)
('over-confident', 2.9)
>>> diagnose(logits / 3, labels).findings[0].kind
'under-confident'
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cogcal._checks import ProbabilitiesAsLogitsWarning, check_multiclass, check_multilabel
from cogcal._constraints import NON_NEGATIVE
from cogcal.calibrators.temperature import fit_temperature
from cogcal.metrics import evaluate

__all__ = [
    "CalibrationWarning",
    "FALLING",
    "Finding",
    "HealthReport",
    "MAX_ECE",
    "MIN_STEPS",
    "NLL_GAIN",
    "check_calibration",
    "diagnose",
]

#: Fewer optimizer steps than this: the run is reported as under-trained.
MIN_STEPS = 500
#: Validation NLL still falling by more than this fraction over the last fifth of the run.
FALLING = 0.02
#: A temperature fitted on validation must lower its NLL by at least this fraction ...
NLL_GAIN = 0.05
#: ... and the validation ECE-15 must exceed this for a miscalibration finding.
MAX_ECE = 0.03
N_BINS = 15


class CalibrationWarning(UserWarning):
    """A finding of the health check (:func:`cogcal.fit` raises one per finding)."""


@dataclass(frozen=True)
class Finding:
    """One problem found: ``kind`` (``"under-trained"``, ``"over-confident"``,
    ``"under-confident"``), its size (``value``, see ``message``), and the whole sentence
    (what, how much, the fix)."""

    kind: str
    value: float
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class HealthReport:
    """What :func:`check_calibration` / :func:`diagnose` found.

    Attributes
    ----------
    findings : list of Finding
        Empty when nothing is wrong.
    ece : float
        Validation ECE (15 equal-width bins, top-label).
    confidence_gap : float
        Mean confidence minus accuracy (> 0: over-confident, < 0: under-confident).
    nll, nll_temperature : float
        Validation NLL as it is, and with the temperature fitted on validation.
    temperature : float
        That temperature (> 1: the model is over-confident; < 1: under-confident).
    steps : int or None
        Optimizer steps of the run, when known.
    nll_trend : float or None
        Relative fall of the validation NLL over the last fifth of the epochs (> 0:
        still falling), when a history was given.
    """

    findings: list[Finding] = field(default_factory=list)
    ece: float = math.nan
    confidence_gap: float = math.nan
    nll: float = math.nan
    nll_temperature: float = math.nan
    temperature: float = math.nan
    steps: int | None = None
    nll_trend: float | None = None

    @property
    def ok(self) -> bool:
        """Whether nothing was found."""
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        """JSON form (as recorded under ``health`` in a run's ``metrics.json``)."""
        out = asdict(self)
        out["findings"] = [asdict(f) for f in self.findings]
        out["ok"] = self.ok
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HealthReport:
        """The report of :meth:`to_dict` (missing values: NaN; a JSON null: NaN)."""
        numbers = {
            k: math.nan if data.get(k) is None else float(data[k])
            for k in ("ece", "confidence_gap", "nll", "nll_temperature", "temperature")
        }
        return cls(
            findings=[Finding(**f) for f in data.get("findings") or []],
            steps=data.get("steps"),
            nll_trend=data.get("nll_trend"),
            **numbers,
        )


def _two_class(logits: torch.Tensor, labels: torch.Tensor, task: str) -> tuple[Any, Any]:
    """Multi-label logits (N, T) as N*T two-class problems with logits (0, z)."""
    if task == "multiclass":
        return logits, labels.long()
    z = logits.reshape(-1, 1)
    return torch.cat([torch.zeros_like(z), z], dim=1), labels.reshape(-1).long()


def _calibration(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, float]:
    """``(ECE-15, mean confidence - accuracy, NLL)`` of multiclass logits: the ECE and NLL
    :func:`cogcal.metrics.evaluate` reports (docs/method.md §3)."""
    with warnings.catch_warnings():  # logits that look like probabilities are still logits
        warnings.simplefilter("ignore", ProbabilitiesAsLogitsWarning)
        metrics = evaluate(logits, labels, n_bins=N_BINS)
    confidence = float(logits.softmax(dim=1).amax(dim=1).mean())
    return metrics[f"ece_{N_BINS}"], confidence - metrics["acc"], metrics["nll"]


#: The temperature reported lies in log T in [-LOG_T_BOUND, LOG_T_BOUND] (the search's bounds).
LOG_T_BOUND = 5.0


def _temperature_text(temperature: float) -> str:
    """``a temperature of T``, saying so when T is at the search's bound (the ML one is
    further out: near-uniform, uninformative logits above, separable ones below)."""
    if abs(math.log(temperature)) < LOG_T_BOUND - 1e-6:
        return f"a temperature of {temperature:.2f}"
    side, beyond = ("upper", "higher") if temperature > 1 else ("lower", "lower")
    return (
        f"a temperature at the {side} bound of the search ({temperature:.3g}; the best one is "
        f"{beyond} still)"
    )


def _fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The maximum-likelihood temperature on (logits, labels) (the calibrators' fit,
    :func:`cogcal.calibrators.temperature.fit_temperature` with ``l2=0``; float64), with
    log T clipped to [-LOG_T_BOUND, LOG_T_BOUND]."""
    log_t = math.log(fit_temperature(logits, labels, l2=0.0))
    return math.exp(min(max(log_t, -LOG_T_BOUND), LOG_T_BOUND))


def _trend(history: Sequence[dict[str, float]], key: str) -> float | None:
    """Relative fall of ``key`` from the start to the end of the last fifth of the epochs
    (at least two epochs); None when the history is shorter than five epochs."""
    values = [float(r[key]) for r in history if key in r and r[key] is not None]
    if len(values) < 5 or not all(math.isfinite(v) for v in values):
        return None
    window = max(2, math.ceil(len(values) / 5))
    start, end = values[-window], values[-1]
    return (start - end) / abs(start) if start else None


def diagnose(
    logits: Any,
    labels: Any,
    *,
    task: str = "multiclass",
    history: Sequence[dict[str, float]] | None = None,
    steps: int | None = None,
    advice: dict[str, str] | None = None,
) -> HealthReport:
    """The health check of validation ``logits`` and ``labels`` (see the module docstring).

    Parameters
    ----------
    logits : tensor or array, shape (N, K) or, multi-label, (N, T)
        Validation logits of the model as it predicts.
    labels : tensor or array, shape (N,) class indices, or (N, T) 0/1 targets
    task : {"multiclass", "multilabel"}
    history : list of dict, optional
        One row per epoch with ``val_nll`` (e.g. :attr:`cogcal.fit` 's ``history``, a run's
        ``logs/stage1.csv``): the under-training check looks at its last fifth.
    steps : int, optional
        Optimizer steps the model was trained for.
    advice : dict, optional
        Fix sentences replacing the generic ones, keyed by finding kind
        (``"under-trained"``, ``"over-confident"``, ``"under-confident"``); the runner
        passes fixes naming its own flags.

    Returns
    -------
    HealthReport
    """
    z, y = _validated(logits, labels, task, steps)
    z, y = _two_class(z.detach().double().cpu(), y.detach().cpu(), task)
    advice = advice or {}
    ece, gap, nll = _calibration(z, y)
    temperature = _fit_temperature(z, y)
    nll_t = float(F.cross_entropy(z / temperature, y))
    report = HealthReport(
        ece=ece, confidence_gap=gap, nll=nll, nll_temperature=nll_t, temperature=temperature,
        steps=steps, nll_trend=_trend(history, "val_nll") if history else None,
    )  # fmt: skip
    for finding in (_under_training(report, advice), _miscalibration(report, advice)):
        if finding is not None:
            report.findings.append(finding)
    return report


def _validated(
    logits: Any, labels: Any, task: str, steps: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`diagnose`'s arguments checked (the logits and labels by the checks every
    metric and calibrator uses, :mod:`cogcal._checks`); the logits and labels as tensors."""
    if task not in ("multiclass", "multilabel"):
        raise ValueError(f"`task` must be 'multiclass' or 'multilabel', got {task!r}.")
    z, y = (check_multiclass if task == "multiclass" else check_multilabel)(logits, labels)
    if steps is not None and NON_NEGATIVE.problem(steps) is not None:
        raise ValueError(
            f"`steps` must be the number of optimizer steps (an integer >= 0) or None, got "
            f"{steps!r}."
        )
    return z, y


def _under_training(report: HealthReport, advice: dict[str, str]) -> Finding | None:
    """The under-training finding: too few steps, or a validation NLL still falling."""
    steps, falling = report.steps, report.nll_trend
    reasons = []
    if steps is not None and steps < MIN_STEPS:
        reasons.append(f"it made only {steps} optimizer steps (fewer than {MIN_STEPS})")
    if falling is not None and falling > FALLING:
        reasons.append(
            f"its validation NLL was still falling over the last fifth of the run ({falling:.1%})"
        )
    if not reasons:
        return None
    fix = advice.get(
        "under-trained", "train for more optimizer steps (more epochs, or a smaller batch)"
    )
    return Finding(
        "under-trained",
        float(steps if steps is not None and steps < MIN_STEPS else falling or 0.0),
        f"under-trained: {' and '.join(reasons)}; {fix}.",
    )


def _miscalibration(report: HealthReport, advice: dict[str, str]) -> Finding | None:
    """The over- or under-confidence finding: a temperature would lower the NLL by at least
    :data:`NLL_GAIN` and the ECE exceeds :data:`MAX_ECE`."""
    nll, nll_t, ece, gap = report.nll, report.nll_temperature, report.ece, report.confidence_gap
    gain = (nll - nll_t) / nll if nll > 0 else 0.0
    if not (gain >= NLL_GAIN and ece > MAX_ECE):
        return None
    kind = "over-confident" if report.temperature > 1 else "under-confident"
    fix = advice.get(
        kind,
        "fit a temperature on validation data (cogcal.calibrators.Temperature) or, for a "
        "COG model, "
        + (
            "lower the calibrator learning rate"
            if kind == "over-confident"
            else "raise the calibrator learning rate or train longer"
        ),
    )
    return Finding(
        kind,
        ece,
        f"{kind}: validation ECE-15 {ece:.3f} (mean confidence {abs(gap):.3f} "
        f"{'above' if gap >= 0 else 'below'} the accuracy); "
        f"{_temperature_text(report.temperature)} fitted on validation would lower the "
        f"validation NLL from {nll:.4f} to {nll_t:.4f} "
        f"({gain:.0%}); {fix}.",
    )


@torch.no_grad()
def check_calibration(
    model: nn.Module,
    val_loader: Iterable[Any],
    *,
    task: str = "multiclass",
    history: Sequence[dict[str, float]] | None = None,
    steps: int | None = None,
    device: torch.device | str | None = None,
) -> HealthReport:
    """The health check of ``model`` on a validation loader (your own training loop).

    Runs the model in eval mode over ``val_loader`` (batches ``(x, y)``) and calls
    :func:`diagnose` on the logits; the model is left in eval mode and unchanged.

    Parameters
    ----------
    model : nn.Module
        Produces logits (e.g. a :class:`cogcal.CalibratedModel`).
    val_loader : iterable of (x, y)
        Validation batches (never the test split).
    task, history, steps
        As in :func:`diagnose`.
    device : optional
        Where to run the model (default: where its parameters are).

    Examples
    --------
    >>> import torch
    >>> from cogcal import CalibratedModel
    >>> from cogcal.health import check_calibration
    >>> _ = torch.manual_seed(0)  # the network's initialisation
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    >>> model = CalibratedModel(net)
    >>> g = torch.Generator().manual_seed(0)
    >>> val = [(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g))]
    >>> report = check_calibration(model, val, steps=10)
    >>> [f.kind for f in report.findings]
    ['under-trained']
    """
    if device is None:
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
    model.eval()
    logits, labels = [], []
    for x, y in val_loader:
        logits.append(model(x.to(device)).float().cpu())
        labels.append(y.cpu())
    if not logits:
        raise ValueError("`val_loader` yielded no batches.")
    return diagnose(torch.cat(logits), torch.cat(labels), task=task, history=history, steps=steps)
