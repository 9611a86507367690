"""The ``dpo`` strategy: direct preference optimization against a frozen reference.

Offline (default): ``preference``-format data (prompt or messages + chosen + rejected);
each loader batch is one micro-batch of pairs. Online (``mode: online``): every optimizer
step draws a rollout (``data.batch_size`` prompts from ``prompt``-format data,
``group_size`` completions each, scored by the ``rewards:``) and pairs each group's
best-reward completion (chosen) with its worst (rejected), both conditioned on the group's
prompt; groups whose rewards all tie are skipped. No advantage estimator is involved.

The reference is a frozen copy of the starting policy. A response's log-prob is the sum
of its tokens' log-probs at temperature 1 (the policy's own distribution, whatever the
sampling temperature); prompt tokens attend but carry no loss.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from astrai_core.api import (
    BatchSource,
    FieldError,
    RolloutBatch,
    RunComponents,
    Strategy,
    StrategyNeeds,
    frozen_reference,
)
from astrai_plugin_dpo.losses import dpo_loss
from astrai_plugin_dpo.pairs import PairSource, dataset_pair_logprobs, rollout_pair_logprobs


class DPOConfig(BaseModel):
    """The ``strategy:`` section of a dpo run."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["offline", "online"] = Field(
        "offline", description="offline: preference data; online: best vs worst of rollouts")
    beta: float = Field(0.1, gt=0, description="strength of the KL anchor to the reference")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = "sigmoid"
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="sigmoid only: assumed "
                                   "probability that a preference label is flipped")
    group_size: int = Field(8, ge=2, description="online: completions sampled per prompt")
    max_skipped_rollouts: int = Field(
        20, ge=1, description="online: consecutive rollouts without enough pairs before "
        "giving up")
    aux_loss_coef: float | None = Field(
        None, ge=0, description="MoE load-balancing weight (default: the model's config)")

    @model_validator(mode="after")
    def _smoothing_needs_sigmoid(self) -> DPOConfig:
        if self.label_smoothing and self.loss_type != "sigmoid":
            raise ValueError(f"label_smoothing applies to loss_type sigmoid only, "
                             f"not {self.loss_type}")
        return self


class DPO(Strategy):
    """Direct preference optimization; see the module docstring."""

    Config: ClassVar[type[BaseModel]] = DPOConfig
    data_formats: ClassVar[tuple[str, ...]] = ("preference",)

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        if config.mode == "offline":
            return super().needs(config)
        return StrategyNeeds(data_formats=("prompt",), rollouts=True,
                             group_size=config.group_size)

    @classmethod
    def check_run(cls, config: Any, run_config: Any) -> None:
        super().check_run(config, run_config)
        if config.mode == "online" and run_config.rollout.max_staleness:
            raise FieldError(("rollout", "max_staleness"), "online DPO pairs each rollout's "
                             "completions on-policy; max_staleness > 0 applies to grpo, ppo "
                             "and reinforce")

    def __init__(self, config: DPOConfig, run: RunComponents) -> None:
        super().__init__(config, run)
        self.reference = frozen_reference(run.model)

    def frozen_modules(self) -> dict[str, torch.nn.Module]:
        return {"reference": self.reference}

    def batch_source(self) -> BatchSource:
        if self.config.mode == "offline":
            return super().batch_source()
        return PairSource(self.run.rollouts, self.run.trainer.grad_accum_steps,
                          max_skipped=self.config.max_skipped_rollouts, device=self.run.device)

    # -- the loss ---------------------------------------------------------------------
    def compute_loss(self, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        pair_logprobs = rollout_pair_logprobs if isinstance(batch, RolloutBatch) \
            else dataset_pair_logprobs
        if not isinstance(batch, RolloutBatch):
            batch = self.to_device(batch)
        chosen, rejected, aux_loss, tokens = pair_logprobs(self.run.model, batch)
        with torch.no_grad():
            ref_chosen, ref_rejected, _, _ = pair_logprobs(self.reference, batch)
        cfg = self.config
        losses, chosen_rewards, rejected_rewards, metrics = dpo_loss(
            chosen, rejected, ref_chosen, ref_rejected, beta=cfg.beta, loss_type=cfg.loss_type,
            label_smoothing=cfg.label_smoothing)
        loss = losses.mean()
        metrics.update(chosen_reward=chosen_rewards.mean(), rejected_reward=rejected_rewards.mean(),
                       chosen_logp=chosen.detach().mean(), rejected_logp=rejected.detach().mean(),
                       tokens=tokens, loss_weight=len(losses))  # the loss is a mean over pairs
        return self.add_aux_loss(loss, aux_loss, metrics), metrics
