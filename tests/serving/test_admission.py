"""What one request may ask and the queue may hold, fair scheduling, and request shapes.

A request over ``--max-seqs-per-request`` is a 400 before anything is tokenized or queued;
a full queue answers 429 with ``Retry-After``; sequences of different requests take free
batch slots in turn, so a small request behind a large one finishes early; JSON nested
absurdly deep, content that is not text, and tool parameters that are not a JSON Schema
are 400s naming the field. Load stays on loopback with bounded request counts.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from astrai_core.testing.serving import live_server, wait_for_stats

CHAT = [{"role": "user", "content": "Tell me a story about a cat"}]


def _post(server, path: str, body: bytes | dict) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.base_url}{path}", content=content, timeout=60,
                      headers={"Content-Type": "application/json"})


def _assert_400(response: httpx.Response, param: str | None, *words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    for word in words:
        assert word in error["message"], error["message"]


# ---------------------------------------------------------------- request shapes

@pytest.mark.parametrize("depth", [100_000, 65])
def test_json_nested_too_deep_is_a_400(server, depth):
    body = b'{"model": "tiny", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    _assert_400(_post(server, "/chat/completions", body), None, "deeper than 64")


def test_json_at_a_sane_depth_still_validates_normally(server):
    deep_but_fine = {"model": "tiny", "max_tokens": 2, "messages": CHAT,
                     "metadata": {"a": {"b": {"c": [[[{"d": 1}]]]}}}}
    assert _post(server, "/chat/completions", deep_but_fine).status_code == 200


@pytest.mark.parametrize("message, field, words", [
    ({"role": "user", "content": 5}, "messages", ("messages[0].content", "got int")),
    ({"role": "user"}, "messages", ("messages[0].content is required",)),
    ({"role": "user", "content": [{"type": "text", "text": 3}]}, "messages", ("content[0].text",)),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "messages",
     ("image_url", "not supported")),
    ({"role": "system", "content": [{"type": "refusal", "refusal": "no"}]}, "messages",
     ("content[0].type",)),
    ({"role": "tool", "content": "42"}, "messages", ("tool_call_id",)),
    ({"role": "user", "content": "hi", "tool_calls": []}, "messages", ("only allowed on assistant",)),
    ({"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {}}]},
     "messages", ("function.name",)),
])
def test_message_shapes_outside_openais_are_400s(server, message, field, words):
    response = _post(server, "/chat/completions", {"model": "tiny", "messages": [message]})
    _assert_400(response, field, *words)


def test_every_shape_openai_allows_is_served(server):
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
    ]
    reply = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=3)
    assert reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("parameters, words", [
    ({"type": "object", "properties": 5}, ("tools.0.function.parameters", "not a valid JSON Schema")),
    ({"type": "objekt"}, ("not a valid JSON Schema",)),
    ({"type": "object", "required": "city"}, ("not a valid JSON Schema",)),
])
def test_tool_parameters_must_be_a_json_schema(server, parameters, words):
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    response = _post(server, "/chat/completions", {"model": "tiny", "messages": CHAT, "tools": tools})
    _assert_400(response, "tools.0.function.parameters", *words)


# ---------------------------------------------------------------- admission

def test_a_thousand_prompts_times_64_is_refused_before_any_work(server):
    before = server.engine.stats()
    started = time.perf_counter()
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().completions.create(model="tiny", prompt=["Tell me a story"] * 1000, n=64, max_tokens=4)
    assert time.perf_counter() - started < 2
    assert "64000 sequences" in str(raised.value) and "at most 256" in str(raised.value)
    after = server.engine.stats()
    assert (after.waiting, after.prefills) == (before.waiting, before.prefills)  # nothing was queued


def test_a_full_queue_answers_429_with_retry_after(random_checkpoint):
    with live_server(random_checkpoint, max_batch_size=1, max_queued=8) as small:
        no_end = {str(small.tokenizer.eos_token_id): -100}
        holder = small.client().with_options(timeout=120)
        opened = holder.chat.completions.create(model="tiny", messages=CHAT, n=8, max_tokens=600,
                                                logit_bias=no_end, stream=True)
        next(iter(opened))  # the first chunk: all 8 are queued, at most 1 has a slot
        response = _post(small, "/chat/completions", {"model": "tiny", "messages": CHAT, "n": 2, "max_tokens": 2})
        opened.close()
    assert response.status_code == 429, response.text
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "queue_full"


def test_a_small_request_next_to_a_large_one_finishes_first_and_fast(random_checkpoint):
    """The large request's 240 sequences would keep 4 slots busy for ~60 rounds; the small one
    takes the first slot that frees (round-robin between requests), not the 241st."""
    with live_server(random_checkpoint, max_batch_size=4) as srv:
        no_end = {str(srv.tokenizer.eos_token_id): -100}
        large_done = threading.Event()

        def large() -> None:
            srv.client().completions.create(model="tiny", prompt=["Tell me a story"] * 240, max_tokens=48,
                                            logit_bias=no_end)
            large_done.set()

        thread = threading.Thread(target=large)
        thread.start()
        deadline = time.monotonic() + 60
        while srv.engine.stats().waiting < 200 and time.monotonic() < deadline:
            time.sleep(0.01)  # the large request is queued
        started = time.perf_counter()
        small = srv.client().chat.completions.create(model="tiny", messages=CHAT, max_tokens=4)
        elapsed = time.perf_counter() - started
        waiting_then = srv.engine.stats().waiting
        thread.join(timeout=300)
    assert small.choices[0].message.content is not None
    assert waiting_then > 100  # most of the large request still waited when the small one was done
    assert elapsed < 2, f"the small request took {elapsed:.2f} s"
    assert large_done.is_set()


def test_fifty_concurrent_streams_all_complete_with_their_solo_text(server):
    prompts = [f"Tell me about {i} cats" for i in range(50)]
    client = server.client()
    solo = [client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0).choices[0].text
            for p in prompts]

    async def stream(aclient, prompt: str) -> str:
        chunks = await aclient.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                                  stream=True)
        return "".join([chunk.choices[0].text async for chunk in chunks if chunk.choices])

    async def run() -> list[str]:
        async with server.async_client() as aclient:
            return await asyncio.gather(*(stream(aclient, p) for p in prompts))

    before = _idle(server.engine)
    assert asyncio.run(run()) == solo
    after = _idle(server.engine)
    assert after.finished - before.finished == 50
    assert after.max_active > 1  # the streams shared decode batches


def _idle(engine, timeout: float = 30.0):
    """The engine's stats once nothing runs or waits: it counts a finish just after
    sending it, so a client can see its last token before the engine is idle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.active == 0 and stats.waiting == 0:
            return stats
        time.sleep(0.01)
    raise AssertionError(f"the engine did not go idle: {engine.stats()}")


