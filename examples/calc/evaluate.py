"""Held-out accuracy of a calc checkpoint with the calculator and without it.

Run: ``python examples/calc/evaluate.py runs/calc/sft/checkpoints/step_300``. With the
tool: greedy episodes with the ``tools`` environment on ``eval_tool.jsonl`` (the system
message offers the calculator). Without: greedy single completions on
``eval_no_tool.jsonl`` (no system message, no environment: a tool call is just text and
scores 0), so the model must multiply and add in its head. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

DATA = Path("runs/calc/data")
CALCULATOR = "astrai_core.environments.calculator:calculator"
MAX_NEW_TOKENS = 24


def prompt_records(tokenizer, path: Path) -> list[dict]:
    """The prompt rows of a JSONL file, rendered, with their other columns for the rewards."""
    from astrai_core.data.render import render_prompt

    records = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        text, ids = render_prompt(tokenizer, {"prompt": None, "messages": row["messages"]})
        columns = {key: value for key, value in row.items() if key != "messages"}
        records.append({"prompt_ids": ids, "prompt_text": text, "columns": columns})
    return records


def accuracies(checkpoint: Path, data: Path = DATA) -> dict[str, float]:
    from transformers import AutoTokenizer

    from astrai_core.api import load_pretrained
    from astrai_core.environments.episode_config import EpisodeConfig
    from astrai_core.environments.tools import Tools
    from astrai_core.rewards.reward_set import RewardSet
    from astrai_core.rollout.episodes import EpisodeRunner
    from astrai_core.rollout.evaluate import evaluate_episodes, evaluate_generation
    from astrai_core.sampling.torch_sampler import TorchSampler

    import torch

    torch.set_num_threads(1)  # as the trainer pins it (trainer.threads): the same numbers
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    sampler = TorchSampler(load_pretrained(str(checkpoint)).eval(), tokenizer)
    rewards = RewardSet.from_config([{"name": "exact_match"}])
    episodes = EpisodeRunner(Tools(tools=[CALCULATOR]), sampler, tokenizer, rewards,
                             EpisodeConfig(max_turns=3), pad_token_id=tokenizer.pad_token_id)
    with_tool = evaluate_episodes(episodes, prompt_records(tokenizer, data / "eval_tool.jsonl"),
                                  max_new_tokens=MAX_NEW_TOKENS, batch_size=100)
    without = evaluate_generation(sampler, tokenizer, prompt_records(tokenizer, data / "eval_no_tool.jsonl"),
                                  rewards, max_new_tokens=MAX_NEW_TOKENS, batch_size=100)
    return {"with_tool": with_tool["eval/accuracy"], "without_tool": without["eval/accuracy"],
            "tool_calls_per_episode": with_tool["eval/tool_calls_mean"],
            "tool_error_rate": with_tool["eval/tool_error_rate"]}


def print_result(numbers: dict[str, float], path: Path | None) -> None:
    """Print ``numbers`` as one JSON line, and write it to ``path`` when given."""
    result = json.dumps(numbers)
    print(result)
    if path is not None:  # written aside, then renamed: never a half-written file
        partial = path.with_name(path.name + ".partial")
        partial.write_text(result + "\n")
        partial.replace(path)


def evaluation_main(description: str, default_data: Path,
                    evaluate: Callable[[Path, Path], dict[str, float]]) -> None:
    """A demo's evaluation command: ``CHECKPOINT [--data PATH] [--json FILE]``, whose
    numbers (``evaluate(checkpoint, data)``) go out through :func:`print_result`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data", type=Path, default=default_data)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    print_result(evaluate(args.checkpoint, args.data), args.json)


def main() -> None:
    evaluation_main(__doc__.splitlines()[0], DATA, accuracies)


if __name__ == "__main__":
    main()
