"""Calibrators: ``nn.Module`` maps from logits (or features, for the TST heads) to logits.

Each parametric calibrator serves both ways the paper uses it:

* **post hoc**: ``.fit(val_logits, val_labels)`` fits it on frozen logits of a held-out
  split by full-batch L-BFGS on the negative log-likelihood, computed in float64, and
  returns ``self``;
* **in one go** (COG): placed after a network by :class:`cogcal.CalibratedModel`, its
  parameters are trained by the network's own optimiser on a slower learning rate.

Multiclass calibrators take ``(N, K)`` logits; the multi-label ones take ``(N, T)`` logits of
``T`` independent binary tasks and keep one temperature (:class:`TaskTemperature`) or one
affine map ``a * z + b`` (Platt form, :class:`TaskAffine`) per task.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cogcal._checks import check_multiclass, check_multilabel

__all__ = [
    "Calibrator",
    "Temperature",
    "VectorScaling",
    "MatrixScaling",
    "TaskTemperature",
    "TaskAffine",
    "TSTHead",
    "VTSTHead",
]


def _check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        expected = "a positive integer or None" if allow_none else "a positive integer"
        raise ValueError(f"`{name}` must be {expected}, got {value!r}.")


def _check_nonnegative_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"`{name}` must be a non-negative number, got {value!r}.")


class Calibrator(nn.Module):
    """Base class of the post-hoc-capable calibrators.

    Subclasses define ``forward`` (logits to calibrated logits), ``_loss`` (the mean
    negative log-likelihood of calibrated logits) and, when their size is only known from
    data, ``_build(num_outputs)``.  :meth:`fit` then runs full-batch L-BFGS on a float64
    copy of the parameters and writes the result back.

    Fitted attributes (set by :meth:`fit`): ``n_iter_`` (L-BFGS iterations),
    ``nll_before_`` and ``nll_after_`` (mean NLL on the fitting data).
    """

    multilabel: bool = False

    def __init__(self, *, max_iter: int = 200, l2: float = 0.0) -> None:
        super().__init__()
        _check_positive_int("max_iter", max_iter)
        _check_nonnegative_float("l2", l2)
        self.max_iter = max_iter
        self.l2 = l2

    # -- to be provided by subclasses -------------------------------------------------
    def _build(self, num_outputs: int) -> None:  # pragma: no cover - overridden when needed
        return None

    def _penalty(self) -> torch.Tensor:
        return torch.zeros((), dtype=torch.float64)

    # -- shared machinery ---------------------------------------------------------------
    def _check(self, logits: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.multilabel:
            return check_multilabel(logits, labels)
        return check_multiclass(logits, labels)

    def _nll(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        z = self(logits)
        if self.multilabel:
            return F.binary_cross_entropy_with_logits(z, labels.to(z.dtype), reduction="mean")
        return F.cross_entropy(z, labels)

    def fit(self, logits: Any, labels: Any) -> Calibrator:
        """Fit the calibrator post hoc by full-batch L-BFGS on the NLL of ``labels``.

        Parameters
        ----------
        logits : Tensor of shape (N, K) (multiclass) or (N, T) (multi-label)
            Frozen logits of a held-out split (never the test split). Any floating dtype;
            the optimisation runs in float64.
        labels : Tensor of shape (N,) with class indices, or (N, T) with 0/1 targets

        Returns
        -------
        self
        """
        z, y = self._check(logits, labels)
        width = z.shape[1]
        self._build(width)
        self._check_width(width)
        device = next(self.parameters()).device
        z64 = z.detach().to(device=device, dtype=torch.float64)
        y = y.to(device)
        original_dtype = next(self.parameters()).dtype
        self.to(torch.float64)
        self.train(False)
        try:
            params = [p for p in self.parameters() if p.requires_grad]
            with torch.no_grad():
                self.nll_before_ = float(self._nll(z64, y))
            opt = torch.optim.LBFGS(
                params,
                lr=1.0,
                max_iter=self.max_iter,
                tolerance_grad=1e-10,
                tolerance_change=1e-14,
                history_size=20,
                line_search_fn="strong_wolfe",
            )

            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = self._nll(z64, y) + self.l2 * self._penalty()
                loss.backward()
                return loss

            with torch.enable_grad():
                opt.step(closure)
            state = opt.state[opt._params[0]]
            self.n_iter_ = int(state.get("n_iter", 0))
            with torch.no_grad():
                self.nll_after_ = float(self._nll(z64, y))
            if not all(bool(torch.isfinite(p).all()) for p in params):
                raise RuntimeError(
                    f"{type(self).__name__}.fit diverged (non-finite parameters); the logits may "
                    "be extreme or the classes perfectly separable: try l2 > 0."
                )
        finally:
            self.to(original_dtype)
        return self

    def _check_width(self, width: int) -> None:
        expected = getattr(self, "num_outputs", None)
        if expected is not None and width != expected:
            kind = "tasks" if self.multilabel else "classes"
            raise ValueError(
                f"{type(self).__name__} was built for {expected} {kind} but got logits with "
                f"{width} columns; build it with the right size or with None to take it from fit."
            )

    def _require_built(self) -> None:
        if getattr(self, "num_outputs", 0) is None:
            raise RuntimeError(
                f"{type(self).__name__} has no parameters yet: pass the number of classes to "
                "the constructor or call .fit(logits, labels) first."
            )


class Temperature(Calibrator):
    """Temperature scaling: ``z / T`` with one scalar ``T > 0`` (Guo et al., 2017).

    ``T`` is parametrised as ``exp(log_temperature)`` so that it stays positive whether
    it is fitted post hoc or trained with COG. It starts at ``T = 1`` (identity).

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import Temperature
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> labels = torch.randint(0, 5, (4000,))
    >>> clean = torch.randn(4000, 5) + 3 * torch.nn.functional.one_hot(labels, 5)
    >>> y = torch.distributions.Categorical(logits=clean).sample()
    >>> t = Temperature().fit(clean * 2.0, y)   # logits twice too confident
    >>> abs(t.temperature - 2.0) < 0.15
    True
    """

    def __init__(self, *, max_iter: int = 200) -> None:
        super().__init__(max_iter=max_iter)
        self.log_temperature = nn.Parameter(torch.zeros(()))

    @property
    def temperature(self) -> float:
        """The current temperature ``T`` as a float."""
        return float(self.log_temperature.detach().exp())

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.log_temperature.exp().to(logits.dtype)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature:.4g}"


class _LazyWidth(Calibrator):
    """A calibrator whose parameters depend on the number of outputs, possibly known only at fit."""

    def __init__(self, num_outputs: int | None, *, max_iter: int, l2: float, name: str) -> None:
        super().__init__(max_iter=max_iter, l2=l2)
        _check_positive_int(name, num_outputs, allow_none=True)
        if num_outputs is not None and num_outputs < 2 and not self.multilabel:
            raise ValueError(f"`{name}` must be at least 2 for a multiclass calibrator.")
        self.num_outputs: int | None = None
        if num_outputs is not None:
            self._build(num_outputs)

    def _build(self, num_outputs: int) -> None:
        if self.num_outputs is None:
            self.num_outputs = num_outputs
            self._init_params(num_outputs)

    def _init_params(self, k: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    _width_key = "bias"

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[override]
        key = prefix + self._width_key
        if self.num_outputs is None and key in state_dict:
            self._build(int(state_dict[key].shape[0]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _penalty(self) -> torch.Tensor:
        return sum(((p - p0) ** 2).sum() for p, p0 in self._deviations())  # type: ignore[return-value]

    def _deviations(self):  # pragma: no cover - overridden
        raise NotImplementedError


class _ElementwiseAffine(_LazyWidth):
    """``w * z + b`` with one weight and one bias per output, starting at the identity."""

    def _init_params(self, k: int) -> None:
        self.weight = nn.Parameter(torch.ones(k))
        self.bias = nn.Parameter(torch.zeros(k))

    def _deviations(self):
        return [(self.weight, 1.0), (self.bias, 0.0)]

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        self._require_built()
        return logits * self.weight.to(logits.dtype) + self.bias.to(logits.dtype)


class VectorScaling(_ElementwiseAffine):
    """Vector scaling: ``w * z + b`` with one weight and one bias per class (2K parameters).

    Starts at the identity (``w = 1``, ``b = 0``). ``num_classes=None`` defers creating the
    parameters until :meth:`fit` sees the logits. ``l2`` penalises ``||w - 1||^2 + ||b||^2``
    in post-hoc fitting.

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import VectorScaling
    >>> vs = VectorScaling(3)
    >>> vs(torch.tensor([[1.0, 2.0, 3.0]]))
    tensor([[1., 2., 3.]], grad_fn=<AddBackward0>)
    """

    def __init__(self, num_classes: int | None = None, *, max_iter: int = 500, l2: float = 0.0):
        super().__init__(num_classes, max_iter=max_iter, l2=l2, name="num_classes")

    def extra_repr(self) -> str:
        return f"num_classes={self.num_outputs}"


class MatrixScaling(_LazyWidth):
    """Matrix scaling: ``W z + b`` with a full K x K matrix (K^2 + K parameters).

    ``W`` starts at the identity and ``b`` at zero, so an untrained calibrator changes
    nothing. ``num_classes=None`` defers creating the parameters until :meth:`fit`.
    ``l2`` penalises ``||W - I||_F^2 + ||b||^2`` in post-hoc fitting (the unregularised
    fit can overfit a small validation split when K is large).

    Examples
    --------
    >>> import torch
    >>> from cogcal.calibrators import MatrixScaling
    >>> ms = MatrixScaling()            # K taken from the data at fit
    >>> z = torch.randn(300, 4); y = z.argmax(1)
    >>> ms.fit(z, y).num_outputs
    4
    """

    def __init__(self, num_classes: int | None = None, *, max_iter: int = 500, l2: float = 0.0):
        super().__init__(num_classes, max_iter=max_iter, l2=l2, name="num_classes")

    def _init_params(self, k: int) -> None:
        self.weight = nn.Parameter(torch.eye(k))
        self.bias = nn.Parameter(torch.zeros(k))

    def _deviations(self):
        eye = torch.eye(self.weight.shape[0], dtype=self.weight.dtype, device=self.weight.device)
        return [(self.weight, eye), (self.bias, 0.0)]

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        self._require_built()
        return F.linear(logits, self.weight.to(logits.dtype), self.bias.to(logits.dtype))

    def extra_repr(self) -> str:
        return f"num_classes={self.num_outputs}"


class TaskTemperature(_LazyWidth):
    """One temperature per binary task: ``z_t / T_t`` for (N, T) multi-label logits.

    ``T_t = exp(log_temperature[t])``, starting at 1. Fitting minimises the mean binary
    cross-entropy over all tasks; the tasks do not share parameters, so this equals T
    separate fits.
    """

    multilabel = True
    _width_key = "log_temperature"

    def __init__(self, num_tasks: int | None = None, *, max_iter: int = 200):
        super().__init__(num_tasks, max_iter=max_iter, l2=0.0, name="num_tasks")

    def _init_params(self, k: int) -> None:
        self.log_temperature = nn.Parameter(torch.zeros(k))

    def _deviations(self):
        return []

    @property
    def temperature(self) -> torch.Tensor:
        """The per-task temperatures as a detached tensor of shape (T,)."""
        self._require_built()
        return self.log_temperature.detach().exp()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        self._require_built()
        return logits / self.log_temperature.exp().to(logits.dtype)

    def extra_repr(self) -> str:
        return f"num_tasks={self.num_outputs}"


class TaskAffine(_ElementwiseAffine):
    """One affine map per binary task, ``a_t * z_t + b_t`` (Platt scaling in logit form).

    This is the multi-label form of vector and matrix scaling (SPEC §4): each task's
    calibrated probability is ``sigmoid(a_t z_t + b_t)``. Starts at ``a = 1``, ``b = 0``.
    """

    multilabel = True

    def __init__(self, num_tasks: int | None = None, *, max_iter: int = 500, l2: float = 0.0):
        super().__init__(num_tasks, max_iter=max_iter, l2=l2, name="num_tasks")

    def extra_repr(self) -> str:
        return f"num_tasks={self.num_outputs}"


def default_latent_dim(num_classes: int) -> int:
    """TST latent size Z of SPEC §2: 128 for 10 classes, 512 for 100, 256 otherwise."""
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
    """

    def __init__(self, in_features: int, num_classes: int, *, latent_dim: int | None = None):
        super().__init__()
        _check_positive_int("in_features", in_features)
        _check_positive_int("num_classes", num_classes)
        z = default_latent_dim(num_classes) if latent_dim is None else latent_dim
        _check_positive_int("latent_dim", z)
        self.in_features, self.out_features, self.latent_dim = in_features, num_classes, z
        self.encoder = nn.Sequential(nn.Linear(in_features, 3 * z), nn.ReLU(), nn.Linear(3 * z, z))
        self.classifier = nn.Linear(z, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.encoder(features))


