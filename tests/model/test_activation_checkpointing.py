"""Activation checkpointing (enable_activation_checkpointing): each decoder layer really
runs again in the backward, and the gradients are those of the plain model."""

from __future__ import annotations

import pytest
import torch

from astrai_core.model import CausalLM, ModelConfig, enable_activation_checkpointing

DENSE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
             num_kv_heads=2, qk_norm=True)
MOE = dict(DENSE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def count_layer_forwards(model: CausalLM) -> list[int]:
    # A pre-hook: the recompute stops early, once it has what the backward needs.
    calls = [0]
    for layer in model.layers:
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def gradients(model: CausalLM, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    out = model(ids)
    (out["logits"].log_softmax(-1)[..., 3].mean() + out["aux_loss"]).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_checkpointed_policy_has_the_same_gradients_and_recomputes_each_layer(config):
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**config)).train()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    calls = count_layer_forwards(model)
    plain = gradients(model, ids)
    assert calls[0] == 2  # one forward per layer
    assert enable_activation_checkpointing(model) == 1
    calls[0] = 0
    checkpointed = gradients(model, ids)
    assert calls[0] == 4  # ...and once more per layer in the backward
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=0, msg=name)


def test_generation_and_eval_forwards_are_not_checkpointed():
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**DENSE))
    enable_activation_checkpointing(model)
    calls = count_layer_forwards(model)
    with torch.no_grad():
        model.train()(torch.tensor([[1, 2, 3]]))
    model.eval()(torch.tensor([[1, 2, 3]]))["logits"].sum().backward()
    assert calls[0] == 4  # no recompute: neither forward kept a checkpoint
    assert enable_activation_checkpointing(model, enabled=False) == 1
    assert not model.gradient_checkpointing
    assert enable_activation_checkpointing(torch.nn.Linear(2, 2)) == 0
