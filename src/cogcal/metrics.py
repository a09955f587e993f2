"""Evaluation metrics: accuracy, NLL, Brier, calibration errors, AURC, OOD detection.

The definitions follow docs/method.md §3 and are part of the API:

* ``acc`` -- fraction of samples whose arg-max class equals the label;
* ``nll`` -- mean of ``-log p_y``, computed in float64 from ``log_softmax`` of the logits;
* ``brier`` -- mean over samples of ``sum_k (p_k - 1[y = k])**2`` (a *sum* over classes,
  not divided by ``K``); for a binary task ``(p - y)**2`` with ``p = sigmoid(z)``;
* ``ece_B``, ``rmsce_B``, ``mce_B`` -- calibration errors of the top-label confidence
  ``c = max_k p_k`` on ``B`` equal-width bins ``[b/B, (b+1)/B)``, the last bin closed
  so that ``c = 1.0`` lands in bin ``B - 1``;
* ``ece_positive_B``, ``rmsce_positive_B``, ``mce_positive_B`` -- for two classes (binary
  tasks and two-class multiclass input), the same errors of ``P(y = 1)`` against the
  fraction of positives (scikit-learn's ``calibration_curve`` convention);
* ``cwece_15`` (classwise ECE), ``adaece_15`` (equal-mass ECE), ``smece`` (smooth ECE,
  as ``relplot.smECE``) and ``aurc`` (area under the risk-coverage curve); with
  ``intervals=True``, ``ece_15_low`` / ``ece_15_high`` (a seeded bootstrap interval, also
  :func:`ece_interval`).

Every public function validates its input and raises ``ValueError`` naming what was wrong
(one template for every dtype / shape problem: :func:`cogcal._checks.input_error`).
Probabilities, confidences, NLL and Brier are computed in float64 whatever the input
dtype (float16 / bfloat16 / float32 input is upcast chunk by chunk, so memory stays
bounded) and accumulated in float64.

The one-shot :func:`evaluate`, the streaming :class:`StreamingMetrics` and the
torchmetrics adapter :func:`as_torchmetric` share the same private stages: argument
checks, tensor checks, ``_update`` (sufficient statistics per bin, O(bins x classes x
tasks) memory, independent of the number of samples) and ``_compute`` (metrics from
those statistics).
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from cogcal._checks import (
    ProbabilitiesAsLogitsWarning,
    binary_scores,
    check_binary,
    check_multiclass,
    check_multilabel,
    check_task,
    input_error,
    multiclass_scores,
    probability_tolerance,
    warn_if_probabilities,
)

__all__ = [
    "DEFAULT_N_BINS",
    "ProbabilitiesAsLogitsWarning",
    "StreamingMetrics",
    "as_torchmetric",
    "ece_interval",
    "evaluate",
    "ood",
    "ood_scores",
    "reliability_bins",
]

#: The default sweep of bin counts (docs/method.md §3).
DEFAULT_N_BINS: tuple[int, ...] = (5, 10, 15, 20, 50, 100)

_BINNINGS = ("width", "mass")
_OOD_SCORES = ("msp", "energy", "entropy", "maxlogit")
_LOGIT_SCORES = ("energy", "maxlogit")  # scores of the logits themselves
#: Scores processed at once (rows x columns): the float64 temporaries of a chunk stay
#: small (8 MiB), large enough to amortise the per-call overhead.
_CHUNK_ELEMS = 1 << 20
#: Largest ``tasks x lcm(n_bins)`` histogram built before folding into the coarser bins.
_MAX_FINE = 1 << 22


# --------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------


def _check_n_bins(n_bins: Any) -> tuple[int, ...]:
    items = [n_bins] if isinstance(n_bins, int | np.integer) else n_bins
    try:
        items = list(items)
    except TypeError:
        raise ValueError(
            f"`n_bins` must be a positive integer or a sequence of them, got {n_bins!r}."
        ) from None
    out: list[int] = []
    for b in items:
        if isinstance(b, bool) or not isinstance(b, int | np.integer) or b < 1:
            raise ValueError(
                f"`n_bins` must hold positive integers (e.g. (5, 10, 15)), got {n_bins!r}."
            )
        if int(b) not in out:
            out.append(int(b))
    if not out:
        raise ValueError("`n_bins` is empty; pass at least one bin count, e.g. n_bins=15.")
    return tuple(out)


def _check_binning(binning: str) -> str:
    if binning not in _BINNINGS:
        raise ValueError(
            f"`binning` must be 'width' (equal-width bins) or 'mass' (equal-mass bins), "
            f"got {binning!r}."
        )
    return binning


def _check_task_names(task_names: Sequence[str] | None, n_tasks: int) -> list[str]:
    if task_names is None:
        return [f"t{i}" for i in range(n_tasks)]
    names = [str(n) for n in task_names]
    if len(names) != n_tasks:
        raise ValueError(
            f"`task_names` has {len(names)} name(s) but the input has {n_tasks} task column(s); "
            "pass one name per column."
        )
    if len(set(names)) != len(names):
        raise ValueError(f"`task_names` must be unique, got {names}.")
    return names


def _check_eps(eps: Any) -> float | None:
    if eps is None:
        return None
    if (
        isinstance(eps, bool)
        or not isinstance(eps, int | float | np.floating | np.integer)
        or not (0.0 < float(eps) < 1.0)
    ):
        raise ValueError(
            f"`eps` must be None (no clipping) or a number in (0, 1), got {eps!r}; e.g. "
            "eps=1e-15 clips the probability of the true class at 1e-15 in the NLL."
        )
    return float(eps)


def _check_bootstrap(level: Any, n_boot: Any, seed: Any) -> tuple[float, int, int]:
    if (
        isinstance(level, bool)
        or not isinstance(level, int | float | np.floating | np.integer)
        or not (0.0 < float(level) < 1.0)
    ):
        raise ValueError(
            f"`level` must be a number in (0, 1), got {level!r}; e.g. level=0.95 for a 95% "
            "interval."
        )
    if isinstance(n_boot, bool) or not isinstance(n_boot, int | np.integer) or n_boot < 1:
        raise ValueError(
            f"`n_boot` must be a positive integer (the number of bootstrap resamples, e.g. "
            f"1000), got {n_boot!r}."
        )
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(
            f"`seed` must be a non-negative integer (the bootstrap is seeded so that it is "
            f"reproducible), got {seed!r}."
        )
    return float(level), int(n_boot), int(seed)


def _check_positive_class(positive_class: Any, task: str) -> bool | None:
    if positive_class is not None and not isinstance(positive_class, bool):
        raise ValueError(
            f"`positive_class` must be None (automatic), True or False, got {positive_class!r}."
        )
    return positive_class


def _check_num_classes(num_classes: Any) -> int | None:
    if num_classes is not None and (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, int | np.integer)
        or num_classes < 2
    ):
        raise ValueError(f"`num_classes` must be an integer >= 2, got {num_classes!r}.")
    return None if num_classes is None else int(num_classes)


# --------------------------------------------------------------------------------------
# tensor checks
# --------------------------------------------------------------------------------------


_prob_tolerance = probability_tolerance  # how far from 1 a row of probabilities may sum


def _check_probs(p: torch.Tensor, name: str, *, rows: bool) -> None:
    """Probabilities lie in [0, 1]; with ``rows``, every row sums to 1 within tolerance."""
    lo, hi = (float(v) for v in torch.aminmax(p))
    if lo < 0.0 or hi > 1.0:
        alt = name.replace("probs", "logits")
        raise input_error(
            name,
            f"has values in [{lo:.4g}, {hi:.4g}]",
            "probabilities in [0, 1]",
            f"If these are logits, pass them as `{alt}` instead.",
        )
    if rows:
        dev = (p.sum(1, dtype=torch.float64) - 1.0).abs()
        tol = _prob_tolerance(p.dtype)
        if float(dev.max()) > tol:
            i = int(dev.argmax())
            raise input_error(
                name,
                f"has row {i} summing to {float(p[i].sum(dtype=torch.float64)):.6g} "
                f"({int((dev > tol).sum())} bad row(s))",
                f"rows that sum to 1 (tolerance {tol:.1e})",
                "Pass normalised probabilities, or pass logits as `logits`.",
            )


def _warn_if_probabilities(z: torch.Tensor, name: str, alt: str, rows: bool) -> None:
    """Warn (never convert) when logits look like probabilities (:func:`warn_if_probabilities`)."""
    warn_if_probabilities(
        z, name, f"If they are probabilities, pass them as `{alt}=` instead.", rows=rows,
        stacklevel=5,
    )  # fmt: skip


def _check_tensors(
    logits: Any, labels: Any, probs: Any, task: str, eps: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate the inputs; return ``(scores, labels, is_prob)``.

    ``scores`` is (N, K) for multiclass and (N, T) for binary (T = 1) / multilabel.
    """
    if (logits is None) == (probs is None):
        raise ValueError(
            "pass exactly one of `logits` and `probs` (by keyword, e.g. "
            "evaluate(labels=y, probs=p)): got "
            + ("both" if logits is not None else "neither")
            + "; probabilities are never guessed from the values."
        )
    if labels is None:
        raise input_error(
            "labels",
            "is required but was not given",
            "class indices (multiclass) or 0/1 targets (binary, multilabel)",
            "Call e.g. evaluate(logits, labels) or evaluate(labels=y, probs=p).",
        )
    is_prob = probs is not None
    if eps is not None and not is_prob:
        raise ValueError(
            "`eps` clips probabilities and applies to `probs=` input only; the NLL of logits "
            "is computed exactly from log-softmax / log-sigmoid, so drop `eps`."
        )
    x = probs if is_prob else logits
    name = "probs" if is_prob else "logits"
    if task == "multiclass":
        z, y = check_multiclass(x, labels, logits_name=name)
    elif task == "binary":
        z, y = check_binary(x, labels, logits_name=name)
        z, y = z[:, None], y[:, None]
    else:
        z, y = check_multilabel(x, labels, logits_name=name)
    if is_prob:
        _check_probs(z, name, rows=task == "multiclass")
    else:
        _warn_if_probabilities(z, name, "probs", rows=task == "multiclass")
    return z, y, is_prob


# --------------------------------------------------------------------------------------
# per-sample statistics (float64)
# --------------------------------------------------------------------------------------


def _neg_log(p: torch.Tensor, eps: float | None) -> torch.Tensor:
    return -torch.log(p if eps is None else p.clamp(min=eps))


class _Want(NamedTuple):
    """What a chunk function reads and returns: the scores' kind and the optional outputs."""

    is_prob: bool
    eps: float | None
    positive: bool
    want_probs: bool


