"""Split conformal prediction sets: hand computations, coverage over random splits,
MAPIE's and torch-uncertainty's thresholds and scores on the same data, input errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from cogcal._checks import ProbabilitiesAsLogitsWarning
from cogcal.conformal import (
    ConformalSets,
    conformal_quantile,
    conformity_scores,
    coverage,
    coverage_by_set_size,
    mean_set_size,
    min_calibration_size,
    prediction_sets,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _well_specified(n: int, k: int, seed: int, concentration: float = 1.0):
    """Probabilities ``p`` and labels drawn from them (``y ~ p``: calibrated by design)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(k, concentration), size=n)
    y = (rng.random((n, 1)) > p.cumsum(1)).sum(1).clip(max=k - 1)
    return p, y


def _hand_score(p: list[float], y: int, method: str, k_reg: int = 1, lam: float = 0.1, u=0.0):
    """One row's score by the definitions, with Python loops (ties: lower index first)."""
    if method == "lac":
        return 1.0 - p[y]
    order = sorted(range(len(p)), key=lambda j: (-p[j], j))
    rank = order.index(y) + 1
    mass = sum(p[j] for j in order[:rank])
    penalty = lam * max(rank - k_reg, 0) if method == "raps" else 0.0
    return mass - u * p[y] + penalty


# ------------------------------------------------------------------------------ by hand


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
@pytest.mark.parametrize("randomized", [False, True])
def test_scores_equal_a_hand_computation(method, randomized):
    p, y = _well_specified(40, 6, seed=1)
    p[3] = [0.3, 0.3, 0.1, 0.1, 0.1, 0.1]  # ties: ranked by class index
    y[3] = 1
    u = np.random.default_rng(2).random(40) if randomized and method != "lac" else None
    ours = conformity_scores(probs=p, labels=y, method=method, k_reg=2, lam=0.25, u=u)
    hand = [
        _hand_score(
            list(p[i]), int(y[i]), method, 2, 0.25, 0.0 if u is None or method == "lac" else u[i]
        )
        for i in range(40)
    ]
    np.testing.assert_allclose(ours, hand, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [9, 10, 19, 57, 100, 503])
@pytest.mark.parametrize("alpha", [0.1, 0.05, 0.2, 0.37])
def test_threshold_is_the_finite_sample_order_statistic(n, alpha):
    scores = np.random.default_rng(n).random(n)
    k = math.ceil((n + 1) * (1 - alpha))
    if k > n:
        with pytest.raises(ValueError, match="too few for alpha"):
            conformal_quantile(scores, alpha)
        assert n < min_calibration_size(alpha)
        return
    assert conformal_quantile(scores, alpha) == sorted(scores)[k - 1]
    # numpy's quantile of level ceil((n + 1)(1 - alpha)) / n, method "lower"
    assert conformal_quantile(scores, alpha) == np.quantile(scores, k / n, method="lower")


@pytest.mark.parametrize("alpha", [0.5, 0.2, 0.1, 0.05, 0.01, 0.003])
def test_min_calibration_size_is_the_boundary(alpha):
    n = min_calibration_size(alpha)
    assert math.ceil((n + 1) * (1 - alpha) - 1e-9) <= n
    conformal_quantile(np.arange(n, dtype=float), alpha)
    if n > 1:
        with pytest.raises(ValueError, match=f"needs at least {n} rows"):
            conformal_quantile(np.arange(n - 1, dtype=float), alpha)


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_fit_threshold_and_sets_follow_the_definitions(method):
    p, y = _well_specified(300, 5, seed=3)
    cs = ConformalSets(method=method, alpha=0.1, k_reg=1, lam=0.2).fit(probs=p, labels=y)
    hand = [_hand_score(list(p[i]), int(y[i]), method, 1, 0.2) for i in range(300)]
    assert cs.threshold_ == pytest.approx(sorted(hand)[math.ceil(301 * 0.9) - 1], abs=1e-12)
    assert (cs.n_classes_, cs.n_calibration_) == (5, 300)
    q, _ = _well_specified(50, 5, seed=4)
    sets = cs.predict(probs=q)
    for i in range(50):
        for label in range(5):
            expected = _hand_score(list(q[i]), label, method, 1, 0.2) <= cs.threshold_ + 1e-12
            assert sets[i, label] == expected