class VTSTHead(TSTHead):
    """The variational TST head (V-TST, Jordahn & Olmos, 2024).

    A mean head (the :class:`TSTHead` encoder) and a variance head
    ``Linear(d, 3Z) -> ReLU -> Linear(3Z, Z) -> logsigmoid`` give ``q(z|x) = N(mu, diag sigma^2)``
    with ``log sigma^2 <= 0``; the prior is ``N(0, I)``.

    * In training mode, :meth:`forward_with_kl` draws one reparameterised sample and returns
      its logits with the KL term (summed over Z, divided by Z, averaged over the batch).
    * In eval mode, :meth:`forward` returns the logits of the predictive mean over
      ``num_samples`` draws, ``logsumexp_m(log_softmax(z_m)) - log M``, so metrics and
      post-hoc steps take them like any other logits. In training mode ``forward`` returns
      the single-sample logits.
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
        _check_positive_int("num_samples", num_samples)
        self.num_samples = num_samples
        z = self.latent_dim
        self.log_var = nn.Sequential(
            nn.Linear(in_features, 3 * z), nn.ReLU(), nn.Linear(3 * z, z), nn.LogSigmoid()
        )

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
        eps = torch.randn((self.num_samples, *mu.shape), dtype=mu.dtype, device=mu.device)
        logp = F.log_softmax(self.classifier(mu + eps * std).float(), dim=-1)
        return (torch.logsumexp(logp, dim=0) - math.log(self.num_samples)).to(mu.dtype)
