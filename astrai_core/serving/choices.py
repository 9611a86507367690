"""Engine events -> OpenAI choice deltas, the one path for streamed and non-streamed answers.

A :class:`ChatChoice` turns each engine event into zero or more chat deltas (content,
tool-call announcements, argument pieces) and accumulates them; the non-streamed message
is that accumulation, so it always equals what a streaming client reassembles.
"""

from __future__ import annotations

import uuid
from typing import Any

from astrai_core.serving.hermes import ContentDelta, HermesParser, ToolCallArguments, ToolCallStart
from astrai_core.serving.sequence import FinishEvent, TokenEvent


def token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprob_entry(tokenizer: Any, event: TokenEvent) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        text = token_text(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    entry = one(event.token_id, event.logprob if event.logprob is not None else 0.0)
    entry["top_logprobs"] = [one(t, lp) for t, lp in (event.top_logprobs or [])]
    return entry


class ChatChoice:
    """One chat choice: parser state, tool-call ids, the accumulated message and usage."""

    def __init__(self, index: int, tokenizer: Any, parse_tools: bool, want_logprobs: bool,
                 forced_prefix: str = "") -> None:
        self.index = index
        self.tokenizer = tokenizer
        self.parser = HermesParser() if parse_tools else None
        self.want_logprobs = want_logprobs
        self.content: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []
        self.logprobs: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.error: str | None = None
        self._pending = self.parser.feed(forced_prefix) if self.parser and forced_prefix else []

    def on_event(self, event: TokenEvent | FinishEvent) -> list[dict[str, Any]]:
        """The chunk choices (``{"index", "delta", "logprobs", "finish_reason"}``) for one event."""
        if isinstance(event, TokenEvent):
            deltas = self._text(event.text)
            entry = chat_logprob_entry(self.tokenizer, event) if self.want_logprobs else None
            if entry is not None:
                self.logprobs.append(entry)
                deltas = deltas or [{}]
            return [self._chunk(d, [entry] if entry is not None and i == 0 else None)
                    for i, d in enumerate(deltas)]
        deltas = self._text(event.text)
        if self.parser is not None:
            deltas += self._tool_deltas(self.parser.finish())
        self.completion_tokens = event.completion_tokens
        self.error = event.error
        reason = event.reason if event.reason in ("stop", "length") else "stop"
        self.finish_reason = "tool_calls" if self.tool_calls and reason == "stop" else reason
        return [self._chunk(d, None) for d in deltas] + [
            {"index": self.index, "delta": {}, "logprobs": None, "finish_reason": self.finish_reason}]

    def _chunk(self, delta: dict[str, Any], entries: list | None) -> dict[str, Any]:
        return {"index": self.index, "delta": delta,
                "logprobs": {"content": entries} if entries is not None else None, "finish_reason": None}

    def _text(self, text: str) -> list[dict[str, Any]]:
        events, self._pending = self._pending, []
        if self.parser is None:
            events += [ContentDelta(text)] if text else []
        elif text:
            events += self.parser.feed(text)
        return self._tool_deltas(events)

    def _tool_deltas(self, events: list) -> list[dict[str, Any]]:
        deltas = []
        for event in events:
            if isinstance(event, ContentDelta):
                self.content.append(event.text)
                deltas.append({"content": event.text})
            elif isinstance(event, ToolCallStart):
                call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                        "function": {"name": event.name, "arguments": ""}}
                self.tool_calls.append(call)
                deltas.append({"tool_calls": [{"index": event.index, **call,
                                               "function": {"name": event.name, "arguments": ""}}]})
            elif isinstance(event, ToolCallArguments):
                self.tool_calls[event.index]["function"]["arguments"] += event.text
                deltas.append({"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]})
        return deltas

    def message_choice(self) -> dict[str, Any]:
        """The non-streamed choice."""
        content = "".join(self.content)
        message: dict[str, Any] = {"role": "assistant",
                                   "content": content if content or not self.tool_calls else None}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return {"index": self.index, "message": message, "finish_reason": self.finish_reason,
                "logprobs": {"content": self.logprobs} if self.want_logprobs else None}


class TextChoice:
    """One legacy-completions choice: text and the legacy logprobs shape."""

    def __init__(self, index: int, tokenizer: Any, logprobs: int | None) -> None:
        self.index, self.tokenizer, self.want = index, tokenizer, logprobs
        self.text: list[str] = []
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.top: list[dict[str, float]] = []
        self.offsets: list[int] = []
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.error: str | None = None
        self._length = 0

    def on_event(self, event: TokenEvent | FinishEvent) -> list[dict[str, Any]]:
        if isinstance(event, FinishEvent):
            self.completion_tokens, self.error = event.completion_tokens, event.error
            self.finish_reason = event.reason if event.reason in ("stop", "length") else "stop"
            return [self._add(event.text, None, self.finish_reason)]
        logprobs = None
        if self.want is not None:
            logprobs = self._logprobs(event)
        return [self._add(event.text, logprobs, None)] if event.text or logprobs else []

    def _logprobs(self, event: TokenEvent) -> dict[str, Any]:
        token = token_text(self.tokenizer, event.token_id)
        top = {token_text(self.tokenizer, t): lp for t, lp in (event.top_logprobs or [])}
        part = {"tokens": [token], "token_logprobs": [event.logprob], "top_logprobs": [top],
                "text_offset": [self._length]}
        self.tokens.append(token)
        self.token_logprobs.append(event.logprob)
        self.top.append(top)
        self.offsets.append(self._length)
        return part

    def _add(self, text: str, logprobs: dict | None, finish: str | None) -> dict[str, Any]:
        self.text.append(text)
        self._length += len(text)
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def full_choice(self) -> dict[str, Any]:
        logprobs = None
        if self.want is not None:
            logprobs = {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                        "top_logprobs": self.top, "text_offset": self.offsets}
        return {"index": self.index, "text": "".join(self.text), "logprobs": logprobs,
                "finish_reason": self.finish_reason}
