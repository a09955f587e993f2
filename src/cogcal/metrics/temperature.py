r"""The NLL after the best temperature, streamed (:class:`TemperatureScaledNLL`).

How well a multiclass model *can* be calibrated by one temperature: the lowest mean NLL
of the logits divided by a temperature :math:`T`,

.. math::

    \mathrm{nll\_ts} = \min_{T > 0} \; -\frac1N \sum_i \log \mathrm{softmax}(z_i / T)_{y_i} ,

the "calibrated log-likelihood" of Ashukha et al. (2020), here in sample (the temperature
fitted on the samples it is scored on: one parameter, so the optimism is small). The
training loop records it on the validation split every epoch of the default path's runs
(``val_nll_ts``), which reads it to compare the rates at which a network trains *before*
a post-hoc calibrator (docs/method.md §1, "COG-FC or cross-entropy + post-hoc
calibration").

It is computed in one pass in O(grid) memory, so that it streams and its state adds up
over processes like :class:`~cogcal.metrics.StreamingMetrics`': the sum of the NLL is
accumulated at every inverse temperature :math:`\beta = 1/T` of a log-spaced grid
(:data:`INVERSE_TEMPERATURES`, 1/20 to 20) with its derivative in :math:`\beta`,
:math:`\mathbb{E}_{p}[z] - z_y`; the NLL is convex in :math:`\beta`, and its minimum is
that of the cubic with the NLL's values and slopes at the two grid points around the
minimiser (within 1e-5 of the exact minimum, tested against a scalar minimiser). A
minimum at an end of the grid (a temperature beyond 1/20 or 20) is that end's value: an
upper bound.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["INVERSE_TEMPERATURES", "TemperatureScaledNLL", "temperature_scaled_nll"]

#: The inverse temperatures at which the NLL is accumulated: 49 values, log-spaced from
#: 1/20 to 20 (neighbours 13% apart).
INVERSE_TEMPERATURES = torch.logspace(math.log10(1 / 20), math.log10(20), 49, dtype=torch.float64)
_CHUNK = 8  # inverse temperatures per vectorised step (bounds the batch's temporary memory)


class TemperatureScaledNLL:
    """Streaming form of :func:`temperature_scaled_nll`: ``update`` batch by batch, then
    ``compute``; :meth:`sync` sums the state over the processes of ``torch.distributed``.

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randint(0, 5, (400,), generator=g)
    >>> z = 6.0 * torch.nn.functional.one_hot(y, 5) + 3.0 * torch.randn(400, 5, generator=g)
    >>> m = TemperatureScaledNLL()
    >>> for i in range(0, 400, 128):
    ...     m.update(z[i : i + 128], y[i : i + 128])
    >>> plain = torch.nn.functional.cross_entropy(z.double(), y).item()
    >>> round(plain, 3), round(m.compute(), 3)  # over-confident: a temperature helps
    (0.773, 0.675)
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every sample."""
        # per inverse temperature: the sums of the NLL and of its derivative in beta
        self.sums = torch.zeros(2, len(INVERSE_TEMPERATURES), dtype=torch.float64)
        self.count = 0.0

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a batch of ``(N, K)`` logits and ``(N,)`` integer labels in ``[0, K)``."""
        if logits.ndim != 2 or labels.ndim != 1 or len(labels) != len(logits):
            raise ValueError(
                f"TemperatureScaledNLL.update: expected (N, K) logits and (N,) labels, got "
                f"shapes {tuple(logits.shape)} and {tuple(labels.shape)}."
            )
        z = logits.detach().float()
        y = labels.detach().long().to(z.device)
        if not bool(torch.isfinite(z).all()):
            raise ValueError(
                "TemperatureScaledNLL.update: the logits hold NaN or infinite values; pass "
                "finite logits (a diverged model has no temperature that calibrates it)."
            )
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= z.shape[1]):
            raise ValueError(
                f"TemperatureScaledNLL.update: labels must be class indices in [0, "
                f"{z.shape[1]}) for {z.shape[1]} logit columns, got values from "
                f"{int(y.min())} to {int(y.max())}."
            )
        if self.sums.device != z.device:
            self.sums = self.sums.to(z.device)
        # with d = z - max_k z (<= 0): NLL(beta) = log sum_k exp(beta d_k) - beta d_y and
        # its slope E_p[d] - d_y; one exp per entry, per-sample values summed in float64
        d = z - z.max(dim=1, keepdim=True).values
        d_true = d.gather(1, y[:, None])[:, 0]  # (N,)
        betas = INVERSE_TEMPERATURES.to(device=z.device, dtype=z.dtype)
        for start in range(0, len(betas), _CHUNK):
            b = betas[start : start + _CHUNK, None]  # (C, 1)
            e = torch.exp(b[:, :, None] * d)  # (C, N, K)
            total = e.sum(-1)  # (C, N), >= 1
            nll = torch.log(total) - b * d_true
            slope = (e * d).sum(-1) / total - d_true
            block = self.sums[:, start : start + _CHUNK]
            block += torch.stack([nll.double().sum(1), slope.double().sum(1)])
        self.count += float(len(y))

    def sync(self, group: Any = None) -> TemperatureScaledNLL:
        """Sum the state over the processes of ``group`` (a no-op without
        ``torch.distributed``); a collective: call it on every rank, once after the last
        :meth:`update` (the sums then hold every rank's samples; :meth:`reset` before the
        next pass)."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            # NCCL alone reduces CUDA tensors (a rank that saw no batch holds CPU ones)
            backend = str(dist.get_backend(group)).lower()
            nccl = "nccl" in backend and "gloo" not in backend
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
            here = self.sums.device
            flat = torch.cat([self.sums.reshape(-1), self.sums.new_tensor([self.count])])
            flat = flat.to(device)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            self.sums = flat[:-1].reshape(self.sums.shape).to(here)
            self.count = float(flat[-1])
        return self

    def compute(self) -> float:
        """The mean NLL at the best temperature of the samples seen (NaN before any)."""
        if self.count == 0:
            return math.nan
        f, slope = (self.sums / self.count).cpu()
        i = int(torch.argmin(f))
        a = i - 1 if slope[i] > 0 else i  # the grid interval where the slope turns positive
        if a < 0 or a + 1 >= len(f) or not bool(torch.isfinite(f[a : a + 2]).all()):
            return float(f[i])  # at an end of the grid: that end's value
        # the cubic with the NLL's values and slopes at both ends of the interval (Hermite)
        h = float(INVERSE_TEMPERATURES[a + 1] - INVERSE_TEMPERATURES[a])
        t = torch.linspace(0, 1, 1025, dtype=torch.float64)
        t2, t3 = t * t, t * t * t
        cubic = (
            (2 * t3 - 3 * t2 + 1) * f[a] + (t3 - 2 * t2 + t) * h * slope[a]
            + (3 * t2 - 2 * t3) * f[a + 1] + (t3 - t2) * h * slope[a + 1]
        )  # fmt: skip
        # (an NLL is never negative: where it is nearly 0, the cubic can dip below it)
        return max(0.0, min(float(cubic.min()), float(f[i])))


def temperature_scaled_nll(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The mean NLL of ``(N, K)`` logits at the temperature that minimises it (module
    docstring).

    >>> import torch
    >>> z = torch.tensor([[4.0, 0.0], [4.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    >>> y = torch.tensor([0, 0, 1, 1])  # 3 of 4 right at confidence 0.98: over-confident
    >>> round(temperature_scaled_nll(z, y), 4)  # best at confidence 3/4: the binary entropy of 1/4
    0.5623
    """
    metric = TemperatureScaledNLL()
    metric.update(torch.as_tensor(logits), torch.as_tensor(labels))
    return metric.compute()
