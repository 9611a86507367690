"""What the engines share: a request, the events it produces, and its output bookkeeping.

A :class:`Sequence` turns each sampled token into a :class:`TokenEvent` (the text it adds
after incremental detokenization and stop-string holdback) and ends with one
:class:`FinishEvent`. Both engines (continuous batching, and the vllm adapter) feed tokens
through it, so text, stops and finish reasons never depend on the engine.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from astrai_core.sampling.params import SamplingParams
from astrai_core.sampling.requests import request_rng
from astrai_core.serving.detokenize import IncrementalDetokenizer, StopStringHoldback

EngineFinish = Literal["stop", "length", "cancelled", "error"]


@dataclass
class EngineRequest:
    """One completion to generate (a request with ``n`` > 1 submits ``n`` of these)."""

    prompt_ids: list[int]
    params: SamplingParams            # n is ignored here; ``copy`` picks the random stream
    copy: int = 0
    logit_bias: dict[int, float] | None = None
    top_logprobs: int = 0             # how many alternatives to report per token (0: none)
    images: dict[str, Any] | None = None  # the processor's image inputs for the prompt


@dataclass
class TokenEvent:
    token_id: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None
    text: str                         # the text this token adds (may be empty)


@dataclass
class FinishEvent:
    reason: EngineFinish
    text: str                         # the text still held when the sequence ended
    completion_tokens: int
    error: str | None = None


EngineEvent = TokenEvent | FinishEvent
Sink = Callable[[EngineEvent], None]   # called on the engine's thread


@dataclass
class Handle:
    """The caller's grip on a submitted request: ``engine.cancel(handle)``."""

    id: int
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_step: int | None = None     # the engine's decode-step count when it was cancelled


@dataclass
class EngineStats:
    active: int = 0                   # sequences in the running decode batch
    waiting: int = 0                  # submitted, not yet admitted
    decode_steps: int = 0
    prefills: int = 0
    finished: int = 0
    cancelled: int = 0
    max_batch_size: int = 0
    max_cancel_delay_steps: int = 0   # most decode steps between a cancel and its slot's release
    max_active: int = 0               # the largest running batch seen


class Engine(Protocol):
    """What the HTTP app needs from an engine."""

    tokenizer: Any
    max_context: int

    def submit(self, request: EngineRequest, sink: Sink) -> Handle: ...
    def submit_group(self, requests: list[EngineRequest], sinks: list[Sink]) -> list[Handle]: ...
    def cancel(self, handle: Handle) -> None: ...
    def stats(self) -> EngineStats: ...
    def close(self) -> None: ...


class Sequence:
    """A request being generated: its random stream, detokenizer, stop holdback and counts."""

    def __init__(self, request: EngineRequest, handle: Handle, sink: Sink, tokenizer: Any) -> None:
        self.request = request
        self.handle = handle
        self.sink = sink
        self.rng: random.Random | None = request_rng(request.params, request.copy)
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.holdback = StopStringHoldback(request.params.stop)
        self.generated = 0
        self.done = False

    def record(self, token: int, logprob: float | None,
               top: list[tuple[int, float]] | None = None) -> bool:
        """Take one sampled token; returns True when the sequence has finished."""
        self.generated += 1
        params = self.request.params
        reason: EngineFinish | None = None
        if token in params.stop_token_ids:
            text, reason = "", "stop"
        else:
            text, stopped = self.holdback.push(self.detokenizer.push(token))
            reason = "stop" if stopped else None
        if reason is None and self.generated >= params.max_new_tokens:
            reason = "length"
        self.sink(TokenEvent(token, logprob, top, text))
        if reason is not None:
            self.finish(reason)
        return reason is not None

    def finish(self, reason: EngineFinish) -> None:
        """End with ``reason``, emitting what the detokenizer and the stop holdback still hold."""
        tail, stopped = self.holdback.push(self.detokenizer.finish())
        if stopped:
            reason = "stop"
        else:
            tail += self.holdback.finish()
        self.end(reason, tail)

    def end(self, reason: EngineFinish, text: str = "", error: str | None = None) -> None:
        if not self.done:
            self.done = True
            self.sink(FinishEvent(reason, text, self.generated, error))
