"""`astrai eval MODEL_DIR --data FILE`: score a checkpoint on a prompt set.

The same code as evaluation during training (:func:`evaluate_generation`): the prompts go
through the data pipeline (any source `data.eval` takes, with its renames), the sampler
generates, the reward functions score. Greedy with one sample per prompt by default, as
in training; ``--n K --temperature T`` samples K completions per prompt and adds pass@k.
Under torchrun (``torchrun --nproc-per-node N -m astrai_core.cli.main eval ...``) the
prompts are shared out over the processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="native checkpoint directory")
    parser.add_argument("--data", required=True, help="prompt-format data: .jsonl, .parquet, "
                        ".json, .csv, .arrow, a save_to_disk directory or hf://NAME")
    parser.add_argument("--split", default="train", help="split of a hub or DatasetDict source")
    parser.add_argument("--subset", default=None, help="subset of a hub dataset")
    parser.add_argument("--columns", default=None, metavar="JSON",
                        help='renames, e.g. \'{"question": "prompt"}\'')
    parser.add_argument("--transform", default=None, metavar="MODULE:FUNCTION",
                        help="applied to each row after the renames, as data.eval.transform")
    parser.add_argument("--rewards", nargs="+", default=["exact_match"], metavar="NAME",
                        help="reward functions (registered names or module:function); the "
                        "accuracy is exact_match, gsm8k or math_verify when listed, else the first one")
    parser.add_argument("--n", type=int, default=1, help="completions per prompt (pass@k)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="default 0 (greedy) for --n 1, else 1.0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=16,
                        help="as trainer.eval_max_new_tokens (default 16)")
    parser.add_argument("--max-prompt-len", type=int, default=None,
                        help="as data.max_prompt_len: longer prompts are skipped (default: "
                        "the model's context less --max-new-tokens)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per generate call "
                        "(as data.eval_batch_size)")
    parser.add_argument("--cache-dir", default=None, help="as data.cache_dir: where the "
                        "tokenized prompts are cached (default .cache/astrai/data)")
    parser.add_argument("--sampler", default="torch", help="registered sampler")
    parser.add_argument("--device", default="auto", help="device backend name")
    parser.add_argument("--out", default=None, metavar="FILE.json", help="also write the "
                        "metrics there")


def run(args: argparse.Namespace) -> int:
    from astrai_core.errors import ConfigError

    if args.n < 1:
        raise ConfigError("--n: must be at least 1")
    temperature = args.temperature if args.temperature is not None else \
        (0.0 if args.n == 1 else 1.0)
    if args.n > 1 and temperature == 0.0:
        raise ConfigError("--temperature: 0 (greedy) gives --n identical completions; "
                          "sample with a temperature > 0")
    metrics = evaluate_checkpoint(args, temperature)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # rank 0 prints and writes
    text = json.dumps(metrics, indent=2)
    if args.out:
        out = Path(args.out)
        staging = out.with_name(f".{out.name}.tmp")
        staging.write_text(text + "\n")
        os.replace(staging, out)
    sys.stdout.write(text + "\n")
    return 0


def evaluate_checkpoint(args: argparse.Namespace, temperature: float) -> dict[str, Any]:
    """The metrics over ``--data``. Under torchrun each rank scores every world_size-th
    prompt and rank 0 combines the means, weighted by prompts (every metric is a mean over
    prompts, or over their equally many completions)."""
    from astrai_core.config.parallel import ParallelConfig
    from astrai_core.config.plan import Resolver
    from astrai_core.devices.select import resolve_device
    from astrai_core.distributed.context import init_distributed
    from astrai_core.distributed.metrics import combine_shares
    from astrai_core.plugins import process_registry
    from astrai_core.rewards.reward_set import RewardSet

    registry = process_registry()
    resolve = Resolver(registry)
    choices = [resolve.reward(name, 1.0, {}, ("--rewards", i))
               for i, name in enumerate(args.rewards)]
    rewards = RewardSet.from_choices(choices)
    dist = init_distributed(resolve_device(registry, args.device), ParallelConfig())
    model, tokenizer = _load_on(args, registry, dist)
    budget = prompt_budget(args.max_prompt_len, args.max_new_tokens,
                           getattr(model.config, "max_position_embeddings", None))
    records = _prompts(args, tokenizer, {c.label: c.required_columns for c in choices}, budget)
    mine = records[dist.rank::dist.world_size]
    metrics = _score(args, resolve, model, tokenizer, mine, rewards, choices, temperature) \
        if mine else {}
    combined = combine_shares(dist, len(mine), metrics)
    return {"model": str(args.model_dir), "data": str(args.data), "prompts": len(records),
            "n": args.n, "temperature": temperature, "processes": dist.world_size, **combined}


def _load_on(args: argparse.Namespace, registry: Any, dist: Any) -> tuple[Any, Any]:
    """The checkpoint and its tokenizer, on this rank's device."""
    from astrai_core.cli.inference import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(Path(args.model_dir), args.device, registry)
    if dist.enabled:
        model = model.to(dist.device)
    return model.eval(), tokenizer


