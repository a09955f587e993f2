"""Losses against hand computations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cogcal import losses


def _data(n=50, k=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 3, torch.randint(0, k, (n,), generator=g)


def test_label_smoothing_eps_over_k_form():
    z, y = _data()
    k, eps = z.shape[1], 0.1
    target = F.one_hot(y, k) * (1 - eps) + eps / k
    expected = -(target * F.log_softmax(z, 1)).sum(1).mean()
    assert torch.allclose(losses.label_smoothing_cross_entropy(z, y), expected, atol=1e-6)


def test_focal_reduces_to_ce_and_matches_formula():
    z, y = _data()
    assert torch.allclose(losses.focal_loss(z, y, gamma=0.0), F.cross_entropy(z, y), atol=1e-6)
    p = torch.softmax(z, 1)[torch.arange(len(y)), y]
    expected = (-((1 - p) ** 3) * p.log()).mean()
    assert torch.allclose(losses.focal_loss(z, y, gamma=3.0), expected, atol=1e-6)


def test_flsd53_switches_gamma_at_0_2():
    z = torch.tensor([[0.0, 3.0], [3.0, 0.0]])  # p_y small for sample 0, large for sample 1
    y = torch.tensor([0, 0])
    p = torch.softmax(z, 1)[:, 0]
    assert p[0] < 0.2 < p[1]
    expected = (-((1 - p[0]) ** 5) * p[0].log() - (1 - p[1]) ** 3 * p[1].log()) / 2
    assert torch.allclose(losses.flsd53_loss(z, y), expected, atol=1e-6)
    # the gamma choice carries no gradient: the gradient equals that of the fixed-gamma losses
    z1 = z.clone().requires_grad_(True)
    losses.flsd53_loss(z1, y).backward()
    z2 = z.clone().requires_grad_(True)
    (
        (
            -((1 - torch.softmax(z2, 1)[0, 0]) ** 5) * F.log_softmax(z2, 1)[0, 0]
            - (1 - torch.softmax(z2, 1)[1, 0]) ** 3 * F.log_softmax(z2, 1)[1, 0]
        )
        / 2
    ).backward()
    assert torch.allclose(z1.grad, z2.grad, atol=1e-6)


def test_multilabel_bce_is_sum_over_tasks_of_means():
    g = torch.Generator().manual_seed(2)
    z, t = torch.randn(30, 4, generator=g), torch.randint(0, 2, (30, 4), generator=g)
    per_task = [F.binary_cross_entropy_with_logits(z[:, j], t[:, j].float()) for j in range(4)]
    assert torch.allclose(losses.multilabel_bce(z, t), sum(per_task), atol=1e-6)
    smooth = t.float() * 0.9 + 0.05
    expected = sum(F.binary_cross_entropy_with_logits(z[:, j], smooth[:, j]) for j in range(4))
    assert torch.allclose(losses.multilabel_bce(z, t, smoothing=0.1), expected, atol=1e-6)


def test_vtst_loss_adds_kl():
    z, y = _data()
    kl = torch.tensor(0.25)
    assert torch.allclose(losses.vtst_loss(z, y, kl), F.cross_entropy(z, y) + 0.25)


def test_losses_reject_bad_input():
    z, y = _data()
    with pytest.raises(ValueError, match="NaN"):
        losses.focal_loss(torch.full_like(z, float("nan")), y)
    with pytest.raises(ValueError, match="smoothing"):
        losses.label_smoothing_cross_entropy(z, y, smoothing=1.5)
    with pytest.raises(ValueError, match="gamma"):
        losses.focal_loss(z, y, gamma=-1.0)
    with pytest.raises(ValueError, match="shape"):
        losses.multilabel_bce(z, y)
