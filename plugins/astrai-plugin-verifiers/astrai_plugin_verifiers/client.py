"""The model behind verifiers' interception server: astrai's serving engine, in process.

verifiers' harness program sends OpenAI chat completions to verifiers' interception server,
which asks its model client for each turn. This client renders the turn with the policy's
chat template (as ``astrai serve`` does), submits it to astrai's serving engine and answers
with the reply and its tokens: the prompt ids the model saw, the completion ids it sampled
and their sampler log-probs (verifiers' ``TurnTokens``). verifiers stores those tokens in
the episode's trace, whose branches are the training rows.

Later turns continue the token stream: when a turn extends the previous one with tool
results or a user message, its prompt is the previous prompt, the tokens the model sampled
(never re-tokenized) and the new messages rendered by the chat template after them (the
same rendering astrai's own episodes use), so a whole episode is one sequence in which the
model's tokens are exactly those sampled.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from verifiers.v1.clients import Client
from verifiers.v1.clients.train import serialize_completion, tool_to_wire
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import ProviderError
from verifiers.v1.types import AssistantMessage, Response, ToolCall, TurnTokens, Usage

from astrai_core.api import (
    END_TAG, ChatCompletionRequest, EngineRequest, FinishEvent, MessageRenderer, chat_prompt,
    episode_turn_seed, parse_hermes,
)


@dataclass
class Sample:
    """One turn as the engine produced it (what the tests compare the trained rows with)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None      # None: the sampler reports none (the trainer computes them)
    finish_reason: str


@dataclass
class _Stream:
    """A session's conversation so far: messages rendered, and the tokens of its last turn."""

    messages: list[dict]              # the last prompt's messages (OpenAI wire format)
    prompt_ids: list[int]
    completion_ids: list[int]
    samples: list[Sample] = field(default_factory=list)


