"""The interfaces a plugin's targets implement, checked when a spec is loaded.

These Protocols document what the core calls on each kind of component; a target that
lacks a member fails at load time with a message naming the plugin, the target and the
member, instead of an ``AttributeError`` in the middle of a run. Torch-free: the
signatures are written as strings.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Protocol


class StrategyProtocol(Protocol):
    """A strategy class (see :class:`astrai_core.api.Strategy`, the base to extend)."""

    Config: ClassVar[type]

    @classmethod
    def needs(cls, config: Any) -> Any: ...

    @classmethod
    def check_run(cls, config: Any, run_config: Any) -> None: ...

    def compute_loss(self, batch: Any) -> tuple[Any, dict[str, Any]]: ...

    def batch_source(self) -> Any: ...


class SamplerProtocol(Protocol):
    """A sampler class, built as ``Sampler(model=..., tokenizer=..., **engine_options)``."""

    def generate(self, prompt_ids: Any, params: Any) -> list[Any]: ...

    def update_weights(self, state_dict: Any = None) -> int: ...


class AdvantageEstimatorProtocol(Protocol):
    """An estimator class built with its options; ``needs_values`` says it wants a critic."""

    needs_values: ClassVar[bool]

    def __call__(self, *, token_rewards: Any, response_mask: Any, group_ids: Any,
                 values: Any = None) -> tuple[Any, Any]: ...


class RewardFunctionProtocol(Protocol):
    """``f(prompts, completions, **columns) -> list[float]``, or a class whose instances are."""

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> Any: ...


class PolicyLossProtocol(Protocol):
    """A policy loss class built with its options; extras may carry ``rollout_weights``."""

    def __call__(self, *, logprobs: Any, old_logprobs: Any, advantages: Any,
                 response_mask: Any, **extras: Any) -> tuple[Any, dict[str, Any]]: ...


class EnvironmentProtocol(Protocol):
    """An environment class built with its options (see
    :mod:`astrai_core.environments.base`). ``reset`` gets the prompt row of one episode and
    returns its state (anything); ``step`` gets that state and the assistant's turn and
    returns an ``EnvStep`` (messages to append, or done with a reward). ``step`` of
    different episodes may run at once on worker threads: keep per-episode data in the
    state. Optional: a ``prompt_tools`` attribute, a list of OpenAI tool schemas the run
    gives the chat template of every prompt (``apply_chat_template(tools=...)``) when it
    tokenizes the prompts; absent or None, the prompts are rendered without tools.

    Optional: ``episode_runner(sampler=, tokenizer=, rewards=, config=, pad_token_id=)``, for
    an environment that drives the conversation itself (a ``verifiers`` environment, whose
    harness asks the model for each turn): it returns the runner that replaces astrai's
    episode runner, with the same ``run(records, params, group_size, policy_version,
    seed_offset=, first_prompt=) -> RolloutBatch``; ``reset`` and ``step`` are then unused."""

    def reset(self, row: Any) -> Any: ...

    def step(self, state: Any, turn: Any) -> Any: ...


class TrackerProtocol(Protocol):
    """A tracker class built with its ``report_to`` entry's options (see
    :mod:`astrai_core.trackers.base`). ``requires`` lists the modules it imports and
    ``install`` the requirement that provides them (the run plan checks them). On rank 0:
    ``start(run)`` once, ``log(metrics, step)`` per logged step, ``close(status)`` once
    (``finished``, ``failed`` or ``interrupted``)."""

    requires: ClassVar[tuple[str, ...]]
    install: ClassVar[str]

    def start(self, run: Any) -> None: ...

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self, status: str) -> None: ...


PROTOCOLS: dict[str, Any] = {
    "strategy": StrategyProtocol,
    "sampler": SamplerProtocol,
    "advantage_estimator": AdvantageEstimatorProtocol,
    "reward_function": RewardFunctionProtocol,
    "policy_loss": PolicyLossProtocol,
    "environment": EnvironmentProtocol,
    "tracker": TrackerProtocol,
}


def protocol_members(protocol: Any) -> list[str]:
    """The attributes and methods a Protocol declares (its own, not ``object``'s)."""
    names = list(getattr(protocol, "__annotations__", {}))
    names += [name for name, value in vars(protocol).items()
              if not name.startswith("_") and (inspect.isfunction(value)
                                               or isinstance(value, classmethod))]
    if "__call__" in vars(protocol):
        names.append("__call__")
    return list(dict.fromkeys(names))


def missing_members(kind: str, target: Any) -> list[str]:
    """Members of ``kind``'s Protocol that ``target`` (a class or a function) lacks."""
    protocol = PROTOCOLS.get(kind)
    if protocol is None:
        return []
    if kind == "reward_function" and not inspect.isclass(target):
        return [] if callable(target) else ["__call__"]
    return [name for name in protocol_members(protocol) if not hasattr(target, name)]