def _multiclass_chunk(z: torch.Tensor, y: torch.Tensor, want: _Want) -> dict[str, torch.Tensor]:
    """Per-sample statistics of one chunk of (n, K) scores, each of shape (n, 1).

    ``conf`` (top-label confidence), ``correct``, ``nll``, ``brier`` and, with
    ``positive``, ``pos_conf`` = p_1 and ``pos_label`` = 1[y = 1]; ``probs`` (n, 1, K)
    with ``want_probs``.

    From logits, in float64: with the arg-max ``j``, ``e_k = exp(z_k - z_j)`` and the mass
    of the other classes ``S = sum_{k != j} e_k``, ``p_k = e_k / (1 + S)``,
    ``-log p_y = log1p(S) - (z_y - z_j)`` and, without cancellation,
    ``1 - p_y = sum_{k != y} e_k / (1 + S)``, so NLL and Brier keep their full relative
    precision however confident the prediction (no ``1 - p`` is ever formed).
    """
    is_prob, eps, positive, want_probs = want
    yi = y[:, None]
    out: dict[str, torch.Tensor] = {}
    if is_prob:
        p = z.double()
        conf, pred = p.max(1)
        p_y = p.gather(1, yi)[:, 0]
        nll = _neg_log(p_y, eps)
        brier = torch.linalg.vector_norm(p.scatter(1, yi, 0.0), dim=1).square()
        brier += (1.0 - p_y).square()
        if positive:
            out["pos_conf"] = p[:, 1:2]
    else:
        zmax, pred = z.max(1)  # exact in the input dtype
        zmax = zmax.double()
        pi = pred[:, None]
        e = z.to(torch.float64, copy=True).sub_(zmax[:, None]).exp_()  # e_j = 1 at the arg-max
        e.scatter_(1, pi, 0.0)  # now the other classes only
        s1 = e.sum(1)  # S
        s2 = torch.linalg.vector_norm(e, dim=1).square()  # sum_{k != j} e_k^2
        e_y = e.gather(1, yi)[:, 0]  # e_y, or 0 when y = j
        miss = (pred != y).double()
        # sum_{k != y} e_k and sum_{k != y} e_k^2 (the arg-max term 1 counts when y != j)
        rest1 = miss + (s1 - e_y)
        rest2 = miss + (s2 - e_y.square())
        denom = 1.0 + s1
        conf = denom.reciprocal()
        nll = torch.log1p(s1) - (z.gather(1, yi)[:, 0].double() - zmax)
        brier = (rest2 + rest1.square()) / denom.square()
        if positive:
            e1 = torch.where(pred == 1, 1.0, e[:, 1])
            out["pos_conf"] = (e1 / denom)[:, None]
        if want_probs:
            p = e.scatter_(1, pi, 1.0).div_(denom[:, None])
    out.update(
        conf=conf[:, None],
        correct=(pred == y)[:, None],
        nll=nll[:, None],
        brier=brier[:, None],
    )
    if positive:
        out["pos_label"] = yi == 1
    if want_probs:
        out["probs"] = p[:, None, :]
    return out


def _binary_chunk(z: torch.Tensor, y: torch.Tensor, want: _Want) -> dict[str, torch.Tensor]:
    """Per-sample, per-task statistics of (n, T) binary scores (see :func:`_multiclass_chunk`).

    From logits: with the margin against the truth ``s = z`` (y = 0) or ``-z`` (y = 1),
    ``|p - y| = sigmoid(s)`` and ``-log p_y = log(1 + e^s)``, both without cancellation.
    """
    is_prob, eps, positive, want_probs = want
    z = z.double()
    y1 = y == 1
    out: dict[str, torch.Tensor] = {}
    if is_prob:
        p = z
        pt = torch.where(y1, p, 1.0 - p)  # probability of the true class
        out["nll"] = _neg_log(pt, eps)
        out["brier"] = (1.0 - pt).square()
        out["conf"] = torch.maximum(p, 1.0 - p)
        out["correct"] = (p > 0.5) == y1
        if want_probs:
            out["probs"] = torch.stack([1.0 - p, p], dim=-1)
    else:
        s = torch.where(y1, -z, z)
        out["nll"] = s.clamp(min=0) + torch.log1p(torch.exp(-s.abs()))
        out["brier"] = torch.sigmoid(s).square()
        out["conf"] = torch.sigmoid(z.abs())
        out["correct"] = (z > 0) == y1
        p = torch.sigmoid(z)
        if want_probs:
            out["probs"] = torch.stack([torch.sigmoid(-z), p], dim=-1)
    if positive:
        out["pos_conf"] = p
        out["pos_label"] = y1
    return out


# --------------------------------------------------------------------------------------
# state: sufficient statistics
# --------------------------------------------------------------------------------------


