"""Time per GRPO step: astrai vs TRL's GRPOTrainer (HF generation, no vLLM), on CPU.

Both train the same Llama-shaped model (built with transformers, imported into astrai),
on the same prompts, with the same prompts per step, group size, completion length
(forced: no early stop), learning rate and loss (token-mean PPO-clip, no KL), float32
without activation checkpointing (TRL's bf16 and gradient-checkpointing defaults are
switched off), and the same reward function (TRL's calling convention, which astrai shares). A step is one
rollout + one optimizer step. Each trainer runs in a process of its own, so that neither
inherits the other's global torch state, and the two take their steps in turn (astrai's
step 2, TRL's step 2, TRL's step 3, astrai's step 3, ...: bench/lockstep.py), so that
the machine's load hits both alike; a round is one step of each, in fresh processes.
Prints the median step time of each (the first step of every run left out) and the
astrai / TRL ratio: the median of the per-step ratios.

    .venv/bin/python bench/bench_grpo_trl.py [--steps 6] [--prompts 8] [--group 8] [--tokens 16] [--rounds 2] [--device cpu] [--share-prompt]

TRL is a benchmark-only dependency: `make bench` installs bench/requirements.txt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))  # bench/lockstep.py
from lockstep import StepGate, median_ratio, interleave, register_gate_tracker  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "examples" / "arith" / "tokenizer"


def digit_reward(prompts, completions, **columns):
    """Fraction of digits in the completion: cheap, and the same for both trainers."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def make_model(directory: Path, size: str, max_positions: int = 256) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    dims = {"small": (256, 4, 688), "tiny": (128, 2, 344)}[size]
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=dims[0], num_hidden_layers=dims[1],
                         intermediate_size=dims[2], num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def prompts(count: int) -> list[str]:
    import random

    rng = random.Random(0)
    return [f"<|user|>{rng.randint(0, 99)}+{rng.randint(0, 99)}=<|end|><|assistant|>"
            for _ in range(count)]


def train_trl(model: Any, tokenizer: Any, work: Path, args: argparse.Namespace,
              completion_length: int, **options: Any) -> tuple[Any, list[float]]:
    """TRL's GRPO run of ``model``: (the trainer, its step times). ``options``: more
    GRPOConfig fields."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    steps: list[float] = []
    gate = StepGate() if getattr(args, "lockstep", False) else None
    resumed = [0.0]

    class Stamp(TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            # a step runs from the previous one's end (or go-ahead) to its own end
            steps.append(time.perf_counter() - resumed[0])
            if gate is not None:
                gate.step_done(steps[-1])
            resumed[0] = time.perf_counter()

    config = GRPOConfig(
        output_dir=str(work / "trl"), use_cpu=getattr(args, "device", "cpu") == "cpu", report_to="none", logging_steps=1,
        max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant",
        warmup_steps=0, per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group, max_completion_length=completion_length, temperature=1.0,
        beta=0.0, loss_type="dapo", epsilon=0.2, save_strategy="no", seed=0,
        max_grad_norm=1.0, dataloader_num_workers=0,
        # TRL 1.x defaults to bf16 autocast and gradient checkpointing; astrai trains this
        # model in float32 without checkpointing, so compare like with like.
        bf16=False, gradient_checkpointing=False, **options,
    )
    dataset = Dataset.from_list([{"prompt": p} for p in prompts(args.prompts * args.steps)])
    trainer = GRPOTrainer(model=model, reward_funcs=digit_reward, args=config,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[Stamp()])
    resumed[0] = time.perf_counter()
    trainer.train()
    return trainer, steps


def time_trl(model_dir: Path, work: Path, args: argparse.Namespace) -> list[float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    _, steps = train_trl(model, AutoTokenizer.from_pretrained(str(model_dir)), work, args,
                         args.tokens, generation_kwargs={"min_new_tokens": args.tokens})
    return steps


def train_astrai(model_dir: Path, work: Path, args: argparse.Namespace, sampler: dict,
                 overrides: dict | None = None) -> list[dict]:
    """astrai's GRPO run on the model in ``model_dir`` (imported), with these ``sampler``
    options and section ``overrides``: its metrics records."""
    from astrai_core.checkpoints.hf.select import importer_for_hf_dir
    from astrai_core.config import load_config
    from astrai_core.plugins import load_plugins
    from astrai_core.training.run import train

    native = work / "native"
    importer_for_hf_dir(load_plugins(), model_dir).import_checkpoint(model_dir, native)
    config = astrai_config(work, native, args, sampler, overrides)
    path = work / "astrai.yaml"
    path.write_text(yaml.safe_dump(config))
    sys.path.insert(0, str(Path(__file__).parent))  # the reward is `bench_grpo_trl:digit_reward`
    train(load_config(path))
    return [json.loads(line) for line in (work / "astrai" / "metrics.jsonl").read_text()
            .splitlines()]


def astrai_config(work: Path, native: Path, args: argparse.Namespace, sampler: dict,
                  overrides: dict | None = None) -> dict:
    """The run config of :func:`train_astrai` (its prompts written to ``work``)."""
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n"
                            for p in prompts(args.prompts * args.steps)))
    config = {
        "output_dir": str(work / "astrai"),
        "model": {"path": str(native)},
        # The prompts are in the chat markup already, and TRL feeds a string prompt as
        # raw text: the template around them again would give astrai 12 tokens to TRL's 9.
        "data": {"sources": [{"path": str(data), "format": "prompt", "chat_template": False}],
                 "batch_size": args.prompts, "shuffle": False, "cache_dir": str(work / "cache")},
        "strategy": {"name": "grpo", "group_size": args.group, "eps_low": 0.2, "eps_high": 0.2,
                     "loss_aggregation": "token-mean"},
        "rewards": [{"name": f"{Path(__file__).stem}:digit_reward"}],
        "sampler": {"temperature": 1.0, **_engine_defaults(args, sampler), **sampler},
        "device": {"name": getattr(args, "device", "cpu")},
        "trainer": {"max_steps": args.steps, "lr": args.lr, "schedule": "constant",
                    "max_grad_norm": 1.0, "eval_at_start": False, "save_every": 0,
                    "progress": False},
    }
    for section, options in (overrides or {}).items():
        config.setdefault(section, {}).update(options)
    return config


def _engine_defaults(args: argparse.Namespace, sampler: dict) -> dict:
    """The torch sampler with one decode batch of a rollout, unless ``sampler`` names
    another (whose engine options are its own business)."""
    if sampler.get("name", "torch") != "torch":
        return {}
    return {"name": "torch", "max_batch_size": args.prompts * args.group}


def time_astrai(model_dir: Path, work: Path, args: argparse.Namespace) -> list[float]:
    trainer: dict[str, Any] = {"share_prompt": bool(getattr(args, "share_prompt", False))}
    if args.lockstep:  # the tracker waits for the go-ahead after each timed step
        register_gate_tracker()
        trainer["report_to"] = [{"name": "lockstep"}]
    # No stop token (the default is the EOS): every completion is args.tokens long, as TRL's.
    records = train_astrai(model_dir, work, args,
                           {"max_new_tokens": args.tokens, "stop_token_ids": []},
                           {"trainer": trainer})
    return [r["time/step_seconds"] for r in records if "time/step_seconds" in r]


def run_one(args: argparse.Namespace) -> None:
    """The child: one trainer's step times, as a JSON line, on the model in --model-dir."""
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        timer = time_astrai if args.only == "astrai" else time_trl
        steps = timer(Path(args.model_dir), Path(tmp), args)
    print("STEPS " + json.dumps(steps), flush=True)


