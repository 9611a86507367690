"""The interfaces a plugin's targets implement, checked when a spec is loaded.

These Protocols document what the core calls on each kind of component; a target that
lacks a member fails at load time with a message naming the plugin, the target and the
member, instead of an ``AttributeError`` in the middle of a run. Torch-free: the
signatures are written as strings.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Protocol

from astrai_core.plugins.sampler_capabilities import SamplerCapabilities, unkept_promises


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
    """A sampler class, built as ``Sampler(model=..., tokenizer=..., **engine_options)``.

    Required: ``generate`` and ``update_weights``; a sampler with only these runs every
    strategy. The rest is optional and declared, never guessed: the class attribute
    ``capabilities`` (a :class:`SamplerCapabilities`, default all ``False``) says what
    else the core may do with it, and the ``SamplerSpec`` fields ``asynchronous`` and
    ``reports_routing`` what the run plan may rely on:

    * ``interruptible``: ``generate(..., interrupt=event)`` ends after the decode step
      during which the event is set, unfinished completions ``finish_reason="abort"``
      (an asynchronous sampler: ``generate_async(..., interruptible=True)``, cut short by
      the next ``update_weights``). Ray workers and overlapped partial rollouts pass the
      interrupt only to a sampler that declares it.
    * ``owns_weights``: it generates from its own copy of the weights; a sharded trainer
      does not gather the policy around its ``generate``.
    * ``shares_policy``: it reads new weights from the ``model=`` it was built with, so a
      publish calls ``update_weights()`` without tensors; otherwise it gets the policy's
      state dict (LoRA merged) every time.
    * ``reports_metrics``: it has ``metrics()``, logged with every optimizer step.
    * ``images``: ``generate(..., images=[...])`` samples each prompt with its image inputs.
    * ``adapters``: built with ``max_adapters``, ``generate(..., adapter=directory)``
      samples with that peft LoRA adapter on its base (``astrai tinker --sampler``).
    * ``needs_close``: it has ``close()``, called once when the run ends (errors too).
    * ``SamplerSpec.asynchronous``: it has ``generate_async`` and generates apart from the
      trainer's processes (allows ``rollout.max_staleness > 0``).
    * ``SamplerSpec.reports_routing``: ``generate(..., record_routing=True)`` fills each
      completion's ``routed_experts`` (``router_replay: R3``).

    A declared capability's method is checked when the spec loads.
    """

    capabilities: ClassVar[SamplerCapabilities]  # optional: NO_CAPABILITIES when absent

    def generate(self, prompt_ids: Any, params: Any) -> list[Any]: ...

    def update_weights(self, state_dict: Any = None) -> int: ...

    def generate_async(self, prompt_ids: Any, params: Any) -> Any: ...  # asynchronous only

    def metrics(self) -> dict[str, float]: ...  # reports_metrics only

    def close(self) -> None: ...  # needs_close only


# Members a Protocol declares that a target may lack (their capability says whether).
OPTIONAL_MEMBERS: dict[str, frozenset[str]] = {
    "sampler": frozenset({"capabilities", "generate_async", "metrics", "close"}),
}


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
    """Members of ``kind``'s Protocol that ``target`` (a class or a function) lacks: the
    required ones, and for a sampler those its declared capabilities promise."""
    protocol = PROTOCOLS.get(kind)
    if protocol is None:
        return []
    if kind == "reward_function" and not inspect.isclass(target):
        return [] if callable(target) else ["__call__"]
    optional = OPTIONAL_MEMBERS.get(kind, frozenset())
    missing = [name for name in protocol_members(protocol)
               if name not in optional and not hasattr(target, name)]
    return missing + (unkept_promises(target) if kind == "sampler" else [])