def _lcm(values: Iterable[int]) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def _width_bin(c: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Bin index ``floor(c * B)`` clipped to ``B - 1`` (so ``c = 1`` is in the last bin).

    ``c`` is float64; the product ``c * B`` is correctly rounded, so a confidence lands
    in bin ``b`` exactly when ``b/B <= c < (b+1)/B`` except within one float64 rounding
    of an edge (and exactly for any float32 ``c`` and ``B < 2**29``).
    """
    return torch.floor(c.double() * n_bins).long().clamp_(0, n_bins - 1)


def _hist(idx: torch.Tensor, weights: torch.Tensor | None, size: int) -> torch.Tensor:
    w = None if weights is None else weights.reshape(-1).double()
    return torch.bincount(idx.reshape(-1), weights=w, minlength=size).double()


class _State:
    """Sufficient statistics of a stream of predictions (every tensor is a sum over samples).

    ``positive`` is the requested positive-class setting (None: automatic); it is resolved
    into ``positive_`` once the number of classes is known (:meth:`allocate`).
    """

    def __init__(
        self,
        *,
        task: str,
        n_bins: tuple[int, ...],
        classwise: bool,
        num_classes: int | None,
        num_tasks: int | None,
        positive: bool | None = False,
        cw_bins: tuple[int, ...] | None = None,
    ) -> None:
        self.task = task
        self.n_bins = n_bins
        self.classwise = classwise
        # the bin counts of the classwise sums (evaluate adds 15 for its default cwece_15)
        self.cw_bins = (n_bins if classwise else ()) if cw_bins is None else cw_bins
        self.positive = positive
        # multiclass: one "task" with K classes; binary / multilabel: T tasks with 2 classes.
        self.num_classes = 2 if task != "multiclass" else num_classes
        self.num_tasks = 1 if task != "multilabel" else num_tasks
        self.tensors: dict[str, torch.Tensor] = {}

    @property
    def initialised(self) -> bool:
        return bool(self.tensors)

    @property
    def known(self) -> bool:
        """Whether the shapes are known (classes for multiclass, tasks for multilabel)."""
        return self.num_classes is not None and self.num_tasks is not None

    @property
    def positive_(self) -> bool:
        """The resolved positive-class setting (needs the number of classes)."""
        if self.positive is None:
            return self.task == "binary" or (self.task == "multiclass" and self.num_classes == 2)
        if self.positive and self.task == "multiclass" and self.num_classes != 2:
            raise ValueError(
                f"`positive_class=True` needs two classes (P(y = 1) against the fraction of "
                f"positives), but the input has {self.num_classes}; for K classes use "
                "classwise=True (the mean over classes of each class's calibration error)."
            )
        return bool(self.positive)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        t, k = self.num_tasks, self.num_classes
        shapes: dict[str, tuple[int, ...]] = {
            "n": (),
            "correct": (t,),
            "nll": (t,),
            "brier": (t,),
        }
        for b in self.n_bins:
            shapes[f"count_{b}"] = (t, b)
            shapes[f"conf_{b}"] = (t, b)
            shapes[f"acc_{b}"] = (t, b)
            if self.positive_:
                shapes[f"pos_count_{b}"] = (t, b)
                shapes[f"pos_conf_{b}"] = (t, b)
                shapes[f"pos_label_{b}"] = (t, b)
        for b in self.cw_bins:
            shapes[f"cw_count_{b}"] = (t, k, b)
            shapes[f"cw_prob_{b}"] = (t, k, b)
            shapes[f"cw_label_{b}"] = (t, k, b)
        return shapes

    def allocate(self, device: torch.device) -> None:
        self.tensors = {
            key: torch.zeros(shape, dtype=torch.float64, device=device)
            for key, shape in self.shapes().items()
        }

    def config(self) -> tuple:
        return (
            self.task,
            self.n_bins,
            self.classwise,
            self.positive,
            self.num_classes,
            self.num_tasks,
        )

    def fingerprint(self) -> int:
        """A 32-bit hash of the settings every process must share (shapes excluded)."""
        key = repr((self.task, self.n_bins, self.classwise, self.positive))
        return zlib.crc32(key.encode())


def _binned_sums(
    conf: torch.Tensor, hit: torch.Tensor, n_bins: tuple[int, ...]
) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per-bin (count, sum of confidence, sum of hits) of (n, T) values, for every B.

    When ``T * lcm(n_bins)`` is small, one histogram at the finest common resolution
    ``L = lcm(n_bins)`` is folded into each ``B`` (exact: ``floor(floor(c L) / (L/B)) =
    floor(c B)``); otherwise one histogram per ``B``.
    """
    t = conf.shape[1]
    offs = torch.arange(t, device=conf.device)[None, :]
    cd = conf.double()
    fine = _lcm(n_bins)
    out = {}
    if t * fine <= _MAX_FINE:
        idx = _width_bin(cd, fine) + offs * fine
        hs = [_hist(idx, w, t * fine).view(t, fine) for w in (None, cd, hit)]
        for b in n_bins:
            out[b] = tuple(h.view(t, b, fine // b).sum(-1) for h in hs)
    else:
        for b in n_bins:
            idx = _width_bin(cd, b) + offs * b
            out[b] = tuple(_hist(idx, w, t * b).view(t, b) for w in (None, cd, hit))
    return out


def _onehot(y: torch.Tensor, n: int, k: int, task: str) -> torch.Tensor:
    if task == "multiclass":
        onehot = torch.zeros((n, 1, k), dtype=torch.float64, device=y.device)
        return onehot.scatter_(2, y.reshape(n, 1, 1), 1.0)
    y1 = y.double()
    return torch.stack([1.0 - y1, y1], dim=-1)


def _classwise_sums(
    probs: torch.Tensor, y: torch.Tensor, n_bins: tuple[int, ...], task: str
) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per-(task, class, bin) (count, sum p_k, sum 1[y = k]) of (n, T, K) probabilities.

    The label sums count, for each sample and task, the bin of its true class only (a
    gather, no dense one-hot).
    """
    n, t, k = probs.shape
    true_class = (y.reshape(n, 1, 1) if task == "multiclass" else y.reshape(n, t, 1)).long()
    pd = probs.double()
    offs = torch.arange(t * k, device=probs.device).view(1, t, k)
    out = {}
    for b in n_bins:
        idx = _width_bin(pd, b) + offs * b
        size = t * k * b
        out[b] = (
            _hist(idx, None, size).view(t, k, b),
            _hist(idx, pd, size).view(t, k, b),
            _hist(idx.gather(2, true_class), None, size).view(t, k, b),
        )
    return out


def _fix_shapes(state: _State, scores: torch.Tensor) -> None:
    """Take K (multiclass) or T (multilabel) from the first batch; check later batches."""
    if state.task not in ("multiclass", "multilabel"):
        return
    attr, what = (
        ("num_classes", "classes") if state.task == "multiclass" else ("num_tasks", "tasks")
    )
    width, known = scores.shape[1], getattr(state, attr)
    if known is None:
        setattr(state, attr, width)
    elif width != known:
        raise ValueError(
            f"`logits` has {width} {what} (columns) but this metric state was built for "
            f"{known}; every update must use the same {what}."
        )


def _update(
    state: _State,
    scores: torch.Tensor,
    labels: torch.Tensor,
    *,
    is_prob: bool,
    eps: float | None = None,
    return_samples: bool = False,
    return_probs: bool = False,
) -> dict[str, torch.Tensor] | None:
    """Add validated ``scores`` / ``labels`` to ``state``, chunk by chunk.

    With ``return_samples``, return this batch's per-sample ``conf`` and ``correct`` (and
    ``pos_conf`` / ``pos_label`` for the positive class; ``probs`` and ``y`` with
    ``return_probs``), for the one-shot equal-mass binning.
    """
    _fix_shapes(state, scores)
    positive = state.positive_
    if not state.initialised:
        state.allocate(scores.device)
    s = state.tensors
    if positive and state.n_bins and f"pos_count_{state.n_bins[0]}" not in s:
        raise ValueError(
            "this metric state holds no positive-class sums (it was loaded from a state of "
            "another number of classes, or positive_class=False); two-class input needs "
            "them: build a new StreamingMetrics, or pass positive_class=False."
        )
    dev = s["n"].device
    want_probs = bool(state.cw_bins) or return_probs
    chunk_fn = _multiclass_chunk if state.task == "multiclass" else _binary_chunk
    want = _Want(is_prob, eps, positive, want_probs)
    with torch.no_grad():
        # chunks bound the (rows x K) float64 temporaries; the per-sample vectors of this
        # batch are concatenated and reduced / binned once, with few large operations
        rows = max(1, _CHUNK_ELEMS // max(1, scores.shape[1]))
        parts: list[dict[str, torch.Tensor]] = []
        for start in range(0, scores.shape[0], rows):
            z = scores[start : start + rows].to(dev)
            y = labels[start : start + rows].to(dev)
            raw = chunk_fn(z, y, want)
            probs = raw.pop("probs", None)
            if state.cw_bins:
                for b, (cnt, psum, ysum) in _classwise_sums(
                    probs, y, state.cw_bins, state.task
                ).items():
                    s[f"cw_count_{b}"] += cnt
                    s[f"cw_prob_{b}"] += psum
                    s[f"cw_label_{b}"] += ysum
            if return_probs:
                raw["probs"], raw["y"] = probs, y
            parts.append(raw)
        if len(parts) == 1:
            raw = parts[0]
        else:
            raw = {k: torch.cat([part[k] for part in parts]) for k in parts[0]}
        conf, correct, nll = raw["conf"], raw["correct"], raw["nll"]
        if is_prob and eps is None:
            n_zero = int(torch.isinf(nll).sum())
            if n_zero:
                warnings.warn(
                    f"{n_zero} sample(s) give their true class probability 0, so `nll` is "
                    "infinite; pass `eps=` (e.g. eps=1e-15) to clip the probability of the "
                    "true class at eps in the NLL.",
                    UserWarning,
                    stacklevel=3,
                )
        s["n"] += conf.shape[0]
        s["correct"] += correct.sum(0)
        s["nll"] += nll.sum(0)
        s["brier"] += raw["brier"].sum(0)
        if state.n_bins:
            for b, (cnt, csum, asum) in _binned_sums(conf, correct, state.n_bins).items():
                s[f"count_{b}"] += cnt
                s[f"conf_{b}"] += csum
                s[f"acc_{b}"] += asum
            if positive:
                sums = _binned_sums(raw["pos_conf"], raw["pos_label"], state.n_bins)
                for b, (cnt, csum, ysum) in sums.items():
                    s[f"pos_count_{b}"] += cnt
                    s[f"pos_conf_{b}"] += csum
                    s[f"pos_label_{b}"] += ysum
        if not return_samples:
            return None
        keep = ("conf", "correct", "pos_conf", "pos_label", "probs", "y")
        return {k: raw[k] for k in keep if k in raw}


def _errors(
    count: torch.Tensor, conf_sum: torch.Tensor, acc_sum: torch.Tensor, n: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ECE, RMSCE and MCE along the last (bin) axis of per-bin sums.

    Empty bins have zero weight in ECE / RMSCE and are skipped by MCE.
    """
    nonempty = count > 0
    safe = count.clamp(min=1)
    gap = torch.where(nonempty, (acc_sum / safe - conf_sum / safe).abs(), 0.0)
    w = count / n
    ece = (w * gap).sum(-1)
    rmsce = (w * gap.square()).sum(-1).sqrt()
    mce = gap.amax(-1)  # gaps are >= 0 and empty bins hold 0: the max over non-empty bins
    return ece, rmsce, mce


def _compute(state: _State, task_names: list[str] | None = None) -> dict[str, float]:
    """Metrics from the sufficient statistics in ``state`` (dict of Python floats)."""
    if not state.initialised or float(state.tensors["n"]) == 0:
        raise ValueError("no samples were seen: call `update(logits, labels)` before `compute()`.")
    s = {k: v.detach().to("cpu", torch.float64) for k, v in state.tensors.items()}
    n = float(s["n"])
    per: dict[str, torch.Tensor] = {
        "acc": s["correct"] / n,
        "nll": s["nll"] / n,
        "brier": s["brier"] / n,
    }
    groups = [("", "count", "conf", "acc")]
    if state.positive_:
        groups.append(("_positive", "pos_count", "pos_conf", "pos_label"))
    for suffix, cnt, csum, asum in groups:
        errs = {
            b: _errors(s[f"{cnt}_{b}"], s[f"{csum}_{b}"], s[f"{asum}_{b}"], n) for b in state.n_bins
        }
        for i, name in enumerate(("ece", "rmsce", "mce")):
            for b in state.n_bins:
                per[f"{name}{suffix}_{b}"] = errs[b][i]
    for b in state.cw_bins:
        ece_k = _errors(s[f"cw_count_{b}"], s[f"cw_prob_{b}"], s[f"cw_label_{b}"], n)[0]
        per[f"cwece_{b}"] = ece_k.mean(-1)
    return _finish(per, state.task, task_names, state.num_tasks)


def _finish(
    per: dict[str, torch.Tensor], task: str, task_names: list[str] | None, n_tasks: int
) -> dict[str, float]:
    """Per-task tensors of shape (T,) -> plain keys (mean over tasks) + per-task keys."""
    out = {key: float(v.mean()) for key, v in per.items()}
    if task == "multilabel":
        names = task_names if task_names is not None else _check_task_names(None, n_tasks)
        for key, v in per.items():
            for name, val in zip(names, v.tolist(), strict=True):
                out[f"{key}/{name}"] = float(val)
    return out


def _mass_edges(sorted_c: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Inner edges of equal-mass bins of a sorted 1-D confidence vector."""
    n = sorted_c.shape[0]
    starts = torch.div(
        torch.arange(1, n_bins, device=sorted_c.device) * n, n_bins, rounding_mode="floor"
    )
    return sorted_c[starts.clamp(max=n - 1)] if n_bins > 1 else sorted_c[:0]


def _mass_bin(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-mass bin index of each column of (n, ...) values (ties share a bin)."""
    flat = values.reshape(values.shape[0], -1)
    srt = flat.sort(0).values
    idx = torch.empty_like(flat, dtype=torch.long)
    for j in range(flat.shape[1]):
        edges = _mass_edges(srt[:, j].contiguous(), n_bins)
        idx[:, j] = torch.searchsorted(edges, flat[:, j].contiguous(), right=True)
    return idx.view(values.shape)


def _compute_mass(
    samples: dict[str, torch.Tensor],
    state: _State,
    n_bins: tuple[int, ...],
    task_names: list[str] | None,
) -> dict[str, float]:
    """One-shot equal-mass calibration errors from the per-sample values."""
    conf = samples["conf"].cpu().double()
    n, t = conf.shape
    offs = torch.arange(t)[None, :]
    per: dict[str, torch.Tensor] = {}
    groups = [("", conf, samples["correct"].cpu().double())]
    if "pos_conf" in samples:
        groups.append(
            ("_positive", samples["pos_conf"].cpu().double(), samples["pos_label"].cpu().double())
        )
    for suffix, c, hit in groups:
        errs = {}
        for b in n_bins:
            idx = _mass_bin(c, b) + offs * b
            sums = [_hist(idx, w, t * b).view(t, b) for w in (None, c, hit)]
            errs[b] = _errors(*sums, n)
        for i, name in enumerate(("ece", "rmsce", "mce")):
            for b in n_bins:
                per[f"{name}{suffix}_mass_{b}"] = errs[b][i]
    if state.classwise:
        probs, y = samples["probs"].cpu().double(), samples["y"].cpu()
        k = probs.shape[2]
        onehot = _onehot(y, n, k, state.task)
        offs_k = torch.arange(t * k).view(1, t, k)
        for b in n_bins:
            idx = _mass_bin(probs, b) + offs_k * b
            sums = [_hist(idx, w, t * k * b).view(t, k, b) for w in (None, probs, onehot)]
            per[f"cwece_mass_{b}"] = _errors(*sums, n)[0].mean(-1)
    return _finish(per, state.task, task_names, t)


# --------------------------------------------------------------------------------------
# sample-level metrics (one-shot: they need every sample, see evaluate's Notes)
# --------------------------------------------------------------------------------------

#: Bins of ``adaece_15``, ``cwece_15`` and of the bootstrap interval of ``ece_15``.
_FIXED_BINS = 15
#: Elements of one (bootstrap replicates x samples) weight matrix of the bootstrap.
_BOOT_ELEMS = 1 << 22


def _run_means(srt: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` (n, T) with each value replaced by its mean over its run of equal ``srt``.

    ``srt`` is sorted along dim 0 (either direction) and ``x`` is aligned with it; a run
    is a maximal block of equal values in one column.
    """
    n, t = srt.shape
    new = torch.ones_like(srt, dtype=torch.bool)
    new[1:] = srt[1:] != srt[:-1]  # row 0 starts a run in every column
    ids = new.T.reshape(-1).cumsum(0) - 1  # run ids, column after column
    size = int(ids[-1]) + 1
    sums = torch.bincount(ids, weights=x.T.reshape(-1).double(), minlength=size)
    counts = torch.bincount(ids, minlength=size).double()
    return (sums / counts)[ids].view(t, n).T


def _adaptive_ece(conf: torch.Tensor, hit: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-mass ECE (``adaece_B``) of each column of (n, T) confidences and hits.

    The sorted confidences are cut into ``n_bins`` consecutive groups with the sizes of
    ``numpy.array_split`` (the first ``n mod B`` groups one larger); a run of tied
    confidences cut by a group boundary gives each group its share of the run's hits.
    """
    n, t = conf.shape
    srt, order = conf.double().sort(0)
    h = _run_means(srt, hit.double().gather(0, order))
    q, r = divmod(n, n_bins)
    i = torch.arange(n, device=conf.device)
    big = (q + 1) * r  # positions in the r larger groups
    b = torch.where(i < big, i // (q + 1), r + (i - big) // max(q, 1))
    idx = b[:, None] + torch.arange(t, device=conf.device)[None, :] * n_bins
    resid = _hist(idx, h - srt, t * n_bins).view(t, n_bins)  # sum of (hit - conf) per group
    return resid.abs().sum(-1) / n


def _aurc(conf: torch.Tensor, hit: torch.Tensor) -> torch.Tensor:
    """Area under the risk-coverage curve of each column (ties broken in expectation)."""
    n = conf.shape[0]
    srt, order = conf.double().sort(0, descending=True)
    err = _run_means(srt, 1.0 - hit.double().gather(0, order))
    cover = torch.arange(1, n + 1, dtype=torch.float64, device=conf.device)[:, None]
    return (err.cumsum(0) / cover).mean(0)


def _reflected_smooth(grid: np.ndarray, sigma: float) -> np.ndarray:
    """Rows of ``grid`` (values on ``m`` points of [0, 1]) convolved with a reflected Gaussian.

    The kernel is the Gaussian of width ``sigma`` sampled on the grid's offsets within
    ``[-1/2, 1/2]`` (``m`` is odd), the rows are mirrored at both ends, and the ``m``
    central outputs of the convolution are kept (relplot's ``ReflectedGaussianKernel``),
    computed by FFT.
    """
    m = grid.shape[-1]
    t = np.linspace(0.0, 1.0, m)
    ker = np.exp(-((t - 0.5) ** 2) / (2 * sigma**2)) / (math.sqrt(2 * math.pi) * sigma)
    ext = np.concatenate([grid[:, :0:-1], grid, grid[:, -2::-1]], axis=1)  # 3m - 2
    size = 1 << (ext.shape[1] + m - 2).bit_length()
    full = np.fft.irfft(np.fft.rfft(ext, size) * np.fft.rfft(ker, size), size)
    start = m - 1 + m // 2  # 'valid' starts at m - 1; relplot keeps [m // 2, m // 2 + m)
    return full[:, start : start + m]


def _smooth_ece_1d(f: np.ndarray, resid: np.ndarray) -> float:
    """smECE of confidences ``f`` with residuals ``f - y`` (relplot's ``smECE``, see Notes)."""
    grids: dict[int, np.ndarray] = {}
    values: dict[float, float] = {}

    def rounded(m: int) -> np.ndarray:
        # mass and residual of each sample shared linearly between its two grid points
        if m not in grids:
            pos = f * (m - 1)
            i = np.clip(pos.astype(np.int64), 0, m - 2)
            frac = pos - i
            grids[m] = np.stack(
                [
                    np.bincount(i, resid * (1 - frac), m) + np.bincount(i + 1, resid * frac, m),
                    np.bincount(i, 1 - frac, m) + np.bincount(i + 1, frac, m),
                ]
            )
        return grids[m]

    def at(sigma: float) -> float:
        if sigma not in values:
            m = max(2000, round(20 / sigma)) // 2 + 1
            ys, dens = _reflected_smooth(rounded(m), sigma)
            te = np.linspace(0.0, 1.0, max(round(10 / sigma), 200))
            inds = np.clip((te * (m - 1)).astype(np.int64), 0, m - 2)
            w = (te - inds * (1 / (m - 1))) / (1 / (m - 1))
            ys = ys[inds] * (1 - w) + ys[inds + 1] * w
            dens = dens[inds] * (1 - w) + dens[inds + 1] * w + 1e-4
            values[sigma] = float(np.sum(np.abs(ys / dens) * dens) / np.sum(dens))
        return values[sigma]

    def below_fixed_point(sigma: float) -> bool:
        return sigma < 1e-3 or sigma < at(sigma)

    if below_fixed_point(1.0):
        return at(1.0)
    hi, lo = 1.0, 0.0
    for _ in range(10):  # bisection: sigma* within 2**-10
        mid = (hi + lo) / 2
        if below_fixed_point(mid):
            lo = mid
        else:
            hi = mid
    return at(hi)


def _smece(conf: torch.Tensor, hit: torch.Tensor) -> torch.Tensor:
    """smECE of each column of (n, T) confidences and hits."""
    f = conf.detach().cpu().double().numpy()
    resid = f - hit.detach().cpu().double().numpy()
    vals = [_smooth_ece_1d(f[:, j], resid[:, j]) for j in range(f.shape[1])]
    return torch.tensor(vals, dtype=torch.float64)


def _ece_bootstrap(
    conf: torch.Tensor, hit: torch.Tensor, n_bins: int, n_boot: int, seed: int
) -> np.ndarray:
    """ECE of ``n_boot`` bootstrap resamples of the rows of (n, T) values: (n_boot, T).

    Each resample draws n rows with replacement (the same rows for every task) from
    ``numpy.random.default_rng(seed)``; a chunk of resamples is a matrix of draw counts
    ``W`` (resamples x n), and the per-bin sums of ``hit - conf`` are ``W @ F`` with ``F``
    the (n, B) residuals placed in their bins (ECE = sum_b |sum_{i in b} (hit_i -
    conf_i)| / n).
    """
    c = conf.detach().cpu().double()
    n, t = c.shape
    bins = _width_bin(c, n_bins).numpy()
    resid = (hit.detach().cpu().double() - c).numpy()
    rng = np.random.default_rng(seed)
    rows = np.arange(n)
    out = np.empty((n_boot, t))
    step = max(1, _BOOT_ELEMS // n)
    for start in range(0, n_boot, step):
        cc = min(step, n_boot - start)
        draws = rng.integers(0, n, size=(cc, n)) + (np.arange(cc) * n)[:, None]
        weights = np.bincount(draws.ravel(), minlength=cc * n).reshape(cc, n).astype(np.float64)
        for j in range(t):
            feats = np.zeros((n, n_bins))
            feats[rows, bins[:, j]] = resid[:, j]
            out[start : start + cc, j] = np.abs(weights @ feats).sum(1) / n
    return out


def _sample_metrics(
    samples: dict[str, torch.Tensor],
    task: str,
    task_names: list[str] | None,
) -> dict[str, float]:
    """``adaece_15``, ``smece`` and ``aurc`` (per task for multilabel) from the samples."""
    conf = samples["conf"].detach().cpu().double()
    hit = samples["correct"].detach().cpu()
    per = {
        f"adaece_{_FIXED_BINS}": _adaptive_ece(conf, hit, _FIXED_BINS),
        "smece": _smece(conf, hit),
        "aurc": _aurc(conf, hit),
    }
    return _finish(per, task, task_names, conf.shape[1])


def _interval_keys(
    samples: dict[str, torch.Tensor],
    task: str,
    task_names: list[str] | None,
    *,
    level: float,
    n_boot: int,
    seed: int,
) -> dict[str, float]:
    """``ece_15_low`` / ``ece_15_high`` (and per task for multilabel): percentile bootstrap."""
    boot = _ece_bootstrap(samples["conf"], samples["correct"], _FIXED_BINS, n_boot, seed)
    qs = [(1 - level) / 2, (1 + level) / 2]
    lo, hi = np.quantile(boot.mean(1), qs)  # the plain key: the mean over tasks
    key = f"ece_{_FIXED_BINS}"
    out = {f"{key}_low": float(lo), f"{key}_high": float(hi)}
    if task == "multilabel":
        names = task_names if task_names is not None else _check_task_names(None, boot.shape[1])
        for end, vals in zip(("low", "high"), np.quantile(boot, qs, axis=0), strict=True):
            for name, val in zip(names, vals.tolist(), strict=True):
                out[f"{key}_{end}/{name}"] = float(val)
    return out


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


def evaluate(
    logits: Any = None,
    labels: Any = None,
    *,
    task: str = "multiclass",
    n_bins: int | Sequence[int] = DEFAULT_N_BINS,
    binning: str = "width",
    classwise: bool = False,
    probs: Any = None,
    task_names: Sequence[str] | None = None,
    positive_class: bool | None = None,
    eps: float | None = None,
    intervals: bool = False,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    r"""Accuracy, NLL, Brier score, calibration errors and AURC of a classifier.

    Call it as ``evaluate(logits, labels)``, ``evaluate(labels=y, logits=z)`` or
    ``evaluate(labels=y, probs=p)``: exactly one of ``logits`` and ``probs``.

    Parameters
    ----------
    logits : array-like, shape (N, K), (N,) / (N, 1) or (N, T)
        Unnormalised scores: (N, K) for ``task="multiclass"``, (N,) or (N, 1) for
        ``"binary"`` (``p = sigmoid(z)``), (N, T) for ``"multilabel"`` (T binary tasks).
        A tensor of any floating dtype, a numpy array, a list, or anything
        ``numpy.asarray`` accepts (e.g. a pandas DataFrame). Logits that look like
        probabilities (all in [0, 1], multiclass rows summing to 1) are used unchanged,
        with a warning naming ``probs=``.
    labels : array-like
        Class indices of shape (N,) (multiclass), 0/1 of shape (N,) (binary) or (N, T)
        (multilabel): a tensor, numpy array, list or pandas Series; integral floats and
        booleans are accepted.
    task : {"multiclass", "binary", "multilabel"}
        Kind of problem.
    n_bins : int or sequence of int
        Bin counts ``B`` of the calibration errors; default ``(5, 10, 15, 20, 50, 100)``.
    binning : {"width", "mass"}
        Equal-width bins (keys ``ece_B``...) or equal-mass bins (keys ``ece_mass_B``...).
    classwise : bool
        Also report the classwise ECE under ``cwece_B`` (``cwece_mass_B``).
    probs : array-like, optional
        Probabilities instead of logits: (N, K) rows in [0, 1] summing to 1 within
        ``max(1e-4, 4 eps(dtype))`` for multiclass; ``P(y = 1)`` for binary / multilabel.
        Never inferred from the values of ``logits``.
    task_names : sequence of str, optional
        Names of the T multilabel tasks for the per-task keys; default ``t0 ... t{T-1}``.
    positive_class : bool, optional
        Also report the positive-class errors ``ece_positive_B``, ``rmsce_positive_B``,
        ``mce_positive_B`` (``P(y = 1)`` against the fraction of positives). Default
        (None): yes for ``task="binary"`` and two-class multiclass input, no for
        multilabel (pass True to get them per task) and for K > 2 (True raises).
    eps : float in (0, 1), optional
        For ``probs=`` only: the NLL uses ``max(p_true, eps)``. Default None: no
        clipping, so a true class of probability 0 gives ``nll = inf`` (with a warning
        giving the number of such samples). scikit-learn's ``log_loss`` clips at the
        machine epsilon of the dtype (``eps=numpy.finfo(numpy.float64).eps``).
    intervals : bool
        Also report ``ece_15_low`` and ``ece_15_high``, a 95% percentile bootstrap
        interval of ``ece_15`` (see :func:`ece_interval`). Default False: the keys are
        absent.
    n_boot : int
        Bootstrap resamples of the interval; default 1000.
    seed : int
        Seed of the bootstrap; default 0 (the same data give the same interval).

    Returns
    -------
    dict of str to float
        ``acc``, ``nll``, ``brier`` and, for each ``B``, ``ece_B``, ``rmsce_B``, ``mce_B``,
        then ``ece_positive_B``, ``rmsce_positive_B``, ``mce_positive_B`` for two classes
        (``*_mass_B`` with equal-mass bins), ``cwece_B`` for each ``B`` when
        ``classwise``, then always ``cwece_15``, ``adaece_15``, ``smece``, ``aurc``, then
        ``ece_15_low``, ``ece_15_high`` when ``intervals``. For multilabel, these keys
        hold the unweighted mean over tasks and every metric is also given per task
        under ``"{metric}/{task_name}"`` (the plain interval keys are the interval of
        the mean over tasks).

    Notes
    -----
    With :math:`p = \mathrm{softmax}(z)`, top-label confidence :math:`c_i = \max_k p_{ik}`
    and prediction :math:`\hat y_i = \arg\max_k p_{ik}` (first index on ties):

    .. math::

        \mathrm{acc} = \frac1N \sum_i 1[\hat y_i = y_i], \quad
        \mathrm{nll} = -\frac1N \sum_i \log p_{i y_i}, \quad
        \mathrm{brier} = \frac1N \sum_i \Big(\sum_{k \ne y_i} p_{ik}^2
            + (1 - p_{i y_i})^2\Big) .

    Everything is computed in float64 whatever the input dtype: :math:`\log p` by
    ``log_softmax`` of the upcast logits, and :math:`1 - p_y = -\mathrm{expm1}(\log p_y)`,
    so Brier keeps its relative precision for confident predictions (logits ``[9, 0]``,
    label 0: ``2 (1 - \sigma(9))^2 = 3.05e-8``).

    Equal-width bin :math:`b \in \{0..B-1\}` holds :math:`b/B \le c < (b+1)/B`, the last bin
    closed (``c = 1.0`` is in bin ``B - 1``); the index is ``floor(c B)`` in float64. With
    :math:`n_b` samples, mean accuracy :math:`a_b` and mean confidence :math:`\bar c_b` in
    bin ``b``:

    .. math::

        \mathrm{ECE} = \sum_b \frac{n_b}{N} |a_b - \bar c_b|, \quad
        \mathrm{RMSCE} = \sqrt{\sum_b \frac{n_b}{N} (a_b - \bar c_b)^2}, \quad
        \mathrm{MCE} = \max_{b:\, n_b > 0} |a_b - \bar c_b| .

    Empty bins contribute nothing (MCE skips them). Equal-mass bins sort the confidences
    and start bin ``b`` at the ``floor(b N / B)``-th smallest value; a sample equal to an
    edge goes to the upper bin, so tied confidences always share a bin (some bins may be
    empty when there are ties or fewer than ``B`` samples). Classwise ECE is the mean
    over the K classes (absent classes included) of the ECE of :math:`p_{\cdot k}` against
    :math:`1[y = k]`, each on its own bins; ``cwece_15`` (always reported) is this
    with 15 equal-width bins.

    ``adaece_15``, ``smece`` and ``aurc`` need every sample at once (so
    :class:`StreamingMetrics` does not report them). ``adaece_15`` is the ECE on 15
    equal-mass bins of the sorted confidences, cut with the group sizes of
    ``numpy.array_split`` (the first :math:`N \bmod 15` groups hold
    :math:`\lceil N/15 \rceil` samples, the others :math:`\lfloor N/15 \rfloor`); when a
    cut falls inside a run of tied confidences, each side gets its share of the run's
    correct predictions, so the value does not depend on the order of tied samples
    (unlike ``ece_mass_15``, whose ties share one bin). ``smece`` is the smooth ECE of
    Błasiok & Nakkiran (2023) computed exactly as ``relplot.smECE(c, correct)``: the
    residuals :math:`c_i - 1[\hat y_i = y_i]` and the sample mass are spread linearly
    onto a grid of at least 1001 points, smoothed with a Gaussian kernel of width
    :math:`\sigma` reflected at 0 and 1, and

    .. math::

        \mathrm{smECE}_\sigma = \frac{\sum_t |\hat r_\sigma(t)|\, \hat\delta_\sigma(t)}
            {\sum_t \hat\delta_\sigma(t)}

    over at least 200 evaluation points (:math:`\hat r = ` smoothed residual / smoothed
    density, :math:`\hat\delta` = smoothed density + 1e-4); :math:`\sigma^*` is the
    fixed point :math:`\mathrm{smECE}_\sigma = \sigma`, found by 10 bisection steps on
    ``[0, 1]`` (the smallest tried :math:`\sigma \ge \mathrm{smECE}_\sigma`), and
    ``smece`` :math:`= \mathrm{smECE}_{\sigma^*}`. ``aurc``: with the samples sorted by
    decreasing confidence, the risk at coverage :math:`i/N` is the error rate of the
    :math:`i` most confident ones, and

    .. math::

        \mathrm{AURC} = \frac1N \sum_{i=1}^N \frac1i \sum_{j \le i} 1[\hat y_{(j)}
            \ne y_{(j)}] ,

    with ties broken in expectation (the mean over every order of the tied samples: a run
    of tied confidences contributes its mean error rate at each position).

    Binary tasks use :math:`p = \sigma(z)`, top-label confidence :math:`\max(p, 1 - p)`,
    prediction ``z > 0`` (``p > 0.5`` for ``probs=``; a tie predicts 0), and with the
    margin against the truth :math:`s = (1 - 2y) z`: NLL :math:`\log(1 + e^{s})` and Brier
    :math:`(p - y)^2 = \sigma(s)^2`; classwise ECE uses the two classes ``1 - p`` and ``p``;
    ``adaece_15``, ``smece`` and ``aurc`` use the top-label confidence and correctness.
    The positive-class errors bin :math:`p = P(y = 1)` (column 1 of two-class
    multiclass input) and compare each bin's mean :math:`p` with its fraction of
    positives :math:`\frac{1}{n_b}\sum_{i \in b} y_i`. Top-label and positive-class
    errors differ in general: with ``P(y = 1) = 0.3`` for ten samples (one positive) and
    ``0.7`` for ten (five positive), every top-label confidence is 0.7 and 14 of 20
    predictions are right, so ``ece_10 = 0``, while ``ece_positive_10 = 0.2``.

    With ``probs=``: :math:`\mathrm{nll} = -\frac1N\sum_i \log \max(p_{i y_i}, \epsilon)`
    (no clipping when ``eps`` is None) and Brier as above from the given values.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    >>> labels = torch.tensor([0, 2, 2])
    >>> m = evaluate(logits, labels, n_bins=(10,))
    >>> list(m)
    ['acc', 'nll', 'brier', 'ece_10', 'rmsce_10', 'mce_10', 'cwece_15', 'adaece_15', 'smece', 'aurc']
    >>> round(m["acc"], 4), round(m["nll"], 4), round(m["brier"], 4)
    (0.6667, 0.6286, 0.3594)
    >>> round(m["ece_10"], 4), round(m["mce_10"], 4)
    (0.2932, 0.5761)

    Two classes get the positive-class errors alongside the top-label ones:

    >>> p1 = [0.3] * 10 + [0.7] * 10
    >>> y = [1] + [0] * 9 + [1] * 5 + [0] * 5
    >>> m = evaluate(labels=y, probs=p1, task="binary", n_bins=10)
    >>> round(m["ece_10"], 4), round(m["ece_positive_10"], 4)
    (0.0, 0.2)
    """
    task = check_task(task)
    bins = _check_n_bins(n_bins)
    binning = _check_binning(binning)
    positive_class = _check_positive_class(positive_class, task)
    eps = _check_eps(eps)
    level, n_boot, seed = _check_bootstrap(0.95, n_boot, seed)
    scores, y, is_prob = _check_tensors(logits, labels, probs, task, eps)
    names = _check_task_names(task_names, scores.shape[1]) if task == "multilabel" else None
    mass = binning == "mass"
    cw_bins = bins if classwise and not mass else ()
    if _FIXED_BINS not in cw_bins:
        cw_bins += (_FIXED_BINS,)  # cwece_15 is always reported
    state = _State(
        task=task,
        n_bins=() if mass else bins,
        classwise=bool(classwise),
        num_classes=None,
        num_tasks=None,
        positive=positive_class,
        cw_bins=cw_bins,
    )
    samples = _update(
        state,
        scores,
        y,
        is_prob=is_prob,
        eps=eps,
        return_samples=True,
        return_probs=mass and classwise,
    )
    out = _compute(state, names)
    if mass:
        out.update(_compute_mass(samples, state, bins, names))
    out.update(_sample_metrics(samples, task, names))
    if intervals:
        out.update(_interval_keys(samples, task, names, level=level, n_boot=n_boot, seed=seed))
    if task == "multilabel":  # keep the plain keys before the per-task keys
        out = {k: out[k] for k in sorted(out, key=lambda k: "/" in k)}
    return out


def ece_interval(
    logits: Any = None,
    labels: Any = None,
    *,
    probs: Any = None,
    task: str = "multiclass",
    n_bins: int = 15,
    level: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    r"""Percentile bootstrap interval of the equal-width top-label ECE.

    Parameters
    ----------
    logits, labels, probs, task
        As in :func:`evaluate` (exactly one of ``logits`` and ``probs``).
    n_bins : int
        Number of equal-width bins ``B`` of the ECE (as ``ece_B`` of :func:`evaluate`).
    level : float in (0, 1)
        Coverage of the interval; default 0.95.
    n_boot : int
        Number of bootstrap resamples; default 1000.
    seed : int
        Seed of ``numpy.random.default_rng``: the same data, ``n_boot`` and ``seed`` give
        the same interval.

    Returns
    -------
    tuple of float
        ``(low, high)``, the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles
        (``numpy.quantile``, linear interpolation) of the ECE of the resamples; for
        multilabel, of the mean ECE over tasks.

    Notes
    -----
    Each resample draws :math:`N` samples with replacement (whole rows: the same samples
    for every task). The bins stay those of the full data (fixed edges), so a resample's
    ECE is :math:`rac1N \sum_b ig|\sum_i w_i\, 1[i \in b]\, (1[\hat y_i = y_i] -
    c_i)ig|` with :math:`w_i` the number of times sample :math:`i` is drawn. The
    interval describes the sampling variability of the ECE of this model on data like
    the test set; ECE is biased upwards on finite samples, so the point value may lie
    near or below ``low`` for a well-calibrated model. :func:`evaluate` with
    ``intervals=True`` reports the same interval for ``B = 15`` as ``ece_15_low`` and
    ``ece_15_high``.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> logits = torch.randn(2000, 10, generator=g) * 3
    >>> labels = torch.randint(0, 10, (2000,), generator=g)
    >>> low, high = ece_interval(logits, labels, n_boot=200)
    >>> low < evaluate(logits, labels, n_bins=15)["ece_15"] < high
    True
    >>> (low, high) == ece_interval(logits, labels, n_boot=200)  # seeded
    True
    """
    task = check_task(task)
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer) or n_bins < 1:
        raise ValueError(f"`n_bins` must be a positive integer (e.g. 15), got {n_bins!r}.")
    level, n_boot, seed = _check_bootstrap(level, n_boot, seed)
    scores, y, is_prob = _check_tensors(logits, labels, probs, task)
    state = _State(task=task, n_bins=(), classwise=False, num_classes=None, num_tasks=None)
    with warnings.catch_warnings():  # a zero true-class probability only matters to the NLL
        warnings.filterwarnings("ignore", message=r".*true class probability 0")
        samples = _update(state, scores, y, is_prob=is_prob, return_samples=True)
    boot = _ece_bootstrap(samples["conf"], samples["correct"], int(n_bins), n_boot, seed)
    low, high = np.quantile(boot.mean(1), [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


class StreamingMetrics:
    """Streaming form of :func:`evaluate`: ``update`` batch by batch, then ``compute``.

    The state is O(bins x classes x tasks), independent of the number of samples (each
    ``update`` only needs temporary memory proportional to its own batch); the state
    is a dict of float64 tensors that are all *sums* over samples, so states from several
    processes combine by addition: :meth:`sync` all-reduces them under
    ``torch.distributed``; :meth:`merge` and :meth:`state_dict` do it by hand.
    :meth:`compute` gives :func:`evaluate`'s keys except those that need every sample:
    ``adaece_15``, ``smece``, ``aurc``, the intervals, and ``cwece_15`` unless
    ``classwise=True`` and 15 is among ``n_bins``.

    Parameters
    ----------
    task : {"multiclass", "binary", "multilabel"}
        Kind of problem, as in :func:`evaluate`.
    n_bins : int or sequence of int
        Bin counts, as in :func:`evaluate`.
    task_names : sequence of str, optional
        Names of the multilabel tasks (also fixes T before the first update).
    classwise : bool
        Also accumulate the classwise ECE (``cwece_B``); memory O(bins x classes x tasks).
    binning : {"width"}
        Only equal-width bins can be streamed; ``"mass"`` raises ``ValueError`` because
        equal-mass bins need every confidence at once (use :func:`evaluate`).
    num_classes : int, optional
        K for multiclass; by default taken from the first update. Give it to allocate the
        state up front.
    positive_class : bool, optional
        The positive-class errors, as in :func:`evaluate` (default: for two classes).
    eps : float in (0, 1), optional
        NLL clipping for ``probs=`` updates, as in :func:`evaluate`.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> logits, labels = torch.randn(100, 4, generator=g), torch.randint(0, 4, (100,), generator=g)
    >>> m = StreamingMetrics(n_bins=(10, 15))
    >>> for i in range(0, 100, 32):
    ...     m.update(logits[i : i + 32], labels[i : i + 32])
    >>> m.sync()  # no-op unless torch.distributed is initialised  # doctest: +ELLIPSIS
    <cogcal.metrics.StreamingMetrics object at ...>
    >>> one_shot, streamed = evaluate(logits, labels, n_bins=(10, 15)), m.compute()
    >>> all(abs(streamed[k] - one_shot[k]) < 1e-12 for k in streamed)
    True
    >>> sorted(set(one_shot) - set(streamed))  # these need every sample at once
    ['adaece_15', 'aurc', 'cwece_15', 'smece']
    """

    def __init__(
        self,
        *,
        task: str = "multiclass",
        n_bins: int | Sequence[int] = DEFAULT_N_BINS,
        task_names: Sequence[str] | None = None,
        classwise: bool = False,
        binning: str = "width",
        num_classes: int | None = None,
        positive_class: bool | None = None,
        eps: float | None = None,
    ) -> None:
        task = check_task(task)
        bins = _check_n_bins(n_bins)
        if _check_binning(binning) == "mass":
            raise ValueError(
                "equal-mass binning needs every confidence at once, so it cannot be streamed "
                "in O(bins) memory; use StreamingMetrics(binning='width'), or call "
                "evaluate(logits, labels, binning='mass') on the concatenated outputs."
            )
        num_classes = _check_num_classes(num_classes)
        if num_classes is not None and task != "multiclass":
            raise ValueError("`num_classes` applies to task='multiclass' only.")
        self.eps = _check_eps(eps)
        positive_class = _check_positive_class(positive_class, task)
        n_tasks = None
        self._task_names = None
        if task_names is not None:
            if task != "multilabel":
                raise ValueError("`task_names` applies to task='multilabel' only.")
            self._task_names = _check_task_names(task_names, len(list(task_names)))
            n_tasks = len(self._task_names)
        self._state = _State(
            task=task,
            n_bins=bins,
            classwise=bool(classwise),
            num_classes=num_classes,
            num_tasks=n_tasks,
            positive=positive_class,
        )
        # the local sums while the state holds the global ones (between sync and update)
        self._local: dict[str, torch.Tensor] | None = None
        if self._state.known:
            self._state.positive_  # noqa: B018  (raises early for positive_class=True, K > 2)
            self._state.allocate(torch.device("cpu"))

    def update(self, logits: Any = None, labels: Any = None, *, probs: Any = None) -> None:
        """Add a batch: same inputs and checks as :func:`evaluate` (logits or ``probs=``)."""
        scores, y, is_prob = _check_tensors(logits, labels, probs, self._state.task, self.eps)
        self.unsync()
        if (
            self._state.initialised
            and float(self._state.tensors["n"]) == 0
            and self._state.tensors["n"].device != scores.device
        ):
            self.to(scores.device)  # follow the data until the first samples arrive
        _update(self._state, scores, y, is_prob=is_prob, eps=self.eps)

    def compute(self) -> dict[str, float]:
        """Metrics of every sample seen so far (:func:`evaluate`'s binned keys and values).

        After :meth:`sync`, the samples seen by every process.
        """
        names = self._task_names
        if names is None and self._state.task == "multilabel" and self._state.initialised:
            names = _check_task_names(None, self._state.num_tasks)
        return _compute(self._state, names)

    def sync(self, group: Any = None) -> StreamingMetrics:
        """All-reduce (SUM) the statistics over the processes of ``torch.distributed``.

        A no-op when ``torch.distributed`` is not available or not initialised (or has
        one process). Otherwise it is a collective: **call it on every rank** of
        ``group`` (default: the whole world), after the last :meth:`update`; then
        :meth:`compute` on any rank gives the metrics of the union of every rank's
        samples (equal to :func:`evaluate` on the concatenated data). Ranks that saw no
        data take the shapes from the others. A second call without an update in between
        changes nothing; the next :meth:`update` (or :meth:`unsync`) first restores this
        process's own sums, so the local stream simply continues.

        Parameters
        ----------
        group : ProcessGroup, optional
            The process group (default: the world).

        Returns
        -------
        StreamingMetrics
            ``self``.
        """
        if not (dist.is_available() and dist.is_initialized()):
            return self
        if self._local is not None or dist.get_world_size(group) == 1:
            return self
        st = self._state
        dev = _comm_device(dist, group, st)
        # 1) agree on the settings and shapes (every rank takes the same decision)
        dim = st.num_classes if st.task == "multiclass" else st.num_tasks
        fp = float(st.fingerprint())
        big = float(2**40)
        have = float(dim) if st.initialised else 0.0
        desc = torch.tensor(
            [fp, -fp, have, -have if st.initialised else -big], dtype=torch.float64, device=dev
        )
        dist.all_reduce(desc, op=dist.ReduceOp.MAX, group=group)
        fp_max, fp_min, dim_max, dim_min = (float(desc[0]), -float(desc[1]), float(desc[2]),
                                            -float(desc[3]))  # fmt: skip
        if fp_max != fp_min:
            raise ValueError(
                "StreamingMetrics.sync(): the processes were built with different settings "
                "(task, n_bins, classwise, positive_class); build them identically."
            )
        if dim_max == 0:
            return self  # no process has seen any data
        if dim_min != dim_max:
            what = "classes" if st.task == "multiclass" else "tasks"
            raise ValueError(
                f"StreamingMetrics.sync(): the processes saw different numbers of {what} "
                f"({int(dim_min)} to {int(dim_max)}); every process must use the same model."
            )
        if not st.initialised:
            if st.task == "multiclass":
                st.num_classes = int(dim_max)
            else:
                st.num_tasks = int(dim_max)
            st.allocate(dev)
        # 2) one flat all-reduce of every sum
        self._local = {k: v.clone() for k, v in st.tensors.items()}
        keys = list(st.tensors)
        flat = torch.cat([st.tensors[k].reshape(-1).to(dev) for k in keys])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        out, at = {}, 0
        for k in keys:
            v = st.tensors[k]
            out[k] = flat[at : at + v.numel()].view(v.shape).to(v.device)
            at += v.numel()
        st.tensors = out
        return self

    def unsync(self) -> StreamingMetrics:
        """Undo :meth:`sync`: restore this process's own sums (no-op if not synced)."""
        if self._local is not None:
            self._state.tensors = self._local
            self._local = None
        return self

    def merge(self, other: StreamingMetrics) -> StreamingMetrics:
        """Add the statistics of ``other`` (e.g. from another process) into ``self``."""
        if not isinstance(other, StreamingMetrics):
            raise ValueError(f"can only merge a StreamingMetrics, got {type(other).__name__}.")
        self._local = None
        a, b = self._state, other._state
        if not b.initialised:
            return self
        if not a.initialised:
            a.num_classes, a.num_tasks = b.num_classes, b.num_tasks
        if a.config() != b.config():
            raise ValueError(
                f"cannot merge metric states with different settings: {a.config()} vs "
                f"{b.config()} (task, n_bins, classwise, positive_class, classes, tasks)."
            )
        if not a.initialised:
            a.tensors = {k: v.clone() for k, v in b.tensors.items()}
            return self
        for key, v in b.tensors.items():
            a.tensors[key] += v.to(a.tensors[key].device)
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state as plain float64 tensors (all sums: reduce across processes with SUM).

        The tensors are the live state (not copies), so an in-place all-reduce on them
        updates this metric; clone them to keep a snapshot.
        """
        return dict(self._state.tensors)

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Restore a state saved by :meth:`state_dict` with the same settings."""
        st = self._state
        self._local = None
        if not state_dict:
            st.tensors = {}
            return
        if st.task == "multiclass" and st.num_classes is None:
            with_k = [k for k in state_dict if k.startswith("cw_count_")]
            if with_k:
                st.num_classes = int(state_dict[with_k[0]].shape[1])
            elif st.positive is True or any(k.startswith("pos_count_") for k in state_dict):
                st.num_classes = 2  # positive-class sums exist for two classes only
        if st.task == "multilabel" and st.num_tasks is None and "correct" in state_dict:
            st.num_tasks = int(state_dict["correct"].shape[0])
        expected = st.shapes()
        bad = set(state_dict) ^ set(expected)
        if bad:
            raise ValueError(
                f"state_dict does not match this metric's settings: unexpected or missing keys "
                f"{sorted(bad)[:6]}; build StreamingMetrics with the same task / n_bins / "
                "classwise / positive_class as the one that saved it."
            )
        for key, shape in expected.items():
            if tuple(state_dict[key].shape) != shape:
                raise ValueError(
                    f"state_dict[{key!r}] has shape {tuple(state_dict[key].shape)}, expected "
                    f"{shape}; it was saved with other classes / tasks / bins."
                )
        st.tensors = {
            k: torch.as_tensor(v).detach().clone().to(torch.float64) for k, v in state_dict.items()
        }

    def reset(self) -> None:
        """Forget every sample (keeps the settings and the device)."""
        self._local = None
        for v in self._state.tensors.values():
            v.zero_()

    def to(self, device: str | torch.device) -> StreamingMetrics:
        """Move the state tensors to ``device`` (they start where the first batch lives)."""
        self._state.tensors = {k: v.to(device) for k, v in self._state.tensors.items()}
        if self._local is not None:
            self._local = {k: v.to(device) for k, v in self._local.items()}
        return self


def _comm_device(dist: Any, group: Any, state: _State) -> torch.device:
    """Where the all-reduce runs, decided from the backend alone (the same on every rank).

    CPU when the backend includes gloo (also ``"cpu:gloo,cuda:nccl"``), the current CUDA
    device for NCCL alone; for other backends, where the state lives.
    """
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend:
        return torch.device("cpu")
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return state.tensors["n"].device if state.initialised else torch.device("cpu")


def reliability_bins(
    logits: Any = None,
    labels: Any = None,
    *,
    n_bins: int = 15,
    task: str = "multiclass",
    probs: Any = None,
) -> dict[str, np.ndarray]:
    """Per-bin counts, mean confidence and accuracy of equal-width bins (reliability diagram).

    Parameters
    ----------
    logits, labels, task, probs
        As in :func:`evaluate` (exactly one of ``logits`` and ``probs``).
    n_bins : int
        Number of equal-width bins ``B`` (last bin closed, as in :func:`evaluate`).

    Returns
    -------
    dict of str to ndarray
        ``count`` (samples per bin), ``confidence`` (mean top-label confidence, NaN where
        empty), ``accuracy`` (fraction correct, NaN where empty), each of shape (B,) --
        (T, B) for multilabel -- and ``edges`` of shape (B + 1,).
        Then ``ece = nansum(count * |accuracy - confidence|) / count.sum()``.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[3.0, 0.0], [0.0, 0.1]])  # confidences 0.95 and 0.52
    >>> b = reliability_bins(logits, torch.tensor([0, 0]), n_bins=4)
    >>> b["count"].tolist(), b["accuracy"].tolist()
    ([0.0, 0.0, 1.0, 1.0], [nan, nan, 0.0, 1.0])
    >>> b["edges"].tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    task = check_task(task)
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer) or n_bins < 1:
        raise ValueError(f"`n_bins` must be a positive integer, got {n_bins!r}.")
    b = int(n_bins)
    scores, y, is_prob = _check_tensors(logits, labels, probs, task)
    state = _State(task=task, n_bins=(b,), classwise=False, num_classes=None, num_tasks=None)
    with warnings.catch_warnings():  # a zero true-class probability only matters to the NLL
        warnings.filterwarnings("ignore", message=r".*true class probability 0")
        _update(state, scores, y, is_prob=is_prob)
    s = {k: v.cpu().numpy() for k, v in state.tensors.items()}
    count = s[f"count_{b}"]
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.where(count > 0, s[f"conf_{b}"] / count, np.nan)
        acc = np.where(count > 0, s[f"acc_{b}"] / count, np.nan)
    out = {"count": count, "confidence": conf, "accuracy": acc}
    if task != "multilabel":
        out = {k: v[0] for k, v in out.items()}
    out["edges"] = np.arange(b + 1, dtype=np.float64) / b
    return out


# --------------------------------------------------------------------------------------
# torchmetrics adapter (torchmetrics is imported here only, on first use)
# --------------------------------------------------------------------------------------

_TORCHMETRIC_CLASS: type | None = None


def _torchmetric_class() -> type:
    """Build (once) the ``torchmetrics.Metric`` subclass ``CalibrationMetric``."""
    global _TORCHMETRIC_CLASS
    if _TORCHMETRIC_CLASS is not None:
        return _TORCHMETRIC_CLASS
    try:
        import torchmetrics
    except ImportError as err:  # an optional dependency
        raise ImportError(
            "cogcal.metrics.CalibrationMetric / as_torchmetric need torchmetrics: "
            "pip install torchmetrics (or use StreamingMetrics, which needs nothing more)."
        ) from err

    class CalibrationMetric(torchmetrics.Metric):
        """:func:`evaluate` as a ``torchmetrics.Metric`` (sum states, DDP-ready).

        Every state is a float64 sum with ``dist_reduce_fx="sum"``, so torchmetrics'
        own synchronisation (on ``compute``, or ``sync_dist`` in Lightning) gives the
        metrics of every process's samples. The state shapes are fixed at construction:
        ``num_classes`` is required for multiclass, ``task_names`` or ``num_tasks`` for
        multilabel. ``compute()`` returns a dict of 0-d float64 tensors with the keys of
        :func:`evaluate`.

        Parameters
        ----------
        task, n_bins, classwise, positive_class, eps, task_names
            As in :func:`evaluate` (width bins only).
        num_classes : int
            K, required for ``task="multiclass"``.
        num_tasks : int
            T for ``task="multilabel"`` (or give ``task_names``).
        input_type : {"logits", "probs"}
            What ``update(preds, target)`` receives.
        **kwargs
            Passed to ``torchmetrics.Metric`` (e.g. ``sync_on_compute``).
        """

        is_differentiable = False
        higher_is_better = None
        full_state_update = False

        def __init__(
            self,
            *,
            task: str = "multiclass",
            num_classes: int | None = None,
            num_tasks: int | None = None,
            task_names: Sequence[str] | None = None,
            n_bins: int | Sequence[int] = DEFAULT_N_BINS,
            classwise: bool = False,
            positive_class: bool | None = None,
            input_type: str = "logits",
            eps: float | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(**kwargs)
            task = check_task(task)
            bins = _check_n_bins(n_bins)
            if input_type not in ("logits", "probs"):
                raise ValueError(f"`input_type` must be 'logits' or 'probs', got {input_type!r}.")
            eps = _check_eps(eps)
            if eps is not None and input_type != "probs":
                raise ValueError("`eps` applies to input_type='probs' only.")
            num_classes = _check_num_classes(num_classes)
            if task == "multiclass" and num_classes is None:
                raise ValueError(
                    "`num_classes` is required for task='multiclass': torchmetrics states "
                    "need fixed shapes (e.g. as_torchmetric(task='multiclass', num_classes=10))."
                )
            if task != "multiclass" and num_classes is not None:
                raise ValueError("`num_classes` applies to task='multiclass' only.")
            names = None
            if task == "multilabel":
                if task_names is None and num_tasks is None:
                    raise ValueError(
                        "task='multilabel' needs `task_names` or `num_tasks`: torchmetrics "
                        "states need fixed shapes."
                    )
                if num_tasks is not None and (
                    isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1
                ):
                    raise ValueError(f"`num_tasks` must be a positive integer, got {num_tasks!r}.")
                t = len(list(task_names)) if task_names is not None else num_tasks
                if num_tasks is not None and t != num_tasks:
                    raise ValueError(f"`task_names` has {t} names but `num_tasks` is {num_tasks}.")
                names = _check_task_names(task_names, t)
                num_tasks = t
            elif task_names is not None or num_tasks is not None:
                raise ValueError("`task_names` / `num_tasks` apply to task='multilabel' only.")
            self.task = task
            self.input_type = input_type
            self.eps = eps
            self._names = names
            self._cc = _State(
                task=task,
                n_bins=bins,
                classwise=bool(classwise),
                num_classes=num_classes,
                num_tasks=num_tasks,
                positive=_check_positive_class(positive_class, task),
            )
            self._cc.allocate(torch.device("cpu"))
            self._cc_keys = list(self._cc.tensors)
            for key, value in self._cc.tensors.items():
                self.add_state(f"stat_{key}", default=value, dist_reduce_fx="sum")

        def _bind(self) -> _State:
            # torchmetrics replaces the state tensors on reset / to / sync: look them up
            self._cc.tensors = {k: getattr(self, f"stat_{k}") for k in self._cc_keys}
            return self._cc

        def update(self, preds: Any, target: Any) -> None:
            """Add a batch of logits (or probabilities, see ``input_type``) and labels."""
            logits, probs = (preds, None) if self.input_type == "logits" else (None, preds)
            scores, y, is_prob = _check_tensors(logits, target, probs, self.task, self.eps)
            _update(self._bind(), scores, y, is_prob=is_prob, eps=self.eps)

        def compute(self) -> dict[str, torch.Tensor]:
            """The metrics of :func:`evaluate`, as 0-d float64 tensors."""
            out = _compute(self._bind(), self._names)
            return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}

    CalibrationMetric.__module__ = __name__  # picklable as cogcal.metrics.CalibrationMetric
    CalibrationMetric.__qualname__ = "CalibrationMetric"
    _TORCHMETRIC_CLASS = CalibrationMetric
    return CalibrationMetric


def as_torchmetric(**kwargs: Any) -> Any:
    """A ``torchmetrics.Metric`` computing :func:`evaluate`'s metrics (needs torchmetrics).

    The class is ``cogcal.metrics.CalibrationMetric`` (built on first access; torchmetrics
    is only imported then). Its states are float64 sums reduced with ``"sum"``, so it
    works under DDP with torchmetrics' own synchronisation, in a ``MetricCollection``
    and with Lightning's ``self.log_dict``.

    Parameters
    ----------
    **kwargs
        ``task``, ``num_classes`` (required for multiclass), ``num_tasks`` or
        ``task_names`` (multilabel), ``n_bins``, ``classwise``, ``positive_class``,
        ``input_type`` ("logits" or "probs"), ``eps``, and ``torchmetrics.Metric``
        options such as ``sync_on_compute``.

    Returns
    -------
    CalibrationMetric
        A fresh metric; ``update(preds, target)``, ``compute()`` (a dict of 0-d tensors),
        ``reset()``, ``forward``.

    Examples
    --------
    >>> import torch
    >>> m = as_torchmetric(task="multiclass", num_classes=3, n_bins=10)
    >>> m.update(torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), torch.tensor([0, 2]))
    >>> out = m.compute()
    >>> sorted(out), float(out["acc"])
    (['acc', 'brier', 'ece_10', 'mce_10', 'nll', 'rmsce_10'], 0.5)
    """
    return _torchmetric_class()(**kwargs)


def __getattr__(name: str) -> Any:
    if name == "CalibrationMetric":
        return _torchmetric_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------
# OOD detection
# --------------------------------------------------------------------------------------


def _check_ood_task(task: str) -> str:
    if task not in ("multiclass", "binary"):
        raise ValueError(
            f"`task` must be 'multiclass' or 'binary' for OOD detection, got {task!r}; for "
            "multi-label outputs evaluate each task with task='binary'."
        )
    return task


def _check_score(score: str) -> str:
    if score not in _OOD_SCORES:
        raise ValueError(
            f"`score` must be one of {', '.join(map(repr, _OOD_SCORES))}, got {score!r}."
        )
    return score


def _ood_input(
    logits: Any, probs: Any, names: tuple[str, str], task: str, score: str
) -> tuple[torch.Tensor, bool]:
    """(N, K) logits or probabilities of one side of an OOD comparison, and ``is_prob``.

    A binary logit ``z`` is the 2-class problem with logits ``(0, z)``; a binary
    probability ``p`` the probabilities ``(1 - p, p)``.
    """
    lname, pname = names
    if (logits is None) == (probs is None):
        raise ValueError(
            f"pass exactly one of `{lname}` and `{pname}`: got "
            + ("both" if logits is not None else "neither")
            + "; probabilities are never guessed from the values."
        )
    is_prob = probs is not None
    name = pname if is_prob else lname
    x = probs if is_prob else logits
    if is_prob and score in _LOGIT_SCORES:
        what = "log-sum-exp" if score == "energy" else "maximum"
        raise ValueError(
            f"score={score!r} (the {what} of the logits) needs logits: pass "
            f"`{lname}` instead of `{pname}`, or use score='msp' / 'entropy'."
        )
    if task == "multiclass":
        z = multiclass_scores(x, name, "multiclass OOD scores")
    else:
        z = binary_scores(x, name)
    if is_prob:
        _check_probs(z if z.ndim == 2 else z[:, None], name, rows=z.ndim == 2)
    elif z.ndim == 2:
        _warn_if_probabilities(z, name, pname, rows=True)
    if z.ndim == 1:
        z = z.double()
        z = torch.stack([1.0 - z, z], 1) if is_prob else torch.stack([torch.zeros_like(z), z], 1)
    return z, is_prob


def _score(z: torch.Tensor, score: str, is_prob: bool) -> torch.Tensor:
    """Per-sample float64 score of (N, K) logits or probabilities."""
    if is_prob:
        p = z.double()
        return p.amax(1) if score == "msp" else torch.xlogy(p, p).sum(1)
    if score == "msp":
        return torch.log_softmax(z, dim=1, dtype=torch.float64).amax(1).exp()
    if score == "energy":
        return torch.logsumexp(z.double(), dim=1)
    if score == "maxlogit":
        return z.double().amax(1)
    logp = torch.log_softmax(z, dim=1, dtype=torch.float64)
    return (logp.exp() * logp).sum(1)


def ood_scores(
    logits: Any = None, *, score: str = "msp", task: str = "multiclass", probs: Any = None
) -> torch.Tensor:
    r"""Per-sample OOD scores, higher meaning more in-distribution.

    Parameters
    ----------
    logits : array-like, shape (N, K), or (N,) / (N, 1) for ``task="binary"``
        Logits (a binary logit ``z`` is treated as the 2-class logits ``(0, z)``).
    score : {"msp", "energy", "entropy", "maxlogit"}
        ``msp``: maximum softmax probability :math:`\max_k p_k`; ``energy``: the negative
        free energy :math:`\log\sum_k e^{z_k}` (temperature 1, logits only);
        ``entropy``: the negative entropy :math:`\sum_k p_k \log p_k` (with
        :math:`0 \log 0 = 0`); ``maxlogit``: the maximum logit :math:`\max_k z_k`
        (logits only; a binary logit ``z`` gives :math:`\max(0, z)`).
    task : {"multiclass", "binary"}
        Kind of problem.
    probs : array-like, optional
        Probabilities instead of logits ((N, K) rows summing to 1, or ``P(y = 1)`` of
        shape (N,) for binary); ``msp`` and ``entropy`` only.

    Returns
    -------
    Tensor, shape (N,)
        float64 scores (computed in float64 whatever the input dtype).

    Examples
    --------
    >>> import torch
    >>> ood_scores(torch.tensor([[0.0, 0.0], [4.0, 0.0]]), score="msp").tolist()
    [0.5, 0.9820137900379085]
    """
    score = _check_score(score)
    task = _check_ood_task(task)
    z, is_prob = _ood_input(logits, probs, ("logits", "probs"), task, score)
    return _score(z, score, is_prob)


def _auroc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """P(pos > neg) + P(pos = neg) / 2 (Mann-Whitney; ties count one half), exactly."""
    srt = neg.sort().values
    below = torch.searchsorted(srt, pos, right=False)  # negatives strictly below each positive
    at_or_below = torch.searchsorted(srt, pos, right=True)
    twice = 2 * int(below.sum()) + int((at_or_below - below).sum())
    return twice / (2.0 * pos.numel() * neg.numel())


def _fpr_at_tpr95(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Fraction of negatives scored >= the largest t keeping >= 95% of positives."""
    n = pos.numel()
    k = (95 * n + 99) // 100  # ceil(0.95 n), in integers
    t = pos.sort(descending=True).values[k - 1]
    return float((neg >= t).double().mean())


def ood(
    id_logits: Any = None,
    ood_logits: Any = None,
    *,
    score: str = "msp",
    task: str = "multiclass",
    id_probs: Any = None,
    ood_probs: Any = None,
) -> dict[str, float]:
    r"""OOD detection quality of a score: AUROC and FPR at 95% TPR (ID = positive class).

    Parameters
    ----------
    id_logits : array-like, shape (N, K)
        Logits on in-distribution data (the positive class).
    ood_logits : array-like, shape (M, K)
        Logits on out-of-distribution data (the negative class); same K.
    score : {"msp", "energy", "entropy", "maxlogit"}
        The score, higher = more in-distribution (see :func:`ood_scores`); default
        ``"msp"`` (docs/method.md §3).
    task : {"multiclass", "binary"}
        Kind of problem (binary: logits of shape (N,) or (N, 1)).
    id_probs, ood_probs : array-like, optional
        Probabilities instead of logits, side by side: for each side pass exactly one of
        the logits and the probabilities. ``msp`` and ``entropy`` only (``energy`` and
        ``maxlogit`` need logits).

    Returns
    -------
    dict of str to float
        ``auroc`` and ``fpr95``.

    Notes
    -----
    With ID scores :math:`s_i` (``i = 1..N``) and OOD scores :math:`u_j` (``j = 1..M``),
    computed in float64:

    .. math::

        \mathrm{AUROC} = \frac{1}{NM} \sum_{i,j} \Big(1[s_i > u_j]
            + \tfrac12 1[s_i = u_j]\Big),

    the Mann-Whitney statistic with ties counted one half (equal to scikit-learn's
    ``roc_auc_score``). The threshold :math:`t` is the largest value such that at least
    95% of the ID scores are :math:`\ge t`, i.e. the :math:`\lceil 0.95 N\rceil`-th largest
    ID score, and

    .. math::

        \mathrm{FPR95} = \frac1M \sum_j 1[u_j \ge t] ,

    so OOD samples tied with the threshold count as false positives (and the achieved
    TPR may exceed 0.95 when ID scores tie at :math:`t`).

    Examples
    --------
    >>> import torch
    >>> id_logits = torch.tensor([[5.0, 0.0], [3.0, 0.0], [0.0, 4.0]])
    >>> ood_logits = torch.tensor([[0.5, 0.0], [0.0, 3.0]])
    >>> ood(id_logits, ood_logits)
    {'auroc': 0.9166666666666666, 'fpr95': 0.5}
    >>> ood(id_logits, ood_logits, score="maxlogit")  # scores 5, 3, 4 against 0.5, 3
    {'auroc': 0.9166666666666666, 'fpr95': 0.5}
    """
    score = _check_score(score)
    task = _check_ood_task(task)
    zi, pi = _ood_input(id_logits, id_probs, ("id_logits", "id_probs"), task, score)
    zo, po = _ood_input(ood_logits, ood_probs, ("ood_logits", "ood_probs"), task, score)
    if zi.shape[1] != zo.shape[1]:
        a, b = ("id_probs" if pi else "id_logits"), ("ood_probs" if po else "ood_logits")
        raise ValueError(
            f"`{a}` has {zi.shape[1]} classes but `{b}` has {zo.shape[1]}; both must be "
            "outputs of the same model."
        )
    si = _score(zi, score, pi).cpu()
    so = _score(zo, score, po).cpu()
    return {"auroc": _auroc(si, so), "fpr95": _fpr_at_tpr95(si, so)}