class EngineClient(Client):
    """A verifiers model client over an astrai serving engine (see the module docstring).

    ``params``: the run's SamplingParams (temperature, top-p, stop tokens, per-turn
    ``max_new_tokens``); ``max_tokens``: the episode's token budget after its first prompt;
    ``stop_at_tool_call``: a turn ends at a complete ``</tool_call>``; ``rollout``: the
    rollout's number, which with the episode and the turn seeds each turn of a seeded run.
    """

    def __init__(self, engine: Any, tokenizer: Any, params: Any, *, max_tokens: int,
                 stop_at_tool_call: bool = True, rollout: int = 0) -> None:
        self.engine, self.tokenizer, self.params = engine, tokenizer, params
        self.max_tokens, self.stop_at_tool_call = max_tokens, stop_at_tool_call
        self.rollout = rollout
        self.renderer = MessageRenderer(tokenizer)
        self.streams: dict[str, _Stream] = {}
        self.episodes: dict[str, int] = {}  # session (trace id) -> the episode's index

    def follow(self, session_id: str, episode: int) -> None:
        """Session ``session_id`` plays episode ``episode`` of the rollout (its prompt's
        index times the group size plus its member): its turns take that episode's seeds,
        whatever the order in which concurrent episodes ask."""
        self.episodes[session_id] = episode

    async def get_response(self, dialect: Any, body: dict, sampling: Any,
                           session_id: str | None = None, turn: Any = None,
                           headers: Any = None) -> Response:
        """One turn of the session ``session_id`` (verifiers' trace id)."""
        request = dialect.parse_request(body)
        messages = [message_to_wire(m) for m in request.messages]
        tools = [tool_to_wire(t) for t in request.tools] if request.tools else None
        model = body.get("model", "astrai")
        stream = self.streams.get(session_id or "")
        prompt_ids = self._bridge(stream, messages) if stream else None
        if prompt_ids is None:
            prompt_ids = self._render(messages, tools, model)
        first = stream.samples[0].prompt_ids if stream else prompt_ids
        room = self.max_tokens - (len(prompt_ids) - len(first))  # the budget after the first prompt
        if room < 1:
            raise ProviderError("the episode's token budget is spent", status_code=400)
        seed = self._seed(session_id or "", len(stream.samples) if stream else 0)
        sample = await self._generate(prompt_ids, min(room, self.params.max_new_tokens),
                                      bool(tools), seed)
        if stream is None:
            stream = self.streams[session_id or ""] = _Stream(messages, prompt_ids, [])
        stream.messages, stream.prompt_ids = messages, prompt_ids
        stream.completion_ids = sample.completion_ids
        stream.samples.append(sample)
        return self._response(sample, bool(tools), model)

    # ---------------------------------------------------------------- prompts
    def _render(self, messages: list[dict], tools: list[dict] | None, model: str) -> list[int]:
        """The prompt as ``astrai serve`` renders a chat request."""
        request = ChatCompletionRequest(model=model, messages=messages, tools=tools)
        return list(chat_prompt(self.tokenizer, request, bool(tools)))

    def _bridge(self, stream: _Stream, messages: list[dict]) -> list[int] | None:
        """The stream continued by ``messages``: the previous prompt's messages, the reply,
        then tool results or user turns. None when ``messages`` do not extend the stream."""
        known = len(stream.messages)
        tail = messages[known + 1:]
        if (not tail or messages[:known] != stream.messages
                or messages[known]["role"] != "assistant"
                or any(m["role"] not in ("tool", "user") for m in tail)):
            return None
        last = stream.completion_ids[-1] if stream.completion_ids else None
        suffix = self.renderer.tokens(tail, last, self.params.stop_token_ids)
        return stream.prompt_ids + stream.completion_ids + suffix

    # ---------------------------------------------------------------- sampling
    def _seed(self, session_id: str, turn: int) -> int | None:
        """Turn ``turn`` of the session's episode: its seed in a seeded run (as astrai's own
        episodes seed theirs)."""
        if self.params.seed is None:
            return None
        if session_id not in self.episodes:
            raise ProviderError("a model request came from a session that plays no episode "
                                "of this rollout", status_code=400)
        return episode_turn_seed(self.params.seed, self.rollout, turn, self.episodes[session_id])

    async def _generate(self, prompt_ids: list[int], max_new: int, tools: bool,
                        seed: int | None) -> Sample:
        stops = tuple(self.params.stop) + ((END_TAG,) if tools and self.stop_at_tool_call else ())
        update: dict[str, Any] = {"n": 1, "max_new_tokens": max_new, "stop": stops}
        if seed is not None:
            update["seed"] = seed
        params = self.params.model_copy(update=update)
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        ids: list[int] = []
        logprobs: list[float | None] = []

        def sink(event: Any) -> None:  # on the engine's thread
            if isinstance(event, FinishEvent):
                loop.call_soon_threadsafe(_settle, done, event)
                return
            ids.append(event.token_id)
            logprobs.append(event.logprob)

        self.engine.submit(EngineRequest(list(prompt_ids), params), sink)
        finish = await done
        if finish.reason not in ("stop", "length"):
            raise ProviderError(f"the engine ended the turn: {finish.error or finish.reason}",
                                status_code=500)
        reported = None if None in logprobs else [float(x) for x in logprobs]
        return Sample(list(prompt_ids), ids, reported, finish.reason)

    def _response(self, sample: Sample, tools: bool, model: str) -> Response:
        text = self.tokenizer.decode(sample.completion_ids, skip_special_tokens=True)
        parsed = parse_hermes(text) if tools else None
        calls = [ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=c.name, arguments=c.arguments)
                 for c in (parsed.tool_calls if parsed else [])]
        content = parsed.content if parsed else text
        finish = "tool_calls" if calls else sample.finish_reason
        response = Response(
            id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=model,
            message=AssistantMessage(content=content or None, tool_calls=calls or None),
            finish_reason=finish,
            usage=Usage(prompt_tokens=len(sample.prompt_ids),
                        completion_tokens=len(sample.completion_ids)),
            tokens=TurnTokens(prompt_ids=sample.prompt_ids, completion_ids=sample.completion_ids,
                              completion_logprobs=sample.logprobs or []))
        response.raw = serialize_completion(response, model)
        return response


def _settle(future: asyncio.Future, event: Any) -> None:
    if not future.done():
        future.set_result(event)
