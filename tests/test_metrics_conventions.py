"""cogcal's metric conventions against torchmetrics, scikit-learn and netcal, on the same data.

One test (or a few) per line of the conventions table in docs/metrics.md. Each either shows
that the numbers agree, or pins down exactly how and by how much they differ.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.calibration import calibration_curve
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss, roc_auc_score, roc_curve
from torchmetrics.functional.classification import (
    binary_accuracy,
    binary_auroc,
    binary_calibration_error,
    binary_roc,
    multiclass_accuracy,
    multiclass_calibration_error,
)

from cogcal.metrics import evaluate, ood, ood_scores, reliability_bins

netcal = pytest.importorskip("netcal.metrics")  # pip install netcal (1.4.0 here)

#: torchmetrics bins and averages in float32 whatever the input dtype; netcal and
#: scikit-learn work in float64 like cogcal and are compared to 1e-12.
TM_TOL = 1e-6

# ----------------------------------------------------------------------------- data


def _multiclass(n=600, k=5, seed=0, scale=2.0):
    """float64 logits, probabilities and labels drawn from a tempered model (miscalibrated)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z / 2.0, 1), 1, generator=g)[:, 0]
    return z, torch.softmax(z, 1), y


def _binary(n=600, seed=1):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g, dtype=torch.float64) * 2.5 + 0.7
    y = torch.bernoulli(torch.sigmoid(z / 1.7), generator=g).long()
    return z, torch.sigmoid(z), y


def _no_edge_values(p, n_bins):
    """Random data never sits on a bin edge, so every library bins it the same way."""
    scaled = np.asarray(p, dtype=np.float64) * n_bins
    assert not np.any(scaled == np.round(scaled))


def _ece_from_curve(prob_true, prob_pred, counts):
    """ECE from scikit-learn's calibration curve and the counts of its non-empty bins."""
    w = counts / counts.sum()
    gaps = np.abs(prob_true - prob_pred)
    return float(np.sum(w * gaps)), float(np.sqrt(np.sum(w * gaps**2))), float(np.max(gaps))


def _sklearn_positive(y, p1, n_bins, strategy="uniform"):
    prob_true, prob_pred = calibration_curve(y, p1, n_bins=n_bins, strategy=strategy)
    if strategy == "uniform":
        counts = np.histogram(p1, bins=np.linspace(0, 1, n_bins + 1))[0]
    else:
        counts = np.histogram(p1, bins=np.percentile(p1, np.linspace(0, 100, n_bins + 1)))[0]
    return _ece_from_curve(prob_true, prob_pred, counts[counts > 0].astype(float))


# ----------------------------------------------------------------------------- accuracy


def test_accuracy_matches_sklearn_and_torchmetrics():
    z, p, y = _multiclass()
    p[:3] = torch.tensor([0.4, 0.4, 0.2, 0.0, 0.0], dtype=torch.float64)  # ties: first index
    m = evaluate(labels=y, probs=p, eps=1e-15)  # (eps: some true classes now have p = 0)
    assert m["acc"] == accuracy_score(y.numpy(), p.numpy().argmax(1))
    tm = multiclass_accuracy(p, y, num_classes=5, average="micro")
    assert m["acc"] == pytest.approx(float(tm), abs=1e-7)
    zb, pb, yb = _binary()
    pb[:4] = 0.5  # a tie predicts class 0 everywhere
    mb = evaluate(labels=yb, probs=pb, task="binary")
    assert mb["acc"] == accuracy_score(yb.numpy(), pb.numpy() > 0.5)
    assert mb["acc"] == pytest.approx(float(binary_accuracy(pb, yb, threshold=0.5)), abs=1e-7)


# ----------------------------------------------------------------------------- NLL


def test_nll_matches_sklearn_log_loss():
    z, p, y = _multiclass()
    m = evaluate(z, y)
    assert m["nll"] == pytest.approx(log_loss(y.numpy(), p.numpy(), labels=range(5)), rel=1e-12)
    zb, pb, yb = _binary()
    mb = evaluate(zb, yb, task="binary")
    assert mb["nll"] == pytest.approx(log_loss(yb.numpy(), pb.numpy()), rel=1e-12)


