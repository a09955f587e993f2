"""Bayesian binning into quantiles: netcal's BBQ, a direct model average, the BDeu score by
hand, buffers and errors."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from cogcal.calibrators import BBQ
from cogcal.calibrators.bbq import _binning_model, _quantile_edges, bin_counts_range

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    return 3.0 * (rng.normal(size=(n, k)) + 1.2 * np.eye(k)[y]), y


def _softmax(z: np.ndarray) -> np.ndarray:
    return torch.softmax(torch.as_tensor(z, dtype=torch.float64), dim=1).numpy()


def _nll(p: np.ndarray, y: np.ndarray) -> float:
    return float(-np.mean(np.log(p[np.arange(y.size), y])))


def _floored(q: np.ndarray, eps: float) -> np.ndarray:
    """Our floor and renormalisation, applied to a peer's output for a like-for-like NLL."""
    if q.shape[1] == 2:
        q1 = np.clip(q[:, 1], eps, 1 - eps)
        return np.stack([1 - q1, q1], 1)
    q = np.maximum(q, eps)
    return q / q.sum(1, keepdims=True)


@pytest.mark.parametrize("k", [2, 5])
def test_uniform_bins_with_bic_match_netcal_bbq(k):
    """``binning="uniform", score="bic"`` is netcal's BBQ: within 0.002 test NLL (with the
    same floor applied to netcal's probabilities, which can be exactly 0)."""
    binning = pytest.importorskip("netcal.binning")
    z, y = _data(2000, k, seed=k)
    zt, yt = _data(3000, k, seed=k + 10)
    p, pt = _softmax(z), _softmax(zt)
    ours = BBQ(binning="uniform", score="bic").fit(z, y).predict_proba(zt)
    peer = binning.BBQ()
    if k == 2:
        peer.fit(p[:, 1], y)
        q1 = peer.transform(pt[:, 1])
        q = np.stack([1 - q1, q1], 1)
    else:
        peer.fit(p, y)
        q = peer.transform(pt)
    assert abs(_nll(ours, yt) - _nll(_floored(q, 1 / (2 * y.size)), yt)) < 0.002


def test_bin_counts_range_is_the_papers():
    for n in (30, 1000, 2500, 60000):
        root = n ** (1 / 3)
        low = int(max(1, np.floor(root / 10)))
        high = int(min(np.ceil(n / 5), np.ceil(root * 10)))
        assert bin_counts_range(n) == range(low, high + 1)


def test_bdeu_score_and_predictions_by_hand():
    x = np.array([0.05, 0.1, 0.2, 0.35, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95])
    y = np.array([0, 0, 1, 0, 0, 1, 1, 0, 1, 1], dtype=float)
    edges = _quantile_edges(x, 2)
    assert edges.tolist() == [0.5]
    values, score = _binning_model(x, y, edges, "bdeu", 2.0)
    # two bins, [0, 0.5] and [0.5, 1], prior strength 1 each, centred on 0.25 and 0.75
    expected, by_hand = [], 0.0
    for mask, mid in ((x <= 0.5, 0.25), (x > 0.5, 0.75)):
        n, m, s = mask.sum(), y[mask].sum(), 1.0
        a, b = s * mid, s * (1 - mid)
        expected.append((m + a) / (n + s))
        by_hand += (
            math.lgamma(s) - math.lgamma(n + s) + math.lgamma(m + a) - math.lgamma(a)
            + math.lgamma(n - m + b) - math.lgamma(b)
        )  # fmt: skip
    np.testing.assert_allclose(values, expected, rtol=1e-12)
    assert score == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize(("binning", "score"), [("quantile", "bdeu"), ("uniform", "bic")])
def test_the_fitted_map_is_the_weighted_average_of_the_binning_models(binning, score):
    z, y = _data(600, 2, seed=1)
    x = _softmax(z)[:, 1]
    bbq = BBQ(binning=binning, score=score, eps=1e-6).fit(z, y)
    p_new = _softmax(_data(500, 2, seed=2)[0])[:, 1]
    models = []
    for n_bins in bin_counts_range(x.size):
        if binning == "quantile":
            edges = _quantile_edges(np.sort(x), n_bins)
        else:
            edges = np.linspace(0, 1, n_bins + 1)[1:-1]
        values, s = _binning_model(x, y.astype(float), edges, score, 2.0)
        models.append((values[np.searchsorted(edges, p_new, side="left")], s))
    scores = np.array([s for _, s in models])
    weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    ref = sum(w * v for (v, _), w in zip(models, weights, strict=True))
    logits = np.stack([np.zeros_like(p_new), np.log(p_new) - np.log1p(-p_new)], 1)
    q1 = bbq.predict_proba(logits)[:, 1]
    np.testing.assert_allclose(q1, np.clip(ref, 1e-6, 1 - 1e-6), atol=1e-9)


def test_one_vs_rest_is_renormalised_and_beats_the_raw_model():
    z, y = _data(1500, 4, seed=3)
    zt, yt = _data(2000, 4, seed=4)
    bbq = BBQ(multiclass="one-vs-rest").fit(z, y)
    assert bbq.values.shape[0] == 4 and bbq.num_outputs == 4
    q = bbq.predict_proba(zt)
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-12)
    assert _nll(q, yt) < _nll(_softmax(zt), yt)
    # the default (the paper's BDeu over equal-mass bins) never predicts exactly 0
    assert q.min() > 1 / (2 * 1500)
    # by hand: each class's own map of p_k (fitted alone, as for two classes), renormalised
    p, pt = _softmax(z), _softmax(zt)
    ref = np.stack(
        [_one_map(p[:, c], (y == c).astype(float), pt[:, c]) for c in range(4)], 1
    )  # fmt: skip
    ref = np.maximum(ref, 1 / (2 * 1500))
    np.testing.assert_allclose(q, ref / ref.sum(1, keepdims=True), rtol=0, atol=1e-12)


