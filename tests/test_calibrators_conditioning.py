"""The block-Jacobi conditioning of the full affine maps: structured matrix scaling's
hand-written closure against autograd, and cross-validation with one preconditioner for
all folds against one per fold."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cogcal.calibrators import Dirichlet, MatrixScaling, StructuredMatrixScaling
from cogcal.calibrators._base import Calibrator, _Problem
from cogcal.calibrators.affine import _RowBlocks


def _data(n: int = 200, k: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = 3.0 * (torch.randn(n, k, generator=g, dtype=torch.float64) + 1.5 * F.one_hot(y, k))
    return z, y


@pytest.mark.parametrize("weight", [0.0, 0.01, 2.0])
def test_structured_matrix_closure_equals_autograd(weight: float) -> None:
    z, y = _data()
    cal = StructuredMatrixScaling(4).double()
    cal._prepare(z, y)
    stats = cal._standardisation(z, weight)
    assert isinstance(stats, _RowBlocks)
    g = torch.Generator().manual_seed(1)
    start = {
        k: v + 0.3 * torch.randn(v.shape, generator=g, dtype=v.dtype)
        for k, v in cal._encode(stats).items()
    }
    ours = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    reference = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    loss = float(cal._closure(ours, _Problem(z, y, stats, weight))())
    with torch.enable_grad():
        closure = Calibrator._closure(cal, reference, _Problem(z, y, stats, weight))
        ref_loss = float(closure().detach())
    assert loss == pytest.approx(ref_loss, rel=1e-12, abs=1e-12)
    for name in ours:
        torch.testing.assert_close(ours[name].grad, reference[name].grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [MatrixScaling, Dirichlet])
def test_cross_validation_with_a_shared_preconditioner_fits_the_same_maps(cls, monkeypatch) -> None:
    z, y = _data(n=300, k=4, seed=3)
    shared = cls().fit(z, y)
    monkeypatch.setattr(cls, "_fold_models", Calibrator._fold_models)
    per_fold = cls().fit(z, y)
    assert shared.l2_ == per_fold.l2_
    torch.testing.assert_close(
        torch.tensor(shared.cv_scores_), torch.tensor(per_fold.cv_scores_), equal_nan=True,
        rtol=0, atol=1e-5,
    )  # fmt: skip
    torch.testing.assert_close(shared.weight, per_fold.weight, rtol=0, atol=1e-5)
