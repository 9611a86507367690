"""A request body -> what the engine runs and how the answer is built.

Everything here is synchronous and CPU-bound (JSON parsing, validation, the chat
template, tokenization), so the app runs it in worker threads: a large request never
holds the event loop that answers ``/health`` and every other client. The cheap checks
come first: the number of sequences before anything is tokenized, the prompt's length in
characters before it is tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from astrai_core.serving.choices import ChatChoice, TextChoice
from astrai_core.serving.images import vision_prompt
from astrai_core.serving.parse import parse_body
from astrai_core.serving.prompts import (
    check_tools, chat_prompt, completion_prompts, engine_requests, forced_prefix, longest_token_chars,
    prompt_items,
)
from astrai_core.serving.protocol import APIError, ChatCompletionRequest, CompletionRequest, SamplingFields
from astrai_core.serving.sequence import EngineRequest


@dataclass
class Prepared:
    """One HTTP request, ready to submit: its engine requests and the choices that collect them."""

    body: SamplingFields
    requests: list[EngineRequest]
    choices: list
    prompt_tokens: int
    chat: bool


class Preparer:
    """Turns bodies into :class:`Prepared` for one engine and served model name."""

    def __init__(self, engine: Any, model_name: str, tool_call_parser: str | None,
                 max_seqs_per_request: int) -> None:
        self.engine, self.model_name = engine, model_name
        self.tokenizer = engine.tokenizer
        self.vocab_size = getattr(engine, "vocab_size", len(self.tokenizer))
        self.tool_call_parser, self.max_seqs_per_request = tool_call_parser, max_seqs_per_request
        self.max_prompt_chars = engine.max_context * longest_token_chars(self.tokenizer)

    def chat(self, raw: bytes, content_type: str) -> Prepared:
        body: ChatCompletionRequest = parse_body(raw, content_type, ChatCompletionRequest)
        self._check(body)
        self._check_sequences(body.n)
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        use_tools = check_tools(body) and self.tool_call_parser == "hermes"
        vision = vision_prompt(self.engine, self.tokenizer, body, use_tools, self.max_prompt_chars)
        prompt, images = vision or (chat_prompt(self.tokenizer, body, use_tools, self.max_prompt_chars), None)
        top = (body.top_logprobs or 0) if body.logprobs else 0
        requests = engine_requests(self.tokenizer, self.engine.max_context, self.vocab_size, body, prompt,
                                   body.max_completion_tokens or body.max_tokens, top, images)
        prefix = forced_prefix(body) if use_tools else ""
        choices = [ChatChoice(i, self.tokenizer, use_tools, body.logprobs, prefix) for i in range(body.n)]
        return Prepared(body, requests, choices, len(prompt), chat=True)

    def completion(self, raw: bytes, content_type: str) -> Prepared:
        body: CompletionRequest = parse_body(raw, content_type, CompletionRequest)
        self._check(body)
        items = prompt_items(body.prompt)
        self._check_sequences(len(items) * body.n)
        prompts = completion_prompts(self.tokenizer, items, self.max_prompt_chars)
        requests = []
        for prompt in prompts:
            requests += engine_requests(self.tokenizer, self.engine.max_context, self.vocab_size, body, prompt,
                                        body.max_tokens, body.logprobs or 0)
        choices = [TextChoice(i, self.tokenizer, body.logprobs) for i in range(len(requests))]
        return Prepared(body, requests, choices, sum(len(p) for p in prompts) * body.n, chat=False)

    def _check(self, body: SamplingFields) -> None:
        """The model name, and what the engine supports."""
        if body.model != self.model_name:
            raise APIError(404, f"the model {body.model!r} does not exist; this server serves "
                           f"{self.model_name!r}", param="model", code="model_not_found")
        if body.logit_bias and not getattr(self.engine, "supports_logit_bias", True):
            raise APIError(400, "this sampler does not support logit_bias", param="logit_bias")
        wants_top = body.top_logprobs if isinstance(body, ChatCompletionRequest) else body.logprobs
        if wants_top and not getattr(self.engine, "supports_top_logprobs", True):
            raise APIError(400, "this sampler does not report top log-probs", param="top_logprobs")

    def _check_sequences(self, sequences: int) -> None:
        if sequences > self.max_seqs_per_request:
            raise APIError(400, f"this request asks for {sequences} sequences (prompts x n); this server "
                           f"takes at most {self.max_seqs_per_request} per request", param="n",
                           code="too_many_sequences")