# ---------------------------------------------------------------- admission edges

@pytest.mark.parametrize("prompts, n", [(256, 1), (128, 2), (257, 1), (129, 2)])
def test_max_seqs_per_request_takes_exactly_256(server, prompts, n):
    """prompts x n = 256 is served whole; 257 or 258 is a 400 before anything is queued."""
    before = _idle(server.engine)
    request = {"model": "tiny", "prompt": ["hi"] * prompts, "n": n, "max_tokens": 1}
    response = _post(server, "/completions", request)
    if prompts * n <= 256:
        assert response.status_code == 200, response.text[:300]
        assert len(response.json()["choices"]) == prompts * n
    else:
        _assert_400(response, "n", f"{prompts * n} sequences", "at most 256")
        after = server.engine.stats()
        assert (after.waiting, after.prefills) == (before.waiting, before.prefills)


def test_the_queue_takes_exactly_max_queued_and_one_more_is_429(random_checkpoint):
    """With one batch slot held, 7 + 1 waiting sequences fill a queue of 8 exactly: both
    are accepted; one more sequence is a 429 with Retry-After, and nothing of it queues."""
    with live_server(random_checkpoint, max_batch_size=1, max_queued=8) as small:
        client = small.client()
        no_end = {str(small.tokenizer.eos_token_id): -100}
        holder = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=1000,
                                                logit_bias=no_end, stream=True)
        next(iter(holder))
        assert wait_for_stats(small.engine, lambda s: s.active == 1 and s.waiting == 0)
        opened = [holder]
        for n, waiting in ((7, 7), (1, 8)):  # a chat stream answers its role chunk while it waits
            opened.append(client.chat.completions.create(model="tiny", messages=CHAT, n=n, max_tokens=2,
                                                         stream=True))
            next(iter(opened[-1]))
            assert wait_for_stats(small.engine, lambda s, waiting=waiting: s.waiting == waiting)
        response = _post(small, "/chat/completions", {"model": "tiny", "messages": CHAT, "max_tokens": 2})
        stats = small.engine.stats()
        for stream in opened:
            stream.close()
    assert response.status_code == 429, response.text
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "queue_full"
    assert "8 are waiting, the queue holds at most 8" in response.json()["error"]["message"]
    assert (stats.active, stats.waiting) == (1, 8)  # the slot stayed held throughout
