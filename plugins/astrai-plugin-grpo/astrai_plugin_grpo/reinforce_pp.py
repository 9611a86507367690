"""The ``reinforce_pp`` advantage estimator: REINFORCE++ (critic-free, token-level).

The KL penalty of REINFORCE++ lives in the per-token reward: run it with the strategy's
``kl_in_reward_coef`` (token rewards ``r_t = score * [t = last] - kl_coef * KL_t``) rather
than an in-loss KL term. Each token's return is the discounted sum of the rewards from
it to the end of its response, and the advantages are those returns whitened over every
valid token of the whole rollout (no per-prompt groups, no critic).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from astrai_core.api import AdvantageEstimator, masked_whiten


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_next over valid tokens, G = 0 after the last one.

    "next" is the next VALID token: masked positions (padding, or an environment's
    tokens inside a multi-turn response) are skipped and get return 0, as in GAE.
    """
    valid = response_mask.to(torch.bool)
    rewards = torch.where(valid, token_rewards.float(), 0.0)
    running = rewards.new_zeros(rewards.shape[0])
    columns = []
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        columns.append(torch.where(valid[:, t], running, 0.0))
    return torch.stack(columns[::-1], dim=1)


class ReinforcePlusPlusAdvantage(AdvantageEstimator):
    """A_t = whiten(G_t) over the rollout's valid tokens; returns G_t (before whitening)."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per token")

    def estimate(self, token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                 values: Tensor | None) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            returns = discounted_returns(token_rewards, response_mask, self.config.gamma)
            advantages = masked_whiten(returns, response_mask.to(torch.bool))
        return advantages, returns
