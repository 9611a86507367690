"""The online options and every rule about them, checked once by the run plan.

:class:`OnlineConfig` holds the ``strategy:`` options every online strategy shares (grpo,
ppo and plugins extend it); its validators keep the rules inside the section. The rules
that read other sections (``trainer:``, ``rollout:``, the sampler, the model) are one
function per option, named after it, and :func:`check_online_options` calls each of them
once, from :func:`astrai_core.config.plan.plan_run`, before anything is built. An option
given to a strategy that draws no rollouts is refused by its own function too.

The one rule that needs the built model (a dense model cannot replay MoE routing) is
checked where the model exists: :meth:`astrai_core.online.routing.RouterReplay.check`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from astrai_core.checkpoints.model_source import TRANSFORMERS
from astrai_core.config.component import ComponentSection
from astrai_core.config.schema import RunConfig
from astrai_core.config.strategy_needs import ComponentChoice, StrategyNeeds
from astrai_core.errors import FieldError
from astrai_core.rl.options import KLEstimatorOption
from astrai_core.rl.rollout_correction import RolloutCorrectionConfig



class DynamicSamplingConfig(BaseModel):
    """The ``dynamic_sampling:`` option of an online strategy."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="drop groups whose rewards are all equal and draw "
                          "again until the rollout holds data.batch_size informative groups")
    max_tries: int = Field(4, ge=1, description="draws per rollout at most, the first included; "
                           "then it warns and fills up with uniform groups")


class OnlineConfig(KLEstimatorOption):
    """Options every online strategy shares (subclass configs extend this)."""

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

    @property
    def dynamic(self) -> DynamicSamplingConfig | None:
        """``dynamic_sampling`` when it is enabled, else None."""
        dynamic = self.dynamic_sampling
        return dynamic if dynamic is not None and dynamic.enabled else None

    def policy_loss_choice(self) -> ComponentChoice:
        """The policy loss to build: the ``policy_loss`` section, or ppo_clip with the bounds."""
        if self.policy_loss is None:
            return ComponentChoice("policy_loss", "ppo_clip",
                                   {"eps_low": self.eps_low, "eps_high": self.eps_high},
                                   ("strategy",))
        return ComponentChoice("policy_loss", self.policy_loss.name, self.policy_loss.params,
                               ("strategy", "policy_loss"))


def check_online_options(config: RunConfig, needs: StrategyNeeds, online: OnlineConfig | None,
                         *, world: int, registry: Any, sampler: str,
                         model_source: Any = None) -> None:
    """Every rule of the online options, each once (FieldError naming the field).

    ``online``: the strategy's options when they are an :class:`OnlineConfig` (else None);
    ``world``: the launched processes; ``sampler``: the sampler's name in ``registry``;
    ``model_source``: ``model.path`` resolved (None: a native model from scratch).
    """
    trains_online = online if needs.rollouts else None  # its online options apply
    backend = model_source.backend if model_source is not None else None
    check_max_logprob_diff(config, needs)
    check_micro_batch_tokens(config, needs, trains_online, backend)
    check_share_prompt(config, needs, trains_online, backend)
    check_online_context_parallel(config, trains_online, world)
    check_max_staleness(config, needs, trains_online, registry, sampler)
    check_partial(config, needs, trains_online, world)
    if trains_online is not None:  # the rows split over the data-parallel ranks
        data_world = world // config.parallel.context_parallel if world > 1 else 1
        check_mini_batches(config, trains_online, data_world)
    check_router_replay(needs, online, registry, sampler, model_source)


def _offline(path: tuple[str, ...], config: RunConfig, needs: StrategyNeeds, what: str) -> None:
    """An online option given to a strategy that draws no rollouts."""
    if not needs.rollouts:
        raise FieldError(path, f"strategy {config.strategy.name!r} trains offline: it draws "
                         f"no rollouts{what}")


def check_max_logprob_diff(config: RunConfig, needs: StrategyNeeds) -> None:
    """``rollout.max_logprob_diff`` compares the sampler's log-probs with the trainer's for
    the same weights: it needs rollouts, and rollouts sampled by the same policy."""
    if config.rollout.max_logprob_diff is None:
        return
    path = ("rollout", "max_logprob_diff")
    _offline(path, config, needs, ", so there are no sampler log-probs to check")
    if config.rollout.max_staleness:
        raise FieldError(path, "with rollout.max_staleness > 0 the sampler's weights lag the "
                         "trainer's by design, so the mismatch measures the policy's change, "
                         "not the weight push; remove one of the two")


