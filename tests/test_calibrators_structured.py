"""Laplace-smoothed temperature scaling and structured vector / matrix scaling (SVS, SMS):
hand computations, scikit-learn, probmetrics (peers venv only), shapes and errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from cogcal.calibrators import (
    KINDS,
    LaplaceTemperature,
    StructuredMatrixScaling,
    StructuredVectorScaling,
    Temperature,
    auto_candidates,
    make_calibrator,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Over-confident logits with some class confusion (labels drawn from a softened model)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = 3.0 * (rng.normal(size=(n, k)) + 1.3 * np.eye(k)[y])
    return z, y


def _nll(p: np.ndarray, y: np.ndarray) -> float:
    return float(-np.mean(np.log(p[np.arange(y.size), y])))


def _softmax(z: np.ndarray) -> np.ndarray:
    return torch.softmax(torch.as_tensor(z, dtype=torch.float64), dim=1).numpy()


def _smoothed(z: np.ndarray, t: float, a: float) -> np.ndarray:
    return (1.0 - a) * _softmax(z / t) + a / z.shape[1]


def test_laplace_temperature_is_temperature_scaling_mixed_with_uniform():
    z, y = _data(700, 4, seed=0)
    zt, _ = _data(500, 4, seed=1)
    lts = LaplaceTemperature().fit(z, y)
    t = Temperature().fit(z, y).temperature
    assert lts.temperature == pytest.approx(t, rel=1e-6)
    assert float(lts.smoothing) == pytest.approx(1 / 701)
    np.testing.assert_allclose(lts.predict_proba(zt), _smoothed(zt, t, 1 / 701), atol=1e-6)
    # the output is log q: softmax(output) = q, and no probability falls below a / K
    np.testing.assert_allclose(np.exp(lts(zt)), lts.predict_proba(zt), rtol=1e-6)
    assert lts.predict_proba(100.0 * np.eye(4)).min() >= (1 / 701) / 4 * (1 - 1e-6)
    assert lts.nll_after_ < lts.nll_before_


def _features(z: np.ndarray, cal) -> np.ndarray:
    return np.log(_smoothed(z, cal.temperature, float(cal.smoothing)))


@pytest.mark.parametrize("cls", [StructuredVectorScaling, StructuredMatrixScaling])
def test_structured_scaling_minimises_the_documented_objective(cls):
    """The fitted (W, b) is a stationary point of the penalised objective written out in
    numpy from the class docstring (gradient by finite differences of that function)."""
    k, n = 4, 600
    z, y = _data(n, k, seed=2)
    cal = cls(l2=3.0).fit(z, y)
    x = _features(z, cal)
    full = cls is StructuredMatrixScaling

    def objective(theta: np.ndarray) -> float:
        w = theta[: k * k].reshape(k, k) if full else theta[:k]
        b = theta[-k:]
        out = x @ w.T + b if full else x * w + b
        out = out - out.max(1, keepdims=True)
        logp = out - np.log(np.exp(out).sum(1, keepdims=True))
        diag = np.diagonal(w) if full else w
        penalty = k * (((diag - 1) ** 2).sum() + (b**2).sum())
        if full:
            penalty += k * (k - 1) * ((w * (1 - np.eye(k))) ** 2).sum()
        return float(-logp[np.arange(n), y].sum() + 3.0 * penalty) / n

    theta = np.r_[cal.weight.double().numpy().ravel(), cal.bias.double().numpy()]
    h = 1e-6
    grad = [
        (objective(theta + h * e) - objective(theta - h * e)) / (2 * h) for e in np.eye(theta.size)
    ]
    assert np.abs(grad).max() < 2e-5
    np.testing.assert_allclose(cal.predict_proba(z)[:5], _softmax_out(x[:5], cal), atol=1e-5)


def _softmax_out(x: np.ndarray, cal) -> np.ndarray:
    w, b = cal.weight.double().numpy(), cal.bias.double().numpy()
    return _softmax(x @ w.T + b if w.ndim == 2 else x * w + b)


def test_unpenalised_sms_is_multinomial_logistic_regression_on_the_smoothed_log_probs():
    linear_model = pytest.importorskip("sklearn.linear_model")
    z, y = _data(900, 3, seed=3)
    sms = StructuredMatrixScaling(l2=0.0).fit(z, y)
    x = _features(z, sms)
    ref = linear_model.LogisticRegression(C=np.inf, tol=1e-10, max_iter=10_000).fit(x, y)
    assert sms.nll_after_ == pytest.approx(_nll(ref.predict_proba(x), y), abs=1e-6)


def test_a_strong_penalty_gives_laplace_smoothed_temperature_scaling():
    z, y = _data(500, 5, seed=4)
    lts = LaplaceTemperature().fit(z, y)
    for cls in (StructuredVectorScaling, StructuredMatrixScaling):
        cal = cls(l2=1e9).fit(z, y)
        np.testing.assert_allclose(cal.predict_proba(z), lts.predict_proba(z), atol=1e-5)


@pytest.mark.parametrize(("k", "n"), [(4, 800), (10, 2000), (30, 1500)])
def test_against_probmetrics_on_the_same_logits(k, n):
    """Within 0.002 test NLL of probmetrics' ts-mix, SVS and SMS (run in the peers venv)."""
    pytest.importorskip("probmetrics")
    from probmetrics.calibrators import get_calibrator  # noqa: PLC0415 - optional peer

    z, y = _data(n, k, seed=k)
    zt, yt = _data(3000, k, seed=k + 100)
    p, pt = _softmax(z), _softmax(zt)
    for cls, name in [
        (LaplaceTemperature, "ts-mix"),
        (StructuredVectorScaling, "svs"),
        (StructuredMatrixScaling, "sms"),
    ]:
        ours = _nll(cls().fit(z, y).predict_proba(zt), yt)
        peer = get_calibrator(name)
        peer.fit(p, y)
        assert abs(ours - _nll(peer.predict_proba(pt), yt)) < 0.002, name


