"""The ``reinforce`` strategy: REINFORCE with a baseline, on-policy, online.

Each rollout (``data.batch_size`` prompts x ``group_size`` completions) comes from the
rollout runner; the run's advantage estimator (``reinforce_baseline`` by default, see
:mod:`astrai_contrib_reinforce.baseline`) turns its rewards into per-sample advantages
A_i. The loss is the score-function estimator of the policy gradient,

    loss = -(1/N) sum_i sum_t A_it * log pi(y_it | x_i, y_i<t)

over the N sequences of the micro-batch and the valid tokens t of each response (with
the mean baseline A_it = A_i: the sequence's log-probability times its advantage), with
log pi taken at the sampler's temperature (the distribution the rollout was drawn from).
It has no ratio and no clipping, so it is only right on the policy that sampled: one
optimizer step per rollout (``epochs`` and ``mini_batches`` must be 1). With
``kl_in_reward_coef`` the token rewards are shaped by the KL to a frozen copy of the
starting policy (the reference), which then exists; otherwise there is none.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, model_validator
from torch import Tensor

from astrai_core.api import (EntropyOption, OnlineConfig, OnlineStrategy, RolloutBatch, RunComponents,
                             frozen_reference, policy_forward)


class ReinforceConfig(EntropyOption, OnlineConfig):
    """The ``strategy:`` section of a reinforce run (its entropy bonus is a token mean;
    0: pure REINFORCE)."""

    @model_validator(mode="after")
    def _on_policy(self) -> ReinforceConfig:
        if self.epochs != 1 or self.mini_batches != 1:
            raise ValueError("REINFORCE is on-policy (no importance ratio): epochs and "
                             "mini_batches must be 1; use grpo or ppo to reuse a rollout")
        return self


class Reinforce(OnlineStrategy):
    """REINFORCE with a baseline; see the module docstring."""

    Config: ClassVar[type[BaseModel]] = ReinforceConfig

    def __init__(self, config: ReinforceConfig, run: RunComponents) -> None:
        super().__init__(config, run)
        self.reference = frozen_reference(run.model) if config.kl_in_reward_coef else None

    def compute_loss(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Any]]:
        mask = batch.response_mask
        out = policy_forward(self.run.model, batch, self.run.logprob_temperature,
                             return_entropy=self.config.entropy_coef > 0, dist=self.run.dist)
        logprobs = out["logprobs"].where(mask, 0.0)
        seq_logprob = logprobs.sum(-1)                       # log pi(y_i | x_i)
        policy_loss = -(batch.advantages.where(mask, 0.0) * logprobs).sum(-1).mean()
        metrics: dict[str, Any] = {"policy_loss": policy_loss.detach(),
                                   "seq_logprob_mean": seq_logprob.detach().mean(),
                                   "tokens": mask.sum()}
        loss = policy_loss
        if self.config.entropy_coef > 0:
            entropy = (out["entropy"] * mask).sum() / mask.sum().clamp_min(1)
            loss = loss - self.config.entropy_coef * entropy
            metrics["entropy"] = entropy.detach()
        return self.add_aux_loss(loss, out["aux_loss"], metrics), metrics
