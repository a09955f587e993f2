"""A batch loader for in-memory tensors, without per-sample ``DataLoader`` overhead."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch

from cogcal._constraints import COUNT, NON_NEGATIVE, SEED, Integer, check

__all__ = ["BatchLoader"]

Transform = Callable[..., torch.Tensor]

# Stream identifiers mixed into the per-epoch seeds so that the shuffling permutation
# and the augmentation randomness are independent.
_PERM_STREAM = 0
_AUG_STREAM = 1


def _derived_seed(*words: int) -> int:
    """A well-mixed 63-bit seed from a tuple of non-negative integers."""
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(2, np.uint64)[0] >> 1)


class BatchLoader:
    """Iterate over minibatches of in-memory tensors by indexing, one batch at a time.

    Each epoch draws one permutation (when ``shuffle``) from a generator seeded with
    ``(seed, epoch)``, so the order is deterministic, different from epoch to epoch, and
    resumable with :meth:`set_epoch`. Batches are gathered with one indexing operation
    (views when not shuffling), then passed through ``transform``.

    Parameters
    ----------
    x, y : torch.Tensor
        Inputs and labels with the same first dimension.
    batch_size : int
        Samples per batch (per replica).
    shuffle : bool
        Draw a new permutation every epoch.
    transform : callable, optional
        Called as ``transform(x_batch, train=train, generator=g)``, e.g.
        :meth:`cogcal.data.Dataset.transform`; ``g`` is a generator seeded with
        ``(seed, epoch, rank)`` and shared by the batches of the epoch, so augmentation is
        reproducible too.
    train : bool, default False
        Passed to ``transform`` (turns augmentation on).
    seed : int, default 0
        Seed of the shuffling and of the augmentation (use the training seed).
    drop_last : bool, default False
        Drop the last incomplete batch (of this replica's shard).
    device : str or torch.device, optional
        Move ``x`` and ``y`` there once (they stay resident, e.g. on the GPU) and yield
        batches on it. Default: leave the tensors where they are.
    num_replicas : int, default 1
        Number of processes sharing the data (distributed training).
    rank : int, default 0
        This process's index in ``[0, num_replicas)``.
    pad : bool, optional
        How to shard when ``num_replicas`` does not divide ``N``. ``True``: every replica
        gets ``ceil(N / num_replicas)`` samples, the last shards completed with samples
        from the start of the epoch's order (as ``torch.utils.data.DistributedSampler``
        does), so every rank runs the same number of steps. ``False``: the shards are
        disjoint and cover the data exactly once, with sizes differing by at most one (use
        this for evaluation: no sample is duplicated). Default: ``shuffle``.

    Notes
    -----
    Every replica uses the same permutation of the epoch and takes every
    ``num_replicas``-th sample of it, starting at its rank (as ``DistributedSampler``), so
    the shards are disjoint and, at every step, the union of the replicas' batches is
    exactly the batch that one process with ``num_replicas`` times the batch size would
    see: multi-process training follows the single-process trajectory.

    Each iteration uses the current epoch (read when its first batch is drawn) and then
    advances it by one;
    :meth:`set_epoch` sets the epoch the next iteration uses (call it every epoch, or
    once when resuming).

    Examples
    --------
    >>> import torch
    >>> from cogcal.data import BatchLoader
    >>> x, y = torch.arange(10.0)[:, None], torch.arange(10)
    >>> loader = BatchLoader(x, y, batch_size=4, shuffle=True, seed=0)
    >>> len(loader)
    3
    >>> loader.set_epoch(3)
    >>> seen = torch.cat([yb for _, yb in loader])
    >>> sorted(seen.tolist())
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> loader.set_epoch(3)
    >>> torch.equal(seen, torch.cat([yb for _, yb in loader]))
    True
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        batch_size: int,
        shuffle: bool,
        transform: Transform | None = None,
        train: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        device: str | torch.device | None = None,
        num_replicas: int = 1,
        rank: int = 0,
        pad: bool | None = None,
    ) -> None:
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise ValueError(
                "`x` and `y` must be torch.Tensors; convert numpy arrays with torch.as_tensor."
            )
        if x.shape[0] != y.shape[0]:
            raise ValueError(
                f"`x` has {x.shape[0]} samples but `y` has {y.shape[0]}; they must match."
            )
        check(batch_size, COUNT, "batch_size", flag="--batch-size")
        check(num_replicas, COUNT, "num_replicas")
        check(rank, Integer(0, num_replicas - 1), "rank")
        check(seed, SEED, "seed")
        if device is not None:
            device = torch.device(device)
            x, y = x.to(device), y.to(device)
        self.x = x
        self.y = y
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.transform = transform
        self.train = bool(train)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.device = device
        self.num_replicas = num_replicas
        self.rank = rank
        self.pad = self.shuffle if pad is None else bool(pad)
        self.epoch = 0

    # ------------------------------------------------------------------ sizes
    @property
    def num_samples(self) -> int:
        """Number of samples this replica sees per epoch (before ``drop_last``)."""
        n, r = int(self.x.shape[0]), self.num_replicas
        if self.pad:
            return math.ceil(n / r) if n else 0
        return n // r + (1 if self.rank < n % r else 0)

    def __len__(self) -> int:
        m = self.num_samples
        return m // self.batch_size if self.drop_last else math.ceil(m / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch used by the next iteration (shuffling and augmentation seeds)."""
        self.epoch = check(epoch, NON_NEGATIVE, "epoch")

    # ------------------------------------------------------------------ indices
    def indices(self, epoch: int | None = None) -> torch.Tensor | slice:
        """Indices of the samples this replica visits in ``epoch``, in order.

        Returns a :class:`slice` when no gather is needed (no shuffling, no padding
        wrap-around), else an ``int64`` tensor on the data's device.
        """
        epoch = self.epoch if epoch is None else epoch
        n, r, k = int(self.x.shape[0]), self.num_replicas, self.rank
        total = math.ceil(n / r) * r if self.pad else n
        if not self.shuffle and total <= n:
            return slice(k, n, r)
        if self.shuffle:
            g = torch.Generator().manual_seed(_derived_seed(self.seed, epoch, _PERM_STREAM))
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        if total > n:  # padding: wrap around to the start of the epoch's order
            order = torch.cat([order, order[: total - n]]) if n else order
        return order[k:total:r].to(self.x.device)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self._next_epoch()

    def _next_epoch(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # A generator: the epoch is read when the first batch is requested, not when the
        # iterator is made, so iterators that a trainer creates ahead of time (Lightning
        # does, e.g. when resuming) follow the latest set_epoch().
        epoch = self.epoch
        self.epoch += 1
        yield from self._iterate(epoch)

    def _iterate(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        idx = self.indices(epoch)
        generator = None
        if self.transform is not None:
            gen_device = self.x.device if self.x.device.type == "cuda" else "cpu"
            generator = torch.Generator(device=gen_device)
            generator.manual_seed(_derived_seed(self.seed, epoch, _AUG_STREAM, self.rank))
        step = idx.step if isinstance(idx, slice) else 1
        total = self.num_samples
        for b in range(len(self)):
            s = b * self.batch_size
            e = min(s + self.batch_size, total)
            if isinstance(idx, slice):  # views, no copy (strided when sharded)
                lo = idx.start + s * step
                hi = idx.start + e * step
                xb, yb = self.x[lo:hi:step], self.y[lo:hi:step]
            else:
                sel = idx[s:e]
                xb, yb = self.x[sel], self.y[sel]
            if self.transform is not None:
                xb = self.transform(xb, train=self.train, generator=generator)
            yield xb, yb

    def __repr__(self) -> str:
        return (
            f"BatchLoader(n={int(self.x.shape[0])}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, train={self.train}, num_replicas={self.num_replicas}, "
            f"rank={self.rank}, pad={self.pad}, epoch={self.epoch})"
        )
