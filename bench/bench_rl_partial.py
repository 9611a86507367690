"""Partial rollouts vs synchronous rollouts on the long-tailed GRPO workload, on CPU.

The workload of bench_rl_longtail.py (the same model, prompts, reward and length
distribution: 90% of completions uniform in [4, 63] tokens, 10% in [64, 512], forced by
the same logits processor), trained by astrai with packed micro-batches, in one process
with the torch sampler:

- ``sync``: every rollout step waits for its longest completion;
- ``partial``: ``rollout.partial: true`` (``max_staleness``, ``partial_tokens`` below): a
  step trains on the groups that finished and carries the others to later steps.

Each completion's length is drawn once, in the order its group enters the sampler, from
one seeded stream shared by both; a carried sequence keeps its length across segments.
Reported: seconds per step and trained completion tokens per second (tokens masked for
staleness are not counted), medians over steps, the first step of every run left out.

    .venv/bin/python bench/bench_rl_partial.py [--steps 8] [--prompts 4] [--group 8]
        [--max-tokens 512] [--staleness 2] [--partial-tokens 64] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpo_trl import add_run_arguments, child_json, make_model, train_astrai  # noqa: E402
from bench_rl_longtail import force_lengths, length_schedule  # noqa: E402


class Lengths:
    """Each new sequence's target length from one seeded stream; a carried sequence (its
    request is its prompt plus the tokens it already has) keeps its own."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.stream = iter([x for row in length_schedule(200, 64, args.max_tokens) for x in row])
        self.carried: dict[tuple[int, ...], tuple[int, int]] = {}  # prefix -> (target, done)

    def for_requests(self, prompts: list[list[int]], counts: list[int]) -> list[tuple[int, int]]:
        out = []
        for prompt, count in zip(prompts, counts, strict=True):
            for _ in range(count):
                out.append(self.carried.pop(tuple(prompt), None) or (next(self.stream), 0))
        return out

    def carry(self, prompts: list[list[int]], completions: list, plan: list[tuple[int, int]]) -> None:
        for completion, (target, done) in zip(completions, plan, strict=True):
            total = done + len(completion.token_ids)
            if completion.finish_reason == "length" and total < target:
                prompt = prompts[completion.prompt_index]
                self.carried[tuple(prompt) + tuple(completion.token_ids)] = (target, total)


def time_astrai(model_dir: Path, work: Path, args: argparse.Namespace) -> dict:
    from astrai_core.sampling import torch_sampler
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(str(model_dir)).eos_token_id
    plain_choose, plain_generate = torch_sampler.choose, torch_sampler.TorchSampler.generate
    lengths, plan = Lengths(args), []

    def choose(rows, sampling, logits):
        forced = force_lengths(logits, [plan[r.index][1] + len(r.token_ids) for r in rows],
                               [plan[r.index][0] for r in rows], eos)
        return plain_choose(rows, sampling, forced)

    def generate(self, prompts, params, *positional, **kwargs):
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        plan[:] = lengths.for_requests([list(p) for p in prompts], [p.n for p in per_prompt])
        out = plain_generate(self, prompts, params, *positional, **kwargs)
        lengths.carry([list(p) for p in prompts], out, list(plan))
        return out

    torch_sampler.choose = choose
    torch_sampler.TorchSampler.generate = generate
    overrides: dict = {"trainer": {"micro_batch_tokens": 4096}}
    if args.only == "partial":
        overrides["rollout"] = {"partial": True, "max_staleness": args.staleness,
                                "partial_tokens": args.partial_tokens}
        overrides["strategy"] = {"rollout_correction": {"level": "token", "mode": "truncate",
                                                        "threshold": 2.0}}
    # one decode batch of every sequence in flight, as sync has one of its rollout's rows
    rows = args.prompts * args.group * (2 if args.only == "partial" else 1)
    records = train_astrai(model_dir, work, args, {"max_new_tokens": args.max_tokens,
                                                   "max_batch_size": rows}, overrides)
    steps = [r for r in records if "time/step_seconds" in r]
    rows = args.prompts * args.group  # trained per step
    return {"seconds": [r["time/step_seconds"] for r in steps],
            "tokens": [r["rollout/response_length_mean"] * rows for r in steps],
            "masked": [r.get("rollout/stale_masked_fraction", 0.0) for r in steps]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, steps=8, prompts=4, size="tiny")
    parser.add_argument("--max-tokens", type=int, default=512, help="longest completion")
    parser.add_argument("--staleness", type=int, default=2, help="rollout.max_staleness")
    parser.add_argument("--partial-tokens", type=int, default=64, help="rollout.partial_tokens")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", choices=("sync", "partial"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        if args.threads:
            torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            result = time_astrai(Path(args.model_dir), Path(tmp), args)
        print("RESULT " + json.dumps(result), flush=True)
        return
    runs: dict[str, dict[str, list[float]]] = {
        who: {"seconds": [], "tokens": [], "masked": []} for who in ("sync", "partial")}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "hf"
        make_model(model_dir, args.size, max_positions=args.max_tokens + 64)
        for _ in range(args.rounds):
            for who in runs:
                result = child_json(__file__, "RESULT", who, model_dir, sys.argv[1:])
                for key, values in result.items():
                    runs[who][key] += values[1:]  # the first step pays one-off costs
    print(f"GRPO step, long-tailed completions (<= {args.max_tokens} tokens), {args.size} "
          f"model, {args.prompts} prompts x {args.group}, packed micro-batches, "
          f"{args.threads} thread(s), CPU; partial: max_staleness {args.staleness}, "
          f"partial_tokens {args.partial_tokens}")
    rate = {}
    for who, run in runs.items():
        rate[who] = sum(run["tokens"]) / sum(run["seconds"])
        print(f"  {who:<8} {statistics.median(run['seconds']):7.3f} s/step "
              f"{rate[who]:7.0f} trained tok/s  stale-masked {statistics.mean(run['masked']):.1%}")
    print(f"  partial / sync throughput: {rate['partial'] / rate['sync']:.2f}x (goal >= 1.5x)")


if __name__ == "__main__":
    main()
