"""The extension points of astrai (one hook per registry kind).

Each hook takes no arguments and returns an iterable of spec records. A plugin
implements any subset of them with ``@astrai_core.hookimpl``::

    from astrai_core import hookimpl, AdvantageEstimatorSpec

    @hookimpl
    def astrai_advantage_estimators():
        return [AdvantageEstimatorSpec(name="rloo", target="my_pkg.rloo:RLOO",
                                       summary="leave-one-out baseline")]
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from astrai_core.plugins.specs import (
    AdvantageEstimatorSpec,
    DeviceBackendSpec,
    EnvironmentSpec,
    ModelImporterSpec,
    PolicyLossSpec,
    RewardFunctionSpec,
    SamplerSpec,
    StrategySpec,
    TrackerSpec,
)

PROJECT = "astrai"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# registry kind -> hook name; the order is the order of `astrai list-plugins`.
HOOK_FOR_KIND: dict[str, str] = {
    "strategy": "astrai_strategies",
    "advantage_estimator": "astrai_advantage_estimators",
    "sampler": "astrai_samplers",
    "model_importer": "astrai_model_importers",
    "device_backend": "astrai_device_backends",
    "reward_function": "astrai_reward_functions",
    "policy_loss": "astrai_policy_losses",
    "environment": "astrai_environments",
    "tracker": "astrai_trackers",
}


@hookspec
def astrai_strategies() -> Iterable[StrategySpec]:
    """Training strategies. The target is a class built from the ``strategy`` config
    section; it owns the loss (offline on dataset batches, online on rollouts)."""


@hookspec
def astrai_advantage_estimators() -> Iterable[AdvantageEstimatorSpec]:
    """Advantage estimators. The target is a class built with its config keys as
    keyword arguments and called as ``est(token_rewards=, response_mask=, group_ids=,
    values=None) -> (advantages, returns)``; ``needs_values`` says whether it needs a
    critic."""


@hookspec
def astrai_samplers() -> Iterable[SamplerSpec]:
    """Generation engines. The target is a class built as ``Sampler(model=...)`` with
    ``generate(prompt_ids, SamplingParams) -> list[Completion]`` and
    ``update_weights(...)``; anything more it declares as ``capabilities`` (see
    ``SamplerProtocol``)."""


@hookspec
def astrai_model_importers() -> Iterable[ModelImporterSpec]:
    """Hugging Face importers. ``model_types`` lists the config ``model_type``s handled;
    the target converts an HF directory into a native checkpoint and back."""


@hookspec
def astrai_device_backends() -> Iterable[DeviceBackendSpec]:
    """Device backends. The target answers device, distributed backend, synchronisation,
    RNG state and memory questions; ``available`` tells whether it can be used here."""


@hookspec
def astrai_reward_functions() -> Iterable[RewardFunctionSpec]:
    """Reward functions with the TRL convention
    ``f(prompts, completions, **columns) -> list[float]``."""


@hookspec
def astrai_policy_losses() -> Iterable[PolicyLossSpec]:
    """Policy losses of online strategies. The target is a class built with the
    ``policy_loss:`` section's options and called as ``loss(logprobs=, old_logprobs=,
    advantages=, response_mask=, **extras) -> (per_token_loss, metrics)``; the strategy
    adds the KL and entropy terms and aggregates the per-token loss."""


@hookspec
def astrai_environments() -> Iterable[EnvironmentSpec]:
    """Environments of multi-turn rollouts. The target is a class built with the
    ``environment:`` section's options (minus the episode keys ``max_turns``,
    ``max_tokens``, ``step_timeout``, ``workers``); per episode ``reset(row)`` gets the
    prompt row (``prompt_ids``, ``prompt_text``, ``columns``) and returns the episode's
    state, and at each assistant turn ``step(state, turn)`` gets the parsed tool calls and
    the text (an ``AssistantTurn``) and returns an ``EnvStep``: messages to append, or
    ``done`` with an optional reward."""


@hookspec
def astrai_trackers() -> Iterable[TrackerSpec]:
    """Experiment trackers named in ``trainer.report_to``. The target is a class built with
    the entry's options (validated by its ``Config``); on rank 0 the trainer calls
    ``start(run)`` once (``run``: the resolved config, the output directory, the step a
    resume starts from), ``log(metrics, step)`` for every logged step (``eval/...``
    included) and ``close(status)`` at the end, on an error and on a signal. ``requires``
    names the modules it imports and ``install`` the pip requirement that provides them,
    checked when the run is planned."""
