"""What one client can cost the server: body size, time on the event loop, connections, queue.

Each case replays, at bounded sizes and counts on 127.0.0.1, a way one client used to
take `astrai serve` down: a body too large for memory, a large body or long prompt
parsed and tokenized on the event loop (``/health`` stalled), connections that never
finish their headers (file handles), and a disconnected request that stayed queued.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from astrai_core.devices.cpu import CpuBackend
from astrai_core.serving.limits import MIB, ServeLimits
from astrai_core.testing.serving import live_server, wait_for_stats

CHAT = [{"role": "user", "content": "Tell me a story about a cat"}]


def _rss() -> float:
    return CpuBackend().memory_stats()["rss_bytes"]


class _Sampled:
    """Runs ``probe`` every ``interval`` seconds in a thread until closed; keeps the results."""

    def __init__(self, probe, interval: float) -> None:
        self.results: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(probe, interval), daemon=True)
        self._thread.start()

    def _run(self, probe, interval: float) -> None:
        while not self._stop.is_set():
            self.results.append(probe())
            self._stop.wait(interval)

    def close(self) -> list:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.results


def _health_latency(server, client: httpx.Client):
    """Seconds ``/health`` took to answer (inf when it did not within 5 s)."""
    started = time.perf_counter()
    try:
        ok = client.get(f"http://127.0.0.1:{server.port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        ok = False
    return time.perf_counter() - started if ok else float("inf")


def _connect(server, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


# ---------------------------------------------------------------- body size

def test_a_body_declared_too_large_is_refused_before_it_is_sent(server):
    with _connect(server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 104857600\r\n\r\n")  # 100 MiB announced, none sent
        started = time.perf_counter()
        head = sock.recv(65536)
        elapsed = time.perf_counter() - started
    assert _status(head) == 413, head
    error = json.loads(head.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_too_large" and "--max-body-mb" in error["message"]
    assert elapsed < 1


def test_a_streamed_body_past_the_limit_is_413_and_never_held(server):
    """64 MiB sent chunked (no length announced): refused once 4 MiB are in, the rest
    discarded as it arrives; the server's memory grows by far less than the body."""
    chunk = b" " * MIB

    def body():
        yield b'{"model": "tiny", "prompt": "hi", "max_tokens": 1, "metadata": "'
        for _ in range(64):
            yield chunk
        yield b'"}'

    samples = _Sampled(_rss, 0.005)
    before = _rss()
    started = time.perf_counter()
    response = httpx.post(f"{server.base_url}/completions", content=body(), timeout=60,
                          headers={"Content-Type": "application/json"})
    elapsed = time.perf_counter() - started
    growth = max(samples.close()) - before
    assert growth < 32 * MIB, f"the server's memory grew by {growth / MIB:.0f} MiB"
    assert response.status_code == 413, response.text[:200]
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert elapsed < 5
    assert server.client().completions.create(model="tiny", prompt="hi", max_tokens=1).choices


def test_the_openai_client_gets_413_as_an_api_error(server):
    with pytest.raises(openai.APIStatusError) as raised:
        server.client().completions.create(model="tiny", prompt="hi", max_tokens=1,
                                           extra_body={"metadata": "x" * (5 * MIB)})
    assert raised.value.status_code == 413


# ---------------------------------------------------------------- the event loop stays free

def test_a_large_body_and_a_long_prompt_never_stall_health(server):
    """A 3.7 MiB chat of 26,000 messages (validated and rendered) and a 3.5 million
    character prompt (refused by its length before tokenizing): ``/health`` answers in
    under a second throughout."""
    many = [{"role": "user", "content": "x" * 110} for _ in range(26_000)]
    chat = json.dumps({"model": "tiny", "messages": many, "max_tokens": 1}).encode()
    prompt = json.dumps({"model": "tiny", "prompt": "word " * 700_000, "max_tokens": 1}).encode()
    assert len(chat) < 4 * MIB and len(prompt) < 4 * MIB
    with httpx.Client() as poller:
        latencies = _Sampled(lambda: _health_latency(server, poller), 0.02)
        time.sleep(0.1)
        answers = [httpx.post(f"{server.base_url}{path}", content=body, timeout=120,
                              headers={"Content-Type": "application/json"})
                   for path, body in (("/chat/completions", chat), ("/completions", prompt))]
        time.sleep(0.1)
        seen = latencies.close()
    assert len(seen) >= 5
    assert max(seen) < 1, f"/health took up to {max(seen):.2f} s"
    for answer, param in zip(answers, ("messages", "prompt")):
        assert answer.status_code == 400, answer.text[:300]
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", param)
        assert "characters" in error["message"]


