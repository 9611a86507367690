"""The ``grpo`` strategy: a policy loss (``policy_loss:``, PPO-clip by default) on
group-normalized advantages.

Online (default): each rollout (``data.batch_size`` prompts x ``group_size`` completions)
comes from the rollout runner with the sampler's behaviour log-probs as the old policy;
advantages come from the ``advantage:`` estimator (``grpo`` by default). Offline
(``mode: offline``): batches of dataset rows carrying a response and its reward (format
in :mod:`astrai_plugin_grpo.offline`) go through the same rollout source, one optimizer
step per batch; the policy's log-probs when the batch is drawn, before the step, are the
old policy's, so the ratio is taken against the weights the step started from.

KL to the frozen starting policy (the reference) is either a loss term (``kl_coef``) or
token-reward shaping (``kl_in_reward_coef``); the reference exists only when one is on.
Log-probs are taken at the sampler's temperature, like the behaviour log-probs. The loss
is the core's shared objective (:class:`astrai_core.api.PolicyObjective`): the run's
policy loss, the KL term, the entropy bonus, and ``loss_aggregation``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator
from torch import Tensor

from astrai_core.api import (
    AuxLossOption,
    EntropyOption,
    FieldError,
    KLEstimator,
    KLEstimatorOption,
    KLPenaltyOption,
    LossAggregationOptions,
    ObjectiveSettings,
    OnlineConfig,
    OnlineStrategy,
    RolloutBatch,
    RolloutSource,
    RunComponents,
    RunConfig,
    StrategyNeeds,
    frozen_reference,
    redefault,
)
from astrai_plugin_grpo.offline import OfflineRollouts


class GRPOConfig(AuxLossOption, EntropyOption, KLPenaltyOption, LossAggregationOptions,
                 OnlineConfig):
    """The ``strategy:`` section of a grpo run."""

    mode: Literal["online", "offline"] = Field(
        "online", description="online: rollouts from the sampler; offline: dataset rows "
        "with `response` and `reward` columns")
    # the GRPO paper's in-loss estimator (the other online strategies: k1)
    kl_estimator: KLEstimator = redefault(KLEstimatorOption, "kl_estimator", "k3")

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.mode == "offline" and (self.epochs != 1 or self.mini_batches != 1):
            raise ValueError("offline mode takes one optimizer step per data batch: "
                             "epochs and mini_batches must be 1")
        if self.mode == "offline" and self.rollout_correction is not None:
            raise ValueError("rollout_correction needs a sampler's log-probs; offline data "
                             "has none")
        return self


class GRPO(OnlineStrategy):
    """Group-relative policy optimization; see the module docstring."""

    Config: ClassVar[type[BaseModel]] = GRPOConfig
    defers_old_logprobs: ClassVar[bool] = True  # old log-probs via old_logprobs_for

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        needs = super().needs(config)
        return needs if config.mode == "online" else replace(needs, rollouts=False, group_size=1)

    @classmethod
    def check_run(cls, config: Any, run_config: RunConfig) -> None:
        if config.mode == "online":
            super().check_run(config, run_config)
            return
        rows, accum = run_config.data.batch_size, run_config.trainer.grad_accum_steps
        if rows % accum:
            raise FieldError(("trainer", "grad_accum_steps"),
                             f"data.batch_size={rows} rows cannot be cut into "
                             f"trainer.grad_accum_steps={accum} equal micro-batches")

    def __init__(self, config: GRPOConfig, run: RunComponents) -> None:
        super().__init__(config, run)
        self.reference = frozen_reference(run.model) if config.kl_coef or config.kl_in_reward_coef \
            else None
        self.objective = self.policy_objective(ObjectiveSettings.of(config))

    def batch_source(self) -> RolloutSource:
        if self.config.mode == "online":
            return super().batch_source()
        pad_id = getattr(self.run.tokenizer, "pad_token_id", None) or 0
        drawer = OfflineRollouts(self.run.train_loader, self.run.tokenizer, pad_id)
        return RolloutSource(drawer, partial(self.process_rollout, prefix="data/", recompute=True),
                             epochs=1, mini_batches=1,
                             micro_batches=self.run.trainer.grad_accum_steps,
                             seed=self.run.trainer.seed, device=self.run.device, shuffle=False,
                             shard=self.run.dist.shard_rows)  # distributed: this rank's rows

    # -- the loss ---------------------------------------------------------------------
    def compute_loss(self, batch: RolloutBatch) -> tuple[Tensor, dict[str, Any]]:
        mask = batch.response_mask
        loss, metrics, out = self.policy_loss_terms(batch, self.objective)
        loss = self.add_aux_loss(loss, out["aux_loss"], metrics)
        metrics["tokens"] = mask.sum()
        return loss, metrics
