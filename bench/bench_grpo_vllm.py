"""A GRPO step on 2 processes (FSDP2 over gloo): the ``vllm`` sampler (one colocated
engine per process) against the built-in ``torch`` sampler, same config otherwise.

A 5M-parameter model built from scratch over the arithmetic tokenizer (hidden 256, 4
layers, head_dim 32: vLLM's CPU attention needs >= 32), 4 prompts per process, 8 answers
each, 64 new tokens with no stop token (every answer is 64 tokens), one optimizer step
per rollout. Each run's figure is the median of its steps' ``time/step_seconds`` after
the first (metrics.jsonl): rollout, log-probs, the step, and the weight push. The vllm
runs also report the median ``rollout/weight_push_seconds`` and the whole run's wall
time (engine start included). Needs vLLM (``make venv-vllm``, then):

    .venv-vllm/bin/python bench/bench_grpo_vllm.py [--steps 5] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MODEL = {"hidden_size": 256, "intermediate_size": 704, "num_layers": 4, "num_heads": 8,
         "num_kv_heads": 4, "max_position_embeddings": 256}
ENGINE = {"enforce_eager": True, "cpu_kv_cache_gib": 1, "max_num_seqs": 32}


def config(tmp: Path, sampler: str, args: argparse.Namespace) -> Path:
    from astrai_core.testing import tiny_run_config, write_arith_prompts

    prompts = write_arith_prompts(tmp / "prompts.jsonl", count=64)
    options = {"name": sampler, "max_new_tokens": args.new_tokens, "stop_token_ids": [],
               **(ENGINE if sampler == "vllm" else {})}
    run = tiny_run_config(tmp, prompts, {"name": "grpo", "group_size": 8},
                          data={"batch_size": 8}, sampler=options, max_steps=args.steps,
                          lr=1e-4, save_every=0)
    run["model"]["config"] = dict(MODEL)
    run["output_dir"] = str(tmp / sampler)
    path = tmp / f"{sampler}.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def train(path: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "--log-format", "json",
                           "train", str(path), "--nproc-per-node", "2"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{path.stem} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def median_after_first(run_dir: Path, name: str) -> float | None:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [row[name] for row in rows[1:] if name in row]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for sampler in ("torch", "vllm"):
            wall = train(config(tmp, sampler, args))
            results[sampler] = {
                "step_seconds": median_after_first(tmp / sampler, "time/step_seconds"),
                "push_seconds": median_after_first(tmp / sampler, "rollout/weight_push_seconds"),
                "wall_seconds": wall}
    for sampler, figures in results.items():
        print(sampler, json.dumps(figures))
    ratio = results["torch"]["step_seconds"] / results["vllm"]["step_seconds"]
    print(f"GRPO step, 2 processes: vllm {results['vllm']['step_seconds']:.2f} s, "
          f"torch {results['torch']['step_seconds']:.2f} s: vllm {ratio:.2f}x the torch "
          "sampler's speed")


if __name__ == "__main__":
    main()
