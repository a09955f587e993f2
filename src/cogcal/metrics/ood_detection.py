"""Out-of-distribution detection from a classifier's scores: :func:`ood_scores`, :func:`ood`."""

from __future__ import annotations

from typing import Any

import torch

from cogcal._checks import (
    binary_scores,
    multiclass_scores,
)
from cogcal.metrics._inputs import _check_probs, _warn_if_probabilities

_OOD_SCORES = ("msp", "energy", "entropy", "maxlogit")
_LOGIT_SCORES = ("energy", "maxlogit")  # scores of the logits themselves


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
