"""Binned calibration errors (the ECE family): the sufficient statistics of a stream of
predictions per bin (:class:`_State`), their update and the errors computed from them,
for equal-width and equal-mass bins."""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Iterable

import torch

from cogcal.metrics._chunks import _binary_chunk, _multiclass_chunk, _Want
from cogcal.metrics._inputs import _check_task_names

#: Scores processed at once (rows x columns): the float64 temporaries of a chunk stay
#: small (8 MiB), large enough to amortise the per-call overhead.
_CHUNK_ELEMS = 1 << 20
#: Largest ``tasks x lcm(n_bins)`` histogram built before folding into the coarser bins.
_MAX_FINE = 1 << 22


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
    # one task: the value itself (its mean, exactly) without a reduction per key
    out = {key: float(v) if v.numel() == 1 else float(v.mean()) for key, v in per.items()}
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
