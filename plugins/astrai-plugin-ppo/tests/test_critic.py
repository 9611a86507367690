"""The critic: values aligned with the policy's log-prob positions, and its initialisation."""

from __future__ import annotations

import torch

from astrai_core.api import save_pretrained
from astrai_core.model import CausalLM, ModelConfig
from astrai_plugin_ppo.critic import build_critic

VOCAB = 40


def _policy(seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                num_layers=2, num_heads=4, num_kv_heads=2))


def test_value_of_each_response_token_is_head_on_hidden_state_before_it(ppo):
    critic = build_critic(_policy(), init="random", head_init_std=0.5)
    batch = ppo.fixed_rollout(VOCAB)
    with torch.no_grad():
        values = critic(batch)["values"]
        for row in range(len(batch)):
            # An independent full forward of the row's real tokens, without padding.
            tokens, prompt_length, response_length = ppo.real_tokens(batch, row)
            hidden = critic.backbone(tokens, return_hidden_states=True)["hidden_states"][0]
            for t in range(response_length):
                # Token t of the response sits at prompt_length + t; V(s_t) is read one before.
                expected = critic.value_head(hidden[prompt_length + t - 1]).squeeze()
                torch.testing.assert_close(values[row, t], expected, atol=1e-5, rtol=1e-5)
            # ...and not at the token itself: the one-off shift would be a different number.
            shifted = critic.value_head(hidden[prompt_length]).squeeze()
            assert not torch.isclose(values[row, 0], shifted, atol=1e-4)
    assert values.dtype == torch.float32 and values.shape == batch.response_ids.shape


def test_critic_initialised_from_policy_is_an_independent_copy():
    policy = _policy()
    critic = build_critic(policy, init="policy")
    policy_state = policy.state_dict()
    for name, tensor in critic.backbone.state_dict().items():
        assert torch.equal(tensor, policy_state[name]), name
    with torch.no_grad():
        next(critic.backbone.parameters()).add_(1.0)
    assert not torch.equal(next(critic.backbone.parameters()), next(policy.parameters()))
    # The default head is zero: every value starts at 0.
    assert torch.count_nonzero(critic.value_head.weight) == 0
    assert critic.value_head.bias.item() == 0.0


def test_random_init_differs_from_policy_and_critic_path_loads_a_checkpoint(tmp_path):
    policy = _policy(seed=0)
    random_critic = build_critic(policy, init="random")
    assert not torch.equal(random_critic.backbone.embed.weight, policy.embed.weight)
    other = _policy(seed=1)
    save_pretrained(other, tmp_path / "critic_start")
    loaded = build_critic(policy, path=tmp_path / "critic_start")
    for name, tensor in loaded.backbone.state_dict().items():
        assert torch.equal(tensor, other.state_dict()[name]), name
