"""Inputs: logits or probabilities by keyword, labels of every array type, one error template,
warnings for logits that look like probabilities and for zero true-class probabilities."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import log_loss

from cogcal import _checks
from cogcal.calibrators import Temperature
from cogcal.metrics import StreamingMetrics, evaluate, ood, ood_scores, reliability_bins


def _data(n=200, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 2, torch.randint(0, k, (n,), generator=g)


ONE_SHOT = {"cwece_15", "adaece_15", "smece", "aurc"}  # evaluate only (need every sample)


def _same(a: dict, b: dict, tol: float = 1e-12) -> None:
    if "smece" in a:  # both one-shot
        assert list(a) == list(b)
    else:  # streamed: every key but the one-shot ones
        assert list(a) == [k for k in b if k not in ONE_SHOT]
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=tol), key


# ----------------------------------------------------------------------------- keywords


def test_logits_or_probs_by_keyword():
    z, y = _data()
    ref = evaluate(z, y)
    _same(evaluate(labels=y, logits=z), ref)
    _same(evaluate(logits=z, labels=y), ref)
    _same(evaluate(labels=y, probs=torch.softmax(z.double(), 1)), ref, tol=1e-9)
    _same(evaluate(None, y, probs=torch.softmax(z.double(), 1)), ref, tol=1e-9)  # old form
    b = reliability_bins(labels=y, probs=torch.softmax(z.double(), 1), n_bins=10)
    assert b["count"].sum() == len(y)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of `logits` and `probs`.*neither"),
        ({"logits": "z", "probs": "p"}, "exactly one of `logits` and `probs`.*both"),
    ],
)
def test_exactly_one_of_logits_and_probs(kwargs, match):
    z, y = _data()
    values = {"z": z, "p": torch.softmax(z, 1)}
    kw = {k: values[v] for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        evaluate(labels=y, **kw)
    with pytest.raises(ValueError, match=match):
        StreamingMetrics().update(labels=y, **kw)
    with pytest.raises(ValueError, match=match):
        reliability_bins(labels=y, **kw)


def test_labels_are_required():
    z, _ = _data()
    with pytest.raises(ValueError, match="`labels` is required"):
        evaluate(z)
    with pytest.raises(ValueError, match="`labels` is required"):
        evaluate(logits=z)


# ----------------------------------------------------------------------------- array types


def test_labels_and_scores_of_every_array_type():
    z, y = _data(n=120, k=3)
    ref = evaluate(z, y)
    yn = y.numpy()
    for labels in (yn, yn.astype(np.int32), yn.astype(np.uint8), yn.tolist(), tuple(yn.tolist()),
                   pd.Series(yn), pd.Series(yn.astype(np.float64)), yn[::-1].copy()[::-1]):  # fmt: skip
        _same(evaluate(z, labels), ref)
    _same(evaluate(z.numpy(), pd.Series(yn)), ref)
    _same(evaluate(z.numpy().tolist(), yn), ref)
    _same(evaluate(pd.DataFrame(z.numpy()), yn), ref)
    _same(evaluate(labels=pd.Series(yn), probs=pd.DataFrame(torch.softmax(z.double(), 1).numpy())),
          ref, tol=1e-9)  # fmt: skip
    s = StreamingMetrics()
    s.update(z.numpy(), pd.Series(yn))
    _same(s.compute(), ref)
    # binary: pandas Series of bools, numpy float 0/1
    zb = z[:, 0]
    yb = yn == 1
    refb = evaluate(zb, torch.as_tensor(yb).long(), task="binary")
    _same(evaluate(zb.numpy(), pd.Series(yb), task="binary"), refb)
    _same(evaluate(zb, yb.astype(np.float32), task="binary"), refb)


@pytest.mark.slow
def test_pandas_and_torchmetrics_are_never_imported_by_the_core():
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, cogcal.metrics as m\n"
        "m.evaluate(np.zeros((3, 2), dtype=np.float32) + [[1.0, 0.0]], [0, 1, 0])\n"
        "s = m.StreamingMetrics(); s.update(np.ones((4, 3)), [0, 1, 2, 0]); s.sync(); s.compute()\n"
        "print('pandas' in sys.modules, 'torchmetrics' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False", out.stdout + out.stderr


# ----------------------------------------------------------------------------- one error template

TEMPLATE = re.compile(r"^`(logits|labels|probs|id_logits|ood_logits)` .+; expected .+")


def _message(fn) -> str:
    with pytest.raises(ValueError) as err:
        fn()
    return str(err.value)


BAD_LABELS = [
    ("strings", np.array(["cat", "dog", "cat"]), "dtype <U3"),
    ("object", np.array([0, None, 1], dtype=object), "dtype object"),
    ("non-integral", np.array([0.0, 0.5, 1.0]), "non-integral"),
    ("complex", np.array([0, 1, 1], dtype=np.complex64), "complex"),
    ("2-D", np.zeros((3, 2), dtype=np.int64), r"shape \(3, 2\)"),
    ("length", np.zeros(2, dtype=np.int64), "2 entries"),
    ("range", np.array([0, 1, 5]), r"values in \[0, 5\]"),
    ("scalar", 3, "scalar"),
    ("dict", {"a": 1}, "type dict"),
]


@pytest.mark.parametrize(("name", "labels", "match"), BAD_LABELS, ids=[b[0] for b in BAD_LABELS])
def test_one_error_template_for_labels_everywhere(name, labels, match):
    z = torch.randn(3, 4)
    entry_points = {
        "evaluate": lambda: evaluate(z, labels),
        "evaluate(probs=)": lambda: evaluate(labels=labels, probs=torch.softmax(z, 1)),
        "StreamingMetrics.update": lambda: StreamingMetrics().update(z, labels),
        "reliability_bins": lambda: reliability_bins(z, labels),
        "Temperature.fit": lambda: Temperature().fit(z, labels),
    }
    # the probabilities entry point names `probs` where the others name `logits`
    messages = {k: _message(fn).replace("`probs`", "`logits`") for k, fn in entry_points.items()}
    for where, msg in messages.items():
        assert TEMPLATE.match(msg), (where, msg)
        assert msg.startswith("`labels` "), (where, msg)
        assert re.search(match, msg), (where, msg)
    assert len(set(messages.values())) == 1, messages  # literally the same message


@pytest.mark.parametrize(
    ("logits", "match"),
    [
        (torch.zeros(3, 4, dtype=torch.long), "dtype torch.int64.*floating"),
        (torch.zeros(3), r"shape \(3,\).*2-D"),
        (torch.zeros(0, 4), "empty"),
        (torch.full((3, 4), float("nan")), "NaN"),
        ("abc", "type str"),
    ],
)
def test_one_error_template_for_scores(logits, match):
    y = torch.tensor([0, 1, 2])
    for fn in (
        lambda: evaluate(logits, y),
        lambda: StreamingMetrics().update(logits, y),
        lambda: ood(logits, torch.randn(2, 4)),
        lambda: Temperature().fit(logits, y),
    ):
        msg = _message(fn)
        assert TEMPLATE.match(msg), msg
        assert re.search(match, msg), msg


def test_error_template_function():
    err = _checks.input_error("labels", "has shape (3, 2)", "1-D class indices of shape (N,)",
                              "For one-hot labels pass `labels.argmax(1)`.")  # fmt: skip
    assert isinstance(err, ValueError)
    assert str(err) == (
        "`labels` has shape (3, 2); expected 1-D class indices of shape (N,). "
        "For one-hot labels pass `labels.argmax(1)`."
    )


# ----------------------------------------------------------------------------- probability look


def test_warns_when_logits_look_like_probabilities():
    from cogcal.metrics import ProbabilitiesAsLogitsWarning

    z, y = _data()
    p = torch.softmax(z, 1)
    with pytest.warns(ProbabilitiesAsLogitsWarning, match=r"look like probabilities.*probs="):
        m = evaluate(p, y)
    # not converted: the values are used as logits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert m == evaluate(p.double(), y)
    assert m["nll"] == pytest.approx(log_loss(y.numpy(), torch.softmax(p.double(), 1).numpy()))
    with pytest.warns(UserWarning, match="probs="):
        StreamingMetrics().update(p, y)
    with pytest.warns(UserWarning, match="probs="):
        evaluate(torch.sigmoid(z[:, 0]), (y == 1).long(), task="binary")
    with pytest.warns(UserWarning, match="id_probs="):
        ood(p, torch.randn(10, 4))


def test_no_warning_for_real_logits_or_explicit_probs():
    z, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluate(z, y)
        evaluate(labels=y, probs=torch.softmax(z, 1))
        evaluate(torch.rand(50, 4), y[:50])  # in [0, 1] but rows do not sum to 1
        evaluate(torch.zeros(5, 3), torch.zeros(5, dtype=torch.long))  # rows sum to 0
        evaluate(torch.zeros(5), torch.zeros(5, dtype=torch.long), task="binary")  # all equal
        ood(z, torch.randn(10, 4))
        ood(id_probs=torch.softmax(z, 1), ood_probs=torch.softmax(torch.randn(10, 4), 1))


# ----------------------------------------------------------------------------- zero probability


def test_zero_true_class_probability_is_infinite_with_a_warning():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    y = torch.tensor([1, 0, 0])  # two samples give their true class probability 0
    with pytest.warns(UserWarning, match="2 sample"):
        m = evaluate(labels=y, probs=p)
    assert m["nll"] == math.inf
    with pytest.warns(UserWarning, match="1 sample"):
        mb = evaluate(labels=torch.tensor([1, 0]), probs=torch.tensor([0.0, 0.3]), task="binary")
    assert mb["nll"] == math.inf
    with pytest.warns(UserWarning, match="2 sample"):
        s = StreamingMetrics()
        s.update(labels=y, probs=p)
    assert s.compute()["nll"] == math.inf


@pytest.mark.parametrize("eps", [1e-15, 1e-7, 0.01])
def test_eps_clips_the_true_class_probability(eps):
    p = np.array([[1.0, 0.0, 0.0], [0.2, 0.5, 0.3], [0.0, 1.0, 0.0], [0.001, 0.009, 0.99]])
    y = np.array([1, 1, 1, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = evaluate(labels=y, probs=p, eps=eps)
    py = p[np.arange(4), y]
    assert m["nll"] == pytest.approx(np.mean(-np.log(np.maximum(py, eps))), rel=1e-12)
    # brier and the calibration errors ignore eps
    ref = evaluate(labels=y, probs=p, eps=0.3)
    assert m["brier"] == ref["brier"] and m["ece_15"] == ref["ece_15"]
    # binary: the probability of the true class is p for y = 1 and 1 - p for y = 0
    pb, yb = np.array([0.0, 1.0, 0.7]), np.array([1, 0, 1])
    mb = evaluate(labels=yb, probs=pb, task="binary", eps=eps)
    pt = np.where(yb == 1, pb, 1 - pb)
    assert mb["nll"] == pytest.approx(np.mean(-np.log(np.maximum(pt, eps))), rel=1e-12)


@pytest.mark.parametrize("eps", [0.0, -1e-3, 1.0, float("nan"), "1e-7", True])
def test_bad_eps(eps):
    p = torch.tensor([[0.5, 0.5]])
    with pytest.raises(ValueError, match="`eps`"):
        evaluate(labels=torch.tensor([0]), probs=p, eps=eps)


def test_eps_with_logits_is_refused():
    z, y = _data()
    with pytest.raises(ValueError, match="`eps`.*probs="):
        evaluate(z, y, eps=1e-7)


# ----------------------------------------------------------------------------- OOD with probs


def test_ood_with_probabilities():
    g = torch.Generator().manual_seed(3)
    zi, zo = torch.randn(300, 5, generator=g) * 3, torch.randn(200, 5, generator=g)
    pi, po = torch.softmax(zi.double(), 1), torch.softmax(zo.double(), 1)
    for score in ("msp", "entropy"):
        ref = ood(zi, zo, score=score)
        got = ood(id_probs=pi, ood_probs=po, score=score)
        assert got == pytest.approx(ref, abs=1e-12), score
        assert ood_scores(probs=pi, score=score).numpy() == pytest.approx(
            ood_scores(zi, score=score).numpy(), abs=1e-12
        )
    with pytest.raises(ValueError, match="energy.*logits"):
        ood(id_probs=pi, ood_probs=po, score="energy")
    with pytest.raises(ValueError, match="exactly one of `id_logits` and `id_probs`"):
        ood(zi, zo, id_probs=pi)
    with pytest.raises(ValueError, match="exactly one of `ood_logits` and `ood_probs`"):
        ood(zi)
    # binary: P(y = 1) per sample
    bi, bo = torch.sigmoid(zi[:, 0].double()), torch.sigmoid(zo[:, 0].double())
    got = ood(id_probs=bi, ood_probs=bo, task="binary")
    assert got == pytest.approx(ood(zi[:, 0], zo[:, 0], task="binary"), abs=1e-12)
    # entropy with a zero probability: 0 log 0 = 0
    s = ood_scores(probs=torch.tensor([[1.0, 0.0], [0.5, 0.5]]), score="entropy")
    assert s.tolist() == pytest.approx([0.0, math.log(0.5)])
