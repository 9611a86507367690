"""The ``ppo`` strategy: a policy loss (``policy_loss:``, PPO-clip by default) plus a value
critic trained on GAE returns.

Per rollout (see :class:`OnlineStrategy`): the critic's values V(s_t) and, when a KL term
is used, the frozen reference's log-probs are attached; the advantage estimator (``gae``
by default, the spec's ``default_advantage``) turns token rewards and values into
advantages and returns; then ``epochs x mini_batches`` optimizer steps are taken on it.

The critic is a module trained beside the policy (:meth:`PPO.trained_modules`): the
trainer gives it its own AdamW optimizer, learning rate (``critic_lr``, on the trainer's
warmup/decay schedule), weight decay and gradient clipping, steps it after the same
backward as the policy's (the value loss is part of the returned loss, and the two share
no parameters), and checkpoints it as ``critic.safetensors`` with its optimizer state.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, Field
from torch import Tensor

from astrai_core.api import (
    AggregationOption,
    AuxLossOption,
    EntropyOption,
    KLPenaltyOption,
    OnlineConfig,
    OnlineStrategy,
    RolloutBatch,
    RunComponents,
    StrategyNeeds,
    ObjectiveSettings,
    TrainedModule,
    explained_variance,
    frozen_reference,
    get_logger,
    masked_mean,
    masked_var,
    redefault,
)
from astrai_plugin_ppo.critic import ValueCritic, build_critic
from astrai_plugin_ppo.value_loss import clipped_value_loss

log = get_logger("astrai.ppo")


class PPOConfig(AuxLossOption, EntropyOption, KLPenaltyOption, AggregationOption,
                OnlineConfig):
    """The ``strategy:`` section of a ppo run."""

    group_size: int = Field(4, ge=1, description="completions sampled per prompt")
    epochs: int = Field(2, ge=1, description="passes over each rollout")
    mini_batches: int = Field(2, ge=1, description="optimizer steps per pass over a rollout")
    # two of the aggregations: the per-sequence sums are not offered beside the value loss
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean"] = redefault(
        AggregationOption, "loss_aggregation", "token-mean")
    # -- the critic
    vf_coef: float = Field(1.0, gt=0, description="value loss weight")
    value_clip_eps: float = Field(0.2, ge=0, description="clip of V around the rollout's V_old")
    critic_lr: float = Field(1e-4, gt=0, description="the critic's peak learning rate")
    critic_weight_decay: float = Field(0.0, ge=0, description="the critic "
                                       "optimizer's weight decay")
    critic_max_grad_norm: float | None = Field(1.0, gt=0, description="None disables clipping")
    critic_init: Literal["policy", "random"] = Field(
        "policy", description="start the critic's backbone from the policy's weights or afresh")
    critic_path: str | None = Field(
        None, description="a native checkpoint directory for the critic's backbone "
        "(overrides critic_init)")
    value_head_init_std: float = Field(0.0, ge=0, description="0: a zero value head")


class PPO(OnlineStrategy):
    """Policy + value critic; see the module docstring."""

    Config: ClassVar[type[BaseModel]] = PPOConfig
    defers_old_logprobs: ClassVar[bool] = True  # old log-probs via old_logprobs_for

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        return replace(super().needs(config), values=True)  # the critic supplies V(s_t)

    def __init__(self, config: PPOConfig, run: RunComponents) -> None:
        super().__init__(config, run)
        self.reference = frozen_reference(run.model) if config.kl_coef or config.kl_in_reward_coef \
            else None
        self.critic: ValueCritic = build_critic(run.model, config.critic_init, config.critic_path,
                                                config.value_head_init_std)
        self.objective = self.policy_objective(ObjectiveSettings.of(config))
        log.info("critic", parameters=sum(p.numel() for p in self.critic.parameters()),
                 init=config.critic_path or config.critic_init, lr=config.critic_lr)

    def trained_modules(self) -> dict[str, TrainedModule]:
        cfg = self.config
        return {"critic": TrainedModule(
            self.critic, overrides={"lr": cfg.critic_lr, "optimizer": "adamw",
                                    "weight_decay": cfg.critic_weight_decay},
            max_grad_norm=cfg.critic_max_grad_norm)}

    # -- per rollout ------------------------------------------------------------------
    def prepare_rollout(self, rollout: RolloutBatch) -> None:
        """Old values V(s_t) from the critic and, for a KL term, the reference's log-probs."""
        values = self.critic(rollout, self.run.trainer.micro_batch_tokens,
                             self.run.dist)["values"]
        rollout.values = torch.where(rollout.response_mask, values, 0.0)
        super().prepare_rollout(rollout)

    # -- the loss ---------------------------------------------------------------------
    def compute_loss(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Any]]:
        cfg = self.config
        mask = batch.response_mask
        policy_loss, metrics, policy = self.policy_loss_terms(batch, self.objective)
        critic = self.critic(batch, dist=self.run.dist)
        value_loss, value_metrics = clipped_value_loss(
            critic["values"], batch.values, batch.returns, mask, clip_eps=cfg.value_clip_eps)
        loss = policy_loss + cfg.vf_coef * value_loss
        loss = self.add_aux_loss(loss, policy["aux_loss"], metrics)
        loss = self.add_aux_loss(loss, critic["aux_loss"], metrics, name="moe/critic_aux_loss")
        metrics.update(value_metrics)
        metrics.update(self._loss_metrics(batch, value_loss, critic["values"]))
        return loss, metrics

    @staticmethod
    def _loss_metrics(batch: RolloutBatch, value_loss: Tensor, values: Tensor) -> dict[str, Any]:
        mask = batch.response_mask
        return {
            "value_loss": value_loss.detach(),
            "explained_variance": explained_variance(values.detach(), batch.returns, mask),
            "advantage_mean": masked_mean(batch.advantages, mask),
            "advantage_std": masked_var(batch.advantages, mask).sqrt(),
            "tokens": mask.sum(),
        }
