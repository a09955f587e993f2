"""Two-class calibrators: Platt scaling and Beta calibration against scikit-learn's logistic
regression, the refusal of K != 2, shapes and the pending registry entries."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from cogcal.calibrators import KINDS, BetaCalibration, Platt

linear_model = pytest.importorskip("sklearn.linear_model")

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two-class logits, over-confident and shifted, with a non-logistic distortion."""
    rng = np.random.default_rng(seed)
    d = 2.0 * rng.normal(size=n)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-d))).astype(int)
    z1 = 3.0 * d + 0.8 + 0.3 * np.sign(d) * d**2
    return np.stack([rng.normal(size=n), z1 + rng.normal(size=n)], 1), y


def _log_softmax(z: np.ndarray) -> np.ndarray:
    return torch.log_softmax(torch.as_tensor(z, dtype=torch.float64), dim=1).numpy()


def test_unpenalised_platt_is_logistic_regression_on_the_logit_difference():
    z, y = _data(3000, seed=0)
    zt, _ = _data(1000, seed=1)
    platt = Platt(l2=0.0).fit(z, y)
    d = (z[:, 1] - z[:, 0])[:, None]
    ref = linear_model.LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(d, y)
    assert platt.a == pytest.approx(ref.coef_[0, 0], abs=1e-5)
    assert platt.b == pytest.approx(ref.intercept_[0], abs=1e-5)
    q = platt.predict_proba(zt)
    np.testing.assert_allclose(
        q[:, 1], ref.predict_proba((zt[:, 1] - zt[:, 0])[:, None])[:, 1], atol=1e-6
    )
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-12)


def test_penalised_platt_in_scikit_learn_form_equals_its_l2_logistic_regression():
    """The base class's test hooks centre the weight penalty at 0 and leave the bias free:
    then ``l2 = 1 / C``."""
    z, y = _data(500, seed=2)
    platt = Platt(l2=50.0)
    platt._weights_toward_identity, platt._penalize_bias = False, False
    platt.fit(z, y)
    d = (z[:, 1] - z[:, 0])[:, None]
    ref = linear_model.LogisticRegression(C=1 / 50.0, tol=1e-12, max_iter=10_000).fit(d, y)
    assert platt.a == pytest.approx(ref.coef_[0, 0], abs=1e-5)
    assert platt.b == pytest.approx(ref.intercept_[0], abs=1e-5)


def test_unpenalised_beta_is_logistic_regression_on_log_p_and_minus_log_one_minus_p():
    z, y = _data(3000, seed=3)
    zt, _ = _data(2000, seed=4)
    beta = BetaCalibration(l2=0.0).fit(z, y)
    logp = _log_softmax(z)
    features = np.stack([logp[:, 1], -logp[:, 0]], 1)
    ref = linear_model.LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(features, y)
    np.testing.assert_allclose(beta.weight.double().numpy(), ref.coef_[0], atol=1e-5)
    assert float(beta.bias) == pytest.approx(ref.intercept_[0], abs=1e-5)
    logpt = _log_softmax(zt)
    ref_q = ref.predict_proba(np.stack([logpt[:, 1], -logpt[:, 0]], 1))[:, 1]
    np.testing.assert_allclose(beta.predict_proba(zt)[:, 1], ref_q, atol=1e-6)
    # by hand: sigma(a log p - b log(1 - p) + c)
    a, b = beta.weight.double().tolist()
    s = a * logpt[:, 1] - b * logpt[:, 0] + float(beta.bias)
    np.testing.assert_allclose(beta.predict_proba(zt)[:, 1], 1 / (1 + np.exp(-s)), atol=1e-6)
    # Platt's maps are Beta's with a = b (d = log p - log(1 - p)): in-sample, Beta fits better
    platt = Platt(l2=0.0).fit(z, y)
    assert beta.nll_after_ <= platt.nll_after_ + 1e-12


@pytest.mark.parametrize("cls", [Platt, BetaCalibration])
def test_identity_at_start_default_prior_and_frozen_fit(cls):
    z, y = _data(400, seed=5)
    fresh = cls()
    np.testing.assert_allclose(
        fresh.predict_proba(z), torch.softmax(torch.as_tensor(z), 1).numpy(), atol=1e-12
    )
    cal = cls().fit(z, y)  # default l2 = 1: close to maximum likelihood for n = 400
    ml = cls(l2=0.0).fit(z, y)
    np.testing.assert_allclose(cal.predict_proba(z), ml.predict_proba(z), atol=0.01)
    assert cal.nll_after_ < cal.nll_before_
    out = cal(torch.as_tensor(z[:3], dtype=torch.float32))
    assert out.shape == (3, 2) and out.dtype == torch.float32 and not out.requires_grad
    assert cal(z[:3]).shape == (3, 2)


@pytest.mark.parametrize("cls", [Platt, BetaCalibration])
def test_refuses_other_than_two_classes_in_one_line(cls):
    rng = np.random.default_rng(6)
    z3, y3 = rng.normal(size=(30, 3)), np.arange(30) % 3
    message = f"{cls.__name__} is a two-class calibrator: `logits` has 3 columns, it needs 2"
    with pytest.raises(ValueError, match=message) as info:
        cls().fit(z3, y3)
    assert "\n" not in str(info.value)
    z, y = _data(100, seed=7)
    cal = cls().fit(z, y)
    with pytest.raises(ValueError, match=message):
        cal.predict_proba(z3)
    with pytest.raises(ValueError, match=message):
        cal(torch.as_tensor(z3))
    with pytest.raises(ValueError, match="`l2` must be"):
        cls(l2=-1.0)


def test_registry_entries_build_and_refuse_widths():
    pending = {name: KINDS.get(name) for name in ("bbq", "platt", "beta")}
    assert isinstance(pending["platt"].multiclass(2), Platt)
    assert isinstance(pending["beta"].multiclass(None), BetaCalibration)
    with pytest.raises(ValueError, match="Platt is a two-class calibrator"):
        pending["platt"].multiclass(3)
    assert all(e.auto_max_classes == 2 for e in pending.values())
    assert pending["platt"].two_class and not pending["bbq"].two_class


@pytest.mark.parametrize("cls", [Platt, BetaCalibration])
def test_a_fit_warns_about_nothing(cls):
    """The L-BFGS objective hands the line search a detached loss: no torch warning about
    converting a tensor that requires grad (it printed on every `--method platt` run)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    z = np.stack([np.zeros(300), 3 * (y - 0.5) + rng.normal(size=300)], 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls().fit(z, y)
