"""Generate the calc example's data: problems a tiny model cannot do in its head.

Run: ``python examples/calc/generate.py --out runs/calc/data`` (defaults: ``--seed 0
--n-train 6000 --n-eval 200 --n-rl 3000 --no-tool-fraction 0.3``).

Problems are 3-digit x 2-digit products (``123*45=``) and sums of three or four numbers
of one to three digits (``12+345+6+78=``), half each. The held-out problems never appear
in the training files. A system message ``calculator`` tells the model it has the tool.
Files written (JSONL):

- ``sft_train.jsonl``   chat demonstrations: with the system message, the assistant calls
  ``calculator`` in the Hermes format, reads the result and answers; without it (a
  ``--no-tool-fraction`` of the rows) the assistant answers directly
- ``rl_prompts.jsonl``  training-split prompts with the system message and an ``answer``
- ``eval_tool.jsonl``   held-out prompts with the system message (the tool is offered)
- ``eval_no_tool.jsonl`` the same problems without it (the model must answer in its head)
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

SYSTEM = {"role": "system", "content": "calculator"}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


def problem(rng: random.Random) -> tuple[str, str]:
    """(expression, answer): a product or a sum, with equal odds."""
    if rng.random() < 0.5:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        return f"{a}*{b}", str(a * b)
    terms = [rng.randint(1, 10 ** rng.randint(1, 3) - 1) for _ in range(rng.choice((3, 4)))]
    return "+".join(map(str, terms)), str(sum(terms))


def unique_problems(rng: random.Random, count: int, exclude: set[str]) -> list[tuple[str, str]]:
    out, seen = [], set(exclude)
    while len(out) < count:
        expression, answer = problem(rng)
        if expression not in seen:
            seen.add(expression)
            out.append((expression, answer))
    return out


def demonstration(expression: str, answer: str, tool: bool) -> dict:
    user = {"role": "user", "content": f"{expression}="}
    if not tool:
        return {"messages": [user, {"role": "assistant", "content": answer}]}
    return {"messages": [SYSTEM, user, {"role": "assistant", "content": CALL % expression},
                         {"role": "tool", "content": answer},
                         {"role": "assistant", "content": answer}]}


def prompt(expression: str, answer: str, tool: bool) -> dict:
    user = {"role": "user", "content": f"{expression}="}
    return {"messages": [SYSTEM, user] if tool else [user], "answer": answer}


def write(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, path)
    print(f"wrote {path} ({len(rows)} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/calc/data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=6000)
    parser.add_argument("--n-eval", type=int, default=200)
    parser.add_argument("--n-rl", type=int, default=3000)
    parser.add_argument("--no-tool-fraction", type=float, default=0.3)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    held_out = unique_problems(rng, args.n_eval, set())
    train = unique_problems(rng, args.n_train + args.n_rl, {e for e, _ in held_out})
    sft, rl = train[:args.n_train], train[args.n_train:]
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out / "sft_train.jsonl",
          [demonstration(e, a, tool=rng.random() >= args.no_tool_fraction) for e, a in sft])
    write(args.out / "rl_prompts.jsonl", [prompt(e, a, tool=True) for e, a in rl])
    write(args.out / "eval_tool.jsonl", [prompt(e, a, tool=True) for e, a in held_out])
    write(args.out / "eval_no_tool.jsonl", [prompt(e, a, tool=False) for e, a in held_out])


if __name__ == "__main__":
    main()
