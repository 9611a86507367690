"""The ``gae`` advantage estimator: token-level generalized advantage estimation."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from astrai_core.api import AdvantageEstimator, ConfigError, masked_whiten


def generalized_advantages(
    token_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> Tensor:
    """GAE over valid tokens: delta_t = r_t + gamma*V_next - V_t, A_t = delta_t + gamma*lam*A_next.

    "next" is the next VALID token; after the last one V = 0 and A = 0 (terminal
    bootstrap). Masked positions are skipped (they carry nothing) and get advantage 0,
    so trailing padding is exactly an episode end.
    """
    valid = response_mask.to(torch.bool)
    rewards = torch.where(valid, token_rewards.float(), 0.0)
    values = torch.where(valid, values.float(), 0.0)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_advantage = rewards.new_zeros(rewards.shape[0])
    columns = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_advantage = torch.where(valid[:, t], advantage, next_advantage)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        columns.append(torch.where(valid[:, t], advantage, 0.0))
    return torch.stack(columns[::-1], dim=1)


class GAE(AdvantageEstimator):
    """Token-level GAE from a critic's values; returns = advantages + values (before whitening)."""

    needs_values = True

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", populate_by_name=True)
        gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per token")
        lam: float = Field(
            0.95, ge=0.0, le=1.0, validation_alias=AliasChoices("lam", "lambda"),
            description="GAE lambda; YAML may spell it `lambda`",
        )
        whiten: bool = Field(True, description="whiten advantages over the batch's valid tokens")

        @model_validator(mode="before")
        @classmethod
        def _one_lambda_spelling(cls, data: Any) -> Any:
            if isinstance(data, dict) and "lam" in data and "lambda" in data:
                raise ValueError("give GAE lambda as either `lam` or `lambda`, not both")
            return data

    def estimate(self, token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                 values: Tensor | None) -> tuple[Tensor, Tensor]:
        if values is None:
            raise ConfigError(
                "gae needs values from a critic (V(s_t) per token); use it with a strategy "
                "that trains one, such as ppo, or choose another advantage estimator"
            )
        with torch.no_grad():
            advantages = generalized_advantages(
                token_rewards, values.detach(), response_mask, self.config.gamma, self.config.lam
            )
            valid = response_mask.to(torch.bool)
            returns = torch.where(valid, advantages + values.detach().float(), 0.0)
            if self.config.whiten:
                advantages = masked_whiten(advantages, valid)
        return advantages, returns
