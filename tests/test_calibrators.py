"""Post-hoc calibrators: recovery of known parameters, held-out gains, and input errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cogcal.calibrators import (
    MatrixScaling,
    TaskAffine,
    TaskTemperature,
    Temperature,
    TSTHead,
    VectorScaling,
    VTSTHead,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _sample_labels(true_logits: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(true_logits.double(), 1)
    return torch.multinomial(probs, 1, generator=g)[:, 0]


def _true_logits(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randint(0, k, (n,), generator=g)
    return torch.randn(n, k, generator=g) + 2.5 * F.one_hot(centers, k)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.5, 2.0, 3.0])
def test_temperature_recovers_known_temperature_float32(temperature):
    z = _true_logits(60_000, 10)
    y = _sample_labels(z)
    observed = (z * temperature).float()  # logits `temperature` times too sharp
    t = Temperature().fit(observed, y)
    assert t.temperature == pytest.approx(temperature, rel=0.01)
    assert t.nll_after_ < t.nll_before_ or temperature == 1.0
    # calibrated logits equal the truth up to the fitted temperature error
    assert torch.allclose(t(observed), z, atol=0.05 * z.abs().max())
    assert t.log_temperature.dtype == torch.float32


@pytest.mark.slow
def test_temperature_fit_is_exact_mle_against_grid_search():
    z = _true_logits(3_000, 5, seed=1) * 1.7
    y = _sample_labels(z / 1.7, seed=1)
    grid = torch.linspace(0.5, 4.0, 3501, dtype=torch.float64)
    nll = torch.stack([F.cross_entropy(z.double() / g, y) for g in grid])
    mle = float(grid[nll.argmin()])
    assert Temperature(l2=0.0).fit(z, y).temperature == pytest.approx(mle, abs=2e-3)
    # the default prior on log T moves an ordinary fit by far less than 1%
    assert Temperature().fit(z, y).temperature == pytest.approx(mle, rel=0.01)


def test_matrix_scaling_beats_temperature_on_class_dependent_miscalibration():
    k = 6
    z = _true_logits(24_000, k, seed=2)
    y = _sample_labels(z, seed=2)
    scale = torch.tensor([0.3, 0.6, 1.0, 1.5, 2.5, 4.0])
    shift = torch.tensor([1.0, -0.5, 0.0, 0.5, -1.0, 0.0])
    observed = z * scale + shift  # each class miscalibrated differently
    fit_idx, held = slice(0, 12_000), slice(12_000, None)
    ts = Temperature().fit(observed[fit_idx], y[fit_idx])
    # a fixed, weak penalty: this test is about the families (cross-validation has its own)
    ms = MatrixScaling(k, l2=1.0).fit(observed[fit_idx], y[fit_idx])
    vs = VectorScaling(l2=1.0).fit(observed[fit_idx], y[fit_idx])
    with torch.no_grad():
        nll_ts = F.cross_entropy(ts(observed[held]), y[held]).item()
        nll_ms = F.cross_entropy(ms(observed[held]), y[held]).item()
        nll_vs = F.cross_entropy(vs(observed[held]), y[held]).item()
        nll_true = F.cross_entropy(z[held], y[held]).item()
    assert nll_ms < nll_ts - 0.02
    assert nll_vs < nll_ts - 0.02
    assert nll_ms == pytest.approx(nll_true, abs=0.01)  # vector scaling's family holds the truth


def test_calibrators_start_at_identity():
    z = torch.randn(7, 4)
    for cal in (Temperature(), VectorScaling(4), MatrixScaling(4)):
        assert torch.allclose(cal(z), z)
    zt = torch.randn(7, 3)
    for cal in (TaskTemperature(3), TaskAffine(3)):
        assert torch.allclose(cal(zt), zt)


def test_lazy_width_from_fit_and_state_dict_round_trip():
    z = torch.randn(500, 5)
    y = z.argmax(1)
    ms = MatrixScaling(l2=1.0).fit(z, y)
    assert ms.num_outputs == 5 and ms.weight.shape == (5, 5)
    fresh = MatrixScaling()
    fresh.load_state_dict(ms.state_dict())
    assert torch.equal(fresh(z), ms(z))
    tt = TaskTemperature().fit(torch.randn(100, 3), torch.randint(0, 2, (100, 3)))
    fresh_tt = TaskTemperature()
    fresh_tt.load_state_dict(tt.state_dict())
    assert torch.equal(fresh_tt.temperature, tt.temperature)


def test_unbuilt_calibrator_forward_says_how_to_fix():
    with pytest.raises(RuntimeError, match="call .fit"):
        VectorScaling()(torch.randn(2, 3))


def test_task_temperature_recovers_per_task_temperatures():
    g = torch.Generator().manual_seed(3)
    n, temps = 40_000, torch.tensor([0.5, 1.0, 2.0, 4.0])
    true = torch.randn(n, 4, generator=g) * 2
    targets = torch.bernoulli(torch.sigmoid(true), generator=g)
    t = TaskTemperature(4).fit(true * temps, targets)
    assert torch.allclose(t.temperature, temps, rtol=0.03)


def test_task_affine_matches_per_task_platt_fit():
    g = torch.Generator().manual_seed(4)
    true = torch.randn(20_000, 3, generator=g)
    targets = torch.bernoulli(torch.sigmoid(true), generator=g)
    a, b = torch.tensor([2.0, 0.5, 1.0]), torch.tensor([0.5, 0.0, -1.0])
    cal = TaskAffine(l2=0.0).fit(true * a + b, targets)  # Platt: maximum likelihood
    assert torch.allclose(cal.weight.detach(), 1 / a, rtol=0.05)
    assert torch.allclose(cal.bias.detach(), -b / a, atol=0.05)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_fit_accepts_every_float_dtype(dtype):
    z = _true_logits(5_000, 4, seed=5)
    y = _sample_labels(z, seed=5)
    t = Temperature().fit((z * 2).to(dtype), y)
    assert t.temperature == pytest.approx(2.0, rel=0.06)
    assert t(z.to(dtype)).dtype == dtype


BAD_INPUTS = [
    (
        "NaN",
        lambda z, y: (
            z.index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(float("nan"))),
            y,
        ),
        "NaN",
    ),
    (
        "Inf",
        lambda z, y: (
            z.index_put_((torch.tensor([1]), torch.tensor([2])), torch.tensor(float("inf"))),
            y,
        ),
        "infinite",
    ),
    ("length", lambda z, y: (z, y[:-1]), "rows"),
    ("range", lambda z, y: (z, y + 10), r"\[0, 3\]"),
    ("negative", lambda z, y: (z, y - 5), r"\[0, 3\]"),
    ("empty", lambda z, y: (z[:0], y[:0]), "empty"),
    ("1-D logits", lambda z, y: (z[:, 0], y), "2-D"),
    ("2-D labels", lambda z, y: (z, y[:, None]), "1-D"),
    ("probability labels", lambda z, y: (z, torch.rand(len(y))), "integer"),
    ("integer logits", lambda z, y: (z.long(), y), "floating"),
]


@pytest.mark.parametrize("make", [Temperature, VectorScaling, MatrixScaling])
@pytest.mark.parametrize(("name", "corrupt", "message"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_value_error_naming_it(make, name, corrupt, message):
    z, y = torch.randn(20, 4), torch.randint(0, 4, (20,))
    bad_z, bad_y = corrupt(z.clone(), y.clone())
    with pytest.raises(ValueError, match=message):
        make().fit(bad_z, bad_y)


def test_width_mismatch_and_bad_hyperparameters():
    with pytest.raises(ValueError, match="built for 3 classes"):
        MatrixScaling(3).fit(torch.randn(10, 4), torch.randint(0, 4, (10,)))
    with pytest.raises(ValueError, match="num_classes"):
        MatrixScaling(0)
    with pytest.raises(ValueError, match="max_iter"):
        Temperature(max_iter=0)
    with pytest.raises(ValueError, match="l2"):
        VectorScaling(3, l2=-1.0)
    with pytest.raises(ValueError, match="'cv'"):
        MatrixScaling(3, l2="auto")
    with pytest.raises(ValueError, match="0/1"):
        TaskTemperature(2).fit(torch.randn(5, 2), torch.full((5, 2), 2))


def test_tst_head_architecture():
    head = TSTHead(64, 10)
    assert head.latent_dim == 128 and TSTHead(64, 100).latent_dim == 512
    assert TSTHead(64, 7).latent_dim == 256
    shapes = [tuple(m.weight.shape) for m in head.modules() if isinstance(m, torch.nn.Linear)]
    assert shapes == [(384, 64), (128, 384), (10, 128)]
    assert head(torch.randn(3, 64)).shape == (3, 10)


def test_vtst_head_predictive_logits_and_kl():
    torch.manual_seed(0)
    head = VTSTHead(16, 5, latent_dim=8, num_samples=10).eval()
    x = torch.randn(4, 16)
    torch.manual_seed(1)
    logits = head(x)
    # recompute by hand: 10 fixed standard-normal draws from a generator seeded with 0, the
    # same for every input (so neither the global RNG nor the batch changes a prediction)
    eps = torch.randn(10, 8, generator=torch.Generator().manual_seed(0))
    mu, log_var = head.encoder(x), head.log_var(x)
    z = mu[None] + eps[:, None, :] * (0.5 * log_var).exp()
    probs = torch.softmax(head.classifier(z), -1).mean(0)
    assert torch.allclose(torch.softmax(logits, -1), probs, atol=1e-6)
    torch.manual_seed(2)
    assert torch.equal(head(x), logits)
    assert torch.allclose(head(x[2:]), logits[2:], atol=1e-6)  # rounding of another batch
    assert torch.allclose(logits.exp().sum(-1), torch.ones(4), atol=1e-5)  # log of a mean softmax
    assert bool((log_var <= 0).all())
    # KL by hand: 0.5 * sum(var + mu^2 - 1 - log var) / Z, batch mean
    head.train()
    _, kl = head.forward_with_kl(x)
    expected = (0.5 * (log_var.exp() + mu**2 - 1 - log_var)).sum(1).div(8).mean()
    assert kl.item() == pytest.approx(expected.item(), rel=1e-5)
    assert math.isfinite(kl.item()) and kl.item() >= 0


def test_make_calibrator_builds_each_kind_and_refuses_unknown_ones():
    from cogcal.calibrators import make_calibrator

    assert isinstance(make_calibrator("ts"), Temperature)
    assert isinstance(make_calibrator("vs", num_outputs=3), VectorScaling)
    ms = make_calibrator("ms", num_outputs=3)
    assert isinstance(ms, MatrixScaling) and ms.weight.shape == (3, 3)
    assert isinstance(make_calibrator("ts", "multilabel", 4), TaskTemperature)
    assert isinstance(make_calibrator("ms", "multilabel", 4), TaskAffine)
    with pytest.raises(ValueError, match="'ts', 'vs', 'ms'"):
        make_calibrator("gamma")
