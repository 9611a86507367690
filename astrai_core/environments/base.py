"""What an environment sees and answers: the records of the ``environment`` extension point
(an ``astrai_environments()`` hook's targets; docs/environments.md).

An environment is a class built with the ``environment:`` section's options. The episode
runner (:mod:`astrai_core.rollout.episodes`) calls, per episode::

    state = env.reset(row)          # row: {"prompt_ids", "prompt_text", "columns"}
    step = env.step(state, turn)    # after each assistant turn: an AssistantTurn

and ``step`` returns an :class:`EnvStep`: ``messages`` to append to the conversation
(tool results, rendered with the tokenizer's chat template), or ``done=True`` with an
optional ``reward`` added to the reward functions' total. ``step`` calls of different
episodes run at once on worker threads, so per-episode data belongs in the state. An
exception from ``step`` or a step past the runner's timeout never stops the run: every
call of that turn gets an error message and the episode continues.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's ``name`` and its ``arguments`` as JSON text (the Hermes
    parser guarantees a JSON object); ``id`` is unique within the episode."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class AssistantTurn:
    """One assistant turn as the environment sees it.

    ``text`` is everything the model wrote this turn (decoded, special tokens skipped);
    ``content`` is that text without its tool-call blocks; ``tool_calls`` are the calls
    the Hermes parser found; ``index`` counts turns from 0; ``finish_reason`` is the
    sampler's (``stop`` at end-of-turn or at a complete call, ``length``).
    """

    text: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    index: int = 0
    finish_reason: str = "stop"


@dataclass(frozen=True)
class EnvMessage:
    """A message the environment appends: by default a tool result. ``error`` marks a
    failed call (counted in the rollout's tool-error rate); the model sees ``content``."""

    content: str
    role: str = "tool"
    name: str | None = None
    tool_call_id: str | None = None
    error: bool = False

    def chat_message(self) -> dict[str, Any]:
        """The message as a chat template reads it."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


@dataclass(frozen=True)
class EnvStep:
    """The environment's answer to a turn: ``messages`` to append and continue, or
    ``done`` (then ``messages`` are ignored) with an optional ``reward``."""

    messages: tuple[EnvMessage, ...] = ()
    done: bool = False
    reward: float | None = None
    info: Mapping[str, Any] = field(default_factory=dict)


def error_message(call: ToolCall | None, text: str) -> EnvMessage:
    """The tool message a failed (or unparsable) call gets."""
    if call is None:
        return EnvMessage(content=f"error: {text}", error=True)
    return EnvMessage(content=f"error: {text}", name=call.name, tool_call_id=call.id or None,
                      error=True)


class SingleTurn:
    """``single_turn``: one assistant turn, scored by the reward functions (the default).

    The rollout runner recognises it (``single_turn = True``) and samples exactly as
    without an environment: one completion per sample, tool calls left as text.
    """

    single_turn = True

    def reset(self, row: Mapping[str, Any]) -> None:
        return None

    def step(self, state: None, turn: AssistantTurn) -> EnvStep:
        return EnvStep(done=True)
