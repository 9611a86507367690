"""GRPO on a long-tailed workload: astrai vs TRL's GRPOTrainer, on CPU.

Real RL rollouts are long-tailed: most completions are short, a few run to the limit.
Here every completion's length is drawn once from a fixed, seeded distribution (by
default 90% uniform in [4, 63] tokens, 10% uniform in [64, 512]); a deterministic
logits processor (:func:`force_lengths`, the same function for both trainers) forbids
EOS before a row's length and forces it there. Row i of the k-th generation call of a
run gets length ``lengths[k][i]`` in both trainers (both order a rollout's rows prompt by
prompt, the completions of a prompt together).

Everything else is as in bench_grpo_trl.py: the same Llama-shaped model, prompts,
reward, learning rate, token-mean PPO-clip loss without KL, float32, no activation
checkpointing; each trainer runs in a fresh process (astrai variants and TRL
alternating, ``--rounds`` times). A step is one rollout + one optimizer step.

Reported per trainer (medians over steps, the first step of every run left out):
- step time and completion tokens per second;
- padding fraction: the share of the training forward's token slots that are padding
  (from the known lengths: rows x (longest prompt + longest completion) per padded
  micro-batch, the packed tokens when ``trainer.micro_batch_tokens`` packs them);
- sampler idle fraction: the share of the step during which the sampler is not
  generating (it waits on the trainer), and the decode-slot idle fraction: the share
  of a static decode batch's row-steps spent on rows that already finished (a sampler
  that drops finished rows, as astrai's does, spends no compute on them).

    .venv/bin/python bench/bench_rl_longtail.py [--steps 4] [--prompts 4] [--group 8]
        [--max-tokens 512] [--rounds 1]

The astrai variants: ``astrai`` (every throughput option off: one decode batch of all the
completions, padded micro-batches), ``astrai+pack`` (``trainer.micro_batch_tokens``) and
``astrai+pack+cb8`` (also a decode batch of 8 rows, continuously refilled).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpo_trl import (add_run_arguments, child_json, digit_reward,  # noqa: E402,F401
                            make_model, prompts, train_astrai, train_trl)

EOS_FORCED = 0.0


def length_schedule(calls: int, rows: int, max_tokens: int, seed: int = 0,
                    long_share: float = 0.1) -> list[list[int]]:
    """The completion length of every row of every generation call: fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    short = rng.integers(4, 64, size=(calls, rows))
    long = rng.integers(64, max_tokens + 1, size=(calls, rows))
    pick_long = rng.random((calls, rows)) < long_share
    return np.where(pick_long, long, short).tolist()


def force_lengths(scores: torch.Tensor, generated: list[int], targets: list[int],
                  eos: int) -> torch.Tensor:
    """Row r has produced ``generated[r]`` tokens and must end after ``targets[r]``: its
    EOS is forbidden before the last token and the only choice at it."""
    scores = scores.clone()
    for row, (count, target) in enumerate(zip(generated, targets, strict=True)):
        if count + 1 >= target:
            scores[row] = -float("inf")
            scores[row, eos] = EOS_FORCED
        else:
            scores[row, eos] = -float("inf")
    return scores


class Schedule:
    """The lengths of the current generation call (a call counter shared by the patches)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.lengths = length_schedule(args.steps + 1, args.prompts * args.group, args.max_tokens)
        self.call = -1
        self.generate_seconds = 0.0
        self.mean_lengths: list[float] = []  # as the trainer measured them, per step

    def start_call(self) -> list[int]:
        self.call += 1
        return self.lengths[self.call]


def padding_fractions(lengths: list[int], prompt_tokens: list[int], packed: bool) -> float:
    """The training forward's padding share over one step's rows."""
    real = sum(lengths) + sum(prompt_tokens)
    if packed:
        return 0.0
    slots = len(lengths) * (max(lengths) + max(prompt_tokens))
    return 1.0 - real / slots


def slot_idle(lengths: list[int]) -> float:
    """Share of a static decode batch's row-steps spent on finished rows."""
    return 1.0 - sum(lengths) / (len(lengths) * max(lengths))