def test_the_set_of_a_row_holds_exactly_the_labels_whose_score_is_within_the_threshold():
    p, y = _well_specified(400, 7, seed=5)
    for method in ("lac", "aps", "raps"):
        cs = ConformalSets(method=method, alpha=0.2).fit(probs=p[:200], labels=y[:200])
        sets = cs.predict(probs=p[200:])
        for label in range(7):
            s = conformity_scores(probs=p[200:], labels=np.full(200, label), method=method)
            np.testing.assert_array_equal(sets[:, label], s <= cs.threshold_)


def test_randomized_scores_use_one_draw_per_row_and_the_seed():
    p, y = _well_specified(200, 4, seed=6)
    a = ConformalSets(method="aps", randomized=True, random_state=3).fit(probs=p, labels=y)
    b = ConformalSets(method="aps", randomized=True, random_state=3).fit(probs=p, labels=y)
    c = ConformalSets(method="aps", randomized=True, random_state=4).fit(probs=p, labels=y)
    assert a.threshold_ == b.threshold_ != c.threshold_
    np.testing.assert_array_equal(a.predict(probs=p), b.predict(probs=p))
    u = torch.rand(200, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    s = conformity_scores(probs=p, labels=y, method="aps", u=u.numpy())
    assert a.threshold_ == conformal_quantile(s, 0.1)
    # one u per row: the randomised set of a row is still its top-L classes
    sets = ConformalSets(method="raps", randomized=True, random_state=0).fit(probs=p, labels=y)
    mask = sets.predict(probs=p)
    ranked = np.take_along_axis(mask, np.argsort(-p, axis=1, kind="stable"), axis=1)
    assert (np.diff(ranked.astype(int), axis=1) <= 0).all()


def test_sets_are_nested_in_alpha_and_include_top_only_adds_the_argmax():
    p, y = _well_specified(500, 6, seed=7)
    previous = None
    for alpha in (0.3, 0.2, 0.1, 0.05):
        for method in ("lac", "aps", "raps"):
            cs = ConformalSets(method=method, alpha=alpha).fit(probs=p[:250], labels=y[:250])
            top = ConformalSets(method=method, alpha=alpha, include_top=True)
            top = top.fit(probs=p[:250], labels=y[:250])
            assert top.threshold_ == cs.threshold_
            plain, with_top = cs.predict(probs=p[250:]), top.predict(probs=p[250:])
            assert with_top[np.arange(250), p[250:].argmax(1)].all()
            assert (with_top >= plain).all() and (with_top.sum(1) - plain.sum(1) <= 1).all()
        if previous is not None:
            assert (plain >= previous).all()
        previous = plain


def test_logits_are_scored_by_their_softmax_and_types_round_trip():
    rng = np.random.default_rng(8)
    z = rng.normal(size=(300, 4)) * 2
    y = rng.integers(0, 4, 300)
    p = torch.softmax(torch.as_tensor(z), dim=1).numpy()
    a = ConformalSets(method="raps").fit(z, y)
    b = ConformalSets(method="raps").fit(probs=p, labels=y)
    assert a.threshold_ == pytest.approx(b.threshold_, abs=1e-12)
    out = a.predict(z)
    assert isinstance(out, np.ndarray) and out.dtype == np.bool_ and out.shape == (300, 4)
    t = a.predict(torch.as_tensor(z, dtype=torch.float32))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bool
    assert isinstance(conformity_scores(torch.as_tensor(z), torch.as_tensor(y)), torch.Tensor)
    np.testing.assert_array_equal(
        prediction_sets(probs=p, threshold=a.threshold_, method="raps"), b.predict(probs=p)
    )
    with pytest.warns(ProbabilitiesAsLogitsWarning, match="probs="):
        ConformalSets().fit(p, y)


def test_state_round_trips_through_json():
    p, y = _well_specified(200, 3, seed=9)
    cs = ConformalSets(method="raps", alpha=0.05, k_reg=2, lam=0.3, include_top=True)
    cs.fit(probs=p, labels=y)
    state = json.loads(json.dumps(cs.to_dict()))
    back = ConformalSets.from_dict(state)
    assert back.to_dict() == cs.to_dict()
    np.testing.assert_array_equal(back.predict(probs=p), cs.predict(probs=p))
    assert "threshold_" not in ConformalSets().to_dict()
    assert repr(ConformalSets(method="aps")).startswith("ConformalSets(method='aps', alpha=0.1")
    with pytest.raises(ValueError, match="unknown ConformalSets state key"):
        ConformalSets.from_dict({**state, "extra": 1})


def test_set_metrics_by_hand():
    sets = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 1, 0], [0, 0, 1]], dtype=bool)
    y = np.array([0, 2, 1, 0, 2])
    assert coverage(sets, y) == pytest.approx(3 / 5)
    assert mean_set_size(sets) == pytest.approx(7 / 5)
    table = coverage_by_set_size(sets, y)
    assert list(table) == [0, 1, 2, 3]
    assert table[1] == {"count": 2, "fraction": 0.4, "coverage": 0.5}
    assert table[0]["coverage"] == 0.0 and table[3]["coverage"] == 1.0
    assert sum(r["count"] * r["coverage"] for r in table.values()) == 3
    assert coverage(torch.as_tensor(sets), torch.as_tensor(y)) == pytest.approx(0.6)


