"""The online (RL) strategy base: rollouts in, micro-batches out.

The run's rollout runner draws each rollout (prompts x ``group_size`` completions,
scored by the reward functions) and a :class:`RolloutSource` owns the schedule. Each
drawn rollout is processed once by :meth:`OnlineStrategy.process_rollout`:

1. one no-grad trainer forward measures the sampler/trainer log-prob mismatch
   (``rollout/logprob_diff_*``); with ``recompute_old_logprobs`` (implied by
   ``rollout_correction``) its log-probs become the old policy's, and rollout correction
   turns the gap into importance weights (``extras["rollout_weights"]``, handed to the
   policy loss; :mod:`astrai_core.rl.rollout_correction`);
2. the subclass attaches per-token tensors (:meth:`prepare_rollout`: reference
   log-probs, critic values);
3. token rewards (score on the last response token, optional KL shaping) go through the
   run's advantage estimator into ``advantages`` (and ``returns``).

With ``epochs x mini_batches = 1`` each row is trained on exactly once, by the policy
that sampled it, so a strategy whose loss takes its old log-probs through
:meth:`OnlineStrategy.old_logprobs_for` (``defers_old_logprobs``: grpo, ppo) skips step 1's
no-grad forward: the training forward supplies them (detached: the ratio is exactly 1),
the mismatch metrics and, with rollout correction, each micro-batch's weights and the
``rollout_correction/*`` metrics (:meth:`OnlineStrategy.step_metrics`;
:mod:`astrai_core.training.online_logprobs`). KL reward shaping on recomputed log-probs
needs them before the advantages, and ``router_replay: R2`` records its routing in that
forward, so they keep it.

With ``trainer.micro_batch_tokens`` these per-rollout no-grad forwards (old and reference
log-probs, critic values) run over the rollout in packed micro-batches, like the training
ones (:func:`~astrai_core.rollout.forward.rollout_forward`).

The source then serves ``epochs x mini_batches`` optimizer steps from it, each cut into
the trainer's ``grad_accum_steps`` micro-batches; the trainer publishes the new weights
to the sampler after every optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from astrai_core.config.schema import ComponentSection, RunConfig
from astrai_core.distributed.world import launched_world_size
from astrai_core.rollout.gather import gather_rollout
from astrai_core.errors import ConfigError, FieldError
from astrai_core.model.head import has_chunked_head
from astrai_core.model.router_replay import ROUTED_EXPERTS, has_moe, record_routing
from astrai_core.rl.functional import token_rewards_from_scores
from astrai_core.rl.objective import ObjectiveSettings, PolicyObjective
from astrai_core.rl.options import KLEstimatorOption
from astrai_core.rl.rollout_correction import RolloutCorrectionConfig, correction_weights
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.dynamic_sampling import DynamicSampler, DynamicSamplingConfig
from astrai_core.rollout.forward import policy_forward, rollout_forward
from astrai_core.rollout.partial import PartialRollouts
from astrai_core.rollout.metrics import rollout_metrics
from astrai_core.config.strategy_needs import ComponentChoice, StrategyNeeds
from astrai_core.training.batch_sources import RolloutSource
from astrai_core.training.online_logprobs import CORRECTION, DeferredOldLogprobs, may_defer
from astrai_core.training.online_routing import RoutingReplay
from astrai_core.training.run_components import RunComponents
from astrai_core.training.strategy import Strategy


class OnlineConfig(KLEstimatorOption):
    """Options every online strategy shares (subclass configs extend this); the loss
    options several strategies share come from :mod:`astrai_core.rl.options`."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(8, ge=1, description="completions sampled per prompt")
    epochs: int = Field(1, ge=1, description="passes over each rollout")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass over a rollout")
    recompute_old_logprobs: bool = Field(
        False, description="use the trainer's log-probs of the rollout as the old policy "
        "instead of the sampler's (they agree with the torch sampler)")
    kl_in_reward_coef: float = Field(0.0, ge=0, description="KL-to-reference shaping of "
                                     "the token rewards (needs a reference model)")
    eps_low: float = Field(0.2, ge=0, lt=1, description="ratio clip below: 1 - eps_low "
                           "(options of the default ppo_clip policy loss)")
    eps_high: float = Field(0.2, ge=0, description="ratio clip above: 1 + eps_high "
                            "(DAPO's clip-higher uses 0.28)")
    policy_loss: ComponentSection | None = Field(
        None, description="{name: ppo_clip | dual_clip | gspo | cispo | a plugin's, ...}; "
        "default: ppo_clip with eps_low/eps_high")
    rollout_correction: RolloutCorrectionConfig | None = Field(
        None, description="importance weights pi_trainer/pi_sampler on the rollout "
        "(off by default): {level: token|sequence, mode: truncate|mask, threshold: C}")
    router_replay: Literal["disabled", "R2", "R3"] = Field(
        "disabled", description="MoE routing of the training forwards: R2 replays the "
        "experts of the trainer's first forward over each rollout, R3 the sampler's")
    dynamic_sampling: DynamicSamplingConfig | None = Field(
        None, description="DAPO's dynamic sampling (off by default): {enabled, max_tries}; "
        "drops groups whose rewards are all equal and draws again")

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
    def _one_place_for_the_loss(self) -> OnlineConfig:
        clip = {"eps_low", "eps_high"} & self.model_fields_set
        if self.policy_loss is not None and clip:
            raise ValueError(f"{'/'.join(sorted(clip))} configure the default ppo_clip loss; "
                             "with a policy_loss section give them inside it")
        if (self.rollout_correction is not None and "recompute_old_logprobs" in
                self.model_fields_set and not self.recompute_old_logprobs):
            raise ValueError("rollout_correction weighs the trainer's old log-probs against "
                             "the sampler's, so it needs recompute_old_logprobs: true")
        if self.dynamic_sampling is not None and self.dynamic_sampling.enabled \
                and self.group_size < 2:
            raise ValueError("dynamic_sampling drops groups whose rewards are all equal, so "
                             "it needs group_size >= 2 (a group of one is always uniform)")
        return self

    def policy_loss_choice(self) -> ComponentChoice:
        """The policy loss to build: the ``policy_loss`` section, or ppo_clip with the bounds."""
        if self.policy_loss is None:
            return ComponentChoice("policy_loss", "ppo_clip",
                                   {"eps_low": self.eps_low, "eps_high": self.eps_high},
                                   ("strategy",))
        return ComponentChoice("policy_loss", self.policy_loss.name, self.policy_loss.params,
                               ("strategy", "policy_loss"))


