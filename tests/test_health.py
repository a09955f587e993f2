"""The calibration health check (cogcal.health), against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cogcal.health import (
    MIN_STEPS,
    HealthReport,
    check_calibration,
    diagnose,
)


def _calibrated(n: int = 4000, k: int = 4, scale: float = 1.0, seed: int = 0):
    """Logits whose labels are drawn from their own softmax (calibrated by construction),
    then scaled by ``scale`` (> 1: over-confident, < 1: under-confident)."""
    g = torch.Generator().manual_seed(seed)
    classes = torch.randint(0, k, (n,), generator=g)
    logits = torch.randn(n, k, generator=g) + 2.5 * F.one_hot(classes, k)
    labels = torch.multinomial(logits.softmax(1), 1, generator=g)[:, 0]
    return logits * scale, labels


def test_ece_and_confidence_gap_match_a_hand_computation():
    # two samples, two classes: confidences 0.9 (correct) and 0.6 (wrong)
    p = torch.tensor([[0.9, 0.1], [0.6, 0.4]])
    logits, labels = p.log(), torch.tensor([0, 1])
    report = diagnose(logits, labels)
    # bins of width 1/15: 0.9 -> bin 13, 0.6 -> bin 9; |1 - 0.9| / 2 + |0 - 0.6| / 2
    assert report.ece == pytest.approx(0.05 + 0.3)
    assert report.confidence_gap == pytest.approx((0.9 + 0.6) / 2 - 0.5)
    assert report.nll == pytest.approx(-(math.log(0.9) + math.log(0.4)) / 2)


@pytest.mark.slow
def test_temperature_is_the_maximum_likelihood_one():
    logits, labels = _calibrated(scale=2.0)
    report = diagnose(logits, labels)
    grid = np.exp(np.linspace(-1, 2, 3001))
    nll = [F.cross_entropy(logits.double() / t, labels).item() for t in grid]
    best = grid[int(np.argmin(nll))]
    assert report.temperature == pytest.approx(best, rel=2e-3)
    assert report.nll_temperature == pytest.approx(min(nll), rel=1e-6)
    assert report.nll_temperature <= report.nll


@pytest.mark.parametrize(("scale", "kind"), [(3.0, "over-confident"), (1 / 3, "under-confident")])
def test_miscalibration_is_named_with_its_direction_size_and_fix(scale, kind):
    report = diagnose(*_calibrated(scale=scale))
    assert [f.kind for f in report.findings] == [kind]
    finding = report.findings[0]
    assert finding.value == pytest.approx(report.ece)
    assert f"ECE-15 {report.ece:.3f}" in finding.message
    assert f"temperature of {report.temperature:.2f}" in finding.message
    assert "Temperature" in finding.message  # the generic fix names the tool
    assert (report.confidence_gap > 0) == (kind == "over-confident")


@pytest.mark.slow
def test_a_temperature_at_the_search_bound_is_named_as_such():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (2000,), generator=g)
    # logits that carry no information about the labels: the best temperature is infinite
    noise = 5 * torch.randn(2000, 4, generator=g)
    # small logits that separate the classes perfectly: the best temperature is 0
    separable = 0.01 * F.one_hot(labels, 4).double()
    for logits, bound, side, beyond in (
        (noise, math.exp(5.0), "upper", "higher"),
        (separable, math.exp(-5.0), "lower", "lower"),
    ):
        report = diagnose(logits, labels)
        assert report.temperature == pytest.approx(bound)
        message = report.findings[0].message
        assert f"a temperature at the {side} bound of the search ({bound:.3g}; " in message
        assert f"the best one is {beyond} still)" in message
        assert "temperature of" not in message
    # a temperature inside the search keeps the plain wording (the test above)


@pytest.mark.slow
def test_a_calibrated_model_raises_nothing():
    for seed in range(3):
        report = diagnose(*_calibrated(seed=seed), steps=MIN_STEPS)
        assert report.ok, [f.message for f in report.findings]


@pytest.mark.slow
def test_under_training_from_steps_and_from_a_still_falling_validation_nll():
    logits, labels = _calibrated()
    few = diagnose(logits, labels, steps=MIN_STEPS - 1)
    assert [f.kind for f in few.findings] == ["under-trained"]
    assert f"only {MIN_STEPS - 1} optimizer steps" in few.findings[0].message
    falling = [{"val_nll": 1.0 - 0.05 * e} for e in range(10)]  # last fifth: 0.6 -> 0.55
    report = diagnose(logits, labels, history=falling, steps=10 * MIN_STEPS)
    assert [f.kind for f in report.findings] == ["under-trained"]
    assert report.nll_trend == pytest.approx((0.6 - 0.55) / 0.6)
    flat = [{"val_nll": 0.5} for _ in range(10)]
    assert diagnose(logits, labels, history=flat, steps=10 * MIN_STEPS).ok
    short = [{"val_nll": 1.0 - 0.1 * e} for e in range(4)]  # too short to judge a trend
    assert diagnose(logits, labels, history=short).nll_trend is None


@pytest.mark.slow
def test_advice_replaces_the_generic_fix():
    report = diagnose(*_calibrated(scale=3.0), advice={"over-confident": "use --method ts"})
    assert report.findings[0].message.endswith("use --method ts.")


@pytest.mark.slow
def test_multilabel_logits_are_checked_per_binary_task():
    logits, labels = _calibrated(k=2)  # two classes: the logit difference is a binary logit
    binary = (logits[:, 1] - logits[:, 0])[:, None]
    two = diagnose(logits, labels)
    one = diagnose(binary, labels[:, None], task="multilabel")
    assert one.nll == pytest.approx(two.nll, rel=1e-9)
    assert one.temperature == pytest.approx(two.temperature, rel=1e-6)


@pytest.mark.slow
def test_check_calibration_runs_the_model_and_round_trips():
    logits, labels = _calibrated(scale=3.0)
    model = torch.nn.Identity()
    batches = [(logits[i : i + 500], labels[i : i + 500]) for i in range(0, len(labels), 500)]
    report = check_calibration(model, batches, steps=MIN_STEPS)
    assert report.nll == pytest.approx(diagnose(logits, labels).nll, rel=1e-6)
    back = HealthReport.from_dict(report.to_dict())
    assert back.findings == report.findings and back.temperature == report.temperature


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="2 entries but `logits` has 3 rows"):
        diagnose(torch.zeros(3, 2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="`logits` contains 4 NaN"):
        diagnose(torch.full((2, 2), float("nan")), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="yielded no batches"):
        check_calibration(torch.nn.Identity(), [])


# --------------------------------------------------------------------------- issue 34 item 5


def _val(labels):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(len(labels), 4, generator=g), torch.as_tensor(labels))]


@pytest.mark.slow
def test_check_calibration_refuses_bad_arguments_with_value_errors():
    from cogcal import CalibratedModel
    from cogcal.health import check_calibration

    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    ok = _val([0, 1, 2, 1] * 5)
    for steps in (-1, 2.5, True, "10"):
        with pytest.raises(ValueError, match=r"`steps` must be the number of optimizer steps"):
            check_calibration(net, ok, steps=steps)
    assert check_calibration(net, ok, steps=0).steps == 0
    # the labels are checked as every metric and calibrator checks them (cogcal._checks)
    with pytest.raises(ValueError, match=r"values in \[0, 5\]; expected class indices in \[0, 2\]"):
        check_calibration(net, _val([0, 1, 5, 1]))
    with pytest.raises(
        ValueError, match=r"values in \[-1, 2\]; expected class indices in \[0, 2\]"
    ):
        check_calibration(net, _val([0, -1, 2, 1]))
    with pytest.raises(ValueError, match=r"non-integral float values \(e.g. 0.5\)"):
        check_calibration(net, _val([0.5, 1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match=r"the shape of `logits` \(4, 3\)"):
        check_calibration(net, _val([[0, 1], [1, 0], [1, 1], [0, 0]]), task="multilabel")
    with pytest.raises(ValueError, match=r"values other than 0/1 \(e.g. \[2\]\)"):
        check_calibration(net, _val([[0, 1, 2]] * 4), task="multilabel")
    # a model ending in a softmax, wrapped for COG: the documented ValueError
    soft = CalibratedModel(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(1)))
    with pytest.raises(ValueError, match="not the model's output"):
        check_calibration(soft, ok)
