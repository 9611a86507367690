"""`astrai tinker` through the official SDK: a LoRA step's API overhead, and 4 tenants at once.

A random Qwen3-shaped model (built from a transformers config, nothing downloaded) is the
one base served by ``astrai tinker`` in a subprocess on 127.0.0.1 (a free port), as a
deployment runs it: the SDK clients of this process never share the server's interpreter
lock. Two cases:

* **overhead**: a LoRA step (``forward_backward`` cross_entropy + ``optim_step``) sent by
  the ``tinker`` SDK versus the same step called in-process on an engine built the same way
  from the same checkpoint (``build_engine``; ``engine.forward_backward`` +
  ``engine.optim_step``, the same rows, rank, LoRA seed and Adam settings): the peer is the
  server's own compute, so the ratio is what HTTP, the SDK's futures and the per-tenant
  queue add. The two alternate step by step (the first mover alternates too) and the
  direct step runs in a worker thread, as the server's engine does, so load hits both alike.
* **tenants**: 4 SDK clients, each stepping its own adapter in its own thread, against one
  client alone; rounds of each alternate. Engine calls run one at a time, so the ideal
  per-tenant step time is 4x the lone one.

    .venv/bin/python bench/bench_tinker.py [--hidden 256] [--layers 4] [--rows 8] [--seq 128] [--rank 16]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # bench/server_ready.py
from server_ready import wait_until_ready  # noqa: E402

BASE = "bench/qwen3"
KEY = "tml-bench"
LEARNING_RATE = 1e-4


class _Server:
    """``astrai tinker --model BASE=MODEL_DIR`` in a subprocess on a free loopback port."""

    def __init__(self, model_dir: Path, directory: Path, threads: int) -> None:
        import subprocess

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "ASTRAI_CACHE_DIR": str(directory / "cache")}
        directory.mkdir(parents=True, exist_ok=True)
        self.log = directory / "server.log"  # uvicorn's access log: a line per request
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "astrai_core.cli.main", "--log-level", "warning", "tinker",
                 "--model", f"{BASE}={model_dir}", "--port", str(port), "--api-key", KEY,
                 "--state-dir", str(directory / "state"), "--device", "cpu"],
                env=env, stdout=log, stderr=log)
        self.base_url = f"http://127.0.0.1:{port}"
        wait_until_ready(self.process, f"{self.base_url}/api/v1/healthz", "astrai tinker", log=self.log)

    def trainer(self, rank: int):
        """A training client of a fresh SDK service client (its own session)."""
        import tinker

        service = tinker.ServiceClient(base_url=self.base_url, api_key=KEY)
        return service.create_lora_training_client(base_model=BASE, rank=rank, seed=0).result()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def _rows(args, vocab: int) -> list[tuple[list[int], list[int]]]:
    """(input tokens, targets) of ``args.rows`` random rows of ``args.seq`` tokens."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for _ in range(args.rows):
        tokens = [int(t) for t in rng.integers(1, vocab, args.seq + 1)]
        rows.append((tokens[:-1], tokens[1:]))
    return rows


def _sdk_data(rows) -> list:
    """The rows as the SDK's cross_entropy datums (every target token weighted 1)."""
    from tinker import types

    return [types.Datum(model_input=types.ModelInput.from_ints(x),
                        loss_fn_inputs={"target_tokens": y, "weights": [1.0] * len(y)})
            for x, y in rows]


def _sdk_step(trainer, data, types) -> float:
    """One step as a training loop sends it: both requests queued, then both results read."""
    start = time.perf_counter()
    fb = trainer.forward_backward(data, "cross_entropy")
    step = trainer.optim_step(types.AdamParams(learning_rate=LEARNING_RATE))
    fb.result(), step.result()
    return time.perf_counter() - start


def overhead_case(server: _Server, engine, rows, args) -> dict:
    """Median seconds of an SDK step and of the same step on the engine, alternated."""
    import numpy as np
    from tinker import types

    from astrai_core.tinker.engine_types import AdamSpec, DatumIn, LoraSpec

    trainer = server.trainer(args.rank)
    data = _sdk_data(rows)
    datums = [DatumIn(x, {"target_tokens": np.asarray(y, np.int64),
                          "weights": np.ones(len(y), np.float32)}) for x, y in rows]
    engine.create_model("bench-direct", BASE, LoraSpec(rank=args.rank, seed=0))
    worker = ThreadPoolExecutor(1, initializer=_threads, initargs=(args.threads,))

    def direct() -> float:
        start = time.perf_counter()
        engine.forward_backward("bench-direct", datums, "cross_entropy")
        engine.optim_step("bench-direct", AdamSpec(learning_rate=LEARNING_RATE))
        return time.perf_counter() - start

    peers = {"sdk": lambda: _sdk_step(trainer, data, types),
             "direct": lambda: worker.submit(direct).result()}
    times: dict[str, list[float]] = {"sdk": [], "direct": []}
    for step in range(args.warmup + args.steps):
        order = ("sdk", "direct") if step % 2 == 0 else ("direct", "sdk")
        for name in order:
            seconds = peers[name]()
            if step >= args.warmup:
                times[name].append(seconds)
    worker.shutdown()
    return {name: statistics.median(values) for name, values in times.items()}


