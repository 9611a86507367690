"""`astrai serve` under load: tokens/s with 1, 4 and 16 concurrent streams vs sequential requests.

A random native model (byte-level tokenizer, Qwen-style template) is served by
``astrai serve`` in a subprocess on 127.0.0.1; clients are the official ``openai`` async
client in this process. Every
request is greedy with the end token suppressed (``logit_bias``), so each generates
exactly ``--new-tokens`` tokens. Named peers in the same run: sequential non-streamed
requests (one at a time, the baseline of the ratios) and ``TorchSampler.generate`` of
the same prompts in offline batches of 16 (no HTTP: the ceiling; run in a worker thread
like the server's engine, since on a loaded machine torch's OpenMP pool is much slower
from the main thread). Also reports p50/p99 time to first token of the streamed runs.
Loopback only; a bounded number of requests.

    .venv/bin/python bench/bench_serve.py [--requests 32] [--new-tokens 32] [--hidden 128] [--layers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # bench/server_ready.py
from server_ready import wait_until_ready  # noqa: E402


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Request {i}: tell me a story about a cat" + " please" * (i % 7)}]


async def _one(client, i: int, args, bias, stream: bool) -> tuple[float, float]:
    """(time to first token, total time) of one request, seconds."""
    start = time.perf_counter()
    common = dict(model="bench", messages=_messages(i), temperature=0, max_tokens=args.new_tokens,
                  logit_bias=bias)
    if not stream:
        await client.chat.completions.create(**common)
        elapsed = time.perf_counter() - start
        return elapsed, elapsed
    first = None
    async for chunk in await client.chat.completions.create(stream=True, **common):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start, time.perf_counter() - start


async def _load(base_url: str, args, concurrency: int, stream: bool, bias) -> tuple[float, list[float]]:
    """(generated tokens/s, TTFTs) of ``args.requests`` requests, ``concurrency`` at a time."""
    import openai

    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600) as client:
        async def job(i: int):
            async with gate:
                return await _one(client, i, args, bias, stream)

        start = time.perf_counter()
        results = await asyncio.gather(*(job(i) for i in range(args.requests)))
        wall = time.perf_counter() - start
    return args.requests * args.new_tokens / wall, [r[0] for r in results]


def _offline(model_dir: Path, args) -> float:
    """TorchSampler.generate of the same prompts in batches of 16: tokens/s without HTTP."""
    import threading

    import torch

    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.sampling import SamplingParams
    from astrai_core.sampling.torch_sampler import TorchSampler

    model, tokenizer = load_pretrained(model_dir).eval(), load_tokenizer(model_dir)
    prompts = []
    for i in range(args.requests):
        text = tokenizer.apply_chat_template(_messages(i), add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0)  # no stop token: full length
    elapsed: list[float] = []

    def work() -> None:
        torch.set_num_threads(args.threads)
        start = time.perf_counter()
        TorchSampler(model, max_batch_size=16).generate(prompts, params)
        elapsed.append(time.perf_counter() - start)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return args.requests * args.new_tokens / elapsed[0]


class _Server:
    """``astrai serve MODEL_DIR`` in a subprocess on a free loopback port."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        import socket
        import subprocess

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "astrai_core.cli.main", "--log-level", "warning", "serve", str(model_dir),
             "--port", str(self.port), "--served-model-name", "bench", "--device", "cpu",
             "--threads", str(threads)])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        wait_until_ready(self.process, f"http://127.0.0.1:{self.port}/health", "astrai serve")

    def stats(self) -> dict:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=30).json()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads of the server and of the offline peer (on a small shared "
                             "machine, 1 avoids OpenMP stalls)")
    args = parser.parse_args()

    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.testing.serving import build_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_checkpoint(Path(tmp) / "bench", hidden_size=args.hidden, num_layers=args.layers)
        bias = {str(load_tokenizer(model_dir).eos_token_id): -100}
        server = _Server(model_dir, args.threads)
        try:
            warm = argparse.Namespace(requests=4, new_tokens=4)
            asyncio.run(_load(server.base_url, warm, 4, True, bias))
            rows = [("sequential (non-streamed, one at a time)",
                     *asyncio.run(_load(server.base_url, args, 1, False, bias)))]
            for concurrency in (1, 4, 16):
                rows.append((f"{concurrency} concurrent streams",
                             *asyncio.run(_load(server.base_url, args, concurrency, True, bias))))
            stats = server.stats()
        finally:
            server.close()
        offline = _offline(model_dir, args)
    baseline = rows[0][1]
    print(f"model: hidden {args.hidden}, {args.layers} layers; {args.requests} requests x {args.new_tokens} "
          f"tokens, CPU ({args.threads} torch thread(s)), loopback")
    print(f"{'workload':44} {'tokens/s':>9} {'vs seq':>7} {'TTFT p50':>9} {'TTFT p99':>9}")
    for name, rate, ttfts in rows:
        p50, p99 = _percentile(ttfts, 50) * 1e3, _percentile(ttfts, 99) * 1e3
        print(f"{name:44} {rate:9.1f} {rate / baseline:6.2f}x {p50:7.1f}ms {p99:7.1f}ms")
    print(f"{'TorchSampler.generate, offline batch of 16':44} {offline:9.1f} {offline / baseline:6.2f}x")
    print(f"largest running batch: {stats['max_active']}; decode steps: {stats['decode_steps']}")


if __name__ == "__main__":
    main()