def test_the_character_bound_is_exact_at_its_edge(server):
    """A prompt of exactly context x longest-token characters is tokenized (and then too
    long: 422); one character more is refused untokenized (400)."""
    from astrai_core.serving.prompts import longest_token_chars

    limit = server.engine.max_context * longest_token_chars(server.tokenizer)
    client = server.client()
    with pytest.raises(openai.UnprocessableEntityError):
        client.completions.create(model="tiny", prompt="a" * limit, max_tokens=1)
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="tiny", prompt="a" * (limit + 1), max_tokens=1)
    assert raised.value.body["code"] == "context_length_exceeded"


def test_longest_token_bounds_the_characters_per_token(server):
    """The bound's premise, on texts of several scripts: never more characters than
    tokens x the longest token."""
    from astrai_core.serving.prompts import longest_token_chars

    longest = longest_token_chars(server.tokenizer)
    texts = ["The quick brown fox " * 50, "<|im_start|>" * 40, "你好世界🙂" * 60, "0123456789" * 80,
             "    \n\t" * 90, '{"name": "get_weather", "arguments": {"city": "Paris"}}' * 20]
    for text in texts:
        assert len(text) <= len(server.tokenizer(text)["input_ids"]) * longest, text[:30]


# ---------------------------------------------------------------- connections

def test_slow_header_connections_are_closed_at_the_header_timeout(random_checkpoint):
    limits = ServeLimits(header_timeout=1.0)
    with live_server(random_checkpoint, limits=limits) as srv:
        socks = [_connect(srv) for _ in range(150)]
        for i, sock in enumerate(socks[:100]):  # a request line and part of the headers, then nothing
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow-{i}: ".encode())
        opened = time.perf_counter()
        with httpx.Client() as client:  # meanwhile the server answers
            assert _health_latency(srv, client) < 1
        answers = [_read_all(sock) for sock in socks]
        closed = time.perf_counter() - opened
        for sock in socks:
            sock.close()
        assert {_status(a) for a in answers} == {408}
        assert 0.5 < closed < 5
        assert srv.client().completions.create(model="tiny", prompt="hi", max_tokens=1).choices
        assert len(srv.server.server_state.connections) <= 1


def test_endless_headers_are_431(server):
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (80 * 1024))
        answer = _read_all(sock)
    assert _status(answer) == 431, answer[:200]


def test_a_stalled_body_is_408(random_checkpoint):
    with live_server(random_checkpoint, limits=ServeLimits(body_timeout=0.5)) as srv, _connect(srv) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n" + b'{"model": ')
        started = time.perf_counter()
        answer = sock.recv(65536)
        elapsed = time.perf_counter() - started
    assert _status(answer) == 408, answer[:200]
    assert b"body_timeout" in answer
    assert 0.3 < elapsed < 5


def test_the_connection_limit_holds_and_frees(random_checkpoint):
    with live_server(random_checkpoint, limits=ServeLimits(max_connections=20)) as srv:
        held = [_connect(srv) for _ in range(20)]
        deadline = time.monotonic() + 10
        while len(srv.server.server_state.connections) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = [_connect(srv) for _ in range(30)]
        answers = [_read_all(sock) for sock in refused]
        assert len(srv.server.server_state.connections) == 20
        assert {_status(a) for a in answers} == {503}
        assert b"retry-after: 1" in answers[0] and b"--max-connections" in answers[0]
        for sock in held + refused:
            sock.close()
        deadline = time.monotonic() + 10
        while srv.server.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.client().completions.create(model="tiny", prompt="hi", max_tokens=1).choices


# ---------------------------------------------------------------- a gone client's queued request

@pytest.mark.parametrize("stream", [False, True])
def test_a_disconnected_queued_request_leaves_the_queue_at_once(random_checkpoint, stream):
    with live_server(random_checkpoint, max_batch_size=1) as srv:
        no_end = {str(srv.tokenizer.eos_token_id): -100}
        holder = srv.client().chat.completions.create(model="tiny", messages=CHAT, max_tokens=900,
                                                      logit_bias=no_end, stream=True)
        next(iter(holder))
        assert wait_for_stats(srv.engine, lambda s: s.active == 1)
        body = json.dumps({"model": "tiny", "messages": CHAT, "max_tokens": 4, "stream": stream}).encode()
        queued = _connect(srv)
        queued.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert wait_for_stats(srv.engine, lambda s: s.waiting == 1)
        before = srv.engine.stats()
        queued.close()
        assert wait_for_stats(srv.engine, lambda s: s.waiting == 0, timeout=10)
        after = srv.engine.stats()
        holder.close()
    assert after.cancelled == before.cancelled + 1
    assert after.prefills == before.prefills  # it never ran
    assert after.max_cancel_delay_steps <= 1, after
    assert after.active == 1  # the running request was still running when it left
