"""The FastAPI application: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``.

Each request submits its ``n`` completions to the engine, whose thread hands events to
the request's asyncio queue. Streaming answers are server-sent events (``data: <json>``
then a blank line; ``data: [DONE]`` last); a client that disconnects, streaming or not,
has its completions cancelled, which frees their batch slots at the next step boundary.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from astrai_core.serving.choices import ChatChoice, TextChoice
from astrai_core.serving.engine_base import QueueFull
from astrai_core.serving.prompts import (
    check_tools, chat_prompt, completion_prompts, engine_requests, forced_prefix, prompt_items,
)
from astrai_core.serving.protocol import APIError, ChatCompletionRequest, CompletionRequest
from astrai_core.serving.sequence import Engine, FinishEvent, Handle


MAX_JSON_DEPTH = 64  # deeper bodies are refused (OpenAI's own shapes nest a few levels)
DEFAULT_MAX_SEQS_PER_REQUEST = 256
RETRY_AFTER_S = 1  # what a 429 asks the client to wait: the queue drains continuously


def _frame(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def _parse(request: Request, model_cls: type[BaseModel]) -> Any:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise APIError(400, "the body must be JSON (Content-Type: application/json)")
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(400, f"malformed JSON body: {error}", code="invalid_json") from None
    except RecursionError:  # the parser's own guard, far deeper than MAX_JSON_DEPTH
        body = None
    if body is None or _depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels",
                       code="invalid_json")
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    try:
        return model_cls.model_validate(body)
    except ValidationError as error:
        problem = error.errors()[0]
        param = ".".join(str(p) for p in problem["loc"]) or None
        message = problem["msg"].removeprefix("Value error, ")
        raise APIError(400, f"{param}: {message}" if param else message, param=param,
                       code="invalid_value") from None


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in ``value`` (iterative: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_JSON_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


class _Run:
    """The engine requests of one HTTP request, and the queue their events arrive on."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine, self.loop = engine, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.handles: list[Handle] = []
        self.open = 0

    def submit(self, requests: list) -> None:
        """Queue every sequence of the request as one group; 429 when the queue is full."""
        try:
            self.handles = self.engine.submit_group(requests, [self._sink(i) for i in range(len(requests))])
        except QueueFull as full:
            raise APIError(429, f"the server is busy: {full}; retry later", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        self.open = len(requests)

    def _sink(self, index: int) -> Callable:
        def sink(event) -> None:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))
            except RuntimeError:  # the event loop is gone (shutdown)
                pass
        return sink

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        while self.open:
            index, event = await self.queue.get()
            if isinstance(event, FinishEvent):
                self.open -= 1
            yield index, event

    def cancel(self) -> None:
        for handle in self.handles:
            self.engine.cancel(handle)


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine: Engine, *, model_name: str, tool_call_parser: str | None = "hermes",
               max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST) -> FastAPI:
    """The app over ``engine``; requests must name ``model_name``. A request asking for more
    than ``max_seqs_per_request`` sequences (prompts x n) is refused with a 400; the
    engine's own ``max_queued`` bound answers 429."""
    app = FastAPI(title="astrai serve", docs_url=None, redoc_url=None)
    tokenizer = engine.tokenizer
    vocab_size = getattr(engine, "vocab_size", len(tokenizer))
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(_request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(Exception)
    async def _internal(_request: Request, error: Exception) -> JSONResponse:
        return JSONResponse(APIError(500, f"{type(error).__name__}: {error}").body(), status_code=500)

    def check_engine_supports(body) -> None:
        if body.logit_bias and not getattr(engine, "supports_logit_bias", True):
            raise APIError(400, "this sampler does not support logit_bias", param="logit_bias")
        wants_top = body.top_logprobs if isinstance(body, ChatCompletionRequest) else body.logprobs
        if wants_top and not getattr(engine, "supports_top_logprobs", True):
            raise APIError(400, "this sampler does not report top log-probs", param="top_logprobs")

    def check_sequences(count: int) -> None:
        if count > max_seqs_per_request:
            raise APIError(400, f"this request asks for {count} sequences (prompts x n); this server "
                           f"takes at most {max_seqs_per_request} per request", param="n",
                           code="too_many_sequences")

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "astrai"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """Engine counters (not part of the OpenAI API): active and waiting sequences, steps."""
        return asdict(engine.stats())

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body: ChatCompletionRequest = await _parse(request, ChatCompletionRequest)
        check_model(body.model)
        check_engine_supports(body)
        check_sequences(body.n)
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        use_tools = check_tools(body) and tool_call_parser == "hermes"
        prompt = chat_prompt(tokenizer, body, use_tools)
        top = (body.top_logprobs or 0) if body.logprobs else 0
        requests = engine_requests(tokenizer, engine.max_context, vocab_size, body, prompt,
                                   body.max_completion_tokens or body.max_tokens, top)
        prefix = forced_prefix(body) if use_tools else ""
        choices = [ChatChoice(i, tokenizer, use_tools, body.logprobs, prefix) for i in range(body.n)]
        return await _respond(request, body, requests, choices, len(prompt), chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body: CompletionRequest = await _parse(request, CompletionRequest)
        check_model(body.model)
        check_engine_supports(body)
        items = prompt_items(body.prompt)
        check_sequences(len(items) * body.n)
        prompts = completion_prompts(tokenizer, items)
        requests = []
        for prompt in prompts:
            requests += engine_requests(tokenizer, engine.max_context, vocab_size, body, prompt,
                                        body.max_tokens, body.logprobs or 0)
        choices = [TextChoice(i, tokenizer, body.logprobs) for i in range(len(requests))]
        return await _respond(request, body, requests, choices, sum(len(p) for p in prompts) * body.n,
                              chat=False)

    async def _respond(request: Request, body, requests, choices, prompt_tokens: int, chat: bool):
        run = _Run(engine, asyncio.get_running_loop())
        run.submit(requests)
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model_name}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_stream(run, head, choices, prompt_tokens, chat, include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _complete(request, run, head, choices, prompt_tokens, chat)

    async def _complete(request: Request, run: _Run, head, choices, prompt_tokens: int, chat: bool):
        watcher = asyncio.ensure_future(_until_disconnected(request))
        try:
            async def consume() -> None:
                async for index, event in run.events():
                    choices[index].on_event(event)

            consumer = asyncio.ensure_future(consume())
            done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if consumer not in done:  # the client went away
                run.cancel()
                consumer.cancel()
                return JSONResponse({}, status_code=499)
        finally:
            watcher.cancel()
        _raise_engine_error(choices)
        built = [c.message_choice() if chat else c.full_choice() for c in choices]
        return JSONResponse({**head, "object": "chat.completion" if chat else "text_completion",
                             "choices": built, "usage": _usage(prompt_tokens, choices)})

    async def _stream(run: _Run, head, choices, prompt_tokens: int, chat: bool,
                      include_usage: bool) -> AsyncIterator[bytes]:
        try:
            if chat:  # the role, once per choice, in index order
                yield _frame({**head, "choices": [
                    {"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None} for c in choices]})
            async for index, event in run.events():
                parts = choices[index].on_event(event)
                if isinstance(event, FinishEvent) and event.reason == "error":
                    yield _frame(APIError(500, event.error or "engine error").body())
                for part in parts:
                    yield _frame({**head, "choices": [part]})
            if include_usage:
                yield _frame({**head, "choices": [], "usage": _usage(prompt_tokens, choices)})
            yield _frame("[DONE]")
        finally:
            run.cancel()  # no-op for finished requests; frees the slots of a disconnected client

    return app


def _usage(prompt_tokens: int, choices: list) -> dict[str, int]:
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def _raise_engine_error(choices: list) -> None:
    for choice in choices:
        if choice.error:
            raise APIError(500, choice.error)
