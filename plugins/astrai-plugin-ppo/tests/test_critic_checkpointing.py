"""Activation checkpointing reaches the PPO critic's backbone: the same value gradients."""

from __future__ import annotations

import torch

from astrai_core.model import CausalLM, ModelConfig, enable_activation_checkpointing
from astrai_plugin_ppo.critic import build_critic

VOCAB = 40


def test_checkpointed_critic_has_the_same_gradients(ppo):
    torch.manual_seed(0)
    policy = CausalLM(ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                  num_layers=2, num_heads=4, num_kv_heads=2))
    critic = build_critic(policy, init="random", head_init_std=0.5)
    batch = ppo.fixed_rollout(VOCAB)
    recomputed = [0]
    for layer in critic.backbone.layers:
        layer.register_forward_pre_hook(lambda *_: recomputed.__setitem__(0, recomputed[0] + 1))

    def gradients() -> dict[str, torch.Tensor]:
        critic.zero_grad()
        critic(batch)["values"].square().mean().backward()
        # The backbone's head gets no gradient: values read the hidden states.
        return {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}

    plain = gradients()
    assert enable_activation_checkpointing(critic) == 1  # the backbone inside the critic
    recomputed[0] = 0
    checkpointed = gradients()
    assert recomputed[0] == 2 * len(critic.backbone.layers)
    assert plain.keys() == checkpointed.keys() and "value_head.weight" in plain
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=0, msg=name)