def _one_map(x: np.ndarray, y: np.ndarray, x_new: np.ndarray) -> np.ndarray:
    """BBQ's default map of scores ``x`` to labels ``y`` at ``x_new``: the BDeu-weighted
    average of the equal-mass binnings (the model average of the test above, by hand)."""
    models = []
    for n_bins in bin_counts_range(x.size):
        edges = _quantile_edges(np.sort(x), n_bins)
        values, s = _binning_model(x, y, edges, "bdeu", 2.0)
        models.append((values[np.searchsorted(edges, x_new, side="left")], s))
    scores = np.array([s for _, s in models])
    weights = np.exp(scores - scores.max())
    return sum(w * v for (v, _), w in zip(models, weights / weights.sum(), strict=True))


def test_top_label_by_hand_keeps_every_rows_top_label():
    """The default for K > 2: the predicted class gets the BBQ map of the confidence to the
    accuracy; the others share the rest in proportion to their one-vs-rest maps, flattened
    toward uniform just enough to stay below it."""
    k, eps = 5, 1e-4
    z, y = _data(1200, k, seed=21)
    zt, _ = _data(3000, k, seed=22)
    zt = zt * 2.0  # past the fitted confidences too
    bbq = BBQ(eps=eps).fit(z, y)
    assert bbq.values.shape[0] == k + 1 and bbq.num_outputs == k
    p, pt = _softmax(z), _softmax(zt)
    rows, top = np.arange(len(pt)), pt.argmax(1)
    q_top = _one_map(p.max(1), (p.argmax(1) == y).astype(float), pt.max(1))
    q_top = np.clip(q_top, (1 + 1e-6) / k, 1 - eps)
    share = np.stack([_one_map(p[:, c], (y == c).astype(float), pt[:, c]) for c in range(k)], 1)
    share = np.maximum(share, eps)
    share[rows, top] = 0
    share /= share.sum(1, keepdims=True)
    limit = q_top * (1 - 1e-6) / (1 - q_top)
    peak = share.max(1)
    mix = np.where(peak <= limit, 1.0, (limit - 1 / (k - 1)) / (peak - 1 / (k - 1)))
    ref = (1 - q_top)[:, None] * (mix[:, None] * share + (1 - mix[:, None]) / (k - 1))
    ref[rows, top] = q_top
    ref = np.maximum(ref, eps)
    ref /= ref.sum(1, keepdims=True)
    q = bbq.predict_proba(zt)
    np.testing.assert_allclose(q, ref, rtol=0, atol=1e-12)
    assert (q.argmax(1) == top).all()
    assert (mix < 1).any()  # the flattening is exercised


@pytest.mark.parametrize("k", [3, 10, 40])
def test_top_label_keeps_accuracy_where_one_vs_rest_loses_it(k):
    # over-confident logits, 40 validation rows per class: the one-vs-rest maps change the
    # arg-max of many rows, mostly for the worse; the default keeps every row's
    z, y = _data(40 * k, k, seed=30 + k)
    zt, yt = _data(4000, k, seed=60 + k)
    raw = _softmax(zt)
    q = BBQ().fit(z, y).predict_proba(zt)
    assert (q.argmax(1) == raw.argmax(1)).all()
    assert _nll(q, yt) < _nll(raw, yt)
    ovr = BBQ(multiclass="one-vs-rest").fit(z, y).predict_proba(zt)
    assert (ovr.argmax(1) != raw.argmax(1)).any()


def test_state_dict_round_trip_errors_and_width():
    z, y = _data(400, 3, seed=5)
    bbq = BBQ().fit(z, y)
    buffer = io.BytesIO()
    torch.save(bbq.state_dict(), buffer)
    buffer.seek(0)
    fresh = BBQ()
    fresh.load_state_dict(torch.load(buffer))
    np.testing.assert_allclose(fresh.predict_proba(z), bbq.predict_proba(z), rtol=0, atol=0)
    assert repr(fresh) == (
        "BBQ(num_classes=3, binning='quantile', score='bdeu', multiclass='top-label')"
    )
    with pytest.raises(RuntimeError, match=r"maps for 2 \(with multiclass='top-label'\)"):
        BBQ(num_classes=4).load_state_dict(BBQ(multiclass="one-vs-rest").fit(z, y).state_dict())
    with pytest.raises(ValueError, match="has 4 columns but BBQ was built for 3 classes"):
        bbq.predict_proba(np.zeros((2, 4)))
    with pytest.raises(RuntimeError, match="not fitted yet"):
        BBQ().predict_proba(z)
    with pytest.raises(ValueError, match="`binning` must be one of"):
        BBQ(binning="width")
    with pytest.raises(ValueError, match="`score` must be one of"):
        BBQ(score="aic")
    with pytest.raises(ValueError, match="`multiclass` must be one of"):
        BBQ(multiclass="ovr")
    with pytest.raises(ValueError, match="`prior_strength` must be"):
        BBQ(prior_strength=0)
    with pytest.raises(ValueError, match="`eps`"):
        BBQ(eps=0.7)