@pytest.mark.parametrize("cls", [StructuredVectorScaling, StructuredMatrixScaling])
def test_shapes_state_dict_and_arrays(cls):
    z, y = _data(300, 3, seed=5)
    cal = cls().fit(z, y)
    assert cal.num_outputs == 3 and repr(cal) == f"{cls.__name__}(num_classes=3)"
    assert cal.weight.shape == ((3, 3) if cls is StructuredMatrixScaling else (3,))
    out = cal(z[:7].astype(np.float32))
    assert isinstance(out, np.ndarray) and out.shape == (7, 3) and out.dtype == np.float32
    t = cal(torch.as_tensor(z[:2]))
    assert isinstance(t, torch.Tensor) and not t.requires_grad
    buffer = io.BytesIO()
    torch.save(cal.state_dict(), buffer)
    buffer.seek(0)
    fresh = cls()
    fresh.load_state_dict(torch.load(buffer))
    np.testing.assert_allclose(fresh.predict_proba(z), cal.predict_proba(z), atol=1e-7)
    assert fresh.temperature == pytest.approx(cal.temperature)


@pytest.mark.filterwarnings("ignore::cogcal.calibrators.L2GridEdgeWarning")
@pytest.mark.parametrize(
    "cls", [LaplaceTemperature, StructuredVectorScaling, StructuredMatrixScaling]
)
def test_cross_validated_strength(cls):
    z, y = _data(400, 3, seed=6)
    cal = cls(l2="cv", cv=3, l2_grid=(0.0, 1.0, 100.0)).fit(z, y)
    assert cal.l2_ in (0.0, 1.0, 100.0) and cal.cv_scores_.shape == (3,)


def test_errors_bad_input_and_width():
    z, y = _data(200, 3, seed=7)
    sms = StructuredMatrixScaling().fit(z, y)
    with pytest.raises(ValueError, match="has 4 columns but StructuredMatrixScaling was built"):
        sms.predict_proba(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="has 4 columns but StructuredVectorScaling was built"):
        StructuredVectorScaling(3).fit(np.zeros((5, 4)), np.arange(5) % 4)
    with pytest.raises(RuntimeError, match="no parameters yet"):
        StructuredVectorScaling().predict_proba(z)
    with pytest.raises(ValueError, match="`l2` must be"):
        StructuredMatrixScaling(l2=-1.0)
    with pytest.raises(ValueError, match="`num_classes` must be at least 2"):
        StructuredVectorScaling(1)
    with pytest.raises(ValueError, match="labels"):
        LaplaceTemperature().fit(z, np.full(200, 5))
    with pytest.raises(ValueError, match="logits"):
        StructuredVectorScaling().fit(np.full((4, 3), np.nan), np.arange(4) % 3)


def test_registered_kinds_and_auto_candidates():
    assert {"ts-laplace", "svs", "sms"} <= set(KINDS.names())
    assert isinstance(make_calibrator("ts-laplace"), LaplaceTemperature)
    assert make_calibrator("sms", num_outputs=4).weight.shape == (4, 4)
    assert isinstance(make_calibrator("svs"), StructuredVectorScaling)
    assert auto_candidates(10)[-3:] == ("ts-laplace", "svs", "sms")


def test_sms_folds_sharing_a_preconditioner_score_as_folds_with_their_own(monkeypatch):
    """The folds of ``cross_validated_nll`` (``auto``) share SMS's preconditioner, computed
    once on all the data (``fold_share``): the same held-out NLLs as folds that each compute
    their own, to the scoring fits' tolerance."""
    from cogcal.calibrators import structured
    from cogcal.posthoc import fold_share, held_out_nlls

    z, y = (torch.as_tensor(a) for a in _data(n=600, k=40, seed=3))
    shared = fold_share("sms", z, y)
    assert set(shared) == {"_fold_curvature", "_shared_blocks"}
    factorised = []
    row_blocks = structured._row_blocks
    monkeypatch.setattr(
        structured, "_row_blocks", lambda *a: factorised.append(1) or row_blocks(*a)
    )
    with_shared = held_out_nlls(z, y, "sms")
    assert len(factorised) == 1  # once for the five folds
    monkeypatch.setattr(StructuredMatrixScaling, "_fold_share", lambda self, z, y: {})
    alone = held_out_nlls(z, y, "sms")
    assert len(factorised) == 1 + 5
    # (fits to a gradient of 1e-4: each sample's NLL within 1e-3, their mean within 1e-5)
    torch.testing.assert_close(with_shared, alone, rtol=0, atol=1e-3)
    assert float(with_shared.mean()) == pytest.approx(float(alone.mean()), abs=1e-5)
    assert fold_share("svs", z, y) == {} and fold_share("ms", z, y) == {}
