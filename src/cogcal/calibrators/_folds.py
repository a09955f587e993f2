"""Cross-validation folds: the seeded assignment of samples to folds."""

from __future__ import annotations

import torch

#: Seed of the permutation that assigns samples to cross-validation folds.
CV_SEED = 0


def _stratified_folds(y: torch.Tensor, k: int, seed: int = CV_SEED) -> torch.Tensor:
    """Fold index (0..k-1) of each of the N labels in ``y``, stratified by class.

    The samples are permuted with a generator seeded by ``seed``, stably sorted by class,
    and dealt to the folds in turn, so every fold holds ``floor(n_c / k)`` or
    ``ceil(n_c / k)`` samples of each class ``c`` and the fold sizes differ by at most one.
    The assignment depends only on ``y``, ``k`` and ``seed``.
    """
    labels = y.detach().cpu().long()
    n = labels.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    order = perm[torch.argsort(labels[perm], stable=True)]
    folds = torch.empty(n, dtype=torch.long)
    folds[order] = torch.arange(n) % k
    return folds


def _shuffled_folds(n: int, k: int, seed: int = CV_SEED) -> torch.Tensor:
    """Fold index of each of ``n`` rows: a seeded permutation dealt to the folds in turn."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    folds = torch.empty(n, dtype=torch.long)
    folds[perm] = torch.arange(n) % k
    return folds
