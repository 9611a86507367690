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

from collections.abc import Iterator
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from astrai_core.errors import AstraiError
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.metrics import rollout_metrics
from astrai_core.training.strategy import Strategy
from astrai_plugin_dpo.losses import dpo_loss
from astrai_plugin_dpo.pairs import (best_and_worst, dataset_pair_logprobs, pair_micro_batches,
                                     rollout_pair_logprobs)


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

    def setup(self) -> None:
        self.reference = self.ctx.frozen_copy()
        self.rollout_stats: dict[str, float] = {}
        if self.config.mode == "offline":
            super().setup()
            self.runner = None
        else:
            self.runner = self.ctx.rollout_runner(
                group_size=self.config.group_size, steps_per_rollout=1)

    # -- batches ----------------------------------------------------------------------
    def train_batches(self) -> Iterator[Any]:
        if self.runner is None:
            return super().train_batches()
        return self._online_batches()

    def _online_batches(self) -> Iterator[RolloutBatch]:
        accum = self.ctx.trainer_config.grad_accum_steps
        skipped = 0
        while True:
            rollout = self.runner.next_rollout().to(self.ctx.device)
            chosen, rejected = best_and_worst(rollout)
            if len(chosen) < accum:  # too few preferences to fill this step's micro-batches
                skipped += 1
                if skipped >= self.config.max_skipped_rollouts:
                    raise AstraiError(
                        f"{skipped} rollouts in a row gave fewer than trainer.grad_accum_steps="
                        f"{accum} preference pairs (every completion of a group got the same "
                        "reward); raise the sampler temperature or strategy.group_size")
                continue
            self.rollout_stats = {**rollout_metrics(rollout), "rollout/pairs": len(chosen),
                                  "rollout/skipped": skipped}
            skipped = 0
            yield from pair_micro_batches(rollout, chosen, rejected, accum)

    # -- the loss ---------------------------------------------------------------------
    def _pair_logprobs(self, model: torch.nn.Module, batch: Any) -> tuple[Tensor, ...]:
        if isinstance(batch, RolloutBatch):
            return rollout_pair_logprobs(model, batch)
        return dataset_pair_logprobs(model, batch)

    def compute_loss(self, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        if not isinstance(batch, RolloutBatch):
            batch = {name: tensor.to(self.ctx.device) for name, tensor in batch.items()}
        chosen, rejected, aux_loss, tokens = self._pair_logprobs(self.ctx.model, batch)
        with torch.no_grad():
            ref_chosen, ref_rejected, _, _ = self._pair_logprobs(self.reference, batch)
        cfg = self.config
        losses, chosen_rewards, rejected_rewards, metrics = dpo_loss(
            chosen, rejected, ref_chosen, ref_rejected, beta=cfg.beta, loss_type=cfg.loss_type,
            label_smoothing=cfg.label_smoothing)
        loss = losses.mean()
        metrics.update(chosen_reward=chosen_rewards.mean(), rejected_reward=rejected_rewards.mean(),
                       chosen_logp=chosen.detach().mean(), rejected_logp=rejected.detach().mean(),
                       tokens=tokens)
        return self.add_aux_loss(loss, aux_loss, metrics), metrics

    # -- after each step ----------------------------------------------------------------
    def after_optimizer_step(self, step: int) -> None:
        if self.runner is not None:
            self.runner.publish_from(self.ctx.model)

    def step_metrics(self) -> dict[str, float]:
        return dict(self.rollout_stats)

    # -- checkpointing ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.runner is None:
            return super().state_dict()
        return {"rollout": self.runner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.runner is None:
            super().load_state_dict(state)
            return
        self.runner.load_state_dict(state.get("rollout", {}))
