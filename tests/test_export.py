"""CalibratedModel.export(): a plain nn.Module with the calibrated model's outputs."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from cogcal import CalibratedModel
from cogcal.calibrators import TaskAffine, TaskTemperature, Temperature, TSTHead

TOL = 1e-5


def _mlp(k: int = 5) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, k)
    )


def _cnn(k: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, k),
    )  # fmt: skip


def _x(shape=(64, 12)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(3))


def _trained(model: CalibratedModel, x: torch.Tensor, k: int, steps: int = 3) -> CalibratedModel:
    """A few COG steps, then the calibrator pushed well off the identity."""
    y = torch.randint(0, k, (x.shape[0],), generator=torch.Generator().manual_seed(4))
    opt = torch.optim.Adam(model.param_groups(lr=1e-2, calibrator_lr=1e-3))
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.calibrator_parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _only_torch_nn(module: nn.Module) -> bool:
    return all(type(m).__module__.startswith("torch.nn.") for m in module.modules())


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("calibrator", ["fc", "ts", "vs", "ms", "tst"])
def test_export_equals_the_calibrated_model_and_leaves_it_alone(calibrator):
    x = _x()
    net = _mlp()
    model = _trained(CalibratedModel(net, calibrator=calibrator, latent_dim=8), x, k=5)
    with torch.no_grad():
        expected = model(x)
    before, modes = _snapshot(model), [m.training for m in model.modules()]
    exported = model.export()
    # the wrapped model is untouched: same parameters, same outputs, same modes
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [m.training for m in model.modules()] == modes
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    # a plain torch.nn module in eval mode, with the same outputs
    assert not isinstance(exported, CalibratedModel) and not exported.training
    assert _only_torch_nn(exported)
    with torch.no_grad():
        assert (exported(x) - expected).abs().max() <= TOL
    # nothing is shared with the wrapped model
    ids = {id(p) for p in model.parameters()}
    assert not ids & {id(p) for p in exported.parameters()}
    if calibrator == "tst":
        assert isinstance(exported[4], nn.Sequential) and not isinstance(exported[4], TSTHead)
    else:  # exactly the network's architecture and parameter count (folded)
        assert [type(m) for m in exported.modules()] == [type(m) for m in _mlp().modules()]
        assert _n_params(exported) == _n_params(_mlp())


def test_fc_export_is_a_copy_that_later_training_does_not_change():
    x = _x()
    model = _trained(CalibratedModel(_mlp(), calibrator="fc"), x, k=5)
    exported = model.export()
    with torch.no_grad():
        frozen = exported(x).clone()
        for p in model.parameters():
            p.add_(1.0)
        assert torch.equal(exported(x), frozen)
        assert not torch.equal(model(x), frozen)
    assert all(p.grad is None for p in exported.parameters())


@pytest.mark.parametrize("calibrator", ["ts", "ms"])
def test_multilabel_per_task_maps_fold(calibrator):
    x = _x()
    model = CalibratedModel(_mlp(k=7), calibrator=calibrator, task="multilabel")
    assert isinstance(model.calibrator, TaskTemperature if calibrator == "ts" else TaskAffine)
    y = (torch.rand(64, 7, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    opt = torch.optim.Adam(model.param_groups(lr=1e-2, calibrator_lr=1e-3))
    nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
    opt.step()
    with torch.no_grad():
        for p in model.calibrator_parameters():
            p.add_(0.3 * torch.randn_like(p))
        expected = model.eval()(x)
    exported = model.export()
    assert [type(m) for m in exported.modules()] == [type(m) for m in _mlp(7).modules()]
    with torch.no_grad():
        assert (exported(x) - expected).abs().max() <= TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_is_computed_in_float64_then_cast(dtype):
    x = _x()
    net = _mlp(k=10)
    with torch.no_grad():
        net[4].weight.mul_(5)
        net[4].bias.add_(10)
    model = CalibratedModel(net, calibrator="ms").eval()
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        model.calibrator.weight.copy_(torch.eye(10) + 0.5 * torch.randn(10, 10, generator=g))
        model.calibrator.bias.copy_(torch.randn(10, generator=g))
    model.to(dtype)
    with torch.no_grad():
        expected = model(x.to(dtype))
    exported = model.export(example_input=x.to(dtype))
    m, c = model.calibrator.weight.double(), model.calibrator.bias.double()
    w, b = net[4].weight.double(), net[4].bias.double()
    assert exported[4].weight.dtype == dtype
    assert torch.equal(exported[4].weight, (m @ w).to(dtype))
    assert torch.equal(exported[4].bias, (m @ b + c).to(dtype))
    if dtype == torch.float32:  # logits up to ~30
        with torch.no_grad():
            assert (exported(x) - expected).abs().max() <= TOL


def test_unfoldable_models_export_network_then_calibrator():
    class TwoHeads(nn.Module):  # no head can be detected
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(12, 8)
            self.b = nn.Linear(8, 5)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    x = _x()
    for calibrator in ("ts", "vs", "ms"):
        net = TwoHeads()
        model = CalibratedModel(net, calibrator=calibrator, num_outputs=5)
        model = _trained(model, x, k=5)
        with torch.no_grad():
            expected = model(x)
        exported = model.export()
        assert isinstance(exported, nn.Sequential) and len(exported) == 2
        assert isinstance(exported[0], TwoHeads) and exported[0] is not net
        assert _only_torch_nn(exported[1])
        with torch.no_grad():
            assert (exported(x) - expected).abs().max() <= TOL


def test_temperature_module_works_for_any_number_of_classes():
    # a temperature without a detected head is expressed for any K and any leading shape
    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(12, 8), nn.Linear(8, 6)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    model = CalibratedModel(Body(), calibrator="ts").eval()
    with torch.no_grad():
        model.calibrator.log_temperature.fill_(0.8)
    exported = model.export()
    for shape in ((5, 12), (2, 3, 12)):
        x = _x(shape)
        with torch.no_grad():
            assert (exported(x) - model(x)).abs().max() <= TOL


def test_head_that_is_not_the_output_is_not_folded():
    class Clipped(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 5)

        def forward(self, x):
            return self.fc(x).clamp(-1, 1)

    x = _x() * 10
    model = _trained(CalibratedModel(Clipped(), calibrator="vs"), x, k=5)
    with torch.no_grad():
        expected = model(x)
    exported = model.export()
    assert isinstance(exported, nn.Sequential) and isinstance(exported[0], Clipped)
    with torch.no_grad():
        assert (exported(x) - expected).abs().max() <= TOL


@pytest.mark.slow
def test_unchecked_model_needs_an_example_input_to_fold():
    x = _x()
    model = CalibratedModel(_mlp(), calibrator="ts")
    trained = _trained(copy.deepcopy(model), x, k=5)
    fresh = CalibratedModel(_mlp(), calibrator="ts")
    fresh.load_state_dict(trained.state_dict())  # as after loading a checkpoint
    fresh.eval()
    with pytest.warns(UserWarning, match="example_input="):
        unfolded = fresh.export()
    assert isinstance(unfolded, nn.Sequential) and len(unfolded) == 2
    fresh.train()
    folded = fresh.export(example_input=x)
    assert fresh.training and all(m.training for m in fresh.modules())  # modes restored
    assert [type(m) for m in folded.modules()] == [type(m) for m in _mlp().modules()]
    with torch.no_grad():
        expected = trained(x)
        assert (unfolded(x) - expected).abs().max() <= TOL
        assert (folded(x) - expected).abs().max() <= TOL


@pytest.mark.slow
def test_user_calibrator_modules():
    x = _x()
    # a square nn.Linear folds like matrix scaling
    model = _trained(CalibratedModel(_mlp(), calibrator=nn.Linear(5, 5)), x, k=5)
    exported = model.export()
    assert [type(m) for m in exported.modules()] == [type(m) for m in _mlp().modules()]
    with torch.no_grad():
        assert (exported(x) - model(x)).abs().max() <= TOL
    # cogcal's own calibrators given as modules fold too
    model = _trained(CalibratedModel(_mlp(), calibrator=Temperature()), x, k=5)
    assert len(list(model.export().modules())) == len(list(_mlp().modules()))
    # anything else is appended as given (a deep copy)
    custom = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 5))
    model = _trained(CalibratedModel(_mlp(), calibrator=custom), x, k=5)
    exported = model.export()
    assert isinstance(exported, nn.Sequential) and len(exported) == 2
    assert exported[1] is not custom
    with torch.no_grad():
        assert (exported(x) - model(x)).abs().max() <= TOL


def test_tied_head_weight_is_not_folded_into_its_twin():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(5, 5, bias=False)
            self.fc = nn.Linear(5, 5)
            self.fc.weight = self.embed.weight

        def forward(self, x):
            return self.fc(torch.relu(self.embed(x)))

    x = _x((16, 5))
    model = _trained(CalibratedModel(Tied(), calibrator="ms", classifier_name="fc"), x, k=5)
    exported = model.export()
    assert exported.fc.weight is not exported.embed.weight
    assert torch.equal(exported.embed.weight, model.network.embed.weight)
    with torch.no_grad():
        assert (exported(x) - model(x)).abs().max() <= TOL


def test_cnn_export():
    x = _x((6, 3, 8, 8))
    model = _trained(CalibratedModel(_cnn(), calibrator="vs"), x, k=4)
    exported = model.export()
    assert [type(m) for m in exported.modules()] == [type(m) for m in _cnn().modules()]
    with torch.no_grad():
        assert (exported(x) - model(x)).abs().max() <= TOL


# -- ONNX --------------------------------------------------------------------------------------


def _onnx_outputs(module: nn.Module, x: torch.Tensor, path, dynamo: bool):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    if dynamo:
        pytest.importorskip("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated (still offline)
        torch.onnx.export(
            module,
            (x,),
            str(path),
            input_names=["x"],
            output_names=["logits"],
            dynamo=dynamo,
            **({} if dynamo else {"dynamic_axes": {"x": {0: "batch"}, "logits": {0: "batch"}}}),
        )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"x": x.numpy()})[0])


@pytest.mark.parametrize(
    ("calibrator", "arch", "dynamo"),
    [
        ("fc", "mlp", False),
        ("ts", "mlp", False),
        ("vs", "mlp", False),
        ("ms", "mlp", False),
        ("tst", "mlp", False),
        ("ts", "cnn", False),
        # torch.export-based exporter (the default since torch 2.9)
        pytest.param("ms", "mlp", True, marks=pytest.mark.slow),
    ],
)
def test_onnx_runtime_matches(calibrator, arch, dynamo, tmp_path):
    x = _x() if arch == "mlp" else _x((6, 3, 8, 8))
    k = 5 if arch == "mlp" else 4
    net = _mlp() if arch == "mlp" else _cnn()
    model = _trained(CalibratedModel(net, calibrator=calibrator, latent_dim=8), x, k=k)
    exported = model.export()
    got = _onnx_outputs(exported, x, tmp_path / "model.onnx", dynamo)
    with torch.no_grad():
        assert (got - model(x)).abs().max() <= TOL


def test_onnx_of_an_unfolded_temperature(tmp_path):
    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(12, 8), nn.Linear(8, 6)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    x = _x()
    model = CalibratedModel(Body(), calibrator="ts").eval()
    with torch.no_grad():
        model.calibrator.log_temperature.fill_(-0.4)
    exported = model.export()
    assert isinstance(exported, nn.Sequential)
    got = _onnx_outputs(exported, x, tmp_path / "t.onnx", dynamo=False)
    with torch.no_grad():
        assert (got - model(x)).abs().max() <= TOL
