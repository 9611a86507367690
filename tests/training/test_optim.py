"""Optimizers and schedules against independent references: the closed forms of the lr
schedules, the weight-decay groups by parameter name, and Muon through OptimizerGroup
against torch.optim.Muon + AdamW built by hand."""

from __future__ import annotations

import math

import pytest
import torch

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.config.trainer import TrainerConfig
from astrai_core.training.optim import build_optimizer, build_scheduler, lr_factor


def _cfg(**fields) -> TrainerConfig:
    return TrainerConfig.model_validate({"max_steps": 100, "lr": 1.0, **fields})


# (schedule, warmup, min_lr_ratio, step, expected factor), worked out by hand:
# warmup: (step + 1) / warmup; then progress p = (step - warmup) / (max_steps - warmup);
# linear: floor + (1 - floor)(1 - p); cosine: floor + (1 - floor)(1 + cos(pi p)) / 2.
SCHEDULE_CASES = [
    ("cosine", 10, 0.1, 0, 0.1),            # first warmup step: 1/10
    ("cosine", 10, 0.1, 4, 0.5),
    ("cosine", 10, 0.1, 9, 1.0),            # last warmup step reaches the peak
    ("cosine", 10, 0.1, 10, 1.0),           # p = 0
    ("cosine", 10, 0.1, 55, 0.55),          # p = 1/2: 0.1 + 0.9 * 0.5
    ("cosine", 10, 0.1, 25, 0.1 + 0.9 * (1 + math.cos(math.pi / 6)) / 2),  # p = 1/6
    ("cosine", 10, 0.1, 100, 0.1),          # p = 1: the floor
    ("cosine", 10, 0.1, 250, 0.1),          # past max_steps: stays at the floor
    ("cosine", 0, 0.0, 50, 0.5),            # no warmup, floor 0
    ("cosine", 0, 0.0, 100, 0.0),
    ("linear", 0, 0.0, 25, 0.75),
    ("linear", 20, 0.2, 60, 0.2 + 0.8 * 0.5),  # p = 40/80
    ("linear", 20, 0.2, 100, 0.2),
    ("linear", 20, 0.2, 19, 1.0),
    ("constant", 0, 0.1, 77, 1.0),          # the floor applies only to decaying schedules
    ("constant", 4, 0.1, 1, 0.5),           # constant still warms up
]


@pytest.mark.parametrize("schedule,warmup,floor,step,expected", SCHEDULE_CASES)
def test_lr_factor_equals_the_closed_form(schedule, warmup, floor, step, expected):
    config = _cfg(schedule=schedule, warmup_steps=warmup, min_lr_ratio=floor)
    assert lr_factor(step, config) == pytest.approx(expected, abs=1e-12)


def test_scheduler_sets_the_optimizer_lr_step_by_step():
    config = _cfg(schedule="cosine", warmup_steps=3, min_lr_ratio=0.1, max_steps=13, lr=2e-3)
    param = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = build_optimizer([("w", param)], config)
    scheduler = build_scheduler(optimizer, config)
    seen = []
    for _ in range(config.max_steps):
        seen.append(optimizer.param_groups[0]["lr"])
        param.grad = torch.ones_like(param)
        optimizer.step()
        scheduler.step()
    expected = [2e-3 * f for f in (1 / 3, 2 / 3, 1.0)]
    expected += [2e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * k / 10))) for k in range(10)]
    assert seen == pytest.approx(expected, rel=1e-12)


def _model_with_every_kind_of_parameter() -> CausalLM:
    config = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, max_position_embeddings=64,
                         attention_bias=True, qk_norm=True)
    return CausalLM(config)


def _weight_decay_by_name(model, optimizer) -> dict[str, float]:
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    return {name: decay_of[id(p)] for name, p in model.named_parameters()}


def _expected_decay(name: str) -> float:
    # norms and biases are never decayed; embeddings, the head and every matrix are
    no_decay = name.endswith(".bias") or "norm" in name.split(".")[-2]
    return 0.0 if no_decay else 0.1


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_weight_decay_groups_by_parameter_name(optimizer):
    model = _model_with_every_kind_of_parameter()
    built = build_optimizer(list(model.named_parameters()),
                            _cfg(optimizer=optimizer, weight_decay=0.1))
    decay = _weight_decay_by_name(model, built)
    assert set(decay) == {n for n, _ in model.named_parameters()}  # every parameter, once
    assert sum(len(g["params"]) for g in built.param_groups) == len(decay)
    names = list(decay)
    assert any(n.endswith(".bias") for n in names) and any("q_norm" in n for n in names)
    for name, value in decay.items():
        assert value == _expected_decay(name), name


