"""Arrays and probabilities as first-class inputs; fitted calibrators carry no gradients."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cogcal import CalibratedModel
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


def _data(n: int = 300, k: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits twice too confident, with labels drawn from the calibrated softmax."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g) + 1.5 * F.one_hot(centre, k)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    return 2.0 * z, y


def _multilabel(n: int = 300, t: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, t, generator=g)
    return 2.0 * z + 0.5, torch.bernoulli(torch.sigmoid(z), generator=g)


def _fitted() -> list:
    z, y = _data()
    zt, yt = _multilabel()
    return [
        Temperature().fit(z, y),
        VectorScaling(l2=1.0).fit(z, y),
        MatrixScaling(l2=1.0).fit(z, y),
        TaskTemperature().fit(zt, yt),
        TaskAffine(l2=1.0).fit(zt, yt),
    ]


@pytest.fixture(scope="module")
def fitted():
    return _fitted()


def _inputs(cal) -> torch.Tensor:
    return (_multilabel(5, seed=1) if cal.multilabel else _data(5, seed=1))[0]


def _reference_proba(cal, z: torch.Tensor) -> np.ndarray:
    """Softmax / sigmoid by hand in numpy, in float64, of the calibrated logits."""
    logits = np.asarray(cal(z.double()).detach().numpy(), dtype=np.float64)
    if cal.multilabel:
        return 1.0 / (1.0 + np.exp(-logits))
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_numpy_in_numpy_out_with_the_input_dtype(fitted, dtype):
    for cal in fitted:
        z = _inputs(cal)
        out = cal(z.numpy().astype(dtype))
        assert isinstance(out, np.ndarray) and out.dtype == dtype
        expected = cal(z.to(getattr(torch, np.dtype(dtype).name))).numpy()
        np.testing.assert_array_equal(out, expected)
        probs = cal.predict_proba(z.numpy().astype(dtype))
        assert isinstance(probs, np.ndarray) and probs.dtype == dtype
        tol = 2e-3 if dtype == np.float16 else 1e-6
        np.testing.assert_allclose(probs, _reference_proba(cal, z), atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_tensor_in_tensor_out_with_the_input_dtype_and_no_gradient(fitted, dtype):
    for cal in fitted:
        z = _inputs(cal).to(dtype)
        probs = cal.predict_proba(z)
        assert isinstance(probs, torch.Tensor) and probs.dtype == dtype
        assert not probs.requires_grad
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        np.testing.assert_allclose(
            probs.double().numpy(), _reference_proba(cal, z.double()), atol=tol
        )
        if not cal.multilabel:
            torch.testing.assert_close(
                probs.double().sum(1), torch.ones(5, dtype=torch.float64), atol=tol, rtol=0
            )


def test_predict_proba_of_a_trainable_calibrator_has_no_gradient():
    cal = MatrixScaling(4)  # fresh: parameters require gradients (COG use)
    z = _data(5)[0]
    assert cal(z).requires_grad
    probs = cal.predict_proba(z)
    assert not probs.requires_grad
    torch.testing.assert_close(probs, torch.softmax(z, 1))


def test_fitted_output_converts_to_numpy_and_unfreezes_for_training():
    z, y = _data()
    t = Temperature().fit(z, y)
    test_logits = _data(50, seed=2)[0]
    assert isinstance(t(test_logits).numpy(), np.ndarray)  # no gradient attached
    assert not any(p.requires_grad for p in t.parameters())
    t.requires_grad_(True)  # as the fit docstring says, to train it further
    out = t(test_logits)
    assert out.requires_grad
    out.sum().backward()
    assert t.log_temperature.grad is not None


@pytest.mark.parametrize(
    "to_labels",
    [
        lambda y: y,
        lambda y: y.numpy(),
        lambda y: y.numpy().astype(np.int32),
        lambda y: y.tolist(),
        lambda y: pytest.importorskip("pandas").Series(y.numpy()),
    ],
    ids=["tensor", "int64 array", "int32 array", "list", "pandas Series"],
)
def test_fit_accepts_labels_as_tensors_arrays_lists_and_series(to_labels):
    z, y = _data()
    reference = MatrixScaling(l2=1.0).fit(z, y)
    for logits in (z, z.numpy()):
        cal = MatrixScaling(l2=1.0).fit(logits, to_labels(y))
        torch.testing.assert_close(cal.weight, reference.weight)
    zt, yt = _multilabel()
    ref_t = TaskTemperature().fit(zt, yt)
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(yt.numpy().astype(int))
    torch.testing.assert_close(
        TaskTemperature().fit(zt.numpy(), frame).temperature, ref_t.temperature
    )


def test_bad_labels_and_logits_raise_value_errors_naming_them():
    z, y = _data(20)
    pd = pytest.importorskip("pandas")
    with pytest.raises(ValueError, match="labels"):
        Temperature().fit(z, pd.Series(["cat"] * 20))
    with pytest.raises(ValueError, match="integer"):
        Temperature().fit(z, y.numpy() + 0.5)
    with pytest.raises(ValueError, match="labels"):
        Temperature().fit(z, {"y": 1})
    with pytest.raises(ValueError, match="1-D"):
        MatrixScaling(l2=1.0).fit(z, np.stack([y.numpy(), y.numpy()], 1))
    with pytest.raises(ValueError, match="floating"):
        Temperature().fit(z.numpy().astype(np.int64), y)
    with pytest.raises(ValueError, match="shape"):
        TaskAffine(l2=0.0).fit(z, y)  # multi-label needs (N, T) targets
    cal = MatrixScaling(4)
    with pytest.raises(ValueError, match="built for 4 classes"):
        cal.predict_proba(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="floating"):
        cal(np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="2-D"):
        cal.predict_proba(np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match="K >= 2"):
        Temperature().predict_proba(np.zeros((2, 1), dtype=np.float32))
    with pytest.raises(RuntimeError, match="call .fit"):
        VectorScaling().predict_proba(np.zeros((2, 4), dtype=np.float32))


def _net(k: int = 5) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, k))


@pytest.mark.parametrize("calibrator", [lambda: MatrixScaling(5), lambda: "ms"])
def test_fresh_matrix_scaling_trains_inside_calibrated_model(calibrator):
    model = CalibratedModel(_net(), calibrator=calibrator()).train()
    cal = model.calibrator
    assert isinstance(cal, MatrixScaling) and cal.training
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 5, (32,), generator=g)
    before = cal.weight.detach().clone()
    opt = torch.optim.SGD(model.param_groups(lr=0.1, calibrator_lr=0.05))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    assert cal.weight.grad is not None and float(cal.weight.grad.abs().sum()) > 0
    assert cal.bias.grad is not None and float(cal.bias.grad.abs().sum()) > 0
    opt.step()
    assert not torch.equal(cal.weight.detach(), before)


def test_composition_by_hand_passes_gradients_through_a_fresh_calibrator():
    net, cal = _net(), MatrixScaling(5)
    model = nn.Sequential(net, cal)
    x = torch.randn(4, 8, requires_grad=True)
    model(x).logsumexp(1).sum().backward()
    assert cal.weight.grad is not None and x.grad is not None
    assert net[0].weight.grad is not None


def test_fitted_calibrator_in_calibrated_model_needs_unfreezing():
    z, y = _data(k=5)
    fitted = MatrixScaling(l2=1.0).fit(z, y)
    model = CalibratedModel(_net(), calibrator=fitted)
    with pytest.raises(ValueError, match="no trainable parameters"):
        model.param_groups(lr=0.1, calibrator_lr=0.01)
    fitted.requires_grad_(True)
    groups = model.param_groups(lr=0.1, calibrator_lr=0.01)
    assert [g["name"] for g in groups] == ["network", "calibrator"]


def test_tst_heads_predict_probabilities_from_arrays_and_tensors():
    torch.manual_seed(0)
    head = TSTHead(6, 3, latent_dim=4)
    x = torch.randn(5, 6)
    probs = head.predict_proba(x.numpy())
    assert isinstance(probs, np.ndarray) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, torch.softmax(head(x), 1).detach().numpy(), atol=1e-6)
    out = head.predict_proba(x.double())
    assert out.dtype == torch.float64 and not out.requires_grad
    vtst = VTSTHead(6, 3, latent_dim=4).eval()
    torch.manual_seed(1)
    p = vtst.predict_proba(x)
    torch.manual_seed(1)
    torch.testing.assert_close(p, vtst(x).exp().detach(), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="6 columns"):
        head.predict_proba(np.zeros((2, 5), dtype=np.float32))


# -- probabilities passed as logits ------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Temperature(),
        pytest.param(lambda: VectorScaling(), marks=pytest.mark.slow),
        pytest.param(lambda: MatrixScaling(l2=0.1), marks=pytest.mark.slow),
    ],
)
def test_fitting_probabilities_as_logits_warns_naming_predict_proba(make):
    from cogcal.calibrators import ProbabilitiesAsLogitsWarning

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (300,), generator=g)
    logits = 2 * torch.nn.functional.one_hot(y, 4) + torch.randn(300, 4, generator=g)
    probs = logits.softmax(1)
    with pytest.warns(ProbabilitiesAsLogitsWarning, match=r"predict_proba.*np\.log\(p\)"):
        make().fit(probs, y)
    with pytest.warns(ProbabilitiesAsLogitsWarning):
        make().fit(probs.double().numpy(), y.numpy())  # numpy, float64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make().fit(probs.log(), y)  # log-probabilities are logits: no warning
        make().fit(logits, y)


@pytest.mark.slow
def test_task_calibrators_warn_on_sigmoid_outputs():
    from cogcal.calibrators import ProbabilitiesAsLogitsWarning, TaskAffine, TaskTemperature

    g = torch.Generator().manual_seed(1)
    z = torch.randn(200, 3, generator=g) * 2
    y = (z + torch.randn(200, 3, generator=g) > 0).long()
    for cls in (TaskTemperature, TaskAffine):
        with pytest.warns(ProbabilitiesAsLogitsWarning, match="look like probabilities"):
            cls().fit(z.sigmoid(), y)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cls().fit(z, y)
