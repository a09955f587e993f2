"""Evaluation metrics: accuracy, NLL, Brier, binned calibration errors, OOD detection.

The definitions follow SPEC §3 and are part of the API:

* ``acc`` -- fraction of samples whose arg-max class equals the label;
* ``nll`` -- mean of ``-log p_y``, computed from the logits with ``log-sum-exp``;
* ``brier`` -- mean over samples of ``sum_k (p_k - 1[y = k])**2`` (a *sum* over classes,
  not divided by ``K``); for a binary task ``(p - y)**2`` with ``p = sigmoid(z)``;
* ``ece_B``, ``rmsce_B``, ``mce_B`` -- calibration errors of the top-label confidence
  ``c = max_k p_k`` on ``B`` equal-width bins ``[b/B, (b+1)/B)``, the last bin closed
  so that ``c = 1.0`` lands in bin ``B - 1``.

Every public function validates its input and raises ``ValueError`` naming what was wrong.
Everything is computed in float32 chunks (float64 when the input is float64) and
accumulated in float64, so float16/bfloat16 input is safe and memory stays bounded.

The one-shot :func:`evaluate` and the streaming :class:`StreamingMetrics` share the same
private stages: argument checks, tensor checks, ``_update`` (sufficient statistics per
bin, O(bins x classes x tasks) memory, independent of the number of samples) and
``_compute`` (metrics from those statistics).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from cogcal._checks import (
    as_float_tensor,
    check_binary,
    check_multiclass,
    check_multilabel,
    check_task,
)

__all__ = [
    "DEFAULT_N_BINS",
    "StreamingMetrics",
    "evaluate",
    "ood",
    "ood_scores",
    "reliability_bins",
]

#: The default sweep of bin counts (SPEC §3).
DEFAULT_N_BINS: tuple[int, ...] = (5, 10, 15, 20, 50, 100)

_BINNINGS = ("width", "mass")
_OOD_SCORES = ("msp", "energy", "entropy")
#: Scores processed at once (rows x columns): small enough to stay in cache between the
#: few passes over a chunk, large enough to amortise the per-call overhead.
_CHUNK_ELEMS = 1 << 21
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


# --------------------------------------------------------------------------------------
# tensor checks
# --------------------------------------------------------------------------------------


def _prob_tolerance(dtype: torch.dtype) -> float:
    return max(1e-4, 4.0 * torch.finfo(dtype).eps)


def _check_prob_range(p: torch.Tensor) -> None:
    lo, hi = (float(v) for v in torch.aminmax(p))
    if lo < 0.0 or hi > 1.0:
        raise ValueError(
            f"`probs` must lie in [0, 1], got values in [{lo:.4g}, {hi:.4g}]; "
            "if these are logits, pass them as `logits` instead of `probs=`."
        )


def _check_tensors(
    logits: Any, labels: Any, probs: Any, task: str
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate the inputs; return ``(scores, labels, is_prob)``.

    ``scores`` is (N, K) for multiclass and (N, T) for binary (T = 1) / multilabel.
    """
    if (logits is None) == (probs is None):
        raise ValueError(
            "pass exactly one of `logits` and `probs=`: got "
            + ("both" if logits is not None else "neither")
            + "; probabilities are never guessed from the values, use `probs=` explicitly."
        )
    is_prob = probs is not None
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
        _check_prob_range(z)
        if task == "multiclass":
            dev = (z.sum(1, dtype=torch.float64) - 1.0).abs()
            tol = _prob_tolerance(z.dtype)
            if float(dev.max()) > tol:
                i = int(dev.argmax())
                raise ValueError(
                    f"`probs` rows must sum to 1 (tolerance {tol:.1e}), but row {i} sums to "
                    f"{float(z[i].sum(dtype=torch.float64)):.6g} ({int((dev > tol).sum())} bad row(s)); "
                    "pass normalised probabilities, or pass logits as `logits`."
                )
    return z, y, is_prob