def test_frozen_parameters_are_left_out():
    model = _model_with_every_kind_of_parameter()
    model.embed.weight.requires_grad_(False)
    built = build_optimizer(list(model.named_parameters()), _cfg())
    held = {id(p) for g in built.param_groups for p in g["params"]}
    assert id(model.embed.weight) not in held
    assert len(held) == sum(1 for p in model.parameters() if p.requires_grad)


def test_muon_group_equals_torch_muon_and_adamw_stepped_by_hand():
    torch.manual_seed(0)
    ours_model = _model_with_every_kind_of_parameter()
    hand_model = _model_with_every_kind_of_parameter()
    hand_model.load_state_dict(ours_model.state_dict())
    start = {k: v.clone() for k, v in ours_model.state_dict().items()}
    config = _cfg(optimizer="muon", lr=1e-2, muon_lr=2e-2, weight_decay=0.05,
                  muon_momentum=0.9, betas=(0.8, 0.9), eps=1e-6, schedule="linear",
                  warmup_steps=1, max_steps=4)
    ours = build_optimizer(list(ours_model.named_parameters()), config)
    ours_schedule = build_scheduler(ours, config)

    # The reference, by parameter name: Muon for hidden 2-D matrices, AdamW for the rest.
    named = dict(hand_model.named_parameters())
    hidden = [n for n, p in named.items() if p.ndim == 2 and not n.startswith(("embed.", "lm_head."))]
    assert "layers.0.attn.q_proj.weight" in hidden and "embed.weight" not in hidden
    muon = torch.optim.Muon([named[n] for n in hidden], lr=2e-2, weight_decay=0.05,
                            momentum=0.9, adjust_lr_fn="match_rms_adamw")
    rest_decay = [p for n, p in named.items() if n not in hidden and p.ndim >= 2]
    rest_plain = [p for n, p in named.items() if p.ndim < 2]
    adamw = torch.optim.AdamW([{"params": rest_decay, "weight_decay": 0.05},
                               {"params": rest_plain, "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.8, 0.9), eps=1e-6)
    factors = [lr_factor(step, config) for step in range(config.max_steps)]
    assert factors[0] == 1.0 and factors[1] == 1.0 and factors[3] < factors[2] < 1.0

    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    for factor in factors:
        for group in muon.param_groups:
            group["lr"] = 2e-2 * factor
        for group in adamw.param_groups:
            group["lr"] = 1e-2 * factor
        for model in (ours_model, hand_model):
            model(ids)["logits"].square().mean().backward()
        ours.step()
        ours_schedule.step()
        ours.zero_grad()
        muon.step()
        adamw.step()
        muon.zero_grad()
        adamw.zero_grad()
    expected = hand_model.state_dict()
    got = ours_model.state_dict()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)
    assert not torch.equal(got["layers.0.attn.q_proj.weight"], start["layers.0.attn.q_proj.weight"])


def test_optimizer_group_state_round_trips():
    model = _model_with_every_kind_of_parameter()
    config = _cfg(optimizer="muon")
    first = build_optimizer(list(model.named_parameters()), config)
    model(torch.tensor([[1, 2, 3]]))["logits"].sum().backward()
    first.step()
    second = build_optimizer(list(model.named_parameters()), config)
    second.load_state_dict(first.state_dict())
    for a, b in zip(first.optimizers, second.optimizers, strict=True):
        for p in a.state:
            for key, value in a.state[p].items():
                other = b.state[p][key]
                assert torch.equal(value, other) if torch.is_tensor(value) else value == other


@pytest.mark.parametrize("experts", [False, True])
def test_muon_experts_moves_the_fused_expert_tensors_to_muon(experts):
    config = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=4, num_kv_heads=2, num_experts=4, moe_intermediate_size=16)
    model = CausalLM(config)
    built = build_optimizer(list(model.named_parameters()),
                            _cfg(optimizer="muon", muon_experts=experts))
    muon, adamw = built.optimizers
    on_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    expert_tensors = [p for n, p in model.named_parameters() if ".experts." in n]
    assert len(expert_tensors) == 3 and all(p.ndim == 3 for p in expert_tensors)
    assert all((id(p) in on_muon) == experts for p in expert_tensors)
    assert id(model.layers[0].mlp.router.weight) in on_muon  # a 2-D hidden matrix either way
    assert id(model.embed.weight) not in on_muon
