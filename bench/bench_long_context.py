"""Long sequences: the training step over a group whose completions share one long prompt,
with ``trainer.share_prompt`` against the same rows unshared, on CPU.

One GRPO-shaped group: a prompt of ``--prompt`` tokens (1,024) and ``--group`` (8)
completions of ``--completion`` (64) tokens each, through a Qwen3-0.6B-shaped native
model (hidden 1024, 16 query heads of 128, 8 KV heads, MLP 3072; ``--layers`` of its 28
layers, a 4,096-token vocabulary so that the decoder, not the head, is what is timed).
A step is the training forward of every completion's log-probs and its backward, as the
policy's training micro-batch runs it (``policy_forward``). Three ways, timed in turn in
the same process, each ``--repeats`` times after one warm-up (medians):

- ``padded``: the rows as a padded batch (the default);
- ``packed``: the rows packed into one sequence (``trainer.micro_batch_tokens``);
- ``shared``: the prompt once, each completion attending to it (``trainer.share_prompt``).

The ratio printed is shared / packed: the peer is the best unshared way. Aim: <= 0.4.

    .venv/bin/python bench/bench_long_context.py [--prompt 1024] [--group 8]
        [--completion 64] [--layers 2] [--repeats 3]

``--case context-parallel``: the peak memory one rank adds while it trains one row of
``--tokens`` (16,384) tokens (the SFT loss's forward and backward), with
``parallel.context_parallel`` 1 (one process) against N = ``--context`` (2) processes
over gloo, each holding 1/N of the row: the resident set's high-water mark during the
step above the resident set just before it, per rank (the largest). The ratio printed is
CP N / CP 1. Aim: <= 0.55.

    .venv/bin/python bench/bench_long_context.py --case context-parallel [--tokens 16384]
        [--context 2] [--layers 2]

``--case longest-row``: the longest row whose step keeps every rank's peak (as above)
within ``--cap-gib``, with context_parallel 1 and N: lengths double from
``--granularity`` (2,048) until one goes over the cap, then a bisection to the
granularity. The ratio printed is the longest row with N / with 1. Aim: >= 1.8.

    .venv/bin/python bench/bench_long_context.py --case longest-row [--cap-gib 2.5]
        [--context 2] [--layers 2] [--granularity 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.rollout import policy_forward
from astrai_core.rollout.batch import RolloutBatch

sys.path.insert(0, str(Path(__file__).parent))
from bench_lora_memory import rss_bytes  # noqa: E402


def qwen3_shaped(layers: int) -> CausalLM:
    config = ModelConfig(vocab_size=4096, hidden_size=1024, intermediate_size=3072,
                         num_layers=layers, num_heads=16, num_kv_heads=8, head_dim=128,
                         qk_norm=True, tie_word_embeddings=True, max_position_embeddings=40960)
    torch.manual_seed(0)
    return CausalLM(config)


def group_batch(prompt: int, group: int, completion: int, vocab: int) -> RolloutBatch:
    generator = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(vocab, (1, prompt), generator=generator).expand(group, prompt)
    response_ids = torch.randint(vocab, (group, completion), generator=generator)
    return RolloutBatch(
        prompt_ids=prompt_ids.clone(), prompt_mask=torch.ones(group, prompt, dtype=torch.bool),
        response_ids=response_ids, response_mask=torch.ones(group, completion, dtype=torch.bool),
        old_logprobs=None, rewards=torch.zeros(group), reward_components={},
        group_ids=torch.zeros(group, dtype=torch.long))


def step_seconds(model: CausalLM, batch: RolloutBatch, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logprobs = policy_forward(model, batch)["logprobs"]
        (-logprobs[batch.response_mask].mean()).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def row_step_memory(rank: int, size: int, tokens: int, layers: int, results: str) -> None:
    """One rank's step over its shard of one row: (peak RSS above the pre-step RSS, s)."""
    import torch.distributed as dist

    from astrai_core.distributed.context import DistContext
    from astrai_core.distributed.context_rows import context_parallel_logprobs
    from astrai_core.model.head import target_logprobs

    torch.set_num_threads(1)
    if size > 1:
        dist.init_process_group("gloo", init_method=f"file://{results}.store", rank=rank,
                                world_size=size)
    model = qwen3_shaped(layers)
    ids = torch.randint(model.config.vocab_size, (1, tokens),
                        generator=torch.Generator().manual_seed(2))
    before = rss_bytes()
    start = time.perf_counter()
    if size > 1:
        context = DistContext(rank=rank, world_size=size, context_size=size,
                              context_group=dist.group.WORLD)
        out = context_parallel_logprobs(model, {"input_ids": ids}, context)
        loss = -out["logprobs"][out["trained"]].sum()
    else:
        loss = -target_logprobs(model, ids, ids[:, 1:])["logprobs"].sum()
    loss.backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with open(f"{results}.{rank}", "w") as f:
        json.dump({"bytes": peak - before, "seconds": seconds}, f)
    if size > 1:
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)  # torch 2.13's gloo may abort in the interpreter's teardown


