"""Continuous batching: concurrent streams equal their solo greedy outputs; cancelled ones free their slots."""

from __future__ import annotations

import asyncio
import socket

from astrai_core.testing.serving import wait_for_stats


TOPICS = ["a cat", "the weather", "Paris", "a fox", "the dog", "numbers", "a story", "functions",
          "the user", "a city", "today", "help", "42", "the query", "brown", "lazy"]


def _messages(i: int) -> list[dict]:
    # Prompts of different lengths, so joins shift the cache and rows are left-padded.
    return [{"role": "user", "content": f"Tell me about {TOPICS[i]}" + " please" * (i % 5)}]


async def _stream(client, i: int, max_tokens: int, bias: dict | None = None, cancel_after: int | None = None):
    stream = await client.chat.completions.create(model="tiny", messages=_messages(i), temperature=0,
                                                  max_tokens=max_tokens, stream=True, logit_bias=bias)
    text, seen = "", 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
            seen += 1
            if cancel_after is not None and seen >= cancel_after:
                await stream.close()  # the client goes away mid-stream
                return None
    return text


def test_sixteen_concurrent_streams_equal_their_solo_outputs(server):
    client = server.client()
    solo = [client.chat.completions.create(model="tiny", messages=_messages(i), temperature=0,
                                           max_tokens=24).choices[0].message.content for i in range(16)]
    assert len(set(solo)) > 8  # different prompts, different outputs: mixing would show
    before = server.engine.stats()

    async def run():
        async with server.async_client() as aclient:
            return await asyncio.gather(*(_stream(aclient, i, 24) for i in range(16)))

    assert asyncio.run(run()) == solo
    after = server.engine.stats()
    assert after.max_active > 1  # the streams shared decode forwards
    assert after.decode_steps - before.decode_steps < 16 * 24  # fewer forwards than one per token


def test_cancelling_half_mid_stream_keeps_the_others_and_frees_slots(server):
    client = server.client()
    solo = {i: client.chat.completions.create(model="tiny", messages=_messages(i), temperature=0,
                                              max_tokens=24).choices[0].message.content for i in range(0, 16, 2)}
    before = server.engine.stats()
    no_end = {str(server.tokenizer.eos_token_id): -100}  # the cancelled ones would run 400 tokens

    async def run():
        async with server.async_client() as aclient:
            jobs = [_stream(aclient, i, 24) if i % 2 == 0 else _stream(aclient, i, 400, no_end, cancel_after=2)
                    for i in range(16)]
            return await asyncio.gather(*jobs)

    results = asyncio.run(run())
    assert {i: results[i] for i in range(0, 16, 2)} == solo
    assert all(results[i] is None for i in range(1, 16, 2))
    assert wait_for_stats(server.engine, lambda s: s.cancelled - before.cancelled == 8
                          and s.active == 0 and s.waiting == 0, timeout=120)
    stats = server.engine.stats()
    assert stats.max_cancel_delay_steps <= 1  # each slot freed within one decode step of the cancel


def test_non_streaming_disconnect_frees_the_slot(server):
    before = server.engine.stats()
    body = ('{"model": "tiny", "max_tokens": 900, "temperature": 0, "logit_bias": {"%d": -100}, '
            '"messages": [{"role": "user", "content": "hi"}]}' % server.tokenizer.eos_token_id).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert wait_for_stats(server.engine, lambda s: s.active == 1, timeout=60)
    # the connection is closed: the request is cancelled long before its 900 tokens
    assert wait_for_stats(server.engine, lambda s: s.cancelled == before.cancelled + 1
                          and s.active == 0, timeout=60)
    assert server.engine.stats().max_cancel_delay_steps <= 1
