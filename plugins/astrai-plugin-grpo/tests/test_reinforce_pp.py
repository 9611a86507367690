"""The reinforce_pp (REINFORCE++) advantage estimator: hand-computed returns and whitening,
verl's formula, and the KL shaping it reads from the token rewards."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from astrai_core.api import token_rewards_from_scores
from astrai_core.plugins import load_plugins
from astrai_plugin_grpo.reinforce_pp import ReinforcePlusPlusAdvantage, discounted_returns

# Two responses: 3 valid tokens, then 2 valid tokens and padding (whose 9.0 is ignored).
TOKEN_REWARDS = torch.tensor([[0.5, -0.5, 2.0], [1.0, 4.0, 9.0]])
RESPONSE_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
GROUP_IDS = torch.tensor([0, 0])


def test_registered_by_name():
    spec = load_plugins().get("advantage_estimator", "reinforce_pp")
    assert spec.load() is ReinforcePlusPlusAdvantage
    assert ReinforcePlusPlusAdvantage.needs_values is False


def test_hand_computed_returns_and_whitening():
    advantages, returns = ReinforcePlusPlusAdvantage(gamma=0.5)(
        token_rewards=TOKEN_REWARDS, response_mask=RESPONSE_MASK, group_ids=GROUP_IDS)
    # row 0: G2 = 2, G1 = -0.5 + 0.5 * 2 = 0.5, G0 = 0.5 + 0.5 * 0.5 = 0.75
    # row 1: G1 = 4, G0 = 1 + 0.5 * 4 = 3; padding: 0
    assert returns.tolist() == [[0.75, 0.5, 2.0], [3.0, 4.0, 0.0]]
    valid = [0.75, 0.5, 2.0, 3.0, 4.0]
    mean = sum(valid) / 5                                      # 2.05
    std = math.sqrt(sum((v - mean) ** 2 for v in valid) / 4)   # unbiased, over all tokens
    whitened = [(v - mean) / std for v in valid]
    expected = [whitened[:3], whitened[3:] + [0.0]]
    assert advantages.tolist() == [pytest.approx(row, abs=1e-5) for row in expected]


def test_gamma_one_is_the_reward_to_go():
    returns = discounted_returns(TOKEN_REWARDS, RESPONSE_MASK, 1.0)
    assert returns.tolist() == [[2.0, 1.5, 2.0], [5.0, 4.0, 0.0]]


def _verl_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                  gamma: float) -> torch.Tensor:
    """verl's compute_reinforce_plus_plus_outcome_advantage returns, transcribed: the
    running return is reset after each masked-out position."""
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros(token_level_rewards.shape[0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
    return returns


def test_equals_verls_formula_on_right_padded_rows():
    torch.manual_seed(0)
    lengths = torch.tensor([5, 1, 7, 3])
    mask = torch.arange(7)[None, :] < lengths[:, None]
    rewards = torch.where(mask, torch.randn(4, 7), 0.0)  # verl's rewards are 0 on padding
    advantages, returns = ReinforcePlusPlusAdvantage(gamma=0.9)(
        token_rewards=rewards, response_mask=mask, group_ids=torch.arange(4))
    theirs = _verl_returns(rewards, mask.float(), 0.9) * mask
    torch.testing.assert_close(returns, theirs)
    # verl: masked_whiten(returns, mask) * mask (unbiased variance, eps 1e-8)
    mean = theirs[mask].mean()
    whitened = (theirs - mean) * torch.rsqrt(theirs[mask].var(unbiased=True) + 1e-8) * mask
    torch.testing.assert_close(advantages, whitened)


def test_interior_masked_tokens_are_skipped():
    # an environment's tokens (masked) inside a response carry no return but pass it on
    rewards = torch.tensor([[1.0, 7.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 0, 1, 1]], dtype=torch.bool)
    assert discounted_returns(rewards, mask, 0.5).tolist() == [[1.5, 0.0, 1.0, 2.0]]


def test_kl_shaping_arrives_per_token():
    # REINFORCE++ puts -kl_coef * KL_t into each token's reward (the strategy's
    # kl_in_reward_coef); with gamma 1 each return sums the penalties still ahead
    mask = torch.ones(1, 3, dtype=torch.bool)
    logp_old = torch.tensor([[-1.0, -2.0, -0.5]])
    logp_ref = torch.tensor([[-1.5, -1.0, -0.5]])    # k1 KL_t = old - ref = 0.5, -1, 0
    rewards = token_rewards_from_scores(torch.tensor([1.0]), mask, logp_old, logp_ref,
                                        kl_coef=0.1)
    _, returns = ReinforcePlusPlusAdvantage()(token_rewards=rewards, response_mask=mask,
                                             group_ids=torch.zeros(1, dtype=torch.long))
    assert returns.tolist() == [pytest.approx([1.05, 1.1, 1.0])]


def test_bad_gamma_is_rejected():
    with pytest.raises(ValidationError, match="gamma"):
        ReinforcePlusPlusAdvantage(gamma=1.5)
    with pytest.raises(ValidationError, match="extra"):
        ReinforcePlusPlusAdvantage(lam=0.9)


def test_grpo_run_with_reinforce_pp_whitens_over_the_whole_rollout(tmp_path):
    from astrai_core.testing import build_strategy, tiny_run_config, write_arith_prompts

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 4,
                                                 "kl_in_reward_coef": 0.1},
                             sampler={"temperature": 1.3})
    config["advantage"] = {"name": "reinforce_pp", "gamma": 0.9}
    config["data"]["batch_size"] = 4
    strategy, ctx = build_strategy(config, tmp_path)
    assert isinstance(ctx.estimator, ReinforcePlusPlusAdvantage)
    with torch.no_grad():  # a reference that differs, so the KL shaping is not zero
        for param in strategy.reference.parameters():
            param.add_(0.05 * torch.randn_like(param))
    rollout = strategy.batch_source().next_step()[0]
    mask = rollout.response_mask
    valid = rollout.advantages[mask]
    # one whitening over every valid token of the rollout (not per group, not per row)
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert valid.std().item() == pytest.approx(1.0, abs=1e-3)
    # the returns are the discounted shaped token rewards the strategy built
    expected = discounted_returns(strategy.token_rewards(rollout), mask, 0.9)
    torch.testing.assert_close(rollout.returns, expected)
    assert (rollout.returns[mask] != rollout.rewards.repeat_interleave(mask.sum(-1))).any()
