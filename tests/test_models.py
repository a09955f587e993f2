"""Tests of the backbone registry ``cogcal.models`` and its head contract."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cogcal._errors import ArgumentError
from cogcal.models import (
    Backbone,
    check_compatible,
    create_model,
    list_models,
    model_info,
    register_model,
)

ALL = list_models()
# forward passes of the big CIFAR models are kept to 2 images
BIG = {"resnet50", "resnet101", "wrn28_10"}
#: Backbones whose forward and backward passes take seconds on a CPU: slow cases.
CIFAR = {"resnet18", "resnet50", "resnet101", "wrn28_10", "vit_small"}


def _cases(names: list[str], slow: set[str] = CIFAR) -> list:
    """``names`` as parametrised cases, those in ``slow`` marked slow."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in names]


# exact parameter counts at 10 classes and the natural input shape
EXPECTED_PARAMS = {
    "mlp": 78_858,
    "cnn1d": 37_610,
    "cnn": 94_186,
    "resnet18": 11_173_962,  # published CIFAR ResNet-18: 11.17M
    "resnet50": 23_520_842,  # published CIFAR ResNet-50: 23.5M
    "resnet101": 42_512_970,  # published CIFAR ResNet-101: 42.5M
    "wrn28_10": 36_479_194,  # published WRN-28-10: 36.5M
    "vit_small": 3_195_146,
}


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build(name: str, num_classes: int = 10, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return create_model(
        name, num_classes=num_classes, input_shape=model_info(name).default_input_shape
    )


def batch(name: str, n: int = 2) -> torch.Tensor:
    return torch.randn(n, *model_info(name).default_input_shape)


def test_registry_lists_the_spec_backbones():
    assert set(EXPECTED_PARAMS) <= set(ALL)
    assert sorted(ALL) == ALL


@pytest.mark.parametrize("name", _cases(ALL))
def test_head_contract(name):
    model = build(name, num_classes=7).eval()
    assert isinstance(model, Backbone)
    x = batch(name, 1 if name in BIG else 3)
    with torch.no_grad():
        logits = model(x)
        feats = model.forward_features(x)
        assert logits.shape == (x.shape[0], 7)
        assert feats.shape == (x.shape[0], model.num_features)
        torch.testing.assert_close(model.forward_head(feats), logits)
        assert model.forward_head(feats, pre_logits=True) is feats

        head = model.get_classifier()
        assert isinstance(head, nn.Linear) and head is model.head
        assert head.in_features == model.num_features and head.out_features == 7

        # the classifier is the last layer: zero weight, constant bias -> constant logits
        head.weight.zero_()
        head.bias.fill_(1.5)
        torch.testing.assert_close(model(x), torch.full_like(logits, 1.5))

    model.reset_classifier(3)
    assert model.get_classifier() is model.head and model.head.out_features == 3
    assert model.num_classes == 3
    with torch.no_grad():
        out = model.forward_head(feats) if name in BIG else model(x)
    assert out.shape == (x.shape[0], 3)
    assert model.input_shape == model_info(name).default_input_shape


@pytest.mark.parametrize("name", ALL)
def test_parameter_count_at_10_classes(name):
    assert n_params(build(name)) == EXPECTED_PARAMS[name]


@pytest.mark.parametrize(
    ("name", "published"),
    [("resnet101", 42.5e6), ("wrn28_10", 36.5e6), ("resnet18", 11.17e6)],
)
def test_parameter_count_matches_published(name, published):
    assert abs(n_params(build(name)) - published) / published < 0.01


@pytest.mark.parametrize("name", _cases(ALL, {"resnet101", "wrn28_10"}))
def test_deterministic_under_seed(name):
    a, b = build(name, seed=3).state_dict(), build(name, seed=3).state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    if name in BIG:
        return  # a third 20-40M-parameter build adds nothing the small models do not show
    c = build(name, seed=4).state_dict()
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize("name", _cases(["resnet18", "wrn28_10", "vit_small", "cnn", "mlp"]))
def test_multilabel_outputs_and_channels(name):
    """Any number of outputs (40 CelebA tasks) and any channel count from input_shape."""
    shape = (40,) if name == "mlp" else (1, 16, 16)
    model = create_model(name, num_classes=40, input_shape=shape).eval()
    with torch.no_grad():
        assert model(torch.randn(2, *shape)).shape == (2, 40)
    single = create_model(name, num_classes=1, input_shape=shape).eval()
    with torch.no_grad():
        assert single(torch.randn(2, *shape)).shape == (2, 1)


def test_cnn1d_accepts_2d_and_3d_batches():
    model = create_model("cnn1d", num_classes=10, input_shape=(40,)).eval()
    x = torch.randn(3, 40)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x.unsqueeze(1)))
    two = create_model("cnn1d", num_classes=4, input_shape=(2, 40)).eval()
    with torch.no_grad():
        assert two(torch.randn(3, 2, 40)).shape == (3, 4)
    with pytest.raises(ValueError, match=r"\(N, 1, 40\)"):
        model(torch.randn(3, 1, 39))