# ------------------------------------------------------------------------------ coverage


def _digits_logits() -> tuple[np.ndarray, np.ndarray]:
    """Held-out logits of a small MLP trained on half of scikit-learn's digits."""
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = torch.as_tensor(x[order] / 16.0, dtype=torch.float32), torch.as_tensor(y[order])
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    half = len(y) // 2
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[:half]), y[:half]).backward()
        opt.step()
    with torch.no_grad():
        return net(x[half:]).double().numpy(), y[half:].numpy()


def _gaussian_100() -> tuple[np.ndarray, np.ndarray]:
    """100 classes: Bayes logits of unit Gaussians around random means (misspecified scale)."""
    rng = np.random.default_rng(1)
    means = rng.normal(size=(100, 20)) * 0.9
    y = rng.integers(0, 100, 3000)
    x = means[y] + rng.normal(size=(3000, 20))
    z = x @ means.T - 0.5 * (means**2).sum(1)
    return 1.5 * z, y  # over-confident on purpose: coverage must not depend on calibration


@pytest.mark.parametrize("data", ["digits", "gaussian100", "dirichlet10"])
def test_mean_coverage_over_20_random_splits_is_within_1_5_points(data):
    if data == "digits":
        scores, y = _digits_logits()
        kind = "logits"
    elif data == "gaussian100":
        scores, y = _gaussian_100()
        kind = "logits"
    else:
        scores, y = _well_specified(2000, 10, seed=11, concentration=0.3)
        kind = "probs"
    n = len(y)
    configs = [
        ("lac", False, 0.1),
        ("aps", False, 0.1),
        ("aps", True, 0.1),
        ("raps", False, 0.1),
        ("raps", True, 0.05),
    ]
    for method, randomized, alpha in configs:
        covered, sizes = [], []
        for split in range(20):
            order = np.random.default_rng(100 + split).permutation(n)
            cal, test = order[: n // 2], order[n // 2 :]
            cs = ConformalSets(
                method=method, alpha=alpha, randomized=randomized, random_state=split
            )
            cs.fit(**{kind: scores[cal]}, labels=y[cal])
            sets = cs.predict(**{kind: scores[test]})
            covered.append(coverage(sets, y[test]))
            sizes.append(mean_set_size(sets))
        mean = float(np.mean(covered))
        assert abs(mean - (1 - alpha)) <= 0.015, (data, method, randomized, mean)
        assert 0 < np.mean(sizes) < scores.shape[1]


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("alpha", [0, 1, 1.5, -0.1, float("nan"), True, "0.1", None])
def test_alpha_outside_the_open_unit_interval_is_one_error(alpha):
    with pytest.raises(ValueError, match=r"`alpha` must be a number in \(0, 1\)"):
        ConformalSets(alpha=alpha)
    with pytest.raises(ValueError, match="`alpha` must be"):
        conformal_quantile([0.1, 0.2], alpha)


def test_too_few_calibration_rows_is_one_error_naming_the_minimum():
    p, y = _well_specified(18, 3, seed=12)
    with pytest.raises(ValueError, match=r"18 calibration row\(s\) are too few for alpha=0.05"):
        ConformalSets(alpha=0.05).fit(probs=p, labels=y)
    ConformalSets(alpha=0.1).fit(probs=p, labels=y)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "thr"}, "`method` must be one of 'lac', 'aps', 'raps'"),
        ({"k_reg": -1}, "`k_reg` must be a rank >= 0"),
        ({"k_reg": 1.5}, "`k_reg` must be a rank >= 0"),
        ({"lam": -0.1}, "`lam` must be a finite number >= 0"),
        ({"randomized": 1}, "`randomized` must be true or false"),
        ({"include_top": "yes"}, "`include_top` must be true or false"),
        ({"random_state": -1}, "`random_state` must be an integer from 0"),
        ({"randomized": True}, "applies to method='aps' and 'raps'"),
    ],
)
def test_bad_hyperparameters_are_one_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConformalSets(**kwargs)


