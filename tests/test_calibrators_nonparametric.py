"""Isotonic regression and histogram binning (and BBQ where they share a contract):
references, buffers, export, errors."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

from cogcal.calibrators import (
    BBQ,
    HistogramBinning,
    Isotonic,
    ProbabilitiesAsLogitsWarning,
    make_calibrator,
)
from cogcal.calibrators.nonparametric import _isotonic_knots

isotonic = pytest.importorskip("sklearn.isotonic")

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n: int, k: int, seed: int, decimals: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Over-confident logits; rounded (``decimals``) they give many tied probabilities."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = 3.0 * (rng.normal(size=(n, k)) + 1.2 * np.eye(k)[y])
    return (z if decimals is None else np.round(z, decimals)), y


def _softmax(z: np.ndarray) -> np.ndarray:
    """The probabilities the calibrators see: torch's float64 softmax (tied values must be
    bitwise the same as theirs)."""
    return torch.softmax(torch.as_tensor(z, dtype=torch.float64), dim=1).numpy()


def _new_logits(k: int, seed: int) -> np.ndarray:
    """Test logits reaching past both ends of the fitted probabilities."""
    return 5.0 * np.random.default_rng(seed).normal(size=(3000, k))


def _sklearn_isotonic(p: np.ndarray, y: np.ndarray, p_new: np.ndarray) -> np.ndarray:
    return isotonic.IsotonicRegression(out_of_bounds="clip").fit(p, y).predict(p_new)


@pytest.mark.parametrize("decimals", [None, 1, 0])
def test_binary_isotonic_equals_sklearn_on_the_positive_class(decimals):
    z, y = _data(3000, 2, seed=decimals or 0, decimals=decimals)
    cal = Isotonic().fit(z, y)
    eps = 1 / (2 * len(y))
    assert float(cal.floor) == eps
    for logits in (z, _new_logits(2, seed=1)):
        ref = _sklearn_isotonic(_softmax(z)[:, 1], y, _softmax(logits)[:, 1])
        q = cal.predict_proba(logits)
        np.testing.assert_allclose(q[:, 1], np.clip(ref, eps, 1 - eps), rtol=0, atol=1e-10)
        # q0 = 1 - q1, not renormalised (up to the rounding of softmax(log q))
        np.testing.assert_allclose(q[:, 0], 1.0 - q[:, 1], rtol=0, atol=1e-14)
    if decimals == 0:  # heavy ties: few distinct probabilities, each one point
        assert np.unique(_softmax(z)[:, 1]).size < 40


def test_isotonic_knots_equal_sklearn_on_continuous_targets_and_near_ties():
    rng = np.random.default_rng(3)
    x = np.round(rng.random(2000), 2)
    y = x + rng.normal(scale=0.3, size=x.size)  # any real targets: PAV itself is compared
    t = np.r_[rng.random(500), x, -1.0, 2.0]
    knots, values = _isotonic_knots(x, y)
    np.testing.assert_allclose(np.interp(t, knots, values), _sklearn_isotonic(x, y, t), atol=1e-12)
    # a chain of steps each below 1e-15 that spans more: scikit-learn's grouping rule
    x = np.array([0.3, 0.3 + 6e-16, 0.3 + 12e-16, 0.3 + 18e-16, 0.5, 0.7])
    y = np.array([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    t = np.linspace(0.29, 0.71, 50)
    knots, values = _isotonic_knots(x, y)
    np.testing.assert_allclose(np.interp(t, knots, values), _sklearn_isotonic(x, y, t), atol=1e-12)


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_multiclass_isotonic_is_one_vs_rest_sklearn_clipped_and_renormalised(eps):
    k = 5
    z, y = _data(2500, k, seed=4)
    cal = Isotonic(eps=eps).fit(z, y)
    floor = 1 / (2 * len(y)) if eps is None else eps
    for logits in (z, _new_logits(k, seed=5)):
        p, p_new = _softmax(z), _softmax(logits)
        ref = np.stack([_sklearn_isotonic(p[:, c], y == c, p_new[:, c]) for c in range(k)], 1)
        ref = np.maximum(ref, floor)
        ref /= ref.sum(1, keepdims=True)
        np.testing.assert_allclose(cal.predict_proba(logits), ref, rtol=0, atol=1e-10)
        # the output is log q: its softmax is q itself
        np.testing.assert_allclose(np.exp(cal(logits)), ref, rtol=1e-12)


def _equal_mass_reference(p: np.ndarray, y: np.ndarray, n_bins: int, p_new: np.ndarray):
    """Equal-mass binning by hand (no ties): ``np.array_split`` of the sorted samples, each
    bin's class frequency, new points split at the midpoints between neighbouring bins.

    netcal's ``HistogramBinning`` uses equal-width bins, another convention, so this direct
    computation is the reference."""
    order = np.argsort(p)
    groups = np.array_split(order, n_bins)
    freq = np.array([y[g].mean() for g in groups])
    edges = [(p[a].max() + p[b].min()) / 2 for a, b in zip(groups[:-1], groups[1:], strict=True)]
    return freq[np.searchsorted(np.array(edges), p_new, side="left")]


@pytest.mark.parametrize("n_bins", [15, 7])
def test_binary_histogram_binning_equals_direct_equal_mass_bins(n_bins):
    z, y = _data(1003, 2, seed=6)  # 1003 = 15 * 66 + 13: unequal bin sizes
    cal = HistogramBinning(n_bins=n_bins).fit(z, y)
    eps = 1 / (2 * len(y))
    assert cal.values.shape == (1, n_bins)
    for logits in (z, _new_logits(2, seed=7)):
        ref = _equal_mass_reference(_softmax(z)[:, 1], y, n_bins, _softmax(logits)[:, 1])
        q = cal.predict_proba(logits)
        np.testing.assert_allclose(q[:, 1], np.clip(ref, eps, 1 - eps), rtol=0, atol=1e-12)
        np.testing.assert_allclose(q[:, 0], 1.0 - q[:, 1], rtol=0, atol=1e-14)


def test_multiclass_histogram_binning_is_top_label_with_the_others_scaled():
    # top-label binning (Gupta & Ramdas 2022), by hand: equal-mass bins of the confidence,
    # each predicting its accuracy; the others share the rest in the proportions of p
    k = 4
    z, y = _data(800, k, seed=8)
    cal = HistogramBinning(n_bins=10, eps=1e-4).fit(z, y)
    logits = _new_logits(k, seed=9)
    p, p_new = _softmax(z), _softmax(logits)
    correct = (p.argmax(1) == y).astype(float)
    q_top = _equal_mass_reference(p.max(1), correct, 10, p_new.max(1))
    q_top = np.clip(q_top, (1 + 1e-6) / k, 1 - 1e-4)
    top = p_new.argmax(1)
    share = p_new.copy()
    share[np.arange(len(top)), top] = 0
    share /= share.sum(1, keepdims=True)
    limit = q_top * (1 - 1e-6) / (1 - q_top)
    peak = share.max(1)
    mix = np.where(peak <= limit, 1.0, (limit - 1 / (k - 1)) / (peak - 1 / (k - 1)))
    ref = (1 - q_top)[:, None] * (mix[:, None] * share + (1 - mix[:, None]) / (k - 1))
    ref[np.arange(len(top)), top] = q_top
    ref = np.maximum(ref, 1e-4)
    ref /= ref.sum(1, keepdims=True)
    q = cal.predict_proba(logits)
    np.testing.assert_allclose(q, ref, rtol=0, atol=1e-12)
    assert (q.argmax(1) == top).all()  # the top label is kept on every row


@pytest.mark.parametrize("k", [3, 10, 40])
def test_histogram_binning_keeps_accuracy_and_beats_one_vs_rest_nll(k):
    # an over-confident model: one-vs-rest binning ties rows and loses accuracy; top-label
    # binning keeps each row's top label and improves the NLL over the raw logits
    z, y = _data(40 * k, k, seed=30 + k)
    zt, yt = _data(4000, k, seed=60 + k)
    q = HistogramBinning().fit(z, y).predict_proba(zt)
    assert (q.argmax(1) == _softmax(zt).argmax(1)).all()
    nll = -np.log(q[np.arange(len(yt)), yt]).mean()
    raw = -np.log(_softmax(zt)[np.arange(len(yt)), yt]).mean()
    assert nll < raw


def test_histogram_bins_never_split_tied_probabilities():
    z, y = _data(600, 2, seed=10, decimals=0)
    p1 = _softmax(z)[:, 1]
    cal = HistogramBinning(n_bins=15).fit(z, y)
    q1 = cal.predict_proba(z)[:, 1]
    for value in np.unique(p1):  # one prediction per distinct probability ...
        assert np.unique(q1[p1 == value]).size == 1
    # ... equal to its bin's frequency: the bins partition the sorted distinct values
    knots = cal.knots.numpy()[0]
    bins = (p1[:, None] > knots[None, :]).sum(1)
    for b in np.unique(bins):
        freq = y[bins == b].mean()
        np.testing.assert_allclose(
            q1[bins == b], np.clip(freq, float(cal.floor), 1 - float(cal.floor))
        )
    assert len(np.unique(bins)) <= 15


@pytest.mark.parametrize("kind", ["isotonic", "histogram", "bbq"])
def test_state_dict_round_trips_into_a_fresh_calibrator(kind):
    z, y = _data(500, 3, seed=11)
    fitted = make_calibrator(kind).fit(z, y)
    fresh = make_calibrator(kind)
    with pytest.raises(RuntimeError, match="not fitted"):
        fresh(z)
    fresh.load_state_dict(fitted.state_dict())
    assert fresh.num_outputs == 3 and float(fresh.floor) == float(fitted.floor)
    np.testing.assert_array_equal(fresh(z), fitted(z))
    # refitting on other data (other buffer sizes) and loading back also works
    other = make_calibrator(kind).fit(*_data(50, 3, seed=12))
    other.load_state_dict(fitted.state_dict())
    np.testing.assert_array_equal(other(z), fitted(z))
    with pytest.raises(RuntimeError, match="built for 4 classes"):
        make_calibrator(kind, num_outputs=4).load_state_dict(fitted.state_dict())
    assert not list(fitted.parameters())  # all fitted state is in buffers


@pytest.mark.parametrize("cls", [Isotonic, HistogramBinning, BBQ])
@pytest.mark.parametrize("k", [2, 4])
def test_onnx_export_path_equals_eager(cls, k, monkeypatch):
    z, y = _data(700, k, seed=13)
    cal = cls().fit(z, y)
    logits = torch.as_tensor(_new_logits(k, seed=14))
    eager = cal(logits)
    # the comparison-only path taken under torch.onnx.export, run eagerly
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    torch.testing.assert_close(cal(logits), eager, rtol=0, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [Isotonic, HistogramBinning, BBQ])
def test_onnx_export_with_a_dynamic_batch_runs_in_onnxruntime(cls):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    z, y = _data(700, 3, seed=15)
    cal = cls().fit(z, y).float()
    logits = _new_logits(3, seed=16).astype(np.float32)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            cal, (torch.zeros(2, 3),), buffer, input_names=["z"], output_names=["out"],
            dynamic_axes={"z": {0: "batch"}, "out": {0: "batch"}}, dynamo=False,
        )  # fmt: skip
    session = ort.InferenceSession(buffer.getvalue())
    out = session.run(None, {"z": logits})[0]
    np.testing.assert_allclose(out, cal(logits), atol=1e-4)


@pytest.mark.parametrize("cls", [Isotonic, HistogramBinning, BBQ])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_float_dtype_in_and_out(cls, dtype):
    z, y = _data(400, 3, seed=17)
    cal = cls().fit(torch.as_tensor(z).to(dtype), y)
    logits = torch.as_tensor(_new_logits(3, seed=18)[:20]).to(dtype)
    out = cal(logits)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    proba = cal.predict_proba(logits)
    assert proba.dtype == dtype
    torch.testing.assert_close(
        proba.double().sum(1), torch.ones(20, dtype=torch.float64), atol=1e-2, rtol=0
    )
    array = cal(logits.float().numpy())
    assert isinstance(array, np.ndarray) and array.dtype == np.float32


def test_one_class_present_gives_constant_maps():
    # as Temperature and MatrixScaling: no error; every isotonic map is constant, absent
    # classes get the floor; top-label histogram binning keeps each row's top label
    z, _ = _data(100, 3, seed=19)
    y = np.zeros(100, dtype=int)
    logits = _new_logits(3, seed=20)
    q = Isotonic().fit(z, y).predict_proba(logits)
    floor = 1 / 200
    np.testing.assert_allclose(q[:, 1:], floor / (1 + 2 * floor))
    assert bool((q.argmax(1) == 0).all())
    q = HistogramBinning().fit(z, y).predict_proba(logits)
    assert np.isfinite(q).all() and (q.argmax(1) == logits.argmax(1)).all()


def test_errors_are_specific():
    z, y = _data(40, 3, seed=21)
    bad = z.copy()
    bad[3, 1] = np.nan
    for cls in (Isotonic, HistogramBinning):
        with pytest.raises(ValueError, match="NaN"):
            cls().fit(bad, y)
        with pytest.raises(ValueError, match="K >= 2"):
            cls().fit(z[:, :1], np.zeros(40, dtype=int))
        with pytest.raises(ValueError, match="built for 4 classes"):
            cls(4).fit(z, y)
        with pytest.raises(ValueError, match="eps"):
            cls(eps=0.5)
        with pytest.raises(ValueError, match="eps"):
            cls(eps=0)
        with pytest.raises(ValueError, match="num_classes"):
            cls(1)
        with pytest.warns(ProbabilitiesAsLogitsWarning, match="log-probabilities"):
            cls().fit(_softmax(z), y)
    with pytest.raises(ValueError, match="n_bins=15 needs at least 15 samples to fit, got 10"):
        HistogramBinning().fit(z[:10], y[:10])
    with pytest.raises(ValueError, match="n_bins"):
        HistogramBinning(n_bins=0)


def test_make_calibrator_kinds_and_multilabel_refusal():
    assert isinstance(make_calibrator("isotonic", num_outputs=3), Isotonic)
    hist = make_calibrator("histogram")
    assert isinstance(hist, HistogramBinning) and hist.n_bins == 15
    for kind in ("dirichlet", "isotonic", "histogram"):
        with pytest.raises(ValueError, match="multiclass only.*'ts', 'vs', 'ms'"):
            make_calibrator(kind, "multilabel", 3)
    with pytest.raises(ValueError, match="'dirichlet', 'isotonic', 'histogram'"):
        make_calibrator("gamma")


def test_histogram_binning_nll_at_least_netcals():
    # netcal's HistogramBinning (15 equal-width bins, one-vs-rest) on the same logits
    binning = pytest.importorskip("netcal.binning")
    k = 10
    z, y = _data(1500, k, seed=70)
    zt, yt = _data(4000, k, seed=71)
    rows = np.arange(len(yt))
    ours = HistogramBinning().fit(z, y).predict_proba(zt)[rows, yt]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = binning.HistogramBinning(bins=15).fit(_softmax(z), y).transform(_softmax(zt))
    theirs = np.clip(theirs / theirs.sum(1, keepdims=True), 1e-12, None)[rows, yt]
    assert -np.log(ours).mean() <= -np.log(theirs).mean()
