"""CalibratedModel with other libraries: HuggingFace transformers, torch.compile, timm.

Tiny models built from configs (no weights, no download), a couple of steps each.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from cogcal import CalibratedModel, find_classifier
from cogcal.cog import CalibratorRateWarning

LR, CAL_LR = 1e-2, 1e-3


def _bert(num_labels: int = 3):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=num_labels,
    )
    return transformers.BertForSequenceClassification(config)


def _gpt2(num_labels: int = 3):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=50,
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=32,
        num_labels=num_labels,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    )
    return transformers.GPT2ForSequenceClassification(config)


def _batch(n: int = 8, length: int = 7, padded: bool = False, labels: bool = False):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 50, (n, length), generator=g)
    mask = torch.ones_like(ids)
    if padded:  # right padding of varying length: GPT-2 pools the last real token
        for i in range(n):
            cut = length - (i % 3)
            ids[i, cut:] = 0
            mask[i, cut:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if labels:
        batch["labels"] = torch.randint(0, 3, (n,), generator=g)
    return batch


# -- HuggingFace -----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_hf_heads_are_detected(arch):
    model = _bert() if arch == "bert" else _gpt2()
    name, layer = find_classifier(model)
    assert name == ("classifier" if arch == "bert" else "score")
    assert layer.out_features == 3


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
@pytest.mark.parametrize("calibrator", ["fc", "ts", "vs", "ms", "tst"])
def test_hf_model_outputs_keep_their_type(arch, calibrator):
    net = _bert() if arch == "bert" else _gpt2()
    reference = copy.deepcopy(net).eval()
    model = CalibratedModel(net, calibrator=calibrator, latent_dim=8).eval()
    batch = _batch(padded=arch == "gpt2")
    with torch.no_grad():
        if model.appended is not None:  # move the calibrator off the identity
            for p in model.calibrator_parameters():
                p.add_(0.1 * torch.randn_like(p))
        out = model(**batch)
        assert type(out) is type(reference(**batch)) and out.loss is None
        assert type(out).__name__.startswith("SequenceClassifierOutput")
        assert out.logits.shape == (8, 3)
        if calibrator == "fc":
            assert torch.equal(out.logits, reference(**batch).logits)
        elif calibrator == "tst":
            assert torch.equal(out.logits, net(**batch).logits)  # the head replaced in net
        else:
            expected = model.calibrator(reference(**batch).logits)
            assert torch.allclose(out.logits, expected, atol=1e-6)


@pytest.mark.parametrize("arch", [pytest.param("bert", marks=pytest.mark.slow), "gpt2"])
def test_hf_plain_loop_moves_the_calibrator_by_its_rate(arch):
    net = _bert() if arch == "bert" else _gpt2()
    model = CalibratedModel(net, calibrator="ts")
    opt = torch.optim.Adam(model.param_groups(lr=LR, calibrator_lr=CAL_LR))
    batch = _batch(labels=True, padded=arch == "gpt2")
    labels = batch.pop("labels")
    with pytest.raises(ValueError, match="compute_loss_func"):
        model(**batch, labels=labels)  # HF's own loss ignores the calibrator
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibratorRateWarning)
        for _ in range(2):
            log_t = model.calibrator.log_temperature.detach().clone()
            weight = (
                model.network.classifier.weight if arch == "bert" else model.network.score.weight
            )
            before = weight.detach().clone()
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(**batch).logits, labels)
            loss.backward()
            first = not opt.state
            grad = model.calibrator.log_temperature.grad.abs().item()
            opt.step()
            if first:  # Adam's first step moves each parameter by its rate (|grad| >> eps)
                assert grad > 1e-4
                moved = (model.calibrator.log_temperature - log_t).abs().item()
                assert moved == pytest.approx(CAL_LR, rel=1e-3)
                big = weight.grad.abs() > 1e-4
                step = (weight.detach() - before).abs()[big]
                assert torch.allclose(step, torch.full_like(step, LR), rtol=1e-3)


def test_hf_fc_model_keeps_its_own_loss_and_export_returns_the_hf_type():
    net = _gpt2()
    model = CalibratedModel(net, calibrator="fc")
    batch = _batch(labels=True, padded=True)
    out = model(**batch)
    assert out.loss is not None and out.loss.ndim == 0
    exported = model.export()
    assert type(exported) is type(net) and exported is not net
    with torch.no_grad():
        assert torch.equal(exported(**batch).logits, model.eval()(**batch).logits)


@pytest.mark.parametrize("calibrator", ["ts", "vs", "ms"])
def test_hf_export_folds_into_score_without_bias(calibrator):
    net = _gpt2()
    model = CalibratedModel(net, calibrator=calibrator).eval()
    batch = _batch(padded=True)
    with torch.no_grad():
        for p in model.calibrator_parameters():
            p.add_(0.2 * torch.randn_like(p))
        expected = model(**batch).logits  # first forward: checks score -> logits
        before = {k: v.clone() for k, v in model.state_dict().items()}
    exported = model.export()
    assert type(exported) is type(net)
    n_params = sum(p.numel() for p in exported.parameters())
    extra = 0 if calibrator == "ts" else 3  # a folded bias gives score a bias of K
    assert n_params == sum(p.numel() for p in net.parameters()) + extra
    with torch.no_grad():
        got = exported(**batch)
    assert type(got) is type(net(**batch))
    assert (got.logits - expected).abs().max() <= 1e-5
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    # labels now give the calibrated loss, computed by the HF model itself
    labels = torch.randint(0, 3, (8,))
    with torch.no_grad():
        loss = exported(**batch, labels=labels).loss
    assert loss == pytest.approx(nn.functional.cross_entropy(expected, labels).item(), abs=1e-5)


def test_hf_export_that_cannot_fold_is_refused_with_a_reason():
    model = CalibratedModel(_bert(), calibrator=nn.Sequential(nn.Linear(3, 3), nn.Tanh()))
    model(**_batch())
    with pytest.raises(ValueError, match="structured outputs"):
        model.export()


def _trainer(model, tmp_path, optimizer, **kwargs):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    data = []
    for i in range(8):
        b = _batch(n=1, labels=True)
        data.append({k: v[0] for k, v in b.items()} | {"labels": torch.tensor(i % 3)})
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        remove_unused_columns=False,  # CalibratedModel.forward takes **kwargs
        label_names=["labels"],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    return transformers.Trainer(
        model=model, args=args, train_dataset=data, optimizers=(optimizer, None), **kwargs
    )


@pytest.mark.slow
def test_hf_trainer_fc_with_param_groups(tmp_path):
    model = CalibratedModel(_bert(), calibrator="fc")
    head = model.calibrator.weight.detach().clone()
    body = model.network.bert.embeddings.word_embeddings.weight.detach().clone()
    opt = torch.optim.AdamW(model.param_groups(lr=LR, calibrator_lr=CAL_LR))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibratorRateWarning)
        _trainer(model, tmp_path, opt).train()
    assert [g["name"] for g in opt.param_groups] == ["network", "calibrator"]
    assert opt.param_groups[1]["weight_decay"] == 0.0  # AdamW's default decay: network only
    # the scheduler Trainer adds scales both groups alike: the ratio stays 10
    net_lr, cal_lr = (g["lr"] for g in opt.param_groups)
    assert net_lr == pytest.approx(10 * cal_lr)
    assert not torch.equal(head, model.calibrator.weight.detach())
    assert not torch.equal(body, model.network.bert.embeddings.word_embeddings.weight.detach())


@pytest.mark.slow
def test_hf_trainer_appended_calibrator_with_compute_loss_func(tmp_path):
    model = CalibratedModel(_gpt2(), calibrator="ts")
    opt = torch.optim.AdamW(model.param_groups(lr=LR, calibrator_lr=CAL_LR))

    def loss_fn(outputs, labels, num_items_in_batch=None):
        return nn.functional.cross_entropy(outputs.logits, labels)

    trainer = _trainer(model, tmp_path, opt, compute_loss_func=loss_fn)
    trainer.train()
    assert model.calibrator.log_temperature.item() != 0.0  # the calibrator got gradients
    metrics = trainer.evaluate(trainer.train_dataset)
    assert "eval_loss" in metrics


def test_hf_trainer_sees_the_models_loss_kwargs():
    assert CalibratedModel(_bert()).accepts_loss_kwargs is True  # BERT's forward: **kwargs
    assert CalibratedModel(nn.Sequential(nn.Linear(3, 2))).accepts_loss_kwargs is False


# -- torch.compile ---------------------------------------------------------------------------


def _mlp(k: int = 5) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, k))


@pytest.mark.parametrize(
    "calibrator",
    [
        pytest.param("fc", marks=pytest.mark.slow),
        "ts",
        "ms",
        pytest.param("tst", marks=pytest.mark.slow),
    ],
)
def test_compiled_model_is_looked_into(calibrator):
    net = _mlp()
    compiled = torch.compile(net, backend="eager")  # dynamo only: fast, same module naming
    assert find_classifier(compiled)[0] == "_orig_mod.2"
    model = CalibratedModel(compiled, calibrator=calibrator, latent_dim=8)
    assert model.backbone is compiled and model.network is net
    if calibrator in ("fc", "tst"):
        assert model.classifier_name == "2" and model.calibrator is net[2]
    opt = torch.optim.Adam(model.param_groups(lr=LR, calibrator_lr=CAL_LR))
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibratorRateWarning)
        for _ in range(2):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert ids == {id(p) for p in net.parameters()} | {id(p) for p in model.calibrator_parameters()}
    model.eval()
    with torch.no_grad():
        expected = net(x) if model.appended is None else model.appended(net(x))
        assert torch.allclose(model(x), expected, atol=1e-6)
        exported = model.export()
        assert not hasattr(exported, "_orig_mod")
        assert (exported(x) - model(x)).abs().max() <= 1e-5


def test_compiled_classifier_name_accepts_either_spelling():
    for name in ("2", "_orig_mod.2"):
        model = CalibratedModel(torch.compile(_mlp(), backend="eager"), classifier_name=name)
        assert model.classifier_name == "2"


# -- timm --------------------------------------------------------------------------------------


def test_timm_create_optimizer_v2_on_the_model_triggers_the_guard():
    timm_optim = pytest.importorskip("timm.optim")
    model = CalibratedModel(_mlp(), calibrator="ts")
    opt = timm_optim.create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    x, y = torch.randn(8, 12), torch.randint(0, 5, (8,))
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.warns(CalibratorRateWarning, match="share a parameter group"):
        opt.step()
    # timm keeps per-group rates when given the groups
    model = CalibratedModel(_mlp(), calibrator="ts")
    groups = model.param_groups(lr=1e-3, calibrator_lr=1e-4, weight_decay=0.05)
    opt = timm_optim.create_optimizer_v2(groups, opt="adamw", lr=1e-3, weight_decay=0.05)
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(1e-3, 0.05), (1e-4, 0.0)]
    nn.functional.cross_entropy(model(x), y).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibratorRateWarning)
        opt.step()
