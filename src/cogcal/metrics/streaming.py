"""Metrics accumulated batch by batch (:class:`StreamingMetrics`), DDP-ready."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from cogcal._checks import (
    check_eps,
    check_task,
)
from cogcal.metrics._inputs import (
    _EPS_MESSAGE,
    DEFAULT_N_BINS,
    _check_binning,
    _check_n_bins,
    _check_num_classes,
    _check_positive_class,
    _check_task_names,
    _check_tensors,
)
from cogcal.metrics.binning import _compute, _State, _update


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
    >>> from cogcal.metrics import StreamingMetrics, evaluate
    >>> g = torch.Generator().manual_seed(0)
    >>> logits, labels = torch.randn(100, 4, generator=g), torch.randint(0, 4, (100,), generator=g)
    >>> m = StreamingMetrics(n_bins=(10, 15))
    >>> for i in range(0, 100, 32):
    ...     m.update(logits[i : i + 32], labels[i : i + 32])
    >>> m.sync()  # no-op unless torch.distributed is initialised  # doctest: +ELLIPSIS
    <cogcal.metrics.streaming.StreamingMetrics object at ...>
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
        self.eps = check_eps(eps, message=_EPS_MESSAGE)
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