# --------------------------------------------------------------------------------------
# per-sample statistics
# --------------------------------------------------------------------------------------


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _multiclass_chunk(
    z: torch.Tensor, y: torch.Tensor, is_prob: bool, want_probs: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Per-sample raw statistics of one chunk of (n, K) scores, and its (n, 1, K) probs.

    Only the operations on the (n, K) chunk happen here (one fused softmax, a max, a norm
    and gathers); the element-wise arithmetic on the per-sample vectors is left to
    :func:`_multiclass_final`, which runs once on the whole batch.
    """
    z = z.to(_work_dtype(z))
    if is_prob:
        p = z
        conf, pred = p.max(1)
        p_y = p.gather(1, y[:, None])[:, 0].double()
        raw = {
            "conf": conf,
            "correct": pred == y,
            "nll": -torch.log(p_y),
            "brier": (p.double().square().sum(1)) - 2.0 * p_y + 1.0,
        }
    else:
        p = torch.softmax(z, dim=1)
        conf, pred = p.max(1)
        raw = {
            "conf": conf,
            "correct": pred == y,
            "z_pred_y": z.gather(1, torch.stack([pred, y], dim=1)),
            "p_y": p.gather(1, y[:, None])[:, 0],
            "norm": torch.linalg.vector_norm(p, dim=1),
        }
    return raw, (p[:, None, :] if want_probs else None)


def _multiclass_final(raw: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(conf, correct, nll, brier), each of shape (n, 1), from the raw statistics."""
    if "nll" not in raw:
        zz = raw["z_pred_y"].double()
        # log-sum-exp = z_j - log p_j for the arg-max j, so -log p_y = z_j - z_y - log p_j
        raw["nll"] = zz[:, 0] - zz[:, 1] - torch.log(raw["conf"].double())
        # sum_k (p_k - 1[k = y])^2 = sum_k p_k^2 - 2 p_y + 1
        raw["brier"] = raw["norm"].double().square() - 2.0 * raw["p_y"].double() + 1.0
    return tuple(raw[k][:, None] for k in ("conf", "correct", "nll", "brier"))


def _binary_chunk(
    z: torch.Tensor, y: torch.Tensor, is_prob: bool, want_probs: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Per-sample, per-task (conf, correct, nll, brier) of (n, T) binary scores, and the
    (n, T, 2) class probabilities ``(1 - p, p)``."""
    z = z.to(_work_dtype(z))
    yf = y.to(z.dtype)
    if is_prob:
        p = z
        conf = torch.maximum(p, 1.0 - p)
        pred = p > 0.5
        pd = p.double()
        nll = torch.where(y == 1, -torch.log(pd), -torch.log1p(-pd))
    else:
        p = torch.sigmoid(z)
        conf = torch.sigmoid(z.abs())
        pred = z > 0
        zd = z.double()
        # log(1 + e^z) - y z, written without overflow or cancellation
        nll = zd.clamp(min=0) + torch.log1p(torch.exp(-zd.abs())) - y.double() * zd
    raw = {
        "conf": conf,
        "correct": pred == (y == 1),
        "nll": nll,
        "brier": (p.double() - yf.double()).square(),
    }
    return raw, (torch.stack([1.0 - p, p], dim=-1) if want_probs else None)


def _binary_final(raw: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return tuple(raw[k] for k in ("conf", "correct", "nll", "brier"))


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

    The product is taken in float64, which is exact for a float32 ``c`` and ``B < 2**29``:
    a confidence lands in bin ``b`` exactly when ``b/B <= c < (b+1)/B`` as real numbers.
    """
    return torch.floor(c.double() * n_bins).long().clamp_(0, n_bins - 1)


def _hist(idx: torch.Tensor, weights: torch.Tensor | None, size: int) -> torch.Tensor:
    w = None if weights is None else weights.reshape(-1).double()
    return torch.bincount(idx.reshape(-1), weights=w, minlength=size).double()


class _State:
    """Sufficient statistics of a stream of predictions (every tensor is a sum over samples)."""

    def __init__(
        self,
        *,
        task: str,
        n_bins: tuple[int, ...],
        classwise: bool,
        num_classes: int | None,
        num_tasks: int | None,
    ) -> None:
        self.task = task
        self.n_bins = n_bins
        self.classwise = classwise
        # multiclass: one "task" with K classes; binary / multilabel: T tasks with 2 classes.
        self.num_classes = 2 if task != "multiclass" else num_classes
        self.num_tasks = 1 if task != "multilabel" else num_tasks
        self.tensors: dict[str, torch.Tensor] = {}

    @property
    def initialised(self) -> bool:
        return bool(self.tensors)

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
            if self.classwise:
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
        return (self.task, self.n_bins, self.classwise, self.num_classes, self.num_tasks)


def _binned_sums(
    conf: torch.Tensor, correct: torch.Tensor, n_bins: tuple[int, ...]
) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per-bin (count, sum of confidence, sum of correct) of (n, T) values, for every B.

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
        hs = [_hist(idx, w, t * fine).view(t, fine) for w in (None, cd, correct)]
        for b in n_bins:
            out[b] = tuple(h.view(t, b, fine // b).sum(-1) for h in hs)
    else:
        for b in n_bins:
            idx = _width_bin(cd, b) + offs * b
            out[b] = tuple(_hist(idx, w, t * b).view(t, b) for w in (None, cd, correct))
    return out


def _classwise_sums(
    probs: torch.Tensor, y: torch.Tensor, n_bins: tuple[int, ...], task: str
) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per-(task, class, bin) (count, sum p_k, sum 1[y = k]) of (n, T, K) probabilities."""
    n, t, k = probs.shape
    if task == "multiclass":
        onehot = torch.zeros((n, 1, k), dtype=torch.float64, device=probs.device)
        onehot.scatter_(2, y.reshape(n, 1, 1), 1.0)
    else:
        y1 = y.double()
        onehot = torch.stack([1.0 - y1, y1], dim=-1)
    pd = probs.double()
    offs = torch.arange(t * k, device=probs.device).view(1, t, k)
    out = {}
    for b in n_bins:
        idx = _width_bin(pd, b) + offs * b
        out[b] = tuple(_hist(idx, w, t * k * b).view(t, k, b) for w in (None, pd, onehot))
    return out


def _update(
    state: _State,
    scores: torch.Tensor,
    labels: torch.Tensor,
    *,
    is_prob: bool,
    return_samples: bool = False,
    return_probs: bool = False,
) -> dict[str, torch.Tensor] | None:
    """Add validated ``scores`` / ``labels`` to ``state``, chunk by chunk.

    With ``return_samples``, return this batch's per-sample ``conf`` and ``correct``
    (plus ``probs`` and ``y`` with ``return_probs``), for the one-shot equal-mass binning.
    """
    if state.task == "multiclass":
        k = scores.shape[1]
        if state.num_classes is None:
            state.num_classes = k
        elif k != state.num_classes:
            raise ValueError(
                f"`logits` has {k} classes but this metric state was built for "
                f"{state.num_classes}; every update must use the same number of classes."
            )
    else:
        t = scores.shape[1]
        if state.num_tasks is None:
            state.num_tasks = t
        elif t != state.num_tasks:
            raise ValueError(
                f"`logits` has {t} task column(s) but this metric state was built for "
                f"{state.num_tasks}; every update must use the same tasks."
            )
    if not state.initialised:
        state.allocate(scores.device)
    s = state.tensors
    dev = s["n"].device
    want_probs = state.classwise or return_probs
    if state.task == "multiclass":
        chunk_fn, final_fn = _multiclass_chunk, _multiclass_final
    else:
        chunk_fn, final_fn = _binary_chunk, _binary_final
    with torch.no_grad():
        # chunks bound the (rows x K) temporaries; the per-sample vectors of this batch
        # are concatenated and reduced / binned once, with few large operations
        rows = max(1, _CHUNK_ELEMS // max(1, scores.shape[1]))
        parts: list[dict[str, torch.Tensor]] = []
        prob_parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        for start in range(0, scores.shape[0], rows):
            z = scores[start : start + rows].to(dev)
            y = labels[start : start + rows].to(dev)
            raw, probs = chunk_fn(z, y, is_prob, want_probs)
            parts.append(raw)
            if state.classwise and state.n_bins:
                for b, (cnt, psum, ysum) in _classwise_sums(
                    probs, y, state.n_bins, state.task
                ).items():
                    s[f"cw_count_{b}"] += cnt
                    s[f"cw_prob_{b}"] += psum
                    s[f"cw_label_{b}"] += ysum
            if return_probs:
                prob_parts.append((probs.double(), y))
        if len(parts) == 1:
            raw = parts[0]
        else:
            raw = {k: torch.cat([part[k] for part in parts]) for k in parts[0]}
        conf, correct, nll, brier = final_fn(raw)
        s["n"] += conf.shape[0]
        s["correct"] += correct.sum(0)
        s["nll"] += nll.sum(0)
        s["brier"] += brier.sum(0)
        if state.n_bins:
            for b, (cnt, csum, asum) in _binned_sums(conf, correct, state.n_bins).items():
                s[f"count_{b}"] += cnt
                s[f"conf_{b}"] += csum
                s[f"acc_{b}"] += asum
        if not return_samples:
            return None
        out = {"conf": conf.double(), "correct": correct}
        if return_probs:
            out["probs"] = torch.cat([p for p, _ in prob_parts])
            out["y"] = torch.cat([y for _, y in prob_parts])
        return out


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
    errs = {b: _errors(s[f"count_{b}"], s[f"conf_{b}"], s[f"acc_{b}"], n) for b in state.n_bins}
    for i, name in enumerate(("ece", "rmsce", "mce")):
        for b in state.n_bins:
            per[f"{name}_{b}"] = errs[b][i]
    if state.classwise:
        for b in state.n_bins:
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
    conf = samples["conf"].cpu()
    correct = samples["correct"].cpu().double()
    n, t = conf.shape
    offs = torch.arange(t)[None, :]
    per: dict[str, torch.Tensor] = {}
    errs = {}
    for b in n_bins:
        idx = _mass_bin(conf, b) + offs * b
        sums = [_hist(idx, w, t * b).view(t, b) for w in (None, conf, correct)]
        errs[b] = _errors(*sums, n)
    for i, name in enumerate(("ece", "rmsce", "mce")):
        for b in n_bins:
            per[f"{name}_mass_{b}"] = errs[b][i]
    if state.classwise:
        probs, y = samples["probs"].cpu(), samples["y"].cpu()
        k = probs.shape[2]
        if state.task == "multiclass":
            onehot = torch.zeros((n, 1, k), dtype=torch.float64)
            onehot.scatter_(2, y.reshape(n, 1, 1), 1.0)
        else:
            onehot = torch.stack([1.0 - y.double(), y.double()], dim=-1)
        offs_k = torch.arange(t * k).view(1, t, k)
        for b in n_bins:
            idx = _mass_bin(probs, b) + offs_k * b
            sums = [_hist(idx, w, t * k * b).view(t, k, b) for w in (None, probs, onehot)]
            per[f"cwece_mass_{b}"] = _errors(*sums, n)[0].mean(-1)
    return _finish(per, state.task, task_names, t)


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


def evaluate(
    logits: Any,
    labels: Any,
    *,
    task: str = "multiclass",
    n_bins: int | Sequence[int] = DEFAULT_N_BINS,
    binning: str = "width",
    classwise: bool = False,
    probs: Any = None,
    task_names: Sequence[str] | None = None,
) -> dict[str, float]:
    r"""Accuracy, NLL, Brier score and binned calibration errors of a classifier.

    Parameters
    ----------
    logits : Tensor or ndarray, shape (N, K), (N,) / (N, 1) or (N, T)
        Unnormalised scores: (N, K) for ``task="multiclass"``, (N,) or (N, 1) for
        ``"binary"`` (``p = sigmoid(z)``), (N, T) for ``"multilabel"`` (T binary tasks).
        Any floating dtype; half precision is upcast to float32 internally. Pass ``None``
        when giving ``probs=``.
    labels : Tensor or ndarray
        Class indices of shape (N,) (multiclass), 0/1 of shape (N,) (binary) or (N, T)
        (multilabel).
    task : {"multiclass", "binary", "multilabel"}
        Kind of problem.
    n_bins : int or sequence of int
        Bin counts ``B`` of the calibration errors; default ``(5, 10, 15, 20, 50, 100)``.
    binning : {"width", "mass"}
        Equal-width bins (keys ``ece_B``...) or equal-mass bins (keys ``ece_mass_B``...).
    classwise : bool
        Also report the classwise ECE under ``cwece_B`` (``cwece_mass_B``).
    probs : Tensor or ndarray, optional
        Probabilities instead of logits: (N, K) rows summing to 1 within
        ``max(1e-4, 4 eps(dtype))`` for multiclass; ``P(y = 1)`` for binary / multilabel.
        Never inferred from the values of ``logits``.
    task_names : sequence of str, optional
        Names of the T multilabel tasks for the per-task keys; default ``t0 ... t{T-1}``.

    Returns
    -------
    dict of str to float
        ``acc``, ``nll``, ``brier`` and, for each ``B``, ``ece_B``, ``rmsce_B``, ``mce_B``
        (``*_mass_B`` with equal-mass bins; plus ``cwece_B`` when ``classwise``). For
        multilabel, these keys hold the unweighted mean over tasks and every metric is
        also given per task under ``"{metric}/{task_name}"``.

    Notes
    -----
    With :math:`p = \mathrm{softmax}(z)`, top-label confidence :math:`c_i = \max_k p_{ik}`
    and prediction :math:`\hat y_i = \arg\max_k p_{ik}` (first index on ties, taken on
    the float32 probabilities):

    .. math::

        \mathrm{acc} = \frac1N \sum_i 1[\hat y_i = y_i], \quad
        \mathrm{nll} = \frac1N \sum_i \Big(\log\sum_k e^{z_{ik}} - z_{i y_i}\Big), \quad
        \mathrm{brier} = \frac1N \sum_i \sum_k (p_{ik} - 1[y_i = k])^2 .

    Equal-width bin :math:`b \in \{0..B-1\}` holds :math:`b/B \le c < (b+1)/B`, the last bin
    closed (``c = 1.0``, common in float32, is in bin ``B - 1``); the index is
    ``floor(c B)`` evaluated in float64, which is exact for float32 (and half-precision)
    confidences, so a stored ``c`` lands in the bin its exact value belongs to. With :math:`n_b` samples, mean accuracy
    :math:`a_b` and mean confidence :math:`\bar c_b` in bin ``b``:

    .. math::

        \mathrm{ECE} = \sum_b \frac{n_b}{N} |a_b - \bar c_b|, \quad
        \mathrm{RMSCE} = \sqrt{\sum_b \frac{n_b}{N} (a_b - \bar c_b)^2}, \quad
        \mathrm{MCE} = \max_{b:\, n_b > 0} |a_b - \bar c_b| .

    Empty bins contribute nothing (MCE skips them). Equal-mass bins sort the confidences
    and start bin ``b`` at the ``floor(b N / B)``-th smallest value; a sample equal to an
    edge goes to the upper bin, so tied confidences always share a bin (some bins may be
    empty when there are ties or fewer than ``B`` samples). Classwise ECE is the mean
    over the K classes (absent classes included) of the ECE of :math:`p_{\cdot k}` against
    :math:`1[y = k]`, each on its own bins.

    Binary tasks use :math:`p = \sigma(z)`, confidence :math:`\max(p, 1 - p)`, prediction
    ``z > 0`` (``p > 0.5`` for ``probs=``; a tie predicts 0), NLL
    :math:`-y\log p - (1 - y)\log(1 - p)` from the logits stably, and Brier
    :math:`(p - y)^2`; classwise ECE uses the two classes ``1 - p`` and ``p``.

    Computation is chunked in float32 (float64 for float64 input) with float64 sums. With
    ``probs=``, a true class of probability 0 gives an infinite NLL (no clipping).

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    >>> labels = torch.tensor([0, 2, 2])
    >>> m = evaluate(logits, labels, n_bins=(10,))
    >>> sorted(m)
    ['acc', 'brier', 'ece_10', 'mce_10', 'nll', 'rmsce_10']
    >>> round(m["acc"], 4), round(m["nll"], 4), round(m["brier"], 4)
    (0.6667, 0.6286, 0.3594)
    >>> round(m["ece_10"], 4), round(m["mce_10"], 4)
    (0.2932, 0.5761)
    """
    task = check_task(task)
    bins = _check_n_bins(n_bins)
    binning = _check_binning(binning)
    scores, y, is_prob = _check_tensors(logits, labels, probs, task)
    names = _check_task_names(task_names, scores.shape[1]) if task == "multilabel" else None
    mass = binning == "mass"
    state = _State(
        task=task,
        n_bins=() if mass else bins,
        classwise=bool(classwise),
        num_classes=None,
        num_tasks=None,
    )
    if mass:
        state.classwise = False  # no width-bin classwise sums with equal-mass bins
    samples = _update(
        state, scores, y, is_prob=is_prob, return_samples=mass, return_probs=mass and classwise
    )
    out = _compute(state, names)
    if mass:
        state.classwise = bool(classwise)
        out.update(_compute_mass(samples, state, bins, names))
        if task == "multilabel":  # keep the plain keys before the per-task keys
            out = {k: out[k] for k in sorted(out, key=lambda k: "/" in k)}
    return out


class StreamingMetrics:
    """Streaming form of :func:`evaluate`: ``update`` batch by batch, then ``compute``.

    The state is O(bins x classes x tasks), independent of the number of samples (each
    ``update`` only needs temporary memory proportional to its own batch); the state
    is a dict of float64 tensors that are all *sums* over samples, so states from several
    processes combine by addition (:meth:`merge`, or an all-reduce with SUM of
    :meth:`state_dict`).

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
        state up front (e.g. so that every process holds tensors of the same shape).

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> logits, labels = torch.randn(100, 4, generator=g), torch.randint(0, 4, (100,), generator=g)
    >>> m = StreamingMetrics(n_bins=(10, 15))
    >>> for i in range(0, 100, 32):
    ...     m.update(logits[i : i + 32], labels[i : i + 32])
    >>> one_shot = evaluate(logits, labels, n_bins=(10, 15))
    >>> all(abs(m.compute()[k] - one_shot[k]) < 1e-12 for k in one_shot)
    True
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
    ) -> None:
        task = check_task(task)
        bins = _check_n_bins(n_bins)
        if _check_binning(binning) == "mass":
            raise ValueError(
                "equal-mass binning needs every confidence at once, so it cannot be streamed "
                "in O(bins) memory; use StreamingMetrics(binning='width'), or call "
                "evaluate(logits, labels, binning='mass') on the concatenated outputs."
            )
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2
        ):
            raise ValueError(f"`num_classes` must be an integer >= 2, got {num_classes!r}.")
        if num_classes is not None and task != "multiclass":
            raise ValueError("`num_classes` applies to task='multiclass' only.")
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
        )
        if (task != "multiclass" or num_classes is not None) and (
            task != "multilabel" or n_tasks is not None
        ):
            self._state.allocate(torch.device("cpu"))

    def update(self, logits: Any, labels: Any, *, probs: Any = None) -> None:
        """Add a batch: same inputs and checks as :func:`evaluate`."""
        scores, y, is_prob = _check_tensors(logits, labels, probs, self._state.task)
        if (
            self._state.initialised
            and float(self._state.tensors["n"]) == 0
            and self._state.tensors["n"].device != scores.device
        ):
            self.to(scores.device)  # follow the data until the first samples arrive
        _update(self._state, scores, y, is_prob=is_prob)

    def compute(self) -> dict[str, float]:
        """Metrics of every sample seen so far (same keys and values as :func:`evaluate`)."""
        names = self._task_names
        if names is None and self._state.task == "multilabel" and self._state.initialised:
            names = _check_task_names(None, self._state.num_tasks)
        return _compute(self._state, names)

    def merge(self, other: StreamingMetrics) -> StreamingMetrics:
        """Add the statistics of ``other`` (e.g. from another process) into ``self``."""
        if not isinstance(other, StreamingMetrics):
            raise ValueError(f"can only merge a StreamingMetrics, got {type(other).__name__}.")
        a, b = self._state, other._state
        if not b.initialised:
            return self
        if not a.initialised:
            a.num_classes, a.num_tasks = b.num_classes, b.num_tasks
        if a.config() != b.config():
            raise ValueError(
                f"cannot merge metric states with different settings: {a.config()} vs "
                f"{b.config()} (task, n_bins, classwise, classes, tasks)."
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
        if not state_dict:
            st.tensors = {}
            return
        if st.task == "multiclass" and st.num_classes is None and st.classwise:
            cw = [k for k in state_dict if k.startswith("cw_count_")]
            if cw:
                st.num_classes = int(state_dict[cw[0]].shape[1])
        if st.task == "multilabel" and st.num_tasks is None and "correct" in state_dict:
            st.num_tasks = int(state_dict["correct"].shape[0])
        expected = st.shapes()
        bad = set(state_dict) ^ set(expected)
        if bad:
            raise ValueError(
                f"state_dict does not match this metric's settings: unexpected or missing keys "
                f"{sorted(bad)[:6]}; build StreamingMetrics with the same task / n_bins / "
                "classwise as the one that saved it."
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
        for v in self._state.tensors.values():
            v.zero_()

    def to(self, device: str | torch.device) -> StreamingMetrics:
        """Move the state tensors to ``device`` (they start where the first batch lives)."""
        self._state.tensors = {k: v.to(device) for k, v in self._state.tensors.items()}
        return self


def reliability_bins(
    logits: Any,
    labels: Any,
    *,
    n_bins: int = 15,
    task: str = "multiclass",
    probs: Any = None,
) -> dict[str, np.ndarray]:
    """Per-bin counts, mean confidence and accuracy of equal-width bins (reliability diagram).

    Parameters
    ----------
    logits, labels, task, probs
        As in :func:`evaluate`.
    n_bins : int
        Number of equal-width bins ``B`` (last bin closed, as in :func:`evaluate`).

    Returns
    -------
    dict of str to ndarray
        ``count`` (samples per bin), ``confidence`` (mean confidence, NaN where empty),
        ``accuracy`` (fraction correct, NaN where empty), each of shape (B,) -- (T, B) for
        multilabel -- and ``edges`` of shape (B + 1,).
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
# OOD detection
# --------------------------------------------------------------------------------------


def _check_ood_logits(x: Any, name: str, task: str) -> torch.Tensor:
    if task == "multiclass":
        z = as_float_tensor(x, name, 2)
        if z.shape[1] < 2:
            raise ValueError(
                f"`{name}` has {z.shape[1]} column(s); multiclass OOD scores need K >= 2 "
                "columns. For one logit per sample use task='binary'."
            )
        return z
    z = as_float_tensor(x, name, (1, 2))
    if z.ndim == 2:
        if z.shape[1] != 1:
            raise ValueError(
                f"binary `{name}` must have shape (N,) or (N, 1), got {tuple(z.shape)}."
            )
        z = z[:, 0]
    # a binary logit z is the 2-class problem with logits (0, z)
    return torch.stack([torch.zeros_like(z), z], dim=1)


def ood_scores(logits: Any, *, score: str = "msp", task: str = "multiclass") -> torch.Tensor:
    r"""Per-sample OOD scores, higher meaning more in-distribution.

    Parameters
    ----------
    logits : Tensor or ndarray, shape (N, K), or (N,) / (N, 1) for ``task="binary"``
        Logits (a binary logit ``z`` is treated as the 2-class logits ``(0, z)``).
    score : {"msp", "energy", "entropy"}
        ``msp``: maximum softmax probability :math:`\max_k p_k`; ``energy``: the negative
        free energy :math:`\log\sum_k e^{z_k}` (temperature 1); ``entropy``: the negative
        entropy :math:`\sum_k p_k \log p_k`.
    task : {"multiclass", "binary"}
        Kind of problem.

    Returns
    -------
    Tensor, shape (N,)
        float64 scores (computed in float32, or float64 for float64 input).

    Examples
    --------
    >>> import torch
    >>> ood_scores(torch.tensor([[0.0, 0.0], [4.0, 0.0]]), score="msp").tolist()
    [0.5, 0.9820137619972229]
    """
    if score not in _OOD_SCORES:
        raise ValueError(
            f"`score` must be one of {', '.join(map(repr, _OOD_SCORES))}, got {score!r}."
        )
    if task not in ("multiclass", "binary"):
        raise ValueError(
            f"`task` must be 'multiclass' or 'binary' for OOD scores, got {task!r}; for "
            "multi-label outputs score each task with task='binary'."
        )
    z = _check_ood_logits(logits, "logits", task)
    return _score(z.to(_work_dtype(z)), score).double()


def _score(z: torch.Tensor, score: str) -> torch.Tensor:
    if score == "msp":
        return torch.softmax(z, dim=1).amax(1)
    if score == "energy":
        return torch.logsumexp(z, dim=1)
    logp = torch.log_softmax(z, dim=1)
    return (logp.exp() * logp).sum(1)


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
    id_logits: Any, ood_logits: Any, *, score: str = "msp", task: str = "multiclass"
) -> dict[str, float]:
    r"""OOD detection quality of a score: AUROC and FPR at 95% TPR (ID = positive class).

    Parameters
    ----------
    id_logits : Tensor or ndarray, shape (N, K)
        Logits on in-distribution data (the positive class).
    ood_logits : Tensor or ndarray, shape (M, K)
        Logits on out-of-distribution data (the negative class); same K.
    score : {"msp", "energy", "entropy"}
        The score, higher = more in-distribution (see :func:`ood_scores`); SPEC default
        ``"msp"``.
    task : {"multiclass", "binary"}
        Kind of problem (binary: logits of shape (N,) or (N, 1)).

    Returns
    -------
    dict of str to float
        ``auroc`` and ``fpr95``.

    Notes
    -----
    With ID scores :math:`s_i` (``i = 1..N``) and OOD scores :math:`u_j` (``j = 1..M``):

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
    """
    if score not in _OOD_SCORES:
        raise ValueError(
            f"`score` must be one of {', '.join(map(repr, _OOD_SCORES))}, got {score!r}."
        )
    if task not in ("multiclass", "binary"):
        raise ValueError(
            f"`task` must be 'multiclass' or 'binary' for OOD detection, got {task!r}; for "
            "multi-label outputs evaluate each task with task='binary'."
        )
    zi = _check_ood_logits(id_logits, "id_logits", task)
    zo = _check_ood_logits(ood_logits, "ood_logits", task)
    if zi.shape[1] != zo.shape[1]:
        raise ValueError(
            f"`id_logits` has {zi.shape[1]} classes but `ood_logits` has {zo.shape[1]}; both "
            "must be outputs of the same model."
        )
    si = _score(zi.to(_work_dtype(zi)), score).double().cpu()
    so = _score(zo.to(_work_dtype(zo)), score).double().cpu()
    return {"auroc": _auroc(si, so), "fpr95": _fpr_at_tpr95(si, so)}