def test_cnn_takes_digits_and_cifar_shapes():
    for shape in [(1, 8, 8), (3, 32, 32)]:
        model = create_model("cnn", num_classes=10, input_shape=shape).eval()
        with torch.no_grad():
            assert model(torch.randn(2, *shape)).shape == (2, 10)
    flat = create_model("cnn", num_classes=10, input_shape=(8, 8)).eval()
    with torch.no_grad():
        assert flat(torch.randn(2, 8, 8)).shape == (2, 10)


def test_mlp_flattens_any_input():
    model = create_model("mlp", num_classes=10, input_shape=(1, 8, 8)).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)
        assert model(torch.randn(2, 64)).shape == (2, 10)
    with pytest.raises(ValueError, match="64 input features"):
        model(torch.randn(2, 40))


def test_vit_pools_a_layer_normed_class_token_and_checks_the_size():
    model = create_model("vit_small", num_classes=10, input_shape=(3, 32, 32))
    assert isinstance(model.norm, nn.LayerNorm)
    with pytest.raises(ValueError, match=r"\(N, 3, 32, 32\)"):
        model(torch.randn(1, 3, 16, 16))
    smaller = create_model("vit_small", num_classes=10, input_shape=(3, 16, 16), depth=1)
    with torch.no_grad():
        assert smaller(torch.randn(1, 3, 16, 16)).shape == (1, 10)


@pytest.mark.slow
def test_wrn_dropout_option():
    model = create_model("wrn28_10", num_classes=10, input_shape=(3, 32, 32), dropout=0.3)
    assert any(isinstance(m, nn.Dropout) and m.p == 0.3 for m in model.modules())
    default = create_model("wrn28_10", num_classes=10, input_shape=(3, 32, 32))
    assert not any(isinstance(m, nn.Dropout) for m in default.modules())


def test_unknown_name_suggests_the_closest():
    with pytest.raises(ValueError, match="resnet101") as err:
        create_model("resnet10l", num_classes=10, input_shape=(3, 32, 32))
    msg = str(err.value)
    assert "Did you mean 'resnet101'" in msg
    for name in ALL:
        assert name in msg


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10", True, None])
def test_bad_num_classes(bad):
    with pytest.raises(ValueError, match="num_classes"):
        create_model("mlp", num_classes=bad, input_shape=(40,))


def test_reset_classifier_rejects_bad_num_classes():
    model = create_model("mlp", num_classes=10, input_shape=(40,))
    with pytest.raises(ValueError, match="num_classes"):
        model.reset_classifier(0)


@pytest.mark.parametrize(
    ("name", "shape", "match"),
    [
        ("resnet18", (40,), r"\(channels, height, width\)"),
        ("resnet101", (3, 4, 4), "at least 8x8"),
        ("wrn28_10", (32, 32), r"\(channels, height, width\)"),
        ("vit_small", (3, 30, 30), "divisible by 4"),
        ("cnn", (40,), r"\(channels, height, width\)"),
        ("cnn1d", (3, 32, 32), r"\(length,\) or \(channels, length\)"),
        ("mlp", (), "input_shape"),
        ("mlp", (40, 0), "input_shape"),
        ("mlp", 40, "input_shape"),
    ],
)
def test_wrong_input_shape(name, shape, match):
    with pytest.raises(ValueError, match=match):
        create_model(name, num_classes=10, input_shape=shape)


def test_register_model_rejects_duplicates_and_can_register():
    with pytest.raises(ValueError, match="already registered"):
        register_model("mlp", default_input_shape=(40,))(lambda **kw: None)

    class Flat(Backbone):
        def __init__(self, num_classes, input_shape):
            super().__init__(input_shape[0], num_classes)

        def forward_features(self, x):
            return x

    from cogcal.models import registry

    try:
        register_model("_test_flat", default_input_shape=(5,))(Flat)
        assert "_test_flat" in list_models()
        model = create_model("_test_flat", num_classes=2, input_shape=(5,))
        assert model(torch.zeros(4, 5)).shape == (4, 2)
    finally:
        if "_test_flat" in registry.MODELS:
            registry.MODELS.unregister("_test_flat")
    assert "_test_flat" not in list_models()