def _stepping(trainers, data, steps: int) -> float:
    """Wall seconds of every trainer taking ``steps`` steps, each in its own thread, over steps."""
    from tinker import types

    gate = threading.Barrier(len(trainers) + 1)

    def run(trainer) -> None:
        gate.wait()
        for _ in range(steps):
            _sdk_step(trainer, data, types)

    threads = [threading.Thread(target=run, args=(t,)) for t in trainers]
    for thread in threads:
        thread.start()
    gate.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return (time.perf_counter() - start) / steps


def tenants_case(server: _Server, rows, args) -> dict:
    """Per-tenant step seconds of ``args.tenants`` clients at once vs one alone (medians of rounds)."""
    data = _sdk_data(rows)
    trainers = [server.trainer(args.rank) for _ in range(args.tenants)]
    _stepping(trainers, data, 1)  # warm every adapter's optimizer state
    alone, together = [], []
    for round_ in range(args.rounds):
        runs = [(alone, trainers[:1]), (together, trainers)]
        for sink, group in runs if round_ % 2 == 0 else runs[::-1]:
            sink.append(_stepping(group, data, args.steps))
    return {"alone": statistics.median(alone), "together": statistics.median(together)}


def _threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)


def _model_dir(directory: Path, args) -> Path:
    """A random Qwen3-shaped Hugging Face checkpoint of ``args``' size."""
    from astrai_core.testing.hf_models import write_hf_model_dir

    return write_hf_model_dir(
        directory / "qwen3", "qwen3", vocab_size=args.vocab, hidden_size=args.hidden,
        intermediate_size=args.hidden * 3, num_hidden_layers=args.layers,
        num_attention_heads=max(args.hidden // 64, 2), num_key_value_heads=max(args.hidden // 128, 1),
        head_dim=min(args.hidden // 2, 64), max_position_embeddings=max(args.seq * 2, 64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="measured steps (per round for tenants)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (on a small shared machine, 1 avoids OpenMP stalls)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the server's engine thread too
    os.environ["TINKER_TELEMETRY"] = "0"
    _threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        from astrai_core.tinker.engine import build_engine

        model_dir = _model_dir(Path(tmp), args)
        server = _Server(model_dir, Path(tmp) / "server", args.threads)
        # the direct peer: an engine of its own in this process, on the same checkpoint
        engine = build_engine({BASE: str(model_dir)}, Path(tmp) / "direct",
                              cache_dir=str(Path(tmp) / "direct-cache"))
        rows = _rows(args, args.vocab)
        try:
            overhead = overhead_case(server, engine, rows, args)
            tenants = tenants_case(server, rows, args)
        finally:
            server.close()
    api_ratio = overhead["sdk"] / overhead["direct"]
    tenant_ratio = tenants["together"] / tenants["alone"]
    print(f"LoRA step, {args.rows} rows x {args.seq} tokens, rank {args.rank}, "
          f"hidden {args.hidden} x {args.layers} layers:")
    print(f"  tinker SDK over HTTP {overhead['sdk'] * 1e3:8.1f} ms   "
          f"engine in-process (same checkpoint, rows, rank) {overhead['direct'] * 1e3:8.1f} ms")
    print(f"SDK step / in-process engine step = {api_ratio:.2f}x (goal <= 1.15x: "
          f"{'met' if api_ratio <= 1.15 else 'missed'})")
    print(f"  per-tenant step: {args.tenants} tenants at once {tenants['together'] * 1e3:8.1f} ms   "
          f"1 alone {tenants['alone'] * 1e3:8.1f} ms")
    print(f"{args.tenants} tenants per-tenant step / 1 alone = {tenant_ratio:.2f}x (goal <= "
          f"{args.tenants * 1.1:.1f}x: {'met' if tenant_ratio <= args.tenants * 1.1 else 'missed'})")
    print(json.dumps({**vars(args), "overhead": overhead, "tenant_step": tenants,
                      "api_ratio": api_ratio, "tenant_ratio": tenant_ratio}))


if __name__ == "__main__":
    main()
