"""CalibratedModel: the calibrator moves on its own learning rate, nothing else changes."""

from __future__ import annotations

import copy

import pytest
import torch
import torchvision
from torch import nn

from cogcal import CalibratedModel, find_classifier
from cogcal.calibrators import MatrixScaling, TaskAffine, TaskTemperature, Temperature, TSTHead

LR, CAL_LR = 1e-2, 1e-4


def _mlp(k: int = 5) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, k)
    )


def _batch(k: int = 5, n: int = 64):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 12, generator=g), torch.randint(0, k, (n,), generator=g)


@pytest.mark.parametrize("calibrator", ["fc", "ts", "vs", "ms", "tst"])
def test_one_adam_step_moves_calibrator_by_calibrator_lr(calibrator):
    model = CalibratedModel(_mlp(), calibrator=calibrator)
    reference = copy.deepcopy(model)
    x, y = _batch()

    # hand-built groups: the calibrator module's parameters vs everything else
    cal_ids = {id(p) for p in reference.calibrator.parameters()}
    hand_groups = [
        {"params": [p for p in reference.parameters() if id(p) not in cal_ids], "lr": LR},
        {"params": list(reference.calibrator.parameters()), "lr": CAL_LR},
    ]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for m, groups in (
        (model, model.param_groups(lr=LR, calibrator_lr=CAL_LR)),
        (reference, hand_groups),
    ):
        opt = torch.optim.Adam(groups)
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    for (name, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), name

    # Adam's first step moves each parameter by lr * |g| / (|g| + eps), i.e. by lr where |g| >> eps
    grads = {n: p.grad.detach().abs() for n, p in model.named_parameters()}
    cal_names = {
        n
        for n, p in model.named_parameters()
        if id(p) in {id(c) for c in model.calibrator.parameters()}
    }
    assert cal_names, "the calibrator has parameters"
    for name, p in model.named_parameters():
        step = (p.detach() - before[name]).abs()
        moved = step[grads[name] > 1e-4]
        expected = CAL_LR if name in cal_names else LR
        assert moved.numel() > 0, name
        assert torch.allclose(moved, torch.full_like(moved, expected), rtol=1e-3), name


@pytest.mark.parametrize("calibrator", ["fc", "ts", "ms", "tst"])
def test_groups_cover_every_trainable_parameter_exactly_once(calibrator):
    model = CalibratedModel(_mlp(), calibrator=calibrator)
    model.backbone[0].bias.requires_grad_(False)  # a frozen parameter stays out
    groups = model.param_groups(lr=1e-3, calibrator_lr=1e-4, weight_decay=0.01)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters() if p.requires_grad}
    assert [g["name"] for g in groups] == ["network", "calibrator"]
    assert all(g["weight_decay"] == 0.01 for g in groups)


@pytest.mark.parametrize("calibrator", ["fc", "ts", "vs", "ms"])
def test_equal_learning_rates_equal_plain_training(calibrator):
    x, y = _batch()
    plain_net = _mlp()
    extra = None
    if calibrator != "fc":
        extra = CalibratedModel(_mlp(), calibrator=calibrator).calibrator
    plain_params = list(plain_net.parameters()) + (list(extra.parameters()) if extra else [])
    plain_opt = torch.optim.Adam(plain_params, lr=1e-3)
    model = CalibratedModel(_mlp(), calibrator=calibrator)
    with pytest.warns(UserWarning, match="allow_fast_calibrator=True"):
        groups = model.param_groups(lr=1e-3, calibrator_lr=1e-3, allow_fast_calibrator=True)
    opt = torch.optim.Adam(groups)
    for _ in range(5):
        for m, o in ((model, opt), (None, plain_opt)):
            o.zero_grad()
            out = m(x) if m is not None else plain_net(x)
            if m is None and extra is not None:
                out = extra(out)
            nn.functional.cross_entropy(out, y).backward()
            o.step()
    with torch.no_grad():
        expected = plain_net(x) if extra is None else extra(plain_net(x))
        assert torch.allclose(model(x), expected, atol=1e-6)


def test_wraps_in_place_without_copy():
    net = _mlp()
    model = CalibratedModel(net, calibrator="fc")
    assert model.backbone is net
    assert model.calibrator is net[4]
    ids = {id(p) for p in model.parameters()}
    assert ids == {id(p) for p in net.parameters()}
    # the calibrator is not registered twice in the state dict
    assert sorted(model.state_dict()) == sorted(f"backbone.{k}" for k in net.state_dict())


def test_tst_replaces_the_final_layer():
    net = _mlp(k=10)
    model = CalibratedModel(net, calibrator="tst")
    assert isinstance(net[4], TSTHead) and model.calibrator is net[4]
    assert net[4].in_features == 16 and net[4].latent_dim == 128
    assert model(torch.randn(3, 12)).shape == (3, 10)