class OnlineStrategy(Strategy):
    """Base of strategies trained on rollouts (grpo, ppo)."""

    Config: ClassVar[type[BaseModel]] = OnlineConfig
    # The loss takes its old log-probs through old_logprobs_for, so a rollout's training
    # forward may stand in for its no-grad one (online_logprobs.may_defer).
    defers_old_logprobs: ClassVar[bool] = False

    def __init__(self, config: BaseModel, run: RunComponents) -> None:
        super().__init__(config, run)
        # A frozen reference policy, for KL terms: a subclass that sets it (frozen_reference
        # of the policy) gets it frozen by the trainer and its log-probs attached to every
        # rollout.
        self.reference: torch.nn.Module | None = None
        self.deferred = DeferredOldLogprobs(run.dist)  # the current rollout's, if deferred
        self.routing = RoutingReplay()  # router_replay in the training forwards

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        return StrategyNeeds(data_formats=("prompt",), rollouts=True, advantage=True,
                             group_size=config.group_size,
                             policy_loss=config.policy_loss_choice(),
                             sampler_routing=config.router_replay == "R3")

    @classmethod
    def check_run(cls, config: Any, run_config: RunConfig) -> None:
        """Every optimizer step gets an equal share of the rollout."""
        prompts, accum = run_config.data.batch_size, run_config.trainer.grad_accum_steps
        rows = prompts * config.group_size
        if rows % (config.mini_batches * accum):
            raise FieldError(("trainer", "grad_accum_steps"),
                             f"a rollout of {rows} sequences (data.batch_size={prompts} x "
                             f"strategy.group_size={config.group_size}) cannot be cut into "
                             f"strategy.mini_batches={config.mini_batches} x "
                             f"trainer.grad_accum_steps={accum} equal micro-batches")
        if (run_config.rollout.max_staleness and config.recompute_old_logprobs
                and config.rollout_correction is None):
            raise FieldError(("strategy", "recompute_old_logprobs"),
                             "with rollout.max_staleness > 0 the trainer's log-probs are not "
                             "the sampling policy's: keep the sampler's (false), or add "
                             "rollout_correction to weigh the two")
        if run_config.trainer.micro_batch_tokens is not None:
            cls._check_packing(config, run_config)
        world = launched_world_size()
        if run_config.rollout.partial:
            cls._check_partial(config, world)
        if rows // (config.mini_batches * accum) % world:
            raise FieldError(("trainer", "grad_accum_steps"),
                             f"a micro-batch of {rows // (config.mini_batches * accum)} "
                             f"sequences cannot be split evenly over {world} data-parallel "
                             "ranks; make data.batch_size x strategy.group_size / "
                             "(strategy.mini_batches x trainer.grad_accum_steps) a multiple "
                             f"of {world}")

    @staticmethod
    def _check_packing(config: Any, run_config: RunConfig) -> None:
        """trainer.micro_batch_tokens sizes the micro-batches itself, by tokens."""
        if run_config.trainer.grad_accum_steps != 1:
            raise FieldError(("trainer", "micro_batch_tokens"),
                             "sizes the micro-batches by tokens; leave "
                             "trainer.grad_accum_steps at 1 with it")
        if config.router_replay != "disabled":
            raise FieldError(("trainer", "micro_batch_tokens"),
                             "packed micro-batches cannot replay MoE routing yet; use "
                             "strategy.router_replay: disabled with them")

    @staticmethod
    def _check_partial(config: Any, world: int) -> None:
        """rollout.partial trains on tokens of older policies with the decoupled objective."""
        path = ("rollout", "partial")
        if config.rollout_correction is None:
            raise FieldError(path, "trains on tokens sampled by older policies with the "
                             "decoupled objective, whose importance weight is "
                             "strategy.rollout_correction: add it (e.g. {level: token, "
                             "mode: truncate, threshold: 2})")
        if config.dynamic_sampling is not None and config.dynamic_sampling.enabled:
            raise FieldError(path, "cannot be combined with strategy.dynamic_sampling yet")
        if config.router_replay == "R3":
            raise FieldError(path, "cannot replay the sampler's routing (router_replay: R3) "
                             "of sequences continued across policies; use R2")
        if world > 1:
            raise FieldError(path, "runs in one process for now (launched with "
                             f"{world}); remove it or launch one process")

    def batch_source(self) -> RolloutSource:
        packing = self.run.trainer.micro_batch_tokens
        if packing is not None and not has_chunked_head(self.run.model):
            raise ConfigError("trainer.micro_batch_tokens packs rows into one sequence, "
                              "which needs a native model (model.backend: native)")
        if self.config.router_replay != "disabled" and not has_moe(self.run.model):
            raise ConfigError(f"strategy.router_replay: {self.config.router_replay} replays MoE "
                              "routing, and the model has no MoE layer")
        drawer, process = self.run.rollouts, self.process_rollout
        rollout = self.run.plan.config.rollout
        if rollout.partial:  # carried sequences: the source requests nothing ahead
            drawer = PartialRollouts(drawer, rollout.partial_tokens, rollout.max_staleness,
                                     overlap=rollout.partial_overlap)
        dynamic = self.config.dynamic_sampling
        if dynamic is not None and dynamic.enabled:  # rollouts of informative groups only
            drawer = DynamicSampler(drawer, self.run.data.batch_size, dynamic.max_tries)
            process = _with_stats(process, drawer)
        return RolloutSource(drawer, process, epochs=self.config.epochs,
                             mini_batches=self.config.mini_batches,
                             micro_batches=self.run.trainer.grad_accum_steps,
                             seed=self.run.trainer.seed, device=self.run.device,
                             max_staleness=0 if rollout.partial else rollout.max_staleness,
                             shard=self.run.dist.shard_rows, micro_batch_tokens=packing,
                             world=self.run.dist.world_size)

    def policy_objective(self, settings: ObjectiveSettings) -> PolicyObjective:
        """The shared objective around the run's policy loss (built by the wiring)."""
        return PolicyObjective(self.run.policy_loss, settings)

    def frozen_modules(self) -> dict[str, torch.nn.Module]:
        return {"reference": self.reference} if self.reference is not None else {}

    # -- per-rollout work -------------------------------------------------------------
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
        shaping = self.config.kl_in_reward_coef
        if shaping and rollout.ref_logprobs is None:
            raise ConfigError("strategy.kl_in_reward_coef needs a reference model")
        return token_rewards_from_scores(
            rollout.rewards, rollout.response_mask, logp_old=rollout.old_logprobs,
            logp_ref=rollout.ref_logprobs if shaping else None, kl_coef=shaping,
            kl_kind=self.config.kl_estimator)

    def process_rollout(self, rollout: RolloutBatch, prefix: str = "rollout/",
                        recompute: bool | None = None) -> tuple[RolloutBatch, dict[str, float]]:
        """A drawn rollout made trainable, and its statistics; see the module docstring.

        ``recompute``: take the old policy's log-probs from the trainer (default: the
        ``recompute_old_logprobs`` option; offline data has no sampler log-probs at all).
        """
        correction = self.config.rollout_correction
        if recompute is None:
            recompute = self.config.recompute_old_logprobs or correction is not None
        missing = self._check_behaviour_logprobs(rollout, recompute)
        if missing and correction is not None:
            raise ConfigError(
                f"strategy.rollout_correction needs the sampler's log-probs, and sampler "
                f"{self.run.plan.sampler.name!r} returned none for its tokens")
        rollout = rollout.to(self.run.device)
        self.deferred.stop()
        # whether the training forward supplies the old log-probs
        defer = may_defer(self.config, self.defers_old_logprobs, recompute)
        model = self.run.model
        record = self.config.router_replay == "R2"
        token_tensors: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            if not defer:
                routing = record_routing(model) if record else \
                    self.routing.sampler_routing(model, rollout)  # R2 records, R3 replays
                # router_replay needs the rollout in one padded forward; packing is off
                # with it (_check_packing)
                packing = None if self.config.router_replay != "disabled" else \
                    self.run.trainer.micro_batch_tokens
                with routing as tape:
                    model.eval()
                    forward = rollout_forward(model, rollout, self.run.logprob_temperature,
                                              packing, dist=self.run.dist)
                    model.train()
                if record:  # the experts of the trainer's first forward, replayed in training
                    rollout.extras[ROUTED_EXPERTS] = tape.stacked(*rollout.attention_mask().shape)
                token_tensors["logprobs"] = forward["logprobs"]
            self.prepare_rollout(rollout)  # this rank's rows: values, reference log-probs
        # Distributed: every rank's share gathered into the global rollout, so that the
        # advantages (GAE whitening), statistics and step schedule are the global ones.
        rollout, tokens = gather_rollout(rollout, self.run.dist, token_tensors)
        mask = rollout.response_mask
        stats = rollout_metrics(rollout, prefix=prefix)
        if defer:
            self.deferred.start(recompute=recompute, measure=not missing, prefix=prefix,
                                correction=correction)
            if missing:
                rollout.old_logprobs = None
            return self._finish_rollout(rollout, stats, prefix)
        trainer_logprobs = tokens["logprobs"]
        if not missing:
            diff = (trainer_logprobs - rollout.old_logprobs).abs()[mask]
            stats[f"{prefix}logprob_diff_max"] = diff.max().item() if diff.numel() else 0.0
            stats[f"{prefix}logprob_diff_mean"] = diff.mean().item() if diff.numel() else 0.0
        if correction is not None and not missing:
            weights, metrics = correction_weights(trainer_logprobs, rollout.old_logprobs,
                                                  mask, correction)
            rollout.extras["rollout_weights"] = weights
            stats.update({CORRECTION + k: v.item() for k, v in metrics.items()})
        if recompute:
            rollout.old_logprobs = torch.where(mask, trainer_logprobs, 0.0)
        return self._finish_rollout(rollout, stats, prefix)

    def _finish_rollout(self, rollout: RolloutBatch, stats: dict[str, float], prefix: str
                        ) -> tuple[RolloutBatch, dict[str, float]]:
        """The advantages of the (global) rollout, and their statistics."""
        mask = rollout.response_mask
        with torch.no_grad():
            rollout.advantages, rollout.returns = self.run.estimator(
                token_rewards=self.token_rewards(rollout), response_mask=mask,
                group_ids=rollout.group_ids, values=rollout.values)
        valid = rollout.advantages[mask]
        stats[f"{prefix}advantage_mean"] = valid.mean().item() if valid.numel() else 0.0
        stats[f"{prefix}advantage_std"] = valid.std().item() if valid.numel() > 1 else 0.0
        return rollout, stats

    # -- old log-probs from the training forward (one forward per rollout row) ---------
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
        the step, and ``router/replay_mismatch`` (:meth:`replaying_routing`)."""
        return {**self.deferred.pop_metrics(), **self.routing.pop_metrics()}

    def policy_loss_terms(self, batch: RolloutBatch, objective: PolicyObjective
                          ) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
        """The policy's training forward over ``batch`` (replaying recorded routing) and
        ``objective`` on it: (loss, metrics, the forward's outputs)."""
        with self.replaying_routing(batch):  # router_replay: the recorded experts
            out = policy_forward(self.run.model, batch, self.run.logprob_temperature,
                                 return_entropy=True)
        old = self.old_logprobs_for(batch, out["logprobs"])  # deferred: sets rollout_weights
        loss, metrics = objective(
            logprobs=out["logprobs"], old_logprobs=old, advantages=batch.advantages,
            response_mask=batch.response_mask, ref_logprobs=batch.ref_logprobs,
            entropy=out["entropy"], extras=batch.extras)
        return loss, metrics, out

    # -- MoE router replay (router_replay: R2, R3) --------------------------------------
    @contextmanager
    def replaying_routing(self, batch: RolloutBatch) -> Iterator[None]:
        """Around a training forward of the policy over ``batch``: route its tokens
        through the experts recorded for them (when ``router_replay`` recorded any) and
        count the tokens whose own routing differed (``router/replay_mismatch``)."""
        with self.routing.replaying(self.run.model, batch):
            yield

    def _check_behaviour_logprobs(self, rollout: RolloutBatch, recompute: bool) -> bool:
        """True when the rollout lacks behaviour log-probs and the trainer may supply them."""
        old = rollout.old_logprobs
        if old is not None and tuple(old.shape) == tuple(rollout.response_ids.shape):
            return False
        if not recompute:
            raise ConfigError(
                f"the rollout carries no behaviour log-probs (sampler "
                f"{self.run.plan.sampler.name!r} returned none for its tokens), so the old "
                "policy is unknown; set strategy.recompute_old_logprobs: true to compute "
                "them with the trainer's model")
        return True


def _with_stats(process: Any, drawer: DynamicSampler) -> Any:
    """``process`` whose statistics also carry the dynamic sampler's of that draw."""
    def processed(rollout: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        rollout, stats = process(rollout)
        return rollout, {**stats, **drawer.stats}
    return processed
