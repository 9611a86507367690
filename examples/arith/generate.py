"""Generate the arithmetic example's data: integer problems with verifiable answers.

Run: ``python examples/arith/generate.py --out runs/demo/data`` (the directory every
config of this example reads; defaults: ``--seed 0 --n-train 20000 --n-eval 500 --n-rl 5000
--n-unpaired 5000``).

Problems are ``a+b`` and ``a-b`` with operands 0..99 (a difference may be negative) and
``a*b`` with single-digit operands. The full problem space (20,100 problems) is shuffled
with ``--seed``; the first ``--n-eval`` problems are held out for evaluation and never
appear in the training files. Files written (JSONL, one object per line):

- ``sft_train.jsonl``  chat SFT rows: ``{"messages": [user "12+35=", assistant "47"]}``
- ``eval.jsonl``       held-out prompts: ``{"messages": [user "12+35="], "answer": "47"}``
- ``rl_prompts.jsonl`` training-split prompts in the same shape as eval.jsonl, for RL
- ``unpaired.jsonl``   training-split problems for KTO, alternately with their answer
  (``"label": true``) and a near miss (off by 1 or 10: a slipped digit or carry, ``false``):
  ``{"messages": [user "12+35="], "completion": "57", "label": false}``
- ``rm_train.jsonl``   preference pairs for a reward model, from the training split:
  ``{"messages": [user "12+35="], "chosen": "47", "rejected": "48"}``, the rejected
  answer a near miss (off by 1 to 3, by 10, or one digit changed)
- ``rm_eval.jsonl``    one such pair per held-out problem

SFT and RL prompts are drawn from the training split (they may overlap each other);
``--n-train`` larger than the training split samples problems again (with repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

MAX_OPERAND = 99      # a+b, a-b operands: 0..MAX_OPERAND
MAX_FACTOR = 9        # a*b operands: 0..MAX_FACTOR


def all_problems() -> list[tuple[str, str]]:
    """Every (question, answer) pair of the problem space, in a fixed order."""
    problems = []
    for a in range(MAX_OPERAND + 1):
        for b in range(MAX_OPERAND + 1):
            problems.append((f"{a}+{b}=", str(a + b)))
            problems.append((f"{a}-{b}=", str(a - b)))
    for a in range(MAX_FACTOR + 1):
        for b in range(MAX_FACTOR + 1):
            problems.append((f"{a}*{b}=", str(a * b)))
    return problems


def split(seed: int, n_eval: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Shuffle the problem space with ``seed``; return (train pool, held-out eval)."""
    problems = all_problems()
    if not 0 < n_eval < len(problems):
        raise SystemExit(f"--n-eval must be between 1 and {len(problems) - 1}")
    random.Random(seed).shuffle(problems)
    return problems[n_eval:], problems[:n_eval]


def sample(pool: list[tuple[str, str]], n: int, rng: random.Random) -> list[tuple[str, str]]:
    """``n`` problems from ``pool``: without repeats while the pool lasts, then again."""
    out: list[tuple[str, str]] = []
    while len(out) < n:
        out.extend(rng.sample(pool, min(len(pool), n - len(out))))
    return out


def sft_row(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": answer}]}


def prompt_row(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}], "answer": answer}


def unpaired_rows(problems: list[tuple[str, str]], rng: random.Random) -> list[dict]:
    """Even rows keep their answer (desirable), odd rows get a near miss (undesirable)."""
    rows = []
    for i, (question, answer) in enumerate(problems):
        right = i % 2 == 0
        completion = answer if right else str(int(answer) + rng.choice((-10, -1, 1, 10)))
        rows.append({"messages": [{"role": "user", "content": question}],
                     "completion": completion, "label": right})
    return rows


def near_miss(answer: str, rng: random.Random) -> str:
    """A wrong answer of the kind a small model writes: off by 1 to 3 (a carry or borrow),
    off by 10, or one digit changed."""
    value, roll = int(answer), rng.random()
    if roll < 0.5:
        wrong = value + rng.choice((-1, 1)) * rng.randint(1, 3)
    elif roll < 0.75:
        wrong = value + rng.choice((-10, 10))
    else:
        digits = list(str(abs(value)))
        i = rng.randrange(len(digits))
        choices = [d for d in "0123456789" if d != digits[i] and not (i == 0 and d == "0"
                                                                     and len(digits) > 1)]
        digits[i] = rng.choice(choices)
        wrong = int("".join(digits)) * (-1 if value < 0 else 1)
    return str(wrong) if wrong != value else str(value + 1)


def preference_row(question: str, answer: str, rng: random.Random) -> dict:
    return {"messages": [{"role": "user", "content": question}], "chosen": answer,
            "rejected": near_miss(answer, rng)}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write aside, then rename: an interrupted run never leaves a half-written file."""
    aside = path.with_name(f".{path.name}.tmp")
    with aside.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(aside, path)


def generate(out: Path, seed: int, n_train: int, n_eval: int, n_rl: int,
             n_unpaired: int = 5000, n_pairs: int = 5000) -> dict[Path, str]:
    """Write the six files; returns ``{path: what it holds}``."""
    train_pool, held_out = split(seed, n_eval)
    rng = random.Random(seed + 1)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        out / "sft_train.jsonl": ([sft_row(q, a) for q, a in sample(train_pool, n_train, rng)],
                                  "chat rows for SFT"),
        out / "eval.jsonl": ([prompt_row(q, a) for q, a in held_out], "held-out prompt rows"),
        out / "rl_prompts.jsonl": ([prompt_row(q, a) for q, a in sample(train_pool, n_rl, rng)],
                                   "prompt rows for RL"),
    }
    # Each added file draws from a stream of its own, so the files above stay as they were.
    unpaired_rng = random.Random(seed + 2)
    files[out / "unpaired.jsonl"] = (
        unpaired_rows(sample(train_pool, n_unpaired, unpaired_rng), unpaired_rng),
        "unpaired rows (right or near-miss answers) for KTO")
    pairs = random.Random(seed + 2)
    files[out / "rm_train.jsonl"] = (
        [preference_row(q, a, pairs) for q, a in sample(train_pool, n_pairs, pairs)],
        "preference pairs for a reward model")
    files[out / "rm_eval.jsonl"] = ([preference_row(q, a, pairs) for q, a in held_out],
                                    "held-out preference pairs")
    for path, (rows, _) in files.items():
        write_jsonl(path, rows)
    return {path: f"{len(rows)} {what}" for path, (rows, what) in files.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate integer-arithmetic problems.")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=20000, help="SFT rows")
    parser.add_argument("--n-eval", type=int, default=500, help="held-out problems")
    parser.add_argument("--n-rl", type=int, default=5000, help="RL prompt rows")
    parser.add_argument("--n-unpaired", type=int, default=5000, help="KTO rows")
    parser.add_argument("--n-pairs", type=int, default=5000, help="reward-model pairs")
    args = parser.parse_args(argv)
    written = generate(args.out, args.seed, args.n_train, args.n_eval, args.n_rl,
                       args.n_unpaired, args.n_pairs)
    for path, what in written.items():
        print(f"wrote {path} ({what})")


if __name__ == "__main__":
    main()
