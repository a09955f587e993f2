"""CalibratedModel: the calibrator moves on its own learning rate, nothing else changes."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torchvision
from torch import nn

from cogcal import CalibratedModel, find_classifier
from cogcal.calibrators import MatrixScaling, TaskAffine, TaskTemperature, Temperature, TSTHead
from cogcal.cog import CalibratorRateWarning

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
    # weight decay is the network's; the calibrator's is separate and 0 unless asked
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]


@pytest.mark.parametrize(
    "calibrator", ["fc", *(pytest.param(c, marks=pytest.mark.slow) for c in ("ts", "vs", "ms"))]
)
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


def test_tst_replaces_the_final_layer_of_the_users_net_in_place():
    # documented in the class docstring: "tst" changes the user's network itself
    net = _mlp(k=10)
    original_head = net[4]
    model = CalibratedModel(net, calibrator="tst")
    assert model.backbone is net
    assert isinstance(net[4], TSTHead) and net[4] is not original_head
    assert model.calibrator is net[4]
    assert net[4].in_features == 16 and net[4].latent_dim == 128
    x = torch.randn(3, 12)
    assert model(x).shape == (3, 10)
    assert torch.equal(net(x), model(x))  # the user's net now computes the TST logits
    assert "backbone.4.encoder.0.weight" in model.state_dict()
    # a deep copy keeps the original network intact
    untouched = _mlp(k=10)
    CalibratedModel(copy.deepcopy(untouched), calibrator="tst")
    assert isinstance(untouched[4], nn.Linear)


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
        pytest.param(
            lambda: torchvision.models.vit_b_16(weights=None, num_classes=10),
            "heads.head",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda: torchvision.models.vgg11(weights=None, num_classes=10),
            "classifier.6",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["resnet18", "mobilenet_v3_small", "vit_b_16", "vgg11"],
)
def test_detects_torchvision_heads(builder, expected):
    model = builder()
    name, layer = find_classifier(model)
    assert name == expected and layer.out_features == 10
    cm = CalibratedModel(model, calibrator="fc")
    assert cm.calibrator is layer


@pytest.mark.slow
def test_detects_timm_heads():
    timm = pytest.importorskip("timm")
    for arch, expected in (("resnet10t", "fc"), ("vit_tiny_patch16_224", "head")):
        model = timm.create_model(arch, pretrained=False, num_classes=4)
        assert find_classifier(model)[0] == expected


@pytest.mark.slow
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
    with pytest.raises(ValueError, match="not the model's output"):
        model(torch.randn(2, 4) * 100)


def test_bad_arguments():
    with pytest.raises(ValueError, match="calibrator"):
        CalibratedModel(_mlp(), calibrator="platt")
    with pytest.raises(ValueError, match="task"):
        CalibratedModel(_mlp(), task="regression")
    with pytest.raises(ValueError, match="nn.Module"):
        CalibratedModel(lambda x: x)  # type: ignore[arg-type]


# -- forward: any signature, structured outputs ---------------------------------------------


class _KwargNet(nn.Module):
    """A model called with keyword arguments that returns a mapping (like HuggingFace)."""

    def __init__(self, k: int = 5) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 16), nn.ReLU())
        self.classifier = nn.Linear(16, k)

    def forward(self, x, *, shift=0.0, labels=None):
        logits = self.classifier(self.body(x + shift))
        out = {"logits": logits, "features": x}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


@pytest.mark.parametrize("calibrator", ["fc", "ts", "vs", "ms", "tst"])
def test_keyword_arguments_and_mapping_outputs(calibrator):
    model = CalibratedModel(_KwargNet(), calibrator=calibrator)
    x, _ = _batch()
    with torch.no_grad():
        model.calibrator_parameters()[0].add_(0.3)
        out = model(x=x, shift=0.5)
        assert type(out) is dict and set(out) == {"logits", "features"}
        raw = model.backbone(x=x, shift=0.5)["logits"]
        expected = raw if model.appended is None else model.appended(raw)
        assert torch.equal(out["logits"], expected)
        assert out["features"] is x
    assert model.classifier_name == ("classifier" if calibrator != "ts" else None)


def test_appended_calibrator_refuses_a_loss_from_uncalibrated_logits():
    x, y = _batch()
    model = CalibratedModel(_KwargNet(), calibrator="ts")
    with pytest.raises(ValueError, match="compute_loss_func"):
        model(x, labels=y)
    # "fc" lives inside the model: its own loss is the COG loss
    fc = CalibratedModel(_KwargNet(), calibrator="fc")
    assert fc(x, labels=y)["loss"].ndim == 0


def test_dataclass_namedtuple_and_tuple_outputs_keep_their_type():
    import collections
    import dataclasses

    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        extra: int = 3

    Pair = collections.namedtuple("Pair", ["features", "logits"])

    class Net(nn.Module):
        def __init__(self, wrap):
            super().__init__()
            self.fc = nn.Linear(12, 5)
            self.wrap = wrap

        def forward(self, x):
            return self.wrap(x, self.fc(x))

    x, _ = _batch()
    t = Temperature()
    with torch.no_grad():
        t.log_temperature.fill_(0.7)
    cases = [
        (lambda x, z: Out(z), "logits", lambda o: o.logits),
        (lambda x, z: Pair(x, z), "logits", lambda o: o.logits),
        (lambda x, z: (x, z), 1, lambda o: o[1]),
    ]
    for wrap, key, get in cases:
        net = Net(wrap)
        model = CalibratedModel(net, calibrator=copy.deepcopy(t), output_key=key)
        with torch.no_grad():
            out = model(x)
            assert type(out) is type(net(x))
            assert torch.allclose(get(out), get(net(x)) / t.temperature, atol=1e-6)
    with pytest.raises(TypeError, match="output_key"):
        CalibratedModel(Net(cases[2][0]), calibrator="ts")(x)  # a tuple needs an index
    with pytest.raises(TypeError, match="output_key"):
        CalibratedModel(Net(cases[0][0]), calibrator="fc", output_key="scores")(x)
    with pytest.raises(TypeError, match="output_key"):
        CalibratedModel(_mlp(), output_key=1.5)  # type: ignore[arg-type]


def test_head_whose_rows_are_selected_passes_the_first_forward_check():
    # GPT-2 style: the head runs on every position, the model returns the last position's
    class PerToken(nn.Module):
        def __init__(self):
            super().__init__()
            self.score = nn.Linear(6, 3)

        def forward(self, x):  # (B, T, 6)
            return self.score(x)[:, -1]

    model = CalibratedModel(PerToken())
    assert model.classifier_name == "score"
    assert model(torch.randn(4, 7, 6)).shape == (4, 3)

    class Summed(PerToken):
        def forward(self, x):  # a sum over positions is not a selection
            return self.score(x).sum(1)

    with pytest.raises(ValueError, match="not the model's output"):
        CalibratedModel(Summed())(torch.randn(4, 7, 6))


# -- weight decay ------------------------------------------------------------------------------


def test_calibrator_weight_decay_is_separate_and_explicit():
    model = CalibratedModel(_mlp(), calibrator="ts")
    # AdamW decays by 0.01 by default: the calibrator group says 0.0 explicitly
    opt = torch.optim.AdamW(model.param_groups(1e-3, 1e-4, betas=(0.8, 0.9), eps=1e-6))
    net_group, cal_group = opt.param_groups
    assert net_group["weight_decay"] == 0.01 and cal_group["weight_decay"] == 0.0
    assert net_group["betas"] == cal_group["betas"] == (0.8, 0.9)
    assert net_group["eps"] == cal_group["eps"] == 1e-6
    groups = model.param_groups(1e-3, 1e-4, weight_decay=0.1, calibrator_weight_decay=0.02)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.02]
    # the temperature's decay pulls log T toward 0, i.e. T toward 1 (the identity)
    with torch.no_grad():
        model.calibrator.log_temperature.fill_(1.0)
    opt = torch.optim.SGD(model.param_groups(1e-1, 1e-2, calibrator_weight_decay=1.0))
    model.calibrator.log_temperature.grad = torch.zeros(())
    opt.step()
    assert model.calibrator.log_temperature.item() == pytest.approx(0.99)


@pytest.mark.parametrize(("calibrator", "task"), [("vs", "multiclass"), ("ms", "multiclass"),
                                                  ("ms", "multilabel")])  # fmt: skip
def test_calibrator_weight_decay_refused_where_zero_is_not_the_identity(calibrator, task):
    model = CalibratedModel(_mlp(), calibrator=calibrator, task=task)
    with pytest.raises(ValueError, match="identity"):
        model.param_groups(1e-3, 1e-4, calibrator_weight_decay=1e-4)
    groups = model.param_groups(1e-3, 1e-4, weight_decay=1e-4)  # network decay is fine
    assert [g["weight_decay"] for g in groups] == [1e-4, 0.0]


def test_calibrator_weight_decay_bad_values():
    model = CalibratedModel(_mlp(), calibrator="fc")
    for bad in (-0.1, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ValueError, match="calibrator_weight_decay"):
            model.param_groups(1e-3, 1e-4, calibrator_weight_decay=bad)
    assert model.param_groups(1e-3, 1e-4, calibrator_weight_decay=0.1)[1]["weight_decay"] == 0.1


# -- the optimiser guard -----------------------------------------------------------------------


def _steps(model, opt, n=1, sched=None):
    x, y = _batch()
    caught = []
    for _ in range(n):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if sched is not None:
                sched.step()
        caught.append([w for w in rec if issubclass(w.category, CalibratorRateWarning)])
    return caught


@pytest.mark.slow
def test_guard_warns_once_when_one_group_holds_everything():
    model = CalibratedModel(_mlp(), calibrator="ts")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    caught = _steps(model, opt, n=3)
    assert [len(c) for c in caught] == [1, 0, 0]
    msg = str(caught[0][0].message)
    assert "lr=0.001, not below its network's lr=0.001" in msg
    assert "share a parameter group" in msg and "model.param_groups(lr, calibrator_lr)" in msg
    assert "allow_fast_calibrator=True" in msg
    assert caught[0][0].filename == __file__  # points at the user's opt.step()
    assert issubclass(CalibratorRateWarning, UserWarning)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")
def test_guard_catches_one_cycle_with_a_single_max_lr():
    model = CalibratedModel(_mlp(), calibrator="ts")
    opt = torch.optim.Adam(model.param_groups(lr=0.1, calibrator_lr=0.01))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100)
    for _ in range(50):
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.0794, 0.0794], abs=1e-4)
    caught = _steps(model, opt, n=2, sched=sched)
    assert [len(c) for c in caught] == [1, 0]
    msg = str(caught[0][0].message)
    assert "lr=0.0794, not below its network's lr=0.0794" in msg
    assert "max_lr=[lr, calibrator_lr]" in msg


@pytest.mark.slow
def test_guard_is_silent_when_rates_keep_their_order():
    model = CalibratedModel(_mlp(), calibrator="ms")
    opt = torch.optim.Adam(model.param_groups(lr=0.1, calibrator_lr=0.01))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.1, 0.01], total_steps=30)
    assert not any(_steps(model, opt, n=30, sched=sched))
    # an optimiser holding only the calibrator (post-hoc style fine-tuning) is not COG
    cal_only = torch.optim.Adam(model.calibrator.parameters(), lr=1.0)
    assert not any(_steps(model, cal_only))


def test_guard_fires_when_a_scheduler_raises_the_calibrator_past_the_network():
    model = CalibratedModel(_mlp(), calibrator="vs")
    opt = torch.optim.SGD(model.param_groups(lr=0.01, calibrator_lr=0.001))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda e: 1.0, lambda e: 1.0 + 4 * e])
    caught = _steps(model, opt, n=5, sched=sched)
    # after 2 scheduler steps the calibrator is at 0.009, after 3 at 0.013 >= 0.01
    assert [len(c) for c in caught] == [0, 0, 0, 1, 0]
    assert "lr=0.013, not below its network's lr=0.01" in str(caught[3][0].message)


def test_guard_silenced_by_allow_fast_calibrator():
    model = CalibratedModel(_mlp(), calibrator="ts", allow_fast_calibrator=True)
    assert model.allow_fast_calibrator
    assert not any(_steps(model, torch.optim.Adam(model.parameters())))
    other = CalibratedModel(_mlp(), calibrator="ts")
    with pytest.warns(UserWarning, match="allow_fast_calibrator=True"):
        groups = other.param_groups(1e-3, 1e-3, allow_fast_calibrator=True)
    assert other.allow_fast_calibrator
    assert not any(_steps(other, torch.optim.Adam(groups)))
    with pytest.raises(TypeError, match="allow_fast_calibrator"):
        CalibratedModel(_mlp(), allow_fast_calibrator="yes")  # type: ignore[arg-type]


@pytest.mark.slow
def test_guard_is_per_model_and_follows_added_groups_and_copies():
    a, b = CalibratedModel(_mlp(), calibrator="ts"), CalibratedModel(_mlp(), calibrator="fc")
    opt = torch.optim.Adam(a.param_groups(1e-3, 1e-4))
    assert not any(_steps(a, opt))
    opt.add_param_group({"params": list(b.parameters()), "lr": 1e-3})  # b: one group
    x, y = _batch()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        (nn.functional.cross_entropy(a(x), y) + nn.functional.cross_entropy(b(x), y)).backward()
        opt.step()
    assert len([w for w in rec if w.category is CalibratorRateWarning]) == 1
    assert "calibrator='fc'" in str(rec[-1].message)
    clone = copy.deepcopy(a)  # copies are guarded too
    assert len(_steps(clone, torch.optim.SGD(clone.parameters(), lr=0.1))[0]) == 1
    # a model that is gone is not kept alive by the guard
    import gc
    import weakref

    ref = weakref.ref(b)
    del b, opt
    gc.collect()
    assert ref() is None


def test_guard_costs_next_to_nothing_per_step():
    # one plan per optimiser, then a few float comparisons: time the hook itself
    import time

    from cogcal.cog import _guard

    model = CalibratedModel(_mlp(), calibrator="ts")
    opt = torch.optim.Adam(model.param_groups(1e-3, 1e-4))
    _guard(opt, (), {})
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        _guard(opt, (), {})
    per_call = (time.perf_counter() - start) / n
    assert per_call < 50e-6, per_call  # a typical step takes milliseconds
