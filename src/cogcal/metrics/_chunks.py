"""Per-sample statistics of a chunk of scores, in float64: probabilities, confidences,
correctness, NLL and Brier terms (multiclass and binary)."""

from __future__ import annotations

from typing import NamedTuple

import torch


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
