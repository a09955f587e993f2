"""The Two-Stage-Training heads: :class:`TSTHead` and its variational form :class:`VTSTHead`."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cogcal._checks import (
    as_float_tensor,
)
from cogcal._constraints import COUNT, check
from cogcal.calibrators._base import _array_like


def default_latent_dim(num_classes: int) -> int:
    """TST latent size Z of docs/method.md §2: 128 for 10 classes, 512 for 100, 256 otherwise.

    Examples
    --------
    >>> from cogcal.calibrators import default_latent_dim
    >>> default_latent_dim(10), default_latent_dim(100), default_latent_dim(7)
    (128, 512, 256)
    """
    return {10: 128, 100: 512}.get(num_classes, 256)


class TSTHead(nn.Module):
    """The Two-Stage-Training head (Jordahn & Olmos, 2024): features to logits.

    ``Linear(d, 3Z) -> ReLU -> Linear(3Z, Z) -> Linear(Z, K)``. It replaces a network's
    final linear layer: post hoc in the ``tst`` method (stage 2, body frozen) or as the
    slow-learning-rate calibrator of ``cog-tst``.

    Parameters
    ----------
    in_features : int
        Feature dimension ``d`` entering the head.
    num_classes : int
        Number of outputs ``K``.
    latent_dim : int, optional
        ``Z``; default :func:`default_latent_dim` of ``num_classes``.

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import TSTHead
    >>> head = TSTHead(64, 10)
    >>> head(torch.randn(3, 64)).shape
    torch.Size([3, 10])
    >>> head.predict_proba(torch.randn(3, 64).numpy()).sum(1).round(4)
    array([1., 1., 1.], dtype=float32)
    """

    def __init__(self, in_features: int, num_classes: int, *, latent_dim: int | None = None):
        super().__init__()
        check(in_features, COUNT, "in_features")
        check(num_classes, COUNT, "num_classes")
        z = default_latent_dim(num_classes) if latent_dim is None else latent_dim
        check(z, COUNT, "latent_dim")
        self.in_features, self.out_features, self.latent_dim = in_features, num_classes, z
        self.encoder = nn.Sequential(nn.Linear(in_features, 3 * z), nn.ReLU(), nn.Linear(3 * z, z))
        self.classifier = nn.Linear(z, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.encoder(features))

    def predict_proba(self, features: Any) -> Any:
        """Softmax of the head's logits for ``(N, d)`` features, without gradients.

        Numpy in gives numpy out; a tensor gives a tensor on its own device, of its dtype.
        The module's mode is kept: call ``.eval()`` first for the V-TST predictive mean.
        """
        is_tensor = isinstance(features, torch.Tensor)
        x = as_float_tensor(_array_like(features), "features", 2)
        if x.shape[1] != self.in_features:
            raise ValueError(
                f"`features` must have {self.in_features} columns for this head, got {x.shape[1]}."
            )
        param = next(self.parameters())
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        with torch.no_grad():
            logits = self(x.to(device=param.device, dtype=param.dtype))
            probs = torch.softmax(logits.to(work), dim=1).to(x.dtype)
        return probs.to(x.device) if is_tensor else probs.cpu().numpy()


#: Seed of the fixed standard-normal draws of :class:`VTSTHead`'s predictive mean.
VTST_NOISE_SEED = 0


class VTSTHead(TSTHead):
    """The variational TST head (V-TST, Jordahn & Olmos, 2024).

    A mean head (the :class:`TSTHead` encoder) and a variance head
    ``Linear(d, 3Z) -> ReLU -> Linear(3Z, Z) -> logsigmoid`` give ``q(z|x) = N(mu, diag sigma^2)``
    with ``log sigma^2 <= 0``; the prior is ``N(0, I)``.

    * In training mode, :meth:`forward_with_kl` draws one reparameterised sample and returns
      its logits with the KL term (summed over Z, divided by Z, averaged over the batch).
    * In eval mode, :meth:`forward` returns the logits of the predictive mean over
      ``num_samples`` draws, ``logsumexp_m(log_softmax(z_m)) - log M``, so metrics and
      post-hoc steps take them like any other logits. The draws
      ``z_m = mu + eps_m * sigma`` use ``num_samples`` fixed standard-normal vectors
      ``eps_m`` (the buffer :attr:`noise`, the same for every input and every head of
      this size), so the prediction is deterministic: it does not depend on the global
      random state or on the other inputs of a batch, and an export
      (:meth:`cogcal.CalibratedModel.export`, ONNX) computes exactly it. In training mode
      ``forward`` returns the single-sample logits of a fresh draw.

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import VTSTHead
    >>> head = VTSTHead(16, 5, latent_dim=8).eval()
    >>> x = torch.randn(4, 16)
    >>> logits = head(x)                         # log of the mean of 10 softmaxes
    >>> torch.allclose(logits.exp().sum(1), torch.ones(4), atol=1e-5)
    True
    >>> torch.allclose(head(x[:2]), logits[:2], atol=1e-6)  # the same, whatever the batch
    True
    >>> _, kl = head.train().forward_with_kl(torch.randn(4, 16))
    >>> bool(kl >= 0)
    True
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        *,
        latent_dim: int | None = None,
        num_samples: int = 10,
    ):
        super().__init__(in_features, num_classes, latent_dim=latent_dim)
        check(num_samples, COUNT, "num_samples")
        self.num_samples = num_samples
        z = self.latent_dim
        self.log_var = nn.Sequential(
            nn.Linear(in_features, 3 * z), nn.ReLU(), nn.Linear(3 * z, z), nn.LogSigmoid()
        )
        # the predictive mean's draws: fixed, so that a prediction is a function of its input
        # (not saved in checkpoints: every head of this size has the same ones)
        g = torch.Generator().manual_seed(VTST_NOISE_SEED)
        self.register_buffer("noise", torch.randn(num_samples, z, generator=g), persistent=False)

    def forward_with_kl(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One-sample logits and ``KL(q(z|x) || N(0, I))`` (sum over Z / Z, batch mean)."""
        mu, log_var = self.encoder(features), self.log_var(features)
        sample = mu + torch.randn_like(mu) * (0.5 * log_var).exp()
        kl = 0.5 * (log_var.exp() + mu.pow(2) - 1.0 - log_var).sum(1) / self.latent_dim
        return self.classifier(sample), kl.mean()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mu, log_var = self.encoder(features), self.log_var(features)
        if self.training:
            return self.classifier(mu + torch.randn_like(mu) * (0.5 * log_var).exp())
        std = (0.5 * log_var).exp()
        eps = self.noise.to(dtype=mu.dtype).unsqueeze(1)  # (M, 1, Z): the same for every input
        logp = F.log_softmax(self.classifier(mu + eps * std).float(), dim=-1)
        return (torch.logsumexp(logp, dim=0) - math.log(self.num_samples)).to(mu.dtype)
