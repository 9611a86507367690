"""The ray sampler on CPU: rollout throughput with 1 and 2 workers against the local torch
sampler, the time of one weight push against model size (gloo group and object store),
and the GRPO step time with rollout.max_staleness 0 and 1.

One local Ray session (num_cpus = the machine's cores) for everything. Each worker gets
one CPU and one torch thread; the local sampler runs in this process with one thread, so
"2 workers / local" is the speed-up of spreading the same prompts over two processes.
The GRPO runs use a deliberately slow-sampling setup (long completions, small model) in
which sampling and training take comparable time, which is where staleness pays.

    .venv/bin/python bench/bench_ray.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = [[1 + (i * 7 + j) % 40 for j in range(4 + i % 5)] for i in range(16)]


def _model(hidden: int, layers: int, vocab: int = 64):
    from astrai_core.model import CausalLM, ModelConfig

    torch.manual_seed(0)
    return CausalLM(ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
                                num_layers=layers, num_heads=4, num_kv_heads=2,
                                max_position_embeddings=256))


def _best(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def throughput(repeats: int) -> None:
    from astrai_core.sampling import SamplingParams
    from astrai_core.sampling.torch_sampler import TorchSampler
    from astrai_plugin_ray.sampler import RaySampler

    model = _model(hidden=128, layers=4)
    params = SamplingParams(max_new_tokens=32, n=4, seed=0)
    tokens = len(PROMPTS) * 4 * 32
    local = TorchSampler(model)
    local_s = _best(lambda: local.generate(PROMPTS, params), repeats)
    print(f"rollout: {len(PROMPTS)} prompts x 4 completions x 32 tokens, 1.2M-param model")
    print(f"  local torch sampler (this process): {tokens / local_s:9.0f} tokens/s")
    for workers in (1, 2):
        sampler = RaySampler(model=model, workers=workers, worker_resources={"CPU": 1})
        try:
            sampler.generate(PROMPTS, params)  # warm-up
            seconds = _best(lambda: sampler.generate(PROMPTS, params), repeats)
        finally:
            sampler.close()
        print(f"  ray, {workers} worker(s):              {tokens / seconds:9.0f} tokens/s "
              f"({local_s / seconds:.2f}x local)")


def pushes(repeats: int) -> None:
    from astrai_plugin_ray.sampler import RaySampler

    print("one weight push to 2 workers (all parameters; best of repeats)")
    for hidden, layers in ((128, 2), (512, 4), (1024, 8)):
        model = _model(hidden, layers, vocab=4096)
        size_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20
        row = []
        for transport in ("collective", "object_store"):
            sampler = RaySampler(model=model, workers=2, worker_resources={"CPU": 1},
                                 weight_transport=transport, bucket_mb=64)
            try:
                sampler.update_weights()
                seconds = _best(sampler.update_weights, repeats)
            finally:
                sampler.close()
            row.append(f"{transport} {seconds * 1000:7.1f} ms ({size_mb / seconds:6.0f} MB/s)")
        print(f"  {size_mb:7.1f} MB: " + "  ".join(row))


def grpo_steps() -> None:
    from astrai_core.config.schema import RunConfig
    from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts
    from astrai_core.training.run import train

    print("GRPO step time, sampler ray (2 workers), 8 prompts x 4, 24 new tokens, 8 steps")
    results = {}
    for staleness in (0, 1):
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=64)
            config = tiny_run_config(
                tmp_path, prompts, {"name": "grpo", "group_size": 4}, max_steps=8,
                sampler={"name": "ray", "workers": 2, "max_new_tokens": 24,
                         "stop_token_ids": []})
            config["model"]["config"] = {**config["model"]["config"], "hidden_size": 128,
                                         "intermediate_size": 384, "num_layers": 4}
            config["rollout"] = {"max_staleness": staleness}
            train(RunConfig.model_validate(config))
            rows = read_metrics(tmp_path / "run")[2:]  # steps 1-2: warm-up
            results[staleness] = statistics.median(r["time/step_seconds"] for r in rows)
            push = statistics.median(r["rollout/weight_push_seconds"] for r in rows)
        print(f"  max_staleness {staleness}: {results[staleness] * 1000:7.1f} ms/step "
              f"(push {push * 1000:.1f} ms)")
    print(f"  max_staleness 1 / 0: {results[1] / results[0]:.2f}x the step time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import ray

    torch.set_num_threads(1)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        print(f"CPU cores: {os.cpu_count()}, torch {torch.__version__}, ray {ray.__version__}")
        throughput(args.repeats)
        pushes(args.repeats)
        grpo_steps()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