def child_json(script: str, tag: str, who: str, model_dir: Path, argv: list[str]) -> Any:
    """``script`` run as the child measuring ``who``: the JSON it printed after ``tag``."""
    command = [sys.executable, script, *argv, "--only", who, "--model-dir", str(model_dir)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the {who} run failed:\n{out.stderr[-3000:]}")
    line = next(line for line in out.stdout.splitlines() if line.startswith(tag + " "))
    return json.loads(line[len(tag) + 1:])


def add_run_arguments(parser: argparse.ArgumentParser, *, steps: int, prompts: int,
                      size: str) -> None:
    """The options both GRPO benchmarks share (with their own defaults)."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--prompts", type=int, default=prompts, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--size", choices=("tiny", "small"), default=size)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=1)


def measure(args: argparse.Namespace, argv: list[str]) -> dict[str, list[float]]:
    """Each round: astrai and TRL in fresh processes, their steps in turn (the first step
    of each run left out: it pays one-off costs, and it runs while the other starts)."""
    steps: dict[str, list[float]] = {"astrai": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "hf"
        make_model(model_dir, args.size)
        child = [sys.executable, __file__, *argv, "--lockstep", "--model-dir", str(model_dir)]
        for round_index in range(args.rounds):
            # who starts first alternates between rounds as well as between steps
            order = list(steps) if round_index % 2 == 0 else list(reversed(steps))
            times = interleave({who: [*child, "--only", who] for who in order}, args.steps)
            for who in steps:
                steps[who] += times[who][1:]
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, steps=6, prompts=8, size="small")
    parser.add_argument("--tokens", type=int, default=16, help="completion length")
    parser.add_argument("--rounds", type=int, default=2,
                        help="fresh astrai and TRL processes, their steps taken in turn")
    parser.add_argument("--device", default="cpu",
                        help="device backend of both trainers (cpu, cuda, npu)")
    parser.add_argument("--share-prompt", action="store_true",
                        help="astrai computes each group's prompt once (trainer.share_prompt)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--only", choices=("astrai", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--lockstep", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step of each run is left out")
    if args.only:
        return run_one(args)
    steps = measure(args, sys.argv[1:])
    report(args, steps)


def report(args: argparse.Namespace, steps: dict[str, list[float]]) -> None:
    astrai_median = statistics.median(steps["astrai"])
    trl_median = statistics.median(steps["trl"])
    ratio = median_ratio(steps["astrai"], steps["trl"])
    print(f"GRPO step, {args.size} model, {args.prompts} prompts x {args.group} completions x "
          f"{args.tokens} tokens, {args.threads} thread(s), {args.device}, {args.rounds} rounds, "
          "steps interleaved" + (", astrai with trainer.share_prompt" if args.share_prompt else ""))
    print(f"  astrai: {astrai_median:.3f} s/step   (steps: {', '.join(f'{s:.2f}' for s in steps['astrai'])})")
    print(f"  TRL   : {trl_median:.3f} s/step   (steps: {', '.join(f'{s:.2f}' for s in steps['trl'])})")
    print(f"  astrai / TRL time ratio: {ratio:.2f}, the median of {len(steps['trl'])} per-step "
          f"ratios (ratio of the medians: {astrai_median / trl_median:.2f}; target <= 0.5)")
    if args.json is not None:
        figures = {"astrai_steps": steps["astrai"], "trl_steps": steps["trl"],
                   "astrai_median_seconds": astrai_median, "trl_median_seconds": trl_median,
                   "time_ratio": ratio, "device": args.device}
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