def test_nll_of_zero_probability_sklearn_clips_at_machine_epsilon():
    p = np.array([[1.0, 0.0, 0.0], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    y = np.array([1, 1, 2])
    with pytest.warns(UserWarning, match="1 sample"):
        assert evaluate(labels=y, probs=p)["nll"] == np.inf  # honest by default
    eps = np.finfo(np.float64).eps  # scikit-learn clips to [eps, 1 - eps] of the dtype
    ours = evaluate(labels=y, probs=p, eps=eps)["nll"]
    assert ours == pytest.approx(log_loss(y, p, labels=range(3)), rel=1e-12)


# ----------------------------------------------------------------------------- Brier


def test_brier_sum_over_classes_matches_sklearn_multiclass():
    z, p, y = _multiclass()
    m = evaluate(z, y)
    assert m["brier"] == pytest.approx(brier_score_loss(y.numpy(), p.numpy()), rel=1e-12)
    # divided by K (per-class mean of one-vs-rest squared errors), as some codebases report
    per_class = [brier_score_loss(y.numpy() == k, p[:, k].numpy()) for k in range(5)]
    assert m["brier"] / 5 == pytest.approx(np.mean(per_class), rel=1e-12)


def test_brier_two_classes_is_twice_the_binary_brier():
    zb, pb, yb = _binary()
    binary = evaluate(zb, yb, task="binary")["brier"]
    assert binary == pytest.approx(brier_score_loss(yb.numpy(), pb.numpy()), rel=1e-12)
    two = torch.stack([torch.zeros_like(zb), zb], 1)  # the same model as 2-class logits
    multi = evaluate(two, yb)["brier"]
    assert multi == pytest.approx(2 * binary, rel=1e-12)  # sum over both classes
    p2 = torch.stack([1 - pb, pb], 1).numpy()
    # scikit-learn halves two-column input by default ("auto"), the full sum without it
    assert binary == pytest.approx(brier_score_loss(yb.numpy(), p2), rel=1e-12)
    assert multi == pytest.approx(brier_score_loss(yb.numpy(), p2, scale_by_half=False), rel=1e-12)


# ----------------------------------------------------------------------------- ECE top-label


@pytest.mark.parametrize("n_bins", [10, 15])
def test_top_label_ece_rmsce_mce_match_torchmetrics_and_netcal(n_bins):
    z, p, y = _multiclass()
    assert len(torch.unique(y)) > 2  # netcal treats <= 2 distinct labels as a binary problem
    _no_edge_values(p.max(1).values, n_bins)
    m = evaluate(z, y, n_bins=n_bins)
    for norm, key in (("l1", "ece"), ("l2", "rmsce"), ("max", "mce")):
        tm = multiclass_calibration_error(p, y, num_classes=5, n_bins=n_bins, norm=norm)
        assert m[f"{key}_{n_bins}"] == pytest.approx(float(tm), abs=TM_TOL), key
    pn = p.numpy()
    assert m[f"ece_{n_bins}"] == pytest.approx(
        netcal.ECE(bins=n_bins).measure(pn, y.numpy()), abs=1e-12
    )
    assert m[f"mce_{n_bins}"] == pytest.approx(
        netcal.MCE(bins=n_bins).measure(pn, y.numpy()), abs=1e-12
    )


def test_top_label_two_classes_matches_torchmetrics_multiclass():
    zb, pb, yb = _binary()
    p2 = torch.stack([1 - pb, pb], 1)
    _no_edge_values(p2.max(1).values, 15)
    tm = float(multiclass_calibration_error(p2, yb, num_classes=2, n_bins=15))
    assert evaluate(zb, yb, task="binary")["ece_15"] == pytest.approx(tm, abs=TM_TOL)
    assert evaluate(labels=yb, probs=p2)["ece_15"] == pytest.approx(tm, abs=TM_TOL)


# ----------------------------------------------------------------------------- ECE positive class


@pytest.mark.parametrize("n_bins", [10, 15])
def test_positive_class_ece_matches_sklearn_torchmetrics_netcal(n_bins):
    zb, pb, yb = _binary()
    _no_edge_values(pb, n_bins)
    m = evaluate(zb, yb, task="binary", n_bins=n_bins)
    # scikit-learn's calibration_curve: fraction of positives vs mean P(y = 1) per bin
    ece, rmsce, mce = _sklearn_positive(yb.numpy(), pb.numpy(), n_bins)
    assert m[f"ece_positive_{n_bins}"] == pytest.approx(ece, abs=1e-12)
    assert m[f"rmsce_positive_{n_bins}"] == pytest.approx(rmsce, abs=1e-12)
    assert m[f"mce_positive_{n_bins}"] == pytest.approx(mce, abs=1e-12)
    # torchmetrics' binary_calibration_error uses the same P(y = 1) convention
    for norm, key in (("l1", "ece"), ("l2", "rmsce"), ("max", "mce")):
        tm = binary_calibration_error(pb, yb, n_bins=n_bins, norm=norm)
        assert m[f"{key}_positive_{n_bins}"] == pytest.approx(float(tm), abs=TM_TOL), key
    # netcal: binary confidences (N,) are P(y = 1), and so is column 1 of (N, 2) input
    pn, yn = pb.numpy(), yb.numpy()
    p2 = np.stack([1 - pn, pn], 1)
    for x in (pn, p2):
        assert m[f"ece_positive_{n_bins}"] == pytest.approx(
            netcal.ECE(bins=n_bins).measure(x, yn), abs=1e-12
        )
        assert m[f"mce_positive_{n_bins}"] == pytest.approx(
            netcal.MCE(bins=n_bins).measure(x, yn), abs=1e-12
        )
    # two-class multiclass input gets the same keys, from column 1
    m2 = evaluate(torch.stack([torch.zeros_like(zb), zb], 1), yb, n_bins=n_bins)
    for key in ("ece", "rmsce", "mce"):
        assert m2[f"{key}_positive_{n_bins}"] == pytest.approx(
            m[f"{key}_positive_{n_bins}"], abs=1e-12
        )


def test_top_label_and_positive_class_ece_differ_on_the_same_two_class_data():
    # 10 samples with P(y=1) = 0.3 of which 1 is positive, 10 with P(y=1) = 0.7 of which 5
    # are. Top-label: all confidences are 0.7 and 14/20 predictions are right -> ECE 0
    # (the over- and under-confidence cancel in one bin). P(y=1): bins 0.3 and 0.7 with
    # positive fractions 0.1 and 0.5 -> ECE 0.2.
    p1 = torch.tensor([0.3] * 10 + [0.7] * 10, dtype=torch.float64)
    y = torch.tensor([1] + [0] * 9 + [1] * 5 + [0] * 5)
    m = evaluate(labels=y, probs=p1, task="binary", n_bins=10)
    assert m["ece_10"] == pytest.approx(0.0, abs=1e-15)
    assert m["ece_positive_10"] == pytest.approx(0.2, abs=1e-15)
    p2 = torch.stack([1 - p1, p1], 1)
    assert float(multiclass_calibration_error(p2, y, num_classes=2, n_bins=10)) == pytest.approx(
        0.0, abs=TM_TOL
    )
    assert float(binary_calibration_error(p1, y, n_bins=10)) == pytest.approx(0.2, abs=TM_TOL)
    assert _sklearn_positive(y.numpy(), p1.numpy(), 10)[0] == pytest.approx(0.2, abs=1e-15)
    assert netcal.ECE(bins=10).measure(p2.numpy(), y.numpy()) == pytest.approx(0.2, abs=1e-12)
    # random logits of a model that underestimates P(y = 1) by a shift of its logit: the
    # top-label confidences of both predicted classes mix the two errors, which partly
    # cancel; P(y = 1) sees the whole bias
    g = torch.Generator().manual_seed(0)
    zb = torch.randn(600, generator=g, dtype=torch.float64) * 2
    yb = torch.bernoulli(torch.sigmoid(zb + 1.0), generator=g).long()
    mb = evaluate(zb, yb, task="binary", n_bins=15)
    assert mb["ece_15"] == pytest.approx(0.0673, abs=1e-4)
    assert mb["ece_positive_15"] == pytest.approx(0.1539, abs=1e-4)
    p2 = torch.stack([torch.sigmoid(-zb), torch.sigmoid(zb)], 1)
    assert float(multiclass_calibration_error(p2, yb, num_classes=2, n_bins=15)) == pytest.approx(
        mb["ece_15"], abs=TM_TOL
    )
    assert float(binary_calibration_error(p2[:, 1].contiguous(), yb, n_bins=15)) == pytest.approx(
        mb["ece_positive_15"], abs=TM_TOL
    )


def test_multilabel_positive_class_keys_are_opt_in():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(400, 3, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 2, (400, 3), generator=g)
    default = evaluate(z, y, task="multilabel", n_bins=15)
    assert not any("positive" in k for k in default)
    m = evaluate(z, y, task="multilabel", n_bins=15, positive_class=True)
    per = []
    for j in range(3):
        tm = float(binary_calibration_error(torch.sigmoid(z[:, j]), y[:, j], n_bins=15))
        assert m[f"ece_positive_15/t{j}"] == pytest.approx(tm, abs=TM_TOL)
        per.append(tm)
    assert m["ece_positive_15"] == pytest.approx(np.mean(per), abs=TM_TOL)


# ----------------------------------------------------------------------------- bin edges


def test_bin_edges_on_an_exact_edge_and_at_one():
    # P(y=1) = 0.5 sits on the edge between the two bins of B = 2
    p1 = np.array([0.5, 0.9])
    y = np.array([1, 0])
    ours = reliability_bins(labels=y, probs=np.stack([1 - p1, p1], 1), n_bins=2)
    assert ours["count"].tolist() == [0, 2]  # [0, 0.5), [0.5, 1]: left-closed bins
    m = evaluate(labels=y, probs=p1, task="binary", n_bins=2)
    assert m["ece_positive_2"] == pytest.approx(abs(0.5 - 0.7))  # one bin
    tm = float(binary_calibration_error(torch.tensor(p1), torch.tensor(y), n_bins=2))
    assert tm == pytest.approx(m["ece_positive_2"])  # torchmetrics: left-closed too
    assert netcal.ECE(bins=2).measure(p1, y) == pytest.approx(m["ece_positive_2"])  # netcal too
    prob_true, _ = calibration_curve(y, p1, n_bins=2)
    assert len(prob_true) == 2  # scikit-learn: right-closed bins (0, 0.5], 0.5 in the first
    assert _sklearn_ece_right_closed(y, p1, 2) == pytest.approx(0.5 * 0.5 + 0.5 * 0.9)
    # confidence exactly 1.0: our last bin is closed; torchmetrics opens an extra bin
    p1 = np.array([1.0, 0.95])
    y = np.array([0, 1])
    m = evaluate(labels=y, probs=p1, task="binary", n_bins=10, eps=1e-15)
    assert m["ece_positive_10"] == pytest.approx(abs(0.5 - 0.975))
    tm = float(binary_calibration_error(torch.tensor(p1), torch.tensor(y), n_bins=10))
    assert tm == pytest.approx(0.5 * 1.0 + 0.5 * 0.05)
    assert _sklearn_ece_right_closed(y, p1, 10) == pytest.approx(m["ece_positive_10"])
    # netcal clips to [eps, 1 - eps] first, so 1.0 lands in the last bin as with us
    assert netcal.ECE(bins=10).measure(p1, y) == pytest.approx(m["ece_positive_10"], abs=1e-12)


def _sklearn_ece_right_closed(y, p1, n_bins):
    prob_true, prob_pred = calibration_curve(y, p1, n_bins=n_bins)
    inner = np.linspace(0, 1, n_bins + 1)[1:-1]
    counts = np.bincount(np.searchsorted(inner, p1), minlength=n_bins)  # its own binning
    return _ece_from_curve(prob_true, prob_pred, counts[counts > 0].astype(float))[0]


# ----------------------------------------------------------------------------- equal-mass bins


@pytest.mark.parametrize("n_bins", [5, 10])
def test_equal_mass_bins_match_sklearn_quantile_and_netcal(n_bins):
    # with N divisible by B and distinct values every library splits at the same samples
    z, p, y = _multiclass(n=500)
    assert len(torch.unique(p.max(1).values)) == 500
    m = evaluate(z, y, n_bins=n_bins, binning="mass")
    ref = netcal.ECE(bins=n_bins, equal_intervals=False).measure(p.numpy(), y.numpy())
    assert m[f"ece_mass_{n_bins}"] == pytest.approx(ref, abs=1e-12)
    zb, pb, yb = _binary(n=500)
    mb = evaluate(zb, yb, task="binary", n_bins=n_bins, binning="mass")
    ece, rmsce, mce = _sklearn_positive(yb.numpy(), pb.numpy(), n_bins, strategy="quantile")
    assert mb[f"ece_positive_mass_{n_bins}"] == pytest.approx(ece, abs=1e-12)
    assert mb[f"rmsce_positive_mass_{n_bins}"] == pytest.approx(rmsce, abs=1e-12)
    assert mb[f"mce_positive_mass_{n_bins}"] == pytest.approx(mce, abs=1e-12)


# ----------------------------------------------------------------------------- sample-level metrics


def _array_split_ece(conf, correct, n_bins):
    """Adaptive ECE as torch-uncertainty computes it: sort, ``array_split``, weighted gaps."""
    order = np.argsort(conf, kind="stable")
    total = 0.0
    for g in np.array_split(order, n_bins):
        if len(g):
            total += len(g) / len(conf) * abs(correct[g].mean() - conf[g].mean())
    return total


@pytest.mark.parametrize("n", [600, 503])
def test_adaptive_ece_matches_netcal_quantile_bins_and_array_split(n):
    z, p, y = _multiclass(n=n, k=5, seed=3)
    conf = p.max(1).values.numpy()
    correct = (p.argmax(1) == y).double().numpy()
    assert len(np.unique(conf)) == n  # distinct: no tie to split
    m = evaluate(z, y)
    assert m["adaece_15"] == pytest.approx(_array_split_ece(conf, correct, 15), abs=1e-12)
    if n % 15 == 0:  # netcal's quantile edges cut at the same samples when 15 divides N
        ref = netcal.ECE(bins=15, equal_intervals=False).measure(p.numpy(), y.numpy())
        assert m["adaece_15"] == pytest.approx(ref, abs=1e-12)
        assert m["adaece_15"] == pytest.approx(
            evaluate(z, y, n_bins=15, binning="mass")["ece_mass_15"], abs=1e-12
        )
    else:  # the sizes differ from ece_mass_15's floor(b N / B) starts
        assert m["adaece_15"] != evaluate(z, y, n_bins=15, binning="mass")["ece_mass_15"]


def test_classwise_ece_matches_netcal_and_sklearn_per_class():
    z, p, y = _multiclass(n=700, k=4, seed=4)
    pn, yn = p.numpy(), y.numpy()
    _no_edge_values(pn, 15)
    m = evaluate(z, y)
    # netcal's ECE of 1-D input is the positive-class ECE of p_k against 1[y = k]
    per_netcal = [netcal.ECE(bins=15).measure(pn[:, k], (yn == k).astype(int)) for k in range(4)]
    assert m["cwece_15"] == pytest.approx(np.mean(per_netcal), abs=1e-12)
    per_sk = [
        _sklearn_positive((yn == k).astype(int), pn[:, k], 15, strategy="uniform")[0]
        for k in range(4)
    ]
    assert m["cwece_15"] == pytest.approx(np.mean(per_sk), abs=1e-12)
    assert m["cwece_15"] == evaluate(z, y, n_bins=15, classwise=True)["cwece_15"]


@pytest.mark.parametrize("seed", [0, 1, pytest.param(2, marks=pytest.mark.slow)])
def test_smece_matches_relplot(seed):
    relplot = pytest.importorskip("relplot")  # pip install relplot (1.0.3 here)
    n = (300, 5000, 40000)[seed]
    z, p, y = _multiclass(n=n, k=5, seed=seed, scale=(2.0, 1.0, 0.3)[seed])
    conf = p.max(1).values.numpy()
    correct = (p.argmax(1) == y).double().numpy()
    ref = relplot.smECE(conf, correct)
    assert evaluate(z, y, n_bins=15)["smece"] == pytest.approx(ref, abs=1e-9)
    zb, pb, yb = _binary(n=n, seed=seed + 10)  # binary: top-label confidence and correctness
    cb = np.maximum(pb.numpy(), 1 - pb.numpy())
    hb = ((pb.numpy() > 0.5) == yb.numpy()).astype(float)
    assert evaluate(zb, yb, task="binary", n_bins=15)["smece"] == pytest.approx(
        relplot.smECE(cb, hb), abs=1e-9
    )


def _risks_torch_uncertainty(conf, correct):
    """torch-uncertainty's cumulative error rates (``_aurc_rejection_rate_compute``)."""
    errors = torch.as_tensor(1.0 - correct)[torch.as_tensor(-conf).argsort()]
    return errors.cumsum(0) / torch.arange(1, len(conf) + 1, dtype=torch.float64)


@pytest.mark.slow
def test_aurc_matches_torch_uncertainty_formula_and_a_direct_definition():
    z, p, y = _multiclass(n=400, k=5, seed=5)
    conf = p.max(1).values.numpy()
    correct = (p.argmax(1) == y).double().numpy()
    assert len(np.unique(conf)) == 400
    got = evaluate(z, y, n_bins=15)["aurc"]
    assert got == pytest.approx(float(_risks_torch_uncertainty(conf, correct).mean()), abs=1e-12)
    direct = np.mean(  # risk of the i most confident, for every coverage i / N
        [np.mean([1 - correct[j] for j in range(400) if conf[j] >= np.sort(conf)[::-1][i - 1]])
         for i in range(1, 401)]
    )  # fmt: skip
    assert got == pytest.approx(direct, abs=1e-12)


# ----------------------------------------------------------------------------- OOD


def test_ood_auroc_and_fpr95_match_sklearn_and_torchmetrics():
    g = torch.Generator().manual_seed(7)
    zi = torch.randn(400, 6, generator=g, dtype=torch.float64) * 3
    zo = torch.randn(300, 6, generator=g, dtype=torch.float64)
    zi[:40] = zo[:25] = torch.tensor([50.0, 0, 0, 0, 0, 0], dtype=torch.float64)  # ties at 1.0
    o = ood(zi, zo)
    si, so = ood_scores(zi).numpy(), ood_scores(zo).numpy()
    scores = np.r_[si, so]
    target = np.r_[np.ones(len(si)), np.zeros(len(so))]
    assert o["auroc"] == pytest.approx(roc_auc_score(target, scores), abs=1e-12)
    tm = binary_auroc(torch.tensor(scores), torch.tensor(target).long())
    assert o["auroc"] == pytest.approx(float(tm), abs=1e-6)
    # FPR at the first ROC point (highest threshold) whose TPR reaches 0.95
    fpr, tpr, _ = roc_curve(target, scores, drop_intermediate=False)
    assert o["fpr95"] == pytest.approx(fpr[np.searchsorted(tpr, 0.95)], abs=1e-12)
    tfpr, ttpr, _ = binary_roc(torch.tensor(scores), torch.tensor(target).long())
    i = int(torch.nonzero(ttpr >= 0.95)[0])
    assert o["fpr95"] == pytest.approx(float(tfpr[i]), abs=1e-6)