def test_bad_inputs_are_one_error_each():
    p, y = _well_specified(50, 3, seed=13)
    cs = ConformalSets()
    with pytest.raises(ValueError, match="exactly one of `logits` and `probs`"):
        cs.fit(p, y, probs=p)
    with pytest.raises(ValueError, match="exactly one of `logits` and `probs`"):
        cs.fit(labels=y)
    with pytest.raises(ValueError, match="`labels` is required"):
        cs.fit(probs=p)
    with pytest.raises(ValueError, match=r"`probs` has shape \(50,\)"):
        cs.fit(probs=p[:, 0], labels=y)
    with pytest.raises(ValueError, match="K >= 2 columns"):
        cs.fit(probs=np.ones((50, 1)), labels=np.zeros(50, dtype=int))
    with pytest.raises(ValueError, match="`labels` has 49 entries but `probs` has 50 rows"):
        cs.fit(probs=p, labels=y[:49])
    with pytest.raises(ValueError, match=r"`labels` has values in \[0, 3\]"):
        cs.fit(probs=p, labels=np.r_[y[:-1], 3])
    bad = p.copy()
    bad[4, 1] = np.nan
    with pytest.raises(ValueError, match="`probs` contains 1 NaN"):
        cs.fit(probs=bad, labels=y)
    with pytest.raises(ValueError, match="`logits` contains 1 NaN"):
        cs.fit(bad, y)
    with pytest.raises(ValueError, match="rows that sum to 1"):
        cs.fit(probs=p * 0.9, labels=y)
    with pytest.raises(ValueError, match=r"If these are logits, pass them as `logits`"):
        cs.fit(probs=p * 3 - 1, labels=y)
    with pytest.raises(RuntimeError, match="not fitted yet"):
        cs.predict(probs=p)
    cs.fit(probs=p, labels=y)
    with pytest.raises(ValueError, match="`probs` has 4 columns; expected the 3 classes"):
        cs.predict(probs=np.full((2, 4), 0.25))


def test_bad_draws_sets_and_thresholds_are_one_error_each():
    p, y = _well_specified(20, 3, seed=14)
    with pytest.raises(ValueError, match=r"`u` has values in \[-1, 0\.5\]"):
        conformity_scores(probs=p, labels=y, method="aps", u=np.r_[-1.0, np.full(19, 0.5)])
    with pytest.raises(ValueError, match="`u` has 3 entries; expected one draw per row"):
        conformity_scores(probs=p, labels=y, method="aps", u=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="applies to method='aps' and 'raps'"):
        conformity_scores(probs=p, labels=y, u=np.full(20, 0.5))
    with pytest.raises(ValueError, match="`threshold` must be a number"):
        prediction_sets(probs=p, threshold="0.5")
    with pytest.raises(ValueError, match=r"`sets` has shape \(3,\)"):
        mean_set_size([True, False, True])
    with pytest.raises(ValueError, match="`sets` has values other than 0/1"):
        mean_set_size([[0, 2], [1, 1]])
    with pytest.raises(ValueError, match="one class index per row of `sets`"):
        coverage([[True, False]], [0, 1])
    with pytest.raises(ValueError, match=r"`labels` has values in \[0, 2\]"):
        coverage([[True, False], [False, True]], [0, 2])


# ------------------------------------------------------------------------------ references


