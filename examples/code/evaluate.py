"""Held-out pass rates of a code checkpoint: greedy, and sampled at the GRPO temperature.

Run: ``python examples/code/evaluate.py runs/code/sft/checkpoints/step_300``. Every
program runs with its row's tests in the sandbox (the ``code_tests`` reward, every test
passing). ``greedy`` decodes each held-out prompt once at temperature 0; ``sampled``
draws ``--samples`` programs per prompt at ``--temperature`` (seeded) and gives the mean
pass rate (pass@1) and the unbiased pass@k. Prints one JSON line (``--json``: also
writes it to a file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from calc.evaluate import print_result, prompt_records  # noqa: E402  (examples/calc/evaluate.py)

EVAL = Path("runs/code/data/eval.jsonl")
MAX_NEW_TOKENS = 36
REWARD = {"name": "code_tests", "mode": "all", "max_workers": 4, "timeout": 5}


def pass_rates(checkpoint: Path, data: Path = EVAL, samples: int = 4,
               temperature: float = 1.0, seed: int = 0) -> dict[str, float]:
    import torch
    from transformers import AutoTokenizer

    from astrai_core.api import load_pretrained
    from astrai_core.rewards.reward_set import RewardSet
    from astrai_core.rollout.evaluate import evaluate_generation
    from astrai_core.sampling.torch_sampler import TorchSampler

    torch.set_num_threads(1)  # as the trainer pins it (trainer.threads): the same numbers
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    sampler = TorchSampler(load_pretrained(str(checkpoint)).eval(), tokenizer)
    rewards = RewardSet.from_config([REWARD])
    records = prompt_records(tokenizer, data)
    common = {"max_new_tokens": MAX_NEW_TOKENS, "batch_size": 100, "accuracy_reward": "code_tests"}
    greedy = evaluate_generation(sampler, tokenizer, records, rewards, **common)
    sampled = evaluate_generation(sampler, tokenizer, records, rewards, samples=samples,
                                  temperature=temperature, seed=seed, **common)
    return {"greedy": greedy["eval/accuracy"], "sampled": sampled["eval/accuracy"],
            f"pass@{samples}": sampled[f"eval/pass@{samples}"], "temperature": temperature}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data", type=Path, default=EVAL)
    parser.add_argument("--samples", type=int, default=4, help="programs per prompt when sampling")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    print_result(pass_rates(args.checkpoint, args.data, args.samples, args.temperature, args.seed),
                 args.json)


if __name__ == "__main__":
    main()
