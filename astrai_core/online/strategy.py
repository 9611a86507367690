"""The online (RL) strategy base: rollouts in, micro-batches out.

An online strategy (grpo, ppo, a plugin's) extends :class:`OnlineStrategy` with its loss.
The base wires the loop (docs/rl-loop.md walks one step): its batch source draws each
rollout through the run's rollout runner (:mod:`astrai_core.online.source`), makes it
trainable once (:func:`astrai_core.online.prepare.trainable_rollout`: old and reference
log-probs, values, advantages) and serves ``epochs x mini_batches`` optimizer steps of
``grad_accum_steps`` micro-batches; :meth:`OnlineStrategy.policy_loss_terms` is the policy's
training forward and its objective on one of them. The trainer publishes the new weights
to the sampler after every optimizer step.

Its options are :class:`~astrai_core.config.online.OnlineConfig`, checked by the run plan.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel

from astrai_core.config.online import OnlineConfig
from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.online import prepare
from astrai_core.online.deferred import DeferredOldLogprobs
from astrai_core.online.routing import RouterReplay
from astrai_core.online.source import RolloutSource, online_source
from astrai_core.rl.objective import ObjectiveSettings, PolicyObjective
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.forward import policy_forward, rollout_forward
from astrai_core.training.run_components import RunComponents
from astrai_core.training.strategy import Strategy


class OnlineStrategy(Strategy):
    """Base of strategies trained on rollouts (grpo, ppo)."""

    Config: ClassVar[type[BaseModel]] = OnlineConfig
    # The loss takes its old log-probs through old_logprobs_for, so a rollout's training
    # forward may stand in for its no-grad one (deferred.may_defer).
    defers_old_logprobs: ClassVar[bool] = False

    def __init__(self, config: BaseModel, run: RunComponents) -> None:
        super().__init__(config, run)
        # A frozen reference policy, for KL terms: a subclass that sets it (frozen_reference
        # of the policy) gets it frozen by the trainer and its log-probs attached to every
        # rollout.
        self.reference: torch.nn.Module | None = None
        self.deferred = DeferredOldLogprobs(run.dist)  # the current rollout's, if deferred
        self.routing = RouterReplay(config.router_replay)  # MoE routing of the forwards

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        return StrategyNeeds(data_formats=("prompt",), rollouts=True, advantage=True,
                             group_size=config.group_size,
                             policy_loss=config.policy_loss_choice(),
                             sampler_routing=config.router_replay == "R3",
                             context_parallel=True)  # its forwards: policy_forward(dist=)

    def batch_source(self) -> RolloutSource:
        self.routing.check(self.run.model)
        return online_source(self.run, self.config, self.process_rollout)

    def policy_objective(self, settings: ObjectiveSettings) -> PolicyObjective:
        """The shared objective around the run's policy loss (built by the wiring)."""
        return PolicyObjective(self.run.policy_loss, settings)

    def frozen_modules(self) -> dict[str, torch.nn.Module]:
        return {"reference": self.reference} if self.reference is not None else {}

    # -- per-rollout work (prepare.py) --------------------------------------------------
    def process_rollout(self, rollout: RolloutBatch, prefix: str = "rollout/",
                        recompute: bool | None = None) -> tuple[RolloutBatch, dict[str, float]]:
        """A drawn rollout made trainable, and its statistics
        (:func:`astrai_core.online.prepare.trainable_rollout`)."""
        return prepare.trainable_rollout(self, rollout, prefix, recompute)

    def prepare_rollout(self, rollout: RolloutBatch) -> None:
        """Attach per-token tensors before advantages: by default the reference's
        ``ref_logprobs`` (subclasses add theirs, e.g. a critic's ``values``)."""
        if self.reference is not None:
            self.attach_reference_logprobs(rollout, self.reference)

    def attach_reference_logprobs(self, rollout: RolloutBatch, reference: torch.nn.Module) -> None:
        """``rollout.ref_logprobs``: a frozen reference's log-probs at the rollout's
        temperature, 0 on padding (for KL terms)."""
        ref = rollout_forward(reference, rollout, self.run.logprob_temperature,
                              self.run.trainer.micro_batch_tokens, dist=self.run.dist)["logprobs"]
        rollout.ref_logprobs = torch.where(rollout.response_mask, ref, 0.0)

    def token_rewards(self, rollout: RolloutBatch) -> torch.Tensor:
        """Scalar reward on each last response token, minus optional KL shaping."""
        return prepare.token_rewards(self.config, rollout)

    # -- the training forward ---------------------------------------------------------
    def old_logprobs_for(self, batch: RolloutBatch, logprobs: torch.Tensor) -> torch.Tensor:
        """The old policy's log-probs for the loss over ``batch``, whose training forward
        gave ``logprobs``: the batch's own, or, where process_rollout left them to this
        forward (recompute), ``logprobs`` detached. A training forward also gathers the
        sampler/trainer mismatch the skipped forward would have measured and, with rollout
        correction, sets ``batch.extras["rollout_weights"]``: call it before reading
        ``batch.extras``."""
        return self.deferred.old_logprobs_for(batch, logprobs, self.run.model.training)

    def step_metrics(self) -> dict[str, float]:
        """The mismatch and correction metrics gathered by :meth:`old_logprobs_for` during
        the step, and ``router/replay_mismatch`` (router replay)."""
        return {**self.deferred.pop_metrics(), **self.routing.pop_metrics()}

    def policy_loss_terms(self, batch: RolloutBatch, objective: PolicyObjective
                          ) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
        """The policy's training forward over ``batch`` (replaying recorded routing) and
        ``objective`` on it: (loss, metrics, the forward's outputs)."""
        with self.routing.training_forward(self.run.model, batch):
            out = policy_forward(self.run.model, batch, self.run.logprob_temperature,
                                 return_entropy=True, dist=self.run.dist)
        old = self.old_logprobs_for(batch, out["logprobs"])  # deferred: sets rollout_weights
        loss, metrics = objective(
            logprobs=out["logprobs"], old_logprobs=old, advantages=batch.advantages,
            response_mask=batch.response_mask, ref_logprobs=batch.ref_logprobs,
            entropy=out["entropy"], extras=batch.extras)
        return loss, metrics, out