def _mapie(method: str, p: np.ndarray, y: np.ndarray, seed: int):
    """MAPIE's split conformal classifier conformalized on ``p`` (an identity "model")."""
    pytest.importorskip("mapie")
    from mapie.classification import SplitConformalClassifier  # optional reference
    from sklearn.base import BaseEstimator, ClassifierMixin  # MAPIE's estimator protocol

    class Identity(ClassifierMixin, BaseEstimator):
        def fit(self, x, labels):
            self.classes_ = np.arange(p.shape[1])
            return self

        def predict_proba(self, x):
            return np.asarray(x, dtype=np.float64)

        def predict(self, x):
            return np.asarray(x).argmax(1)

    model = SplitConformalClassifier(
        Identity().fit(p, y), confidence_level=0.9, conformity_score=method, random_state=seed
    )
    model.conformalize(p, y)
    model.predict_set(p[:2])  # MAPIE computes the quantile at the first prediction
    return model._mapie_classifier.conformity_score_function_


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lac_and_aps_thresholds_equal_mapies(seed):
    p, y = _well_specified(501 + 37 * seed, 6, seed=20 + seed)
    lac = _mapie("lac", p, y, seed)
    ours = ConformalSets(method="lac", alpha=0.1).fit(probs=p, labels=y)
    assert ours.threshold_ == float(lac.quantiles_[0])
    # MAPIE always randomises APS, with u = RandomState(seed).uniform(size=n)
    aps = _mapie("aps", p, y, seed)
    u = np.random.RandomState(seed).uniform(size=len(y))
    s = conformity_scores(probs=p, labels=y, method="aps", u=u)
    assert conformal_quantile(s, 0.1) == pytest.approx(float(aps.quantiles_[0]), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_raps_threshold_equals_mapies_at_its_chosen_k_reg_and_lambda(seed):
    p, y = _well_specified(800, 8, seed=30 + seed, concentration=0.5)
    raps = _mapie("raps", p, y, seed)
    from sklearn.model_selection import StratifiedShuffleSplit  # MAPIE's RAPS split

    # the rows MAPIE keeps for the quantile (the rest choose k_reg and lambda)
    split = StratifiedShuffleSplit(n_splits=1, test_size=raps.size_raps, random_state=seed)
    rows, held = next(split.split(p, y))
    np.testing.assert_array_equal(raps.X_raps, p[held])
    u = np.random.RandomState(seed).uniform(size=len(rows))
    k_reg, lam = int(np.ravel(raps.k_star)[0]), float(np.ravel(raps.lambda_star)[0])
    s = conformity_scores(probs=p[rows], labels=y[rows], method="raps", k_reg=k_reg, lam=lam, u=u)
    assert conformal_quantile(s, 0.1) == pytest.approx(float(raps.quantiles_[0]), abs=1e-12)


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_scores_and_sets_equal_torch_uncertaintys(method):
    conformal = pytest.importorskip("torch_uncertainty.post_processing.conformal")
    rng = np.random.default_rng(40)
    z = torch.as_tensor(rng.normal(size=(600, 7)) * 2.0)
    y = torch.as_tensor(rng.integers(0, 7, 600))
    common = {"alpha": 0.1, "model": torch.nn.Identity(), "enable_ts": False}
    if method == "lac":
        ref = conformal.ConformalClsTHR(**common)
    elif method == "aps":
        ref = conformal.ConformalClsAPS(**common, randomized=False)
    else:
        ref = conformal.ConformalClsRAPS(
            **common, randomized=False, penalty=0.25, regularization_rank=2
        )
    ours = ConformalSets(method=method, alpha=0.1, k_reg=2, lam=0.25, include_top=True)
    ours.fit(z[:300], y[:300])
    s = conformity_scores(z, y, method=method, k_reg=2, lam=0.25)
    probs = torch.softmax(z, dim=1)
    if method == "lac":
        ref_scores = 1.0 - probs.gather(1, y[:, None])[:, 0]
    else:
        ref_scores = ref._calculate_single_label(probs, y)
    torch.testing.assert_close(s, ref_scores, rtol=0, atol=1e-12)
    # torch-uncertainty's threshold is the plain (interpolated) quantile, not the
    # finite-sample one; with ours given to it, its sets are ours with include_top
    ref.q_hat = torch.tensor(ours.threshold_, dtype=torch.float64)
    torch.testing.assert_close(ref.conformal(z[300:]) > 0, ours.predict(z[300:]))