def measured_step(size: int, tokens: int, layers: int) -> dict[str, float]:
    """The largest per-rank peak (GiB) and the slowest rank's seconds of one row's step,
    ``tokens`` long, split over ``size`` processes."""
    import torch.multiprocessing as mp

    results = os.path.join(tempfile.mkdtemp(), "rank")
    mp.spawn(row_step_memory, args=(size, tokens, layers, results), nprocs=size)
    ranks = [json.load(open(f"{results}.{rank}")) for rank in range(size)]
    return {"peak_gib": max(r["bytes"] for r in ranks) / 2**30,
            "seconds": max(r["seconds"] for r in ranks)}


def longest_row(size: int, args: argparse.Namespace) -> tuple[int, dict[int, float]]:
    """The longest multiple of ``args.granularity`` tokens whose step fits ``args.cap_gib``
    per rank with ``size`` processes, and every length tried with its peak."""
    tried: dict[int, float] = {}

    def fits(tokens: int) -> bool:
        tried[tokens] = measured_step(size, tokens, args.layers)["peak_gib"]
        print(f"  context_parallel {size}: {tokens} tokens peak {tried[tokens]:.2f} GiB")
        return tried[tokens] <= args.cap_gib

    low, high = 0, args.granularity
    while fits(high):
        low, high = high, high * 2
    while high - low > args.granularity:
        middle = (low + high) // 2 // args.granularity * args.granularity
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, tried


def longest_row_case(args: argparse.Namespace) -> None:
    longest = {}
    for size in (1, args.context):
        longest[size], tried = longest_row(size, args)
        print(f"context_parallel {size}: longest row within {args.cap_gib} GiB per rank: "
              f"{longest[size]} tokens")
    ratio = longest[args.context] / max(longest[1], 1)
    print(f"longest row within the cap, context_parallel {args.context} / 1 = {ratio:.2f}x "
          "(aim >= 1.8x)")
    print(json.dumps({**vars(args), "longest": longest, "ratio": ratio}))


def context_parallel_case(args: argparse.Namespace) -> None:
    runs = {}
    for size in (1, args.context):
        runs[size] = measured_step(size, args.tokens, args.layers)
        print(f"context_parallel {size}: peak per rank above the step's start "
              f"{runs[size]['peak_gib']:.2f} GiB, step {runs[size]['seconds']:.1f} s")
    ratio = runs[args.context]["peak_gib"] / runs[1]["peak_gib"]
    print(f"peak activation memory per rank, context_parallel {args.context} / 1 = "
          f"{ratio:.2f}x (aim <= 0.55x)")
    print(json.dumps({**vars(args), "runs": runs, "ratio": ratio}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("share-prompt", "context-parallel", "longest-row"),
                        default="share-prompt")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--context", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--cap-gib", type=float, default=2.5)
    parser.add_argument("--granularity", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.case != "share-prompt":
        (context_parallel_case if args.case == "context-parallel" else longest_row_case)(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    model = qwen3_shaped(args.layers)
    batch = group_batch(args.prompt, args.group, args.completion, model.config.vocab_size)
    ways = {"padded": batch, "packed": replace(batch, packed=True),
            "shared": replace(batch, share_prompt=True)}
    seconds = {name: step_seconds(model, rows, args.repeats) for name, rows in ways.items()}
    tokens = {"padded": args.group * (args.prompt + args.completion),
              "packed": args.group * (args.prompt + args.completion),
              "shared": args.prompt + args.group * args.completion}
    print(f"{'way':8} {'tokens':>7} {'step s':>8}")
    for name in ways:
        print(f"{name:8} {tokens[name]:7d} {seconds[name]:8.3f}")
    ratio = seconds["shared"] / seconds["packed"]
    print(f"share_prompt step time / packed (the best unshared) = {ratio:.2f}x (aim <= 0.4x); "
          f"/ padded = {seconds['shared'] / seconds['padded']:.2f}x")
    print(json.dumps({**vars(args), "seconds": seconds, "tokens": tokens,
                      "ratio_vs_packed": ratio, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
