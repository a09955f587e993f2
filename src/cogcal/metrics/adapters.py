"""The torchmetrics adapter: :func:`as_torchmetric` and ``CalibrationMetric`` (built,
and torchmetrics imported, on first use)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cogcal._checks import (
    check_eps,
    check_task,
)
from cogcal._constraints import COUNT, check
from cogcal.metrics._inputs import (
    _EPS_MESSAGE,
    DEFAULT_N_BINS,
    _check_n_bins,
    _check_num_classes,
    _check_positive_class,
    _check_task_names,
    _check_tensors,
)
from cogcal.metrics.binning import _compute, _State, _update


# The body of ``CalibrationMetric``, which :func:`torchmetric_class` builds on top of
# ``torchmetrics.Metric`` on first use, so that ``import cogcal`` never imports torchmetrics.
class _CalibrationMetricBase:
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
        eps = check_eps(eps, message=_EPS_MESSAGE)
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
            if num_tasks is not None:
                check(num_tasks, COUNT, "num_tasks")
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


_TORCHMETRIC_CLASS: type | None = None


def torchmetric_class() -> type:
    """Build (once) ``CalibrationMetric``, the ``torchmetrics.Metric`` subclass."""
    global _TORCHMETRIC_CLASS
    if _TORCHMETRIC_CLASS is not None:
        return _TORCHMETRIC_CLASS
    try:  # torchmetrics is optional: imported on first use, never by `import cogcal`
        import torchmetrics
    except ImportError as err:
        raise ImportError(
            "cogcal.metrics.CalibrationMetric / as_torchmetric need torchmetrics: "
            "pip install torchmetrics (or use StreamingMetrics, which needs nothing more)."
        ) from err
    namespace = {
        "__doc__": _CalibrationMetricBase.__doc__,
        # picklable as cogcal.metrics.CalibrationMetric (the package's __getattr__)
        "__module__": "cogcal.metrics",
        "__qualname__": "CalibrationMetric",
    }
    _TORCHMETRIC_CLASS = type(
        "CalibrationMetric", (_CalibrationMetricBase, torchmetrics.Metric), namespace
    )
    return _TORCHMETRIC_CLASS


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
    return torchmetric_class()(**kwargs)
