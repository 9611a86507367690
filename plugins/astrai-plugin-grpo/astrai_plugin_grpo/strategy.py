"""The ``grpo`` strategy: token-level PPO-clip on group-normalized advantages.

Online (default): each rollout (``data.batch_size`` prompts x ``group_size`` completions)
comes from the rollout runner with the sampler's behaviour log-probs as the old policy;
advantages come from the ``advantage:`` estimator (``grpo`` by default). Offline
(``mode: offline``): batches of dataset rows carrying a response and its reward (format
in :mod:`astrai_plugin_grpo.offline`); an old-policy model, a frozen copy of the policy
re-synced after every optimizer step, provides the old log-probs, so the ratio is taken
against the weights the step started from and never drifts.

KL to the frozen starting policy (the reference) is either a loss term (``kl_coef``) or
token-reward shaping (``kl_in_reward_coef``); the reference exists only when one is on.
Log-probs are taken at the sampler's temperature, like the behaviour log-probs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, Field, model_validator
from torch import Tensor

from astrai_core.errors import ConfigError
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.forward import policy_forward
from astrai_core.rollout.metrics import rollout_metrics
from astrai_core.training.online import OnlineConfig, OnlineStrategy
from astrai_plugin_grpo.loss import GRPOLossSettings, grpo_objective
from astrai_plugin_grpo.offline import offline_rollout


class GRPOConfig(OnlineConfig):
    """The ``strategy:`` section of a grpo run."""

    mode: Literal["online", "offline"] = Field(
        "online", description="online: rollouts from the sampler; offline: dataset rows "
        "with `response` and `reward` columns")
    eps_low: float = Field(0.2, ge=0, lt=1, description="ratio clipped below at 1 - eps_low")
    eps_high: float = Field(0.2, ge=0, description="ratio clipped above at 1 + eps_high "
                            "(DAPO's clip-higher uses 0.28)")
    kl_coef: float = Field(0.0, ge=0, description="in-loss KL to the frozen reference")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="KL estimator of the in-loss term and of the reward shaping")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight")
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                              "seq-mean-token-sum-norm"] = "token-mean"
    norm_length: int | None = Field(
        None, ge=1, description="seq-mean-token-sum-norm's constant length "
        "(default: the batch's response width)")
    aux_loss_coef: float | None = Field(
        None, ge=0, description="MoE load-balancing weight (default: the model's config)")

    @model_validator(mode="before")
    @classmethod
    def _symmetric_clip(cls, data: Any) -> Any:
        """``clip_eps: e`` is shorthand for ``eps_low: e, eps_high: e``."""
        if isinstance(data, dict) and "clip_eps" in data:
            data = dict(data)
            clip_eps = data.pop("clip_eps")
            if "eps_low" in data or "eps_high" in data:
                raise ValueError("give either clip_eps or eps_low/eps_high, not both")
            data.update(eps_low=clip_eps, eps_high=clip_eps)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.norm_length is not None and self.loss_aggregation != "seq-mean-token-sum-norm":
            raise ValueError("norm_length applies only to loss_aggregation: "
                             "seq-mean-token-sum-norm")
        if self.mode == "offline" and (self.epochs != 1 or self.mini_batches != 1):
            raise ValueError("offline mode takes one optimizer step per data batch: "
                             "epochs and mini_batches must be 1")
        return self


class GRPO(OnlineStrategy):
    """Group-relative policy optimization; see the module docstring."""

    Config: ClassVar[type[BaseModel]] = GRPOConfig
    default_advantage: ClassVar[str | None] = "grpo"

    def setup(self) -> None:
        cfg = self.config
        self.reference = self.old_model = None
        if cfg.mode == "online":
            super().setup()
            self.temperature = self.runner.logprob_temperature
        else:
            self.estimator = self.ctx.advantage_estimator(self.default_advantage)
            self.loader = self.ctx.train_loader(("prompt",))
            self.old_model = self.ctx.frozen_copy()
            self.temperature = self.ctx.sampler_options()[0].temperature or 1.0
            self.rollout_stats = {}
        if getattr(self.estimator, "needs_values", False):
            raise ConfigError("advantage.name: this estimator needs a value critic, which grpo "
                              "does not train; use ppo, or an estimator without values (grpo)")
        if cfg.kl_coef or cfg.kl_in_reward_coef:
            self.reference = self.ctx.frozen_copy()
        self.loss_settings = GRPOLossSettings(
            eps_low=cfg.eps_low, eps_high=cfg.eps_high, loss_aggregation=cfg.loss_aggregation,
            norm_length=cfg.norm_length, kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
            entropy_coef=cfg.entropy_coef)

    # -- per rollout ------------------------------------------------------------------
    def prepare_rollout(self, rollout: RolloutBatch) -> None:
        """The reference's log-probs, when a KL term needs them."""
        if self.reference is not None:
            ref = policy_forward(self.reference, rollout, self.temperature)["logprobs"]
            rollout.extras["ref_logprobs"] = torch.where(rollout.response_mask, ref, 0.0)

    # -- the loss ---------------------------------------------------------------------
    def compute_loss(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Any]]:
        mask = batch.response_mask
        out = policy_forward(self.ctx.model, batch, self.temperature, return_entropy=True)
        loss, metrics = grpo_objective(
            out["logprobs"], batch.old_logprobs, batch.extras["advantages"], mask,
            self.loss_settings, ref_logprobs=batch.extras.get("ref_logprobs"),
            entropy=out["entropy"])
        loss = self.add_aux_loss(loss, out["aux_loss"], metrics)
        metrics["tokens"] = mask.sum()
        return loss, metrics

    # -- offline batches --------------------------------------------------------------
    def train_batches(self) -> Iterator[RolloutBatch]:
        if self.config.mode == "online":
            yield from super().train_batches()
            return
        accum = self.ctx.trainer_config.grad_accum_steps
        for records in self.loader:
            # Built when the step's first micro-batch is asked for: after the previous
            # optimizer step and the old model's resync.
            batch = self._offline_batch(records)
            micro_batches = batch.split(-(-len(batch) // accum))
            if len(micro_batches) != accum:
                raise ConfigError(f"data.batch_size={len(batch)} rows cannot be cut into "
                                  f"trainer.grad_accum_steps={accum} micro-batches; use fewer")
            yield from micro_batches

    @torch.no_grad()
    def _offline_batch(self, records: list[Any]) -> RolloutBatch:
        pad_id = getattr(self.ctx.tokenizer, "pad_token_id", None) or 0
        batch = offline_rollout(records, self.ctx.tokenizer, pad_id).to(self.ctx.device)
        mask = batch.response_mask
        old = policy_forward(self.old_model, batch, self.temperature)["logprobs"]
        batch.old_logprobs = torch.where(mask, old, 0.0)
        self.prepare_rollout(batch)
        advantages, _ = self.estimator(token_rewards=self.token_rewards(batch),
                                       response_mask=mask, group_ids=batch.group_ids)
        batch.extras["advantages"] = advantages
        stats = rollout_metrics(batch, prefix="data/")
        stats["data/advantage_mean"] = advantages[mask].mean().item() if mask.any() else 0.0
        self.rollout_stats = stats
        return batch

    def after_optimizer_step(self, step: int) -> None:
        if self.old_model is None:
            super().after_optimizer_step(step)
        else:
            self.sync_old_model()

    def sync_old_model(self) -> None:
        """Copy the policy's current weights into the old-policy model (offline mode)."""
        self.old_model.load_state_dict(self.ctx.model.state_dict())

    # -- checkpointing ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.old_model is None:
            return super().state_dict()
        return {"data": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.old_model is None:
            super().load_state_dict(state)
            return
        if "data" in state:
            self.loader.load_state_dict(state["data"])
        self.sync_old_model()  # the trainer restored the policy's weights just before
