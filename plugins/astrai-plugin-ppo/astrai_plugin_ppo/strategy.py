"""The ``ppo`` strategy: a clipped policy objective plus a value critic trained on GAE returns.

Per rollout (see :class:`OnlineStrategy`): the critic's values V(s_t) and, when a KL term
is used, the frozen reference's log-probs are attached; the advantage estimator (``gae``
by default, found through the registry) turns token rewards and values into advantages
and returns; then ``epochs x mini_batches`` optimizer steps are taken on the rollout.

The critic has its own AdamW optimizer, learning rate (``critic_lr``, following the
trainer's warmup/decay schedule) and gradient clipping. Its gradients come from the same
backward as the policy's (the value loss is part of the returned loss, and the two share
no parameters); it steps in :meth:`after_optimizer_step`. Its weights are checkpointed
as ``critic.safetensors`` through :meth:`checkpoint_modules`, its optimizer state through
:meth:`state_dict`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, Field
from torch import Tensor

from astrai_core.log import get_logger
from astrai_core.rl.functional import (
    aggregate_loss,
    clipped_policy_loss,
    explained_variance,
    kl_estimate,
    masked_mean,
    masked_var,
)
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.forward import policy_forward
from astrai_core.training.online import OnlineConfig, OnlineStrategy
from astrai_core.training.optim import build_optimizer, lr_factor
from astrai_plugin_ppo.critic import ValueCritic, build_critic
from astrai_plugin_ppo.value_loss import clipped_value_loss

log = get_logger("astrai.ppo")


class PPOConfig(OnlineConfig):
    """The ``strategy:`` section of a ppo run."""

    group_size: int = Field(4, ge=1, description="completions sampled per prompt")
    epochs: int = Field(2, ge=1, description="passes over each rollout")
    mini_batches: int = Field(2, ge=1, description="optimizer steps per pass over a rollout")
    eps_low: float = Field(0.2, ge=0, lt=1, description="ratio clip below: 1 - eps_low")
    eps_high: float = Field(0.2, ge=0, description="ratio clip above: 1 + eps_high")
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight")
    kl_coef: float = Field(0.0, ge=0, description="in-loss KL to the frozen reference")
    aux_loss_coef: float | None = Field(
        None, ge=0, description="MoE load-balancing weight (default: the model's config)")
    # -- the critic
    vf_coef: float = Field(1.0, gt=0, description="value loss weight")
    value_clip_eps: float = Field(0.2, ge=0, description="clip of V around the rollout's V_old")
    critic_lr: float = Field(1e-4, gt=0, description="the critic's peak learning rate")
    critic_weight_decay: float = Field(0.0, ge=0)
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
    default_advantage: ClassVar[str | None] = "gae"

    def setup(self) -> None:
        super().setup()
        cfg = self.config
        self.reference = self.ctx.frozen_copy() if cfg.kl_coef or cfg.kl_in_reward_coef else None
        self.critic: ValueCritic = build_critic(self.ctx.model, cfg.critic_init, cfg.critic_path,
                                                cfg.value_head_init_std)
        critic_trainer = self.ctx.trainer_config.model_copy(
            update={"lr": cfg.critic_lr, "optimizer": "adamw",
                    "weight_decay": cfg.critic_weight_decay})
        self.critic_optimizer = build_optimizer(list(self.critic.named_parameters()),
                                                critic_trainer)
        self._set_critic_lr(steps_done=0)
        log.info("critic", parameters=sum(p.numel() for p in self.critic.parameters()),
                 init=cfg.critic_path or cfg.critic_init, lr=cfg.critic_lr)

    # -- per rollout ------------------------------------------------------------------
    def prepare_rollout(self, rollout: RolloutBatch) -> None:
        """Old values V(s_t) from the critic and, for a KL term, the reference's log-probs."""
        mask = rollout.response_mask
        values = self.critic(rollout)["values"]
        rollout.extras["values"] = torch.where(mask, values, 0.0)
        if self.reference is not None:
            ref = policy_forward(self.reference, rollout, self.runner.logprob_temperature)
            rollout.extras["ref_logprobs"] = torch.where(mask, ref["logprobs"], 0.0)

    # -- the loss ---------------------------------------------------------------------
    def compute_loss(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Any]]:
        cfg = self.config
        mask = batch.response_mask
        policy = policy_forward(self.ctx.model, batch, self.runner.logprob_temperature,
                                return_entropy=True)
        per_token, metrics = clipped_policy_loss(
            policy["logprobs"], batch.old_logprobs, batch.extras["advantages"], mask,
            cfg.eps_low, cfg.eps_high)
        policy_loss = aggregate_loss(per_token, mask, cfg.loss_aggregation)
        critic = self.critic(batch)
        value_loss, value_metrics = clipped_value_loss(
            critic["values"], batch.extras["values"], batch.extras["returns"], mask,
            clip_eps=cfg.value_clip_eps)
        entropy = aggregate_loss(policy["entropy"], mask, cfg.loss_aggregation)
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.entropy_coef * entropy
        if cfg.kl_coef:
            # Padding gets log-ratio 0, so no garbage there can overflow exp() (k3) into NaN grads.
            ref = torch.where(mask, batch.extras["ref_logprobs"], policy["logprobs"].detach())
            kl = kl_estimate(policy["logprobs"], ref, cfg.kl_estimator)
            kl_loss = aggregate_loss(kl, mask, cfg.loss_aggregation)
            loss = loss + cfg.kl_coef * kl_loss
            metrics["kl"] = kl_loss.detach()
        loss = self.add_aux_loss(loss, policy["aux_loss"], metrics)
        loss = self.add_aux_loss(loss, critic["aux_loss"], metrics, name="moe/critic_aux_loss")
        metrics.update(value_metrics)
        metrics.update(self._loss_metrics(batch, policy_loss, value_loss, entropy,
                                          critic["values"]))
        return loss, metrics

    @staticmethod
    def _loss_metrics(batch: RolloutBatch, policy_loss: Tensor, value_loss: Tensor,
                      entropy: Tensor, values: Tensor) -> dict[str, Any]:
        mask = batch.response_mask
        advantages = batch.extras["advantages"]
        return {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy.detach(),
            "explained_variance": explained_variance(values.detach(), batch.extras["returns"],
                                                     mask),
            "advantage_mean": masked_mean(advantages, mask),
            "advantage_std": masked_var(advantages, mask).sqrt(),
            "tokens": mask.sum(),
        }

    # -- the critic's optimizer step ------------------------------------------------------
    def step_metrics(self) -> dict[str, float]:
        """Rollout statistics plus the critic's gradient norm and lr for this step."""
        metrics = super().step_metrics()
        grads = [p.grad for p in self.critic.parameters() if p.grad is not None]
        if grads:
            metrics["critic/grad_norm"] = torch.nn.utils.get_total_norm(grads).item()
        metrics["critic/lr"] = self.critic_optimizer.param_groups[0]["lr"]
        return metrics

    def after_optimizer_step(self, step: int) -> None:
        self._step_critic(step)
        super().after_optimizer_step(step)

    def _step_critic(self, step: int) -> None:
        """Clip and apply the critic's accumulated gradients with its own (scheduled) lr."""
        from astrai_core.training.trainer import TrainingDiverged

        params = [p for p in self.critic.parameters() if p.grad is not None]
        if self.config.critic_max_grad_norm is not None and params:
            norm = torch.nn.utils.clip_grad_norm_(params, self.config.critic_max_grad_norm)
            if not torch.isfinite(norm):
                raise TrainingDiverged(f"training diverged at step {step}: the critic's "
                                       f"gradient norm is {norm.item()}; lower "
                                       "strategy.critic_lr")
        self.critic_optimizer.step()
        self.critic_optimizer.zero_grad(set_to_none=True)
        self._set_critic_lr(steps_done=step)

    def _set_critic_lr(self, steps_done: int) -> None:
        """The lr of the next critic step: critic_lr on the policy's warmup/decay schedule.

        Like the trainer's scheduler it lives in the optimizer's param groups, so a
        resumed run gets it back with the optimizer state.
        """
        factor = lr_factor(steps_done, self.ctx.trainer_config)
        for group in self.critic_optimizer.param_groups:
            group["lr"] = self.config.critic_lr * factor

    # -- checkpointing ----------------------------------------------------------------
    def checkpoint_modules(self) -> dict[str, torch.nn.Module]:
        return {"critic": self.critic}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "critic_optimizer" in state:
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