def test_learning_rate_hierarchy_is_enforced():
    model = CalibratedModel(_mlp(), calibrator="ts")
    with pytest.raises(ValueError, match="allow_fast_calibrator=True"):
        model.param_groups(lr=1e-3, calibrator_lr=1e-3)
    with pytest.raises(ValueError, match="calibrator_lr.*positive"):
        model.param_groups(lr=1e-3, calibrator_lr=0.0)
    with pytest.raises(ValueError, match="`lr` must be a positive"):
        model.param_groups(lr=-1.0, calibrator_lr=1e-4)


def test_state_dict_round_trip():
    x, _ = _batch()
    model = CalibratedModel(_mlp(), calibrator="ms")
    with torch.no_grad():
        model.calibrator.weight.add_(0.1 * torch.randn(5, 5))
    fresh = CalibratedModel(_mlp(), calibrator="ms")
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh(x), model(x))
    assert isinstance(model.calibrator, MatrixScaling) and model.calibrator.num_outputs == 5


def test_multilabel_calibrators_are_per_task():
    m = CalibratedModel(_mlp(k=7), calibrator="ts", task="multilabel")
    assert isinstance(m.calibrator, TaskTemperature) and m.calibrator.num_outputs == 7
    m = CalibratedModel(_mlp(k=7), calibrator="ms", task="multilabel")
    assert isinstance(m.calibrator, TaskAffine) and m.calibrator.num_outputs == 7
    assert isinstance(CalibratedModel(_mlp(), calibrator="ts").calibrator, Temperature)


def test_custom_module_calibrator_is_appended():
    cal = nn.Linear(5, 5)
    model = CalibratedModel(_mlp(), calibrator=cal)
    assert model.calibrator is cal
    x, _ = _batch()
    with torch.no_grad():
        assert torch.allclose(model(x), cal(model.backbone(x)))


@pytest.mark.parametrize(
    ("builder", "expected"),
    [
        (lambda: torchvision.models.resnet18(weights=None, num_classes=10), "fc"),
        (
            lambda: torchvision.models.mobilenet_v3_small(weights=None, num_classes=10),
            "classifier.3",
        ),
        (lambda: torchvision.models.vit_b_16(weights=None, num_classes=10), "heads.head"),
        (lambda: torchvision.models.vgg11(weights=None, num_classes=10), "classifier.6"),
    ],
    ids=["resnet18", "mobilenet_v3_small", "vit_b_16", "vgg11"],
)
def test_detects_torchvision_heads(builder, expected):
    model = builder()
    name, layer = find_classifier(model)
    assert name == expected and layer.out_features == 10
    cm = CalibratedModel(model, calibrator="fc")
    assert cm.calibrator is layer


def test_detects_timm_heads():
    timm = pytest.importorskip("timm")
    for arch, expected in (("resnet10t", "fc"), ("vit_tiny_patch16_224", "head")):
        model = timm.create_model(arch, pretrained=False, num_classes=4)
        assert find_classifier(model)[0] == expected


def test_real_forward_check_on_resnet18():
    model = CalibratedModel(
        torchvision.models.resnet18(weights=None, num_classes=3), calibrator="fc"
    )
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)


def test_refuses_model_without_linear_head():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    with pytest.raises(ValueError, match="Cannot tell.*classifier_name"):
        CalibratedModel(net, calibrator="fc")


def test_ambiguous_model_lists_candidates_and_accepts_classifier_name():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 8)
            self.out_a = nn.Linear(8, 3)

        def forward(self, x):
            return self.out_a(torch.relu(self.body(x)))

    with pytest.raises(ValueError, match=r"\['body', 'out_a'\]"):
        CalibratedModel(TwoHeads())
    model = CalibratedModel(TwoHeads(), classifier_name="out_a")
    assert model.classifier_name == "out_a"
    with pytest.raises(ValueError, match="not a submodule"):
        CalibratedModel(TwoHeads(), classifier_name="nope")


def test_head_followed_by_clipping_is_refused_on_first_forward():
    class Clipped(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x).clamp(-1, 1)

    model = CalibratedModel(Clipped())
    with pytest.raises(RuntimeError, match="not the model's output"):
        model(torch.randn(2, 4) * 100)


def test_bad_arguments():
    with pytest.raises(ValueError, match="calibrator"):
        CalibratedModel(_mlp(), calibrator="platt")
    with pytest.raises(ValueError, match="task"):
        CalibratedModel(_mlp(), task="regression")
    with pytest.raises(ValueError, match="nn.Module"):
        CalibratedModel(lambda x: x)  # type: ignore[arg-type]