def _score(args: argparse.Namespace, resolve: Any, model: Any, tokenizer: Any,
           records: list[Any], rewards: Any, choices: list[Any], temperature: float
           ) -> dict[str, float]:
    from astrai_core.plugins.sampler_capabilities import sampler_capabilities
    from astrai_core.rollout.evaluate import ACCURACY_REWARDS, evaluate_generation

    sampler = resolve.component("sampler", args.sampler, {}, ("--sampler",)).target(
        model=model, tokenizer=tokenizer)
    labels = [c.label for c in choices]
    accuracy = next((name for name in ACCURACY_REWARDS if name in labels), labels[0])
    import torch

    try:
        with torch.no_grad():
            metrics = evaluate_generation(sampler, tokenizer, records, rewards,
                                          max_new_tokens=args.max_new_tokens,
                                          batch_size=args.batch_size, samples=args.n,
                                          temperature=temperature, seed=args.seed,
                                          accuracy_reward=accuracy)
    finally:  # an engine or workers the sampler holds go, also on an error
        if sampler_capabilities(sampler).needs_close:
            sampler.close()
    return metrics


def prompt_budget(max_prompt_len: int | None, max_new_tokens: int, context: int | None
                  ) -> int | None:
    """The longest prompt to score: ``--max-prompt-len`` when given, else what the
    model's context leaves after ``--max-new-tokens`` (as ``data.max_prompt_len``'s
    default in a run); a ConfigError when the two cannot fit together."""
    from astrai_core.errors import ConfigError

    if context is None:
        return max_prompt_len
    if max_new_tokens >= context:
        raise ConfigError(f"--max-new-tokens: {max_new_tokens} generated tokens leave no room "
                          f"for a prompt in the model's context of {context} tokens")
    if max_prompt_len is not None and max_prompt_len + max_new_tokens > context:
        raise ConfigError(f"--max-prompt-len: {max_prompt_len} + --max-new-tokens "
                          f"{max_new_tokens} exceed the model's context of {context} tokens "
                          f"(at most {context - max_new_tokens} prompt tokens fit)")
    return max_prompt_len if max_prompt_len is not None else context - max_new_tokens


def _prompts(args: argparse.Namespace, tokenizer: Any, required: dict[str, Any],
             max_prompt_len: int | None) -> list[Any]:
    """The prompt records of ``--data``, through the same loader as ``data.eval``."""
    from astrai_core.data import build_eval_loader
    from astrai_core.data.config import DataConfig
    from astrai_core.errors import ConfigError

    columns = None
    if args.columns:
        try:
            columns = json.loads(args.columns)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--columns: not JSON ({exc.msg})") from None
    source = {"path": args.data, "format": "prompt", "split": args.split,
              "subset": args.subset, "columns": columns, "transform": args.transform}
    try:
        config = DataConfig.model_validate({"sources": [source], "eval": source,
                                            "batch_size": args.batch_size,
                                            "max_prompt_len": max_prompt_len,
                                            "cache_dir": args.cache_dir})
    except ValueError as exc:
        raise ConfigError(f"--data: {exc}") from None
    config = config.resolve_paths(Path.cwd())
    if not isinstance(config.eval.path, str) and not config.eval.path.exists():
        raise ConfigError(f"--data: not found: {config.eval.path}")
    loader = build_eval_loader(config, tokenizer, required_columns=required)
    return [record for batch in loader for record in batch]