def check_micro_batch_tokens(config: RunConfig, needs: StrategyNeeds,
                             online: OnlineConfig | None, backend: str | None) -> None:
    """``trainer.micro_batch_tokens`` packs the rollout rows of online steps into
    micro-batches sized by tokens, as one sequence each (the native model's forward)."""
    if config.trainer.micro_batch_tokens is None:
        return
    path = ("trainer", "micro_batch_tokens")
    if not needs.rollouts:
        raise FieldError(path, f"packs the rollout rows of online strategies, and strategy "
                         f"{config.strategy.name!r} draws no rollouts (offline data is packed "
                         "by data.packing)")
    if online is None:
        return
    if config.trainer.grad_accum_steps != 1:
        raise FieldError(path, "sizes the micro-batches by tokens; leave "
                         "trainer.grad_accum_steps at 1 with it")
    if online.router_replay != "disabled":
        raise FieldError(path, "packed micro-batches cannot replay MoE routing yet; use "
                         "strategy.router_replay: disabled with them")
    if backend == TRANSFORMERS:
        raise FieldError(path, "packs rows into one sequence, which needs a native model "
                         "(model.backend: native)")


def check_share_prompt(config: RunConfig, needs: StrategyNeeds, online: OnlineConfig | None,
                       backend: str | None) -> None:
    """``trainer.share_prompt`` packs each forward over rollout rows with every prompt once
    (the native model's attention over a given layout)."""
    if not config.trainer.share_prompt:
        return
    path = ("trainer", "share_prompt")
    if online is None:
        raise FieldError(path, f"shares the prompt of a group's completions in the forwards "
                         f"of online strategies (grpo, ppo, a plugin's on their options), and "
                         f"strategy {config.strategy.name!r} is not one")
    if online.router_replay != "disabled":
        raise FieldError(path, "a shared prompt's tokens are routed once, so MoE routing "
                         "cannot be replayed per row; use strategy.router_replay: disabled "
                         "with it")
    if backend == TRANSFORMERS:
        raise FieldError(path, "packs each group's prompt once, which needs a native model "
                         "(model.backend: native)")


def check_online_context_parallel(config: RunConfig, online: OnlineConfig | None,
                                  world: int) -> None:
    """``parallel.context_parallel`` splits each rollout row's tokens over ranks: not with
    a shared prompt (its layout spans rows) or MoE routing replayed per token."""
    if config.parallel.context_parallel == 1 or world == 1 or online is None:
        return
    path = ("parallel", "context_parallel")
    if config.trainer.share_prompt:
        raise FieldError(path, "splits each row's tokens over ranks, and trainer.share_prompt "
                         "packs a group's rows around one prompt; use one of them")
    if online.router_replay != "disabled":
        raise FieldError(path, "cannot replay MoE routing on split rows yet; use "
                         "strategy.router_replay: disabled with it")
    if config.data.batch_size % world:
        raise FieldError(("data", "batch_size"), f"{config.data.batch_size} prompts per "
                         f"rollout cannot be split evenly over the {world} processes that "
                         "sample them (with parallel.context_parallel the ranks of a context "
                         "group sample shares of their group's prompts)")


def check_max_staleness(config: RunConfig, needs: StrategyNeeds, online: OnlineConfig | None,
                        registry: Any, sampler: str) -> None:
    """``rollout.max_staleness > 0`` needs an online strategy, a sampler that generates
    apart from the trainer (its spec says ``asynchronous``), and the sampler's log-probs as
    the old policy unless rollout correction weighs the two."""
    if config.rollout.max_staleness == 0:
        return
    path = ("rollout", "max_staleness")
    _offline(path, config, needs, ", so there is nothing to overlap (remove rollout:)")
    if online is not None and online.recompute_old_logprobs \
            and online.rollout_correction is None:
        raise FieldError(("strategy", "recompute_old_logprobs"),
                         "with rollout.max_staleness > 0 the trainer's log-probs are not "
                         "the sampling policy's: keep the sampler's (false), or add "
                         "rollout_correction to weigh the two")
    spec = registry.get("sampler", sampler)
    if spec.asynchronous or config.rollout.partial:
        return  # partial rollouts carry sequences over steps with any sampler
    allowed = sorted(s.name for s in registry.specs("sampler") if s.asynchronous)
    hint = (f"samplers that allow it: {', '.join(allowed)}" if allowed else
            "no installed sampler allows it (pip install astrai-plugin-ray for the ray sampler)")
    raise FieldError(path, f"sampler {sampler!r} generates inside the trainer's process, so "
                     f"rollouts cannot overlap training; {hint} (or set max_staleness: 0)")