# ---------------------------------------------------------------------- TRL
def time_trl(model_dir: Path, work: Path, args: argparse.Namespace, schedule: Schedule
             ) -> list[float]:
    from transformers import (AutoModelForCausalLM, AutoTokenizer, LogitsProcessor,
                              LogitsProcessorList)

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    eos = tokenizer.eos_token_id

    class ForceLengths(LogitsProcessor):
        def __init__(self, prompt_width: int, targets: list[int]) -> None:
            self.prompt_width, self.targets = prompt_width, targets

        def __call__(self, input_ids, scores):
            generated = input_ids.shape[1] - self.prompt_width
            return force_lengths(scores, [generated] * len(self.targets), self.targets, eos)

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    plain_generate = model.generate

    def generate(*positional, **kwargs):
        width = kwargs["input_ids"].shape[1]
        processor = ForceLengths(width, schedule.start_call())
        start = time.perf_counter()
        out = plain_generate(*positional, logits_processor=LogitsProcessorList([processor]),
                             **kwargs)
        schedule.generate_seconds += time.perf_counter() - start
        return out

    model.generate = generate
    trainer, steps = train_trl(model, tokenizer, work, args, args.max_tokens)
    schedule.mean_lengths = [r["completions/mean_length"] for r in trainer.state.log_history
                             if "completions/mean_length" in r]
    return steps


# ---------------------------------------------------------------------- astrai
VARIANTS = {
    "astrai": {},
    "astrai+pack": {"trainer": {"micro_batch_tokens": 4096}},
    # continuous batching: fewer decode rows than completions, slots refilled
    "astrai+pack+cb8": {"trainer": {"micro_batch_tokens": 4096},
                        "sampler": {"max_batch_size": 8}},
}


def time_astrai(model_dir: Path, work: Path, args: argparse.Namespace, schedule: Schedule
                ) -> list[float]:
    from astrai_core.sampling import torch_sampler
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(str(model_dir)).eos_token_id
    plain_choose, plain_generate = torch_sampler.choose, torch_sampler.TorchSampler.generate
    targets: list[int] = []

    def choose(rows, sampling, logits):  # both decoders (one batch, continuous) call it
        forced = force_lengths(logits, [len(r.token_ids) for r in rows],
                               [targets[r.index] for r in rows], eos)
        return plain_choose(rows, sampling, forced)

    def generate(self, *positional, **kwargs):
        targets[:] = schedule.start_call()
        start = time.perf_counter()
        out = plain_generate(self, *positional, **kwargs)
        schedule.generate_seconds += time.perf_counter() - start
        return out

    torch_sampler.choose = choose
    torch_sampler.TorchSampler.generate = generate

    records = train_astrai(model_dir, work, args, {"max_new_tokens": args.max_tokens},
                           VARIANTS[args.only])
    schedule.mean_lengths = [r["rollout/response_length_mean"] for r in records
                             if "rollout/response_length_mean" in r]
    return [r["time/step_seconds"] for r in records if "time/step_seconds" in r]


# ---------------------------------------------------------------------- driver
def run_one(args: argparse.Namespace) -> None:
    """The child: one trainer's step times and generation seconds, as a JSON line."""
    if args.threads:
        torch.set_num_threads(args.threads)
    schedule = Schedule(args)
    with tempfile.TemporaryDirectory() as tmp:
        timer = time_trl if args.only == "trl" else time_astrai
        steps = timer(Path(args.model_dir), Path(tmp), args, schedule)
    print("RESULT " + json.dumps({"steps": steps, "generate": schedule.generate_seconds,
                                  "lengths": schedule.mean_lengths}), flush=True)


