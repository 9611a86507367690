"""The ``rm`` strategy: a Bradley-Terry reward model trained on ``preference`` data.

The reward of a sequence is a linear score head on the model's final hidden state at its
last real token (:mod:`astrai_plugin_rm.scoring`, the pooling of Hugging Face's sequence
classifiers). Each pair's loss is ``-log sigmoid(r_chosen - r_rejected - margin)``, the
margin taken from the data's optional ``margin`` column, plus an optional centring term
(:func:`astrai_plugin_rm.loss.bradley_terry_loss`).

The model is the run's policy: the trainer trains it as any policy (LoRA and FSDP
included). The score head is a module trained beside it (:meth:`trained_modules`), with
the trainer's optimizer settings (``head_lr`` aside), saved as ``score.safetensors`` in
every checkpoint. Held-out pairs (``data.eval`` in the preference format) give
``eval/loss`` and ``eval/accuracy``, the share of pairs ranked right.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from pydantic import BaseModel, Field
from torch import Tensor

from astrai_core.api import (AuxLossOption, RunComponents, Strategy, StrategyNeeds,
                             TrainedModule, both_sides, model_images)
from astrai_plugin_rm.loss import bradley_terry_loss
from astrai_plugin_rm.scoring import SCORE_HEAD, new_score_head, reward_pad_id, sequence_rewards


class RewardModelingConfig(AuxLossOption):
    """The ``strategy:`` section of an rm run."""

    center_rewards_coefficient: float | None = Field(
        None, ge=0, description="weight of mean((r_chosen + r_rejected)^2), which keeps "
        "rewards centred on 0 (None: off)")
    head_lr: float | None = Field(
        None, gt=0, description="the score head's peak learning rate (default: trainer.lr)")
    head_init_std: float = Field(
        0.02, ge=0, description="std of the score head's normal init (0: a zero head)")


class RewardModeling(Strategy):
    """Bradley-Terry reward modelling; see the module docstring."""

    Config: ClassVar[type[BaseModel]] = RewardModelingConfig
    data_formats: ClassVar[tuple[str, ...]] = ("preference",)
    eval_metrics: ClassVar[tuple[str, ...]] = ("accuracy",)

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        # context parallel: the rewards are read from the group's gathered scores
        return replace(super().needs(config), context_parallel=True)

    def __init__(self, config: RewardModelingConfig, run: RunComponents) -> None:
        super().__init__(config, run)
        self.pad_id = reward_pad_id(run.tokenizer)
        parameter = next(run.model.parameters())
        self.score = new_score_head(run.model.config.hidden_size, config.head_init_std,
                                    parameter)

    def trained_modules(self) -> dict[str, TrainedModule]:
        overrides = {"lr": self.config.head_lr} if self.config.head_lr is not None else {}
        return {SCORE_HEAD: TrainedModule(self.score, overrides=overrides)}

    def rewards(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Any]:
        """(r_chosen [B], r_rejected [B], MoE aux loss); both sides in one forward (a
        vision-language model's with the prompts' images)."""
        rows = both_sides(batch)
        rewards, aux_loss = sequence_rewards(
            self.run.model, self.score, rows["input_ids"], rows["attention_mask"],
            self.pad_id, position_ids=rows["position_ids"], dist=self.run.dist,
            images=model_images(self.run.model, rows))
        pairs = batch["chosen_input_ids"].shape[0]
        return rewards[:pairs], rewards[pairs:], aux_loss

    def compute_loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        batch = self.to_device(batch)
        chosen, rejected, aux_loss = self.rewards(batch)
        loss, metrics = bradley_terry_loss(
            chosen, rejected, batch.get("margin"),
            center_rewards_coefficient=self.config.center_rewards_coefficient)
        tokens = batch["chosen_attention_mask"].sum() + batch["rejected_attention_mask"].sum()
        metrics.update(tokens=tokens, loss_weight=len(chosen))  # the loss is a mean over pairs
        return self.add_aux_loss(loss, aux_loss, metrics), metrics
