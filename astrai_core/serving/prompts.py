"""Requests -> prompt token ids and engine requests (chat templates, tools, sampling options)."""

from __future__ import annotations

import json
from typing import Any

from astrai_core.sampling.params import SamplingParams
from astrai_core.serving.protocol import APIError, ChatCompletionRequest, NamedToolChoice, SamplingFields
from astrai_core.serving.sequence import EngineRequest

TOOL_CALL_OPEN = "<tool_call>\n"


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: text parts joined (kept as parts beside
    ``{"type": "image"}`` ones, which the template writes as image placeholders),
    tool-call arguments as dicts."""
    message = dict(message)
    content = message.get("content")
    if isinstance(content, list) and not any(p.get("type") == "image" for p in content):
        message["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = []
    for call in message.get("tool_calls") or []:
        function = dict(call.get("function", {}))
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except json.JSONDecodeError:
                pass  # the template renders the string as it is
        calls.append({**call, "function": function})
    if calls:
        message["tool_calls"] = calls
    return message


def forced_prefix(request: ChatCompletionRequest) -> str:
    """The start of the assistant turn that ``tool_choice`` forces (documented in docs/serving.md)."""
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        return f'{TOOL_CALL_OPEN}{{"name": {json.dumps(choice.function.name)}, "arguments": '
    if choice == "required":
        return f'{TOOL_CALL_OPEN}{{"name": "'
    return ""


def check_tools(request: ChatCompletionRequest) -> bool:
    """Whether tool calls are parsed for this request; raises on an inconsistent request."""
    choice = request.tool_choice
    if choice is not None and choice != "none" and not request.tools:
        raise APIError(400, "tool_choice needs tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        names = [t.function.name for t in request.tools]
        if choice.function.name not in names:
            raise APIError(400, f"tool_choice names {choice.function.name!r}, not one of the tools "
                           f"{names}", param="tool_choice")
    return bool(request.tools) and choice != "none"


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one vocabulary entry spells (at least 1).

    A text of ``c`` characters is at least ``c / longest`` tokens (a byte-level token of
    ``k`` characters covers ``k`` bytes, so never more than ``k`` characters of text), so
    a prompt longer than ``context x longest`` characters cannot fit: it is refused
    without tokenizing it (:func:`check_prompt_chars`)."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError):
        return 64  # no vocabulary to measure: a bound no real tokenizer's token reaches
    return max((len(token) for token in vocab), default=1) or 1


def check_prompt_chars(chars: int, max_chars: int | None, param: str) -> None:
    """400 when a prompt of ``chars`` characters cannot fit the context (see
    :func:`longest_token_chars`); ``max_chars`` None: no bound."""
    if max_chars is not None and chars > max_chars:
        raise APIError(400, f"the prompt has {chars} characters: more than the model's context "
                       f"can hold (at most {max_chars} characters for this tokenizer)", param=param,
                       code="context_length_exceeded")


def chat_prompt(tokenizer: Any, request: ChatCompletionRequest, use_tools: bool,
                max_chars: int | None = None) -> list[int]:
    """The prompt token ids of a chat request; a rendered prompt over ``max_chars``
    characters is refused before it is tokenized."""
    text = chat_text(tokenizer, request, use_tools, max_chars)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_text(tokenizer: Any, request: ChatCompletionRequest, use_tools: bool,
              max_chars: int | None = None, messages: list[dict] | None = None) -> str:
    """The rendered prompt of a chat request (of ``messages`` in its place: the request's
    with image parts as ``{"type": "image"}``), checked against ``max_chars``."""
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(422, "this model's tokenizer has no chat template: use /v1/completions",
                       param="messages", code="no_chat_template")
    tools = [t.model_dump(exclude_none=True) for t in request.tools] if use_tools else None
    try:
        text = tokenizer.apply_chat_template([_template_message(m) for m in messages or request.messages],
                                             tools=tools,
                                             add_generation_prompt=True, tokenize=False)
    except Exception as error:  # noqa: BLE001 - jinja raises many kinds
        raise APIError(422, f"the chat template could not render these messages: {error}",
                       param="messages", code="template_error") from None
    text += forced_prefix(request) if use_tools else ""
    check_prompt_chars(len(text), max_chars, "messages")
    return text


def prompt_items(prompt: str | list) -> list[str | list[int]]:
    """The prompts a ``/v1/completions`` prompt holds, untokenized: texts or token-id lists
    (so a request's size is known before any tokenization)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if prompt and all(isinstance(p, list) for p in prompt):
        return [list(p) for p in prompt]
    raise APIError(400, "prompt must be a string, a list of strings, or token ids", param="prompt")


def completion_prompts(tokenizer: Any, items: list[str | list[int]],
                       max_chars: int | None = None) -> list[list[int]]:
    """Token ids of each of :func:`prompt_items`' prompts; every text is checked against
    ``max_chars`` before any is tokenized."""
    for item in items:
        if isinstance(item, str):
            check_prompt_chars(len(item), max_chars, "prompt")
    return [tokenizer(p)["input_ids"] if isinstance(p, str) else p for p in items]


def engine_requests(tokenizer: Any, max_context: int, vocab_size: int, request: SamplingFields,
                    prompt_ids: list[int], max_new: int | None, top_logprobs: int,
                    images: dict[str, Any] | None = None) -> list[EngineRequest]:
    """``n`` engine requests (copies 0..n-1) for one prompt (``images``: the processor's
    image inputs for it); 422 when it cannot fit the context."""
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    if any(not 0 <= t < vocab_size for t in prompt_ids):
        raise APIError(422, f"prompt token ids must lie in [0, {vocab_size})", param="prompt")
    room = max_context - len(prompt_ids)
    max_new = max_new if max_new is not None else room
    if max_new > room or room < 1:
        raise APIError(422, f"the prompt has {len(prompt_ids)} tokens and max_tokens is {max_new}: "
                       f"more than the model's context of {max_context}", param="max_tokens",
                       code="context_length_exceeded")
    bias = {int(k): v for k, v in (request.logit_bias or {}).items()}
    if any(not 0 <= t < vocab_size for t in bias):
        raise APIError(400, f"logit_bias token ids must lie in [0, {vocab_size})", param="logit_bias")
    eos = tokenizer.eos_token_id
    params = SamplingParams(
        max_new_tokens=max_new, temperature=1.0 if request.temperature is None else request.temperature,
        top_k=max(request.top_k or 0, 0), top_p=request.top_p or 1.0, min_p=request.min_p or 0.0,
        seed=request.seed, stop=request.stops(), stop_token_ids=(eos,) if eos is not None else ())
    return [EngineRequest(list(prompt_ids), params, copy=c, logit_bias=bias or None, top_logprobs=top_logprobs,
                          images=images)
            for c in range(request.n)]
