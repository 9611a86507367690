"""What the pairwise preference strategies (dpo, orpo) share: data, modes and log-probs.

Offline (default): ``preference``-format data (prompt or messages + chosen + rejected);
each loader batch is one micro-batch of pairs. Online (``mode: online``): every optimizer
step draws a rollout (``data.batch_size`` prompts from ``prompt``-format data,
``group_size`` completions each, scored by the ``rewards:``) and pairs each group's
best-reward completion (chosen) with its worst (rejected), both conditioned on the group's
prompt; groups whose rewards all tie are skipped. No advantage estimator is involved.

A response's log-prob is the sum of its tokens' log-probs at temperature 1 (the policy's
own distribution, whatever the sampling temperature); prompt tokens attend but carry no
loss.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, Field
from torch import Tensor

from astrai_core.api import (AuxLossOption, BatchSource, FieldError, RolloutBatch, Strategy,
                             StrategyNeeds, launched_world_size)
from astrai_plugin_dpo.pairs import (PairSource, dataset_pair_logprobs, response_lengths,
                                     rollout_pair_logprobs)


class PairConfig(AuxLossOption):
    """Options every pairwise preference strategy shares."""

    mode: Literal["offline", "online"] = Field(
        "offline", description="offline: preference data; online: best vs worst of rollouts")
    group_size: int = Field(8, ge=2, description="online: completions sampled per prompt")
    max_skipped_rollouts: int = Field(
        20, ge=1, description="online: consecutive rollouts without enough pairs before "
        "giving up")


class PairStrategy(Strategy):
    """Base of dpo and orpo: preference pairs from data or from rollouts."""

    Config: ClassVar[type[BaseModel]] = PairConfig
    data_formats: ClassVar[tuple[str, ...]] = ("preference",)

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        # context parallel: every forward gathers the whole rows' log-probs
        if config.mode == "offline":
            return replace(super().needs(config), context_parallel=True)
        return StrategyNeeds(data_formats=("prompt",), rollouts=True,
                             group_size=config.group_size, context_parallel=True)

    @classmethod
    def check_run(cls, config: Any, run_config: Any) -> None:
        super().check_run(config, run_config)
        if config.mode == "online" and run_config.rollout.max_staleness:
            raise FieldError(("rollout", "max_staleness"), f"online {run_config.strategy.name} "
                             "pairs each rollout's completions on-policy; max_staleness > 0 "
                             "applies to grpo, ppo and reinforce")
        world, batch = launched_world_size(), run_config.data.batch_size
        if config.mode == "online" and run_config.parallel.context_parallel > 1 and \
                world > 1 and batch % world:
            raise FieldError(("data", "batch_size"), f"{batch} prompts per rollout cannot be "
                             f"split evenly over the {world} processes that sample them (with "
                             "parallel.context_parallel every rank samples a share)")

    def batch_source(self) -> BatchSource:
        if self.config.mode == "offline":
            return super().batch_source()
        return PairSource(self.run.rollouts, self.run.trainer.grad_accum_steps,
                          max_skipped=self.config.max_skipped_rollouts, device=self.run.device,
                          dist=self.run.dist)

    def on_device(self, batch: Any) -> Any:
        """A micro-batch (online pairs already are) on the run's device."""
        return batch if isinstance(batch, RolloutBatch) else self.to_device(batch)

    def pair_logprobs(self, model: torch.nn.Module, batch: Any
                      ) -> tuple[Tensor, Tensor, Any, Tensor]:
        """(chosen [B], rejected [B], MoE aux loss, response tokens): summed log-probs, of
        the whole rows on every rank of a context group (``parallel.context_parallel``)."""
        pair_logprobs = rollout_pair_logprobs if isinstance(batch, RolloutBatch) \
            else dataset_pair_logprobs
        return pair_logprobs(model, batch, self.run.dist)

    @staticmethod
    def average_logprobs(batch: Any, chosen: Tensor, rejected: Tensor) -> tuple[Tensor, Tensor]:
        """Summed log-probs divided by their response lengths (SimPO's and ORPO's)."""
        chosen_len, rejected_len = response_lengths(batch)
        return chosen / chosen_len.clamp_min(1), rejected / rejected_len.clamp_min(1)