def child(who: str, model_dir: Path, argv: list[str]) -> dict:
    return child_json(__file__, "RESULT", who, model_dir, argv)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, steps=4, prompts=4, size="tiny")
    parser.add_argument("--max-tokens", type=int, default=512, help="longest completion")
    parser.add_argument("--rounds", type=int, default=1,
                        help="each trainer once per round, each run in a fresh process")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="astrai variants to run, comma-separated")
    parser.add_argument("--only", choices=("trl", *VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    return parser.parse_args()


def run_rounds(args: argparse.Namespace, who_runs: list[str]
               ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]],
                          list[int]]:
    """Every trainer once per round, each in a fresh process: its step seconds (the first
    step of a run left out), the share of each run the sampler was idle, its measured mean
    completion lengths; and the token count of every prompt."""
    argv = sys.argv[1:]
    steps: dict[str, list[float]] = {who: [] for who in who_runs}
    idle: dict[str, list[float]] = {who: [] for who in who_runs}
    measured: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "hf"
        make_model(model_dir, args.size, max_positions=args.max_tokens + 64)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        for _ in range(args.rounds):
            for who in who_runs:
                result = child(who, model_dir, argv)
                steps[who] += result["steps"][1:]  # the first step pays one-off costs
                idle[who].append(1.0 - result["generate"] / sum(result["steps"]))
                measured[who] = result["lengths"]
    prompt_tokens = [len(tokenizer(p)["input_ids"]) for p in prompts(args.prompts * args.steps)]
    return steps, idle, measured, prompt_tokens


def main() -> None:
    args = parse_args()
    if args.only:
        return run_one(args)
    who_runs = ["trl", *args.variants.split(",")]
    steps, idle, measured, prompt_tokens = run_rounds(args, who_runs)
    lengths = length_schedule(args.steps + 1, args.prompts * args.group, args.max_tokens)[:args.steps]
    per_step = [prompt_tokens[i * args.prompts:(i + 1) * args.prompts] for i in range(args.steps)]
    completion_tokens = statistics.mean(sum(row) for row in lengths)
    every = [x for row in lengths for x in row]
    print(f"GRPO step, long-tailed completions, {args.size} model, {args.prompts} prompts x "
          f"{args.group} completions, lengths: median {int(np.median(every))}, max "
          f"{max(every)} (of {args.max_tokens}), mean {completion_tokens:.0f} completion tokens "
          f"per step, {args.threads} thread(s), CPU, {args.rounds} round(s)")
    trl_median = statistics.median(steps["trl"])
    print(f"  {'trainer':<16} {'s/step':>7} {'tok/s':>7} {'padding':>8} {'sampler idle':>13} "
          f"{'decode-slot idle':>17} {'/ TRL time':>11}")
    for who in who_runs:
        median = statistics.median(steps[who])
        packed = who != "trl" and "micro_batch_tokens" in VARIANTS[who].get("trainer", {})
        padding = statistics.mean(
            padding_fractions(row, [p for p in prompts_row for _ in range(args.group)], packed)
            for row, prompts_row in zip(lengths, per_step))
        slots = statistics.mean(slot_idle(row) for row in lengths) if who == "trl" else 0.0
        print(f"  {who:<16} {median:7.3f} {completion_tokens / median:7.0f} {padding:8.1%} "
              f"{statistics.mean(idle[who]):13.1%} {slots:17.1%} {median / trl_median:11.2f}")
    # What computing each group's shared prompt once in the training forward could save:
    # at most (G - 1) / G of the prompt tokens of a packed step.
    prompt_share = statistics.mean(
        args.group * sum(p) / (args.group * sum(p) + sum(row)) for row, p in zip(lengths, per_step))
    print(f"  prompt tokens: {prompt_share:.1%} of a packed step's tokens; computing each "
          f"group's prompt once would remove at most {prompt_share * (args.group - 1) / args.group:.1%}")
    scheduled = [statistics.mean(row) for row in lengths]
    print(f"  mean completion length per step, scheduled: {_fmt(scheduled)}; "
          + "; ".join(f"{who}: {_fmt(values)}" for who, values in measured.items()))
    print("  target: long-tail GRPO step <= 0.5x TRL's time; padding < 10%")


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    main()