def test_backbones_are_found_by_the_cog_wrapper():
    cog = pytest.importorskip("cogcal.cog")
    model = create_model("cnn", num_classes=10, input_shape=(1, 8, 8))
    _, head = cog.find_classifier(model)
    assert head is model.get_classifier()


@pytest.mark.parametrize("name", _cases(["mlp", "cnn1d", "cnn", "resnet18", "vit_small"]))
def test_gradients_reach_body_and_head(name):
    model = build(name).train()
    x = batch(name, 2)
    loss = nn.functional.cross_entropy(model(x), torch.tensor([0, 1]))
    loss.backward()
    head_ids = {id(p) for p in model.get_classifier().parameters()}
    body = [p for p in model.parameters() if id(p) not in head_ids]
    assert model.head.weight.grad is not None
    assert all(p.grad is not None for p in body)


def test_names_are_case_insensitive():
    assert model_info("ResNet18").name == "resnet18"
    assert model_info(" MLP ").name == "mlp"
    torch.manual_seed(0)
    a = create_model("CNN", num_classes=3, input_shape=(1, 8, 8))
    torch.manual_seed(0)
    b = create_model("cnn", num_classes=3, input_shape=(1, 8, 8))
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(a.eval()(x), b.eval()(x))
    with pytest.raises(ValueError, match="case-insensitively"):
        register_model("Mlp", default_input_shape=(40,))(lambda **kw: None)
    with pytest.raises(ArgumentError, match="Did you mean 'resnet18'") as err:
        model_info("RESNET19")
    assert err.value.cli_message.startswith("--model: unknown model")


@pytest.mark.parametrize(
    ("name", "shape", "match", "fits"),
    [
        ("resnet18", (20,), r"needs images of shape \(channels, height, width\)", "cnn1d, mlp"),
        ("resnet50", (3, 6, 6), "at least 8x8", "cnn, mlp, wrn28_10"),
        ("wrn28_10", (1, 40), r"\(channels, height, width\).*one-channel image", "cnn1d, mlp"),
        ("vit_small", (3, 30, 30), "divisible by 4", "cnn, mlp, resnet101"),
        ("cnn1d", (3, 32, 32), r"needs sequences.*\(images\)", "cnn, mlp, resnet101"),
        ("cnn", (20,), r"\(channels, height, width\)", "cnn1d, mlp"),
        ("cnn", (3, 1, 1), "at least 2x2", "mlp"),
    ],
)
def test_check_compatible_explains_and_suggests(name, shape, match, fits):
    with pytest.raises(ArgumentError, match=match) as err:
        check_compatible(name, shape)
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert msg.startswith(name) and f"take input {shape}: {fits}" in msg
    assert err.value.cli_message.startswith(f"--model {name} ")
    with pytest.raises(ArgumentError, match=match):  # create_model runs the same check
        create_model(name.upper(), num_classes=2, input_shape=shape)


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("mlp", (20,)),
        ("mlp", (3, 32, 32)),
        ("cnn1d", (40,)),
        ("cnn1d", (2, 40)),
        ("cnn", (1, 8, 8)),
        ("cnn", (28, 28)),
        ("cnn", (3, 64, 64)),
        ("resnet18", (3, 32, 32)),
        ("resnet18", (1, 8, 8)),
        ("wrn28_10", (3, 4, 4)),
        ("vit_small", (3, 64, 64)),
    ],
)
def test_check_compatible_accepts(name, shape):
    assert check_compatible(name, shape) is None


def test_check_compatible_bad_arguments():
    with pytest.raises(ArgumentError, match="unknown model"):
        check_compatible("nope", (3, 32, 32))
    with pytest.raises(ValueError, match="input_shape"):
        check_compatible("mlp", (0,))


def test_options_that_change_what_fits_are_left_to_the_builder():
    # patch 5 divides 35 although the default patch (4) does not: the builder decides
    model = create_model("vit_small", num_classes=2, input_shape=(3, 35, 35), patch_size=5, depth=1)
    assert model(torch.randn(1, 3, 35, 35)).shape == (1, 2)
