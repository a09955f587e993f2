"""Where a run's batches come from: a built-in dataset, or the data given to :func:`cogcal.fit`.

The runner needs the same few things from either: the task and the number of outputs, the
training batches of this process (reshuffled per epoch), the validation batches of this
process (every sample on exactly one process), and the whole validation and test splits in
order for the final predictions. :class:`DatasetSource` serves them from a
:class:`cogcal.data.Dataset` (in-memory tensors, :class:`~cogcal.data.BatchLoader`);
:class:`LoaderSource` from user tensors, ``torch.utils.data.Dataset`` s or ``DataLoader`` s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from cogcal.data import BatchLoader, Dataset

__all__ = ["DataSource", "DatasetSource", "LoaderSource", "EVAL_BATCH"]

EVAL_BATCH = 1024  # samples per batch for validation and predictions

Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


class DataSource:
    """What the runner reads; see the module docstring."""

    name: str
    task: str
    num_classes: int
    class_names: list[str]
    info: dict[str, Any]
    dataset: Dataset | None = None  # a built-in dataset (OOD / shift sets exist for some)
    #: every split held as tensors in this process (no user ``DataLoader``, whose worker
    #: processes a forked process could not start: :mod:`cogcal.train.background`)
    in_memory: bool = True

    def train_loader(self, batch_size: int, *, world: int, rank: int, seed: int, device: Any):
        raise NotImplementedError

    def val_loader(self, *, world: int, rank: int, device: Any) -> Batches:
        raise NotImplementedError

    def split(self, name: str) -> Batches | None:
        """All of ``"val"`` or ``"test"`` in order (None: no such split)."""
        raise NotImplementedError


class DatasetSource(DataSource):
    """The splits of a :class:`cogcal.data.Dataset`."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.name = dataset.name
        self.task = dataset.task
        self.num_classes = dataset.num_classes
        self.class_names = list(dataset.class_names)
        self.info = dataset.info

    def train_loader(self, batch_size: int, *, world: int, rank: int, seed: int, device: Any):
        return self.dataset.loader(
            "train", batch_size, seed=seed, num_replicas=world, rank=rank, device=device
        )

    def val_loader(self, *, world: int, rank: int, device: Any) -> Batches:
        return self.dataset.loader(
            "val", EVAL_BATCH, pad=False, num_replicas=world, rank=rank, device=device
        )

    def split(self, name: str) -> Batches:
        return self.dataset.loader(name, EVAL_BATCH, shuffle=False)


@dataclass
class _Epochs:
    """A user ``DataLoader`` as a training loader: ``len`` and a ``set_epoch`` that its
    sampler honours when it has one (shuffling otherwise follows the global RNG, which the
    loop reseeds at every epoch, so runs still repeat and resume exactly)."""

    loader: DataLoader

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


@dataclass
class _OnDevice:
    """Batches moved to ``device`` (user loaders yield CPU tensors)."""

    batches: Any
    device: Any = None

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.batches, "set_epoch"):
            self.batches.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in self.batches:
            if self.device is not None:
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            yield x, y


@dataclass
class LoaderSource(DataSource):
    """Training and validation data given in Python (:func:`cogcal.fit`).

    ``train``/``val`` are either pairs of tensors ``(x, y)`` (served by a
    :class:`~cogcal.data.BatchLoader`, the fast path) or ``DataLoader`` s used as given
    (the training one must shuffle itself; validation order does not matter).
    """

    name: str
    task: str
    num_classes: int
    train: tuple[torch.Tensor, torch.Tensor] | DataLoader
    val: tuple[torch.Tensor, torch.Tensor] | DataLoader
    class_names: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    dataset: Dataset | None = None

    @property
    def in_memory(self) -> bool:  # type: ignore[override]
        return not isinstance(self.train, DataLoader) and not isinstance(self.val, DataLoader)

    def train_loader(self, batch_size: int, *, world: int, rank: int, seed: int, device: Any):
        if isinstance(self.train, DataLoader):
            return _OnDevice(_Epochs(self.train), device)
        x, y = self.train
        return BatchLoader(
            x, y, batch_size=batch_size, shuffle=True, seed=seed, num_replicas=world, rank=rank,
            device=device,
        )  # fmt: skip

    def val_loader(self, *, world: int, rank: int, device: Any) -> Batches:
        if isinstance(self.val, DataLoader):
            return _OnDevice(self.val, device)
        x, y = self.val
        return BatchLoader(
            x, y, batch_size=EVAL_BATCH, shuffle=False, pad=False, num_replicas=world,
            rank=rank, device=device,
        )  # fmt: skip

    def split(self, name: str) -> Batches | None:
        if name != "val":
            return None
        if isinstance(self.val, DataLoader):
            return self.val
        x, y = self.val
        return BatchLoader(x, y, batch_size=EVAL_BATCH, shuffle=False)