def check_partial(config: RunConfig, needs: StrategyNeeds, online: OnlineConfig | None,
                  world: int) -> None:
    """``rollout.partial: true`` carries single-turn sequences across rollout steps, so
    their tokens may be up to ``max_staleness`` policy versions old, and trains on them
    with the decoupled objective (whose importance weight is the rollout correction)."""
    if not config.rollout.partial:
        return
    path = ("rollout", "partial")
    _offline(path, config, needs, " to interrupt (remove rollout.partial)")
    if config.rollout.max_staleness < 1:
        raise FieldError(path, "carries unfinished sequences to the next rollout step, whose "
                         "policy is newer: set rollout.max_staleness >= 1 (the versions a "
                         "token may lag; older ones are not trained on)")
    if config.environment is not None:
        raise FieldError(path, "continues single-turn completions; a multi-turn "
                         "environment's episodes cannot be carried over yet (remove one)")
    if online is None:
        return
    if online.rollout_correction is None:
        raise FieldError(path, "trains on tokens sampled by older policies with the "
                         "decoupled objective, whose importance weight is "
                         "strategy.rollout_correction: add it (e.g. {level: token, "
                         "mode: truncate, threshold: 2})")
    if online.dynamic is not None:
        raise FieldError(path, "cannot be combined with strategy.dynamic_sampling yet")
    if online.router_replay == "R3":
        raise FieldError(path, "cannot replay the sampler's routing (router_replay: R3) "
                         "of sequences continued across policies; use R2")
    if world > 1:
        raise FieldError(path, "runs in one process for now (launched with "
                         f"{world}); remove it or launch one process")


def check_mini_batches(config: RunConfig, online: OnlineConfig, world: int) -> None:
    """``strategy.mini_batches`` x ``trainer.grad_accum_steps``: every optimizer step gets
    an equal share of the rollout, and every micro-batch an equal share per rank."""
    prompts, accum = config.data.batch_size, config.trainer.grad_accum_steps
    rows = prompts * online.group_size
    if rows % (online.mini_batches * accum):
        raise FieldError(("trainer", "grad_accum_steps"),
                         f"a rollout of {rows} sequences (data.batch_size={prompts} x "
                         f"strategy.group_size={online.group_size}) cannot be cut into "
                         f"strategy.mini_batches={online.mini_batches} x "
                         f"trainer.grad_accum_steps={accum} equal micro-batches")
    if rows // (online.mini_batches * accum) % world:
        raise FieldError(("trainer", "grad_accum_steps"),
                         f"a micro-batch of {rows // (online.mini_batches * accum)} "
                         f"sequences cannot be split evenly over {world} data-parallel "
                         "ranks; make data.batch_size x strategy.group_size / "
                         "(strategy.mini_batches x trainer.grad_accum_steps) a multiple "
                         f"of {world}")


def check_router_replay(needs: StrategyNeeds, online: OnlineConfig | None, registry: Any,
                        sampler: str, model_source: Any) -> None:
    """``strategy.router_replay`` replays MoE routing through astrai's own router (not the
    transformers backend's), and R3 the routing the sampler reports."""
    replay = online.router_replay if online is not None else "disabled"
    if replay != "disabled" and model_source is not None and model_source.backend == TRANSFORMERS:
        raise FieldError(("strategy", "router_replay"), f"{replay} replays MoE routing "
                         f"through astrai's own router, and model_type "
                         f"{model_source.model_type!r} runs on the transformers backend, whose "
                         "router astrai cannot see; set router_replay: disabled")
    if needs.sampler_routing and not registry.get("sampler", sampler).reports_routing:
        raise FieldError(("strategy", "router_replay"),
                         f"R3 replays the routing the sampler recorded, and sampler "
                         f"{sampler!r} does not report MoE routing; use R2")
