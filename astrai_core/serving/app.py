"""The FastAPI application: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``.

A request's body is read whole, within ``--max-body-mb`` (:class:`~astrai_core.serving.limits.BodyLimit`),
then parsed, validated and tokenized in a worker thread (:mod:`~astrai_core.serving.prepare`),
so the event loop stays free for every other client. Each request then submits its
completions to the engine, whose thread hands events to the request's asyncio queue.
Streaming answers are server-sent events (``data: <json>`` then a blank line; ``data:
[DONE]`` last); a client that disconnects, streaming or not, has its completions
cancelled: waiting ones leave the queue at once, running ones free their batch slots at
the next step boundary.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from astrai_core.serving.engine_base import QueueFull
from astrai_core.serving.limits import BodyLimit, ServeLimits
from astrai_core.serving.prepare import Prepared, Preparer
from astrai_core.serving.protocol import APIError
from astrai_core.serving.sequence import Engine, FinishEvent, Handle


DEFAULT_MAX_SEQS_PER_REQUEST = 256
RETRY_AFTER_S = 1  # what a 429 asks the client to wait: the queue drains continuously
PREPARE_THREADS = 4  # requests parsed and tokenized at once; more wait (bounds their memory)


def _frame(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


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
               max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST,
               limits: ServeLimits | None = None) -> FastAPI:
    """The app over ``engine``; requests must name ``model_name``. A request asking for more
    than ``max_seqs_per_request`` sequences (prompts x n) is refused with a 400; the
    engine's own ``max_queued`` bound answers 429; a body over ``limits.max_body_bytes``
    is refused with a 413 while it streams in."""
    limits = limits or ServeLimits()
    app = FastAPI(title="astrai serve", docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout=limits.body_timeout)
    _add_error_handlers(app)
    _add_info_routes(app, engine, model_name)
    preparer = Preparer(engine, model_name, tool_call_parser, max_seqs_per_request)
    responder = _Responder(engine, model_name)
    executor = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="astrai-prepare")

    async def prepare(request: Request, how: Callable[[bytes, str], Prepared]) -> Prepared:
        raw = await request.body()
        content_type = request.headers.get("content-type", "")
        return await asyncio.get_running_loop().run_in_executor(executor, how, raw, content_type)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await responder.respond(request, await prepare(request, preparer.chat))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await responder.respond(request, await prepare(request, preparer.completion))

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(Exception)
    async def _internal(_request: Request, error: Exception) -> JSONResponse:
        return JSONResponse(APIError(500, f"{type(error).__name__}: {error}").body(), status_code=500)


def _add_info_routes(app: FastAPI, engine: Engine, model_name: str) -> None:
    created = int(time.time())

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


class _Responder:
    """Submits a prepared request and answers it, whole or as server-sent events."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    async def respond(self, request: Request, prepared: Prepared):
        run = _Run(self.engine, asyncio.get_running_loop())
        run.submit(prepared.requests)
        head = {"id": f"{'chatcmpl' if prepared.chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion.chunk" if prepared.chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}
        body = prepared.body
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_stream(run, head, prepared, include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _complete(request, run, head, prepared)


async def _complete(request: Request, run: _Run, head: dict[str, Any], prepared: Prepared):
    choices, chat = prepared.choices, prepared.chat
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
                         "choices": built, "usage": _usage(prepared.prompt_tokens, choices)})


async def _stream(run: _Run, head: dict[str, Any], prepared: Prepared,
                  include_usage: bool) -> AsyncIterator[bytes]:
    choices = prepared.choices
    try:
        if prepared.chat:  # the role, once per choice, in index order
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
            yield _frame({**head, "choices": [], "usage": _usage(prepared.prompt_tokens, choices)})
        yield _frame("[DONE]")
    finally:
        run.cancel()  # no-op for finished requests; frees the slots of a disconnected client


def _usage(prompt_tokens: int, choices: list) -> dict[str, int]:
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def _raise_engine_error(choices: list) -> None:
    for choice in choices:
        if choice.error:
            raise APIError(500, choice.error)
