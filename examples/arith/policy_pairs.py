"""Preference pairs from a policy's own mistakes, for the reward model of the RLHF demo.

For training problems that are not among the PPO prompts (``rl_prompts.jsonl``), the
policy samples ``--samples`` answers at the PPO sampler's temperature; every prompt with a
wrong sample gives one pair: the right answer chosen, a wrong sample rejected. A reward
model trained on near misses alone ranks the policy's own mistakes worse than near misses
(see docs/reward-models.md); these pairs show it the mistakes PPO will make. Run from the
repository root:

    python examples/arith/policy_pairs.py --policy runs/demo/sft/checkpoints/step_400 \
        --out runs/demo/data/rm_policy_train.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

from astrai_core.api import SamplingParams, load_pretrained, load_tokenizer, process_registry

DATA = Path("runs/demo/data")
END = 5  # <|end|>: the token generation stops at


def questions(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` distinct (question, answer) training problems that PPO never sees."""
    ppo = {json.loads(line)["messages"][0]["content"]
           for line in (DATA / "rl_prompts.jsonl").read_text().splitlines()}
    seen, found = set(), []
    for line in (DATA / "sft_train.jsonl").read_text().splitlines():
        user, assistant = json.loads(line)["messages"]
        if user["content"] not in ppo and user["content"] not in seen:
            seen.add(user["content"])
            found.append((user["content"], assistant["content"]))
    random.Random(seed).shuffle(found)
    return found[:n]


def pairs(policy: Path, n: int, samples: int, temperature: float, seed: int) -> list[dict]:
    tokenizer = load_tokenizer(policy)
    model = load_pretrained(policy)
    model.eval()
    sampler = process_registry().get("sampler", "torch").load()(model=model)
    problems = questions(n, seed)
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False) for q, _ in problems]
    params = SamplingParams(max_new_tokens=6, temperature=temperature, n=samples, seed=seed,
                            stop_token_ids=[END])
    wrong: dict[int, list[str]] = {}
    for out in sampler.generate(prompts, params):
        text = tokenizer.decode(out.token_ids, skip_special_tokens=True).strip()
        if text != problems[out.prompt_index][1]:
            wrong.setdefault(out.prompt_index, []).append(text)
    rng = random.Random(seed)
    return [{"messages": [{"role": "user", "content": problems[i][0]}],
             "chosen": problems[i][1], "rejected": rng.choice(wrong[i])}
            for i in sorted(wrong)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True, help="checkpoint that samples")
    parser.add_argument("--out", type=Path, required=True, help="preference .jsonl to write")
    parser.add_argument("--problems", type=int, default=3000)
    parser.add_argument("--samples", type=int, default=4, help="answers per problem")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = pairs(args.policy, args.problems, args.samples, args.temperature, args.seed)
    aside = args.out.with_name(f".{args.out.name}.tmp")
    aside.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(aside, args.out)
    print(f"wrote {args.out}: {len(rows)} pairs (a right answer over the policy's wrong one)")


if __name__ == "__main__":
    main()
