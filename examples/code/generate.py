"""Generate the code example's data: write a tiny Python function from two of its values.

Run: ``python examples/code/generate.py --out runs/code/data`` (defaults: ``--seed 0
--n-train 4000 --n-eval 150 --n-rl 2000 --shortcuts 0.5``).

Each task is a linear function ``f(x) = a*x + b`` (a in 1..20, b in 0..30) shown by two of
its values, ``f(0)=3 f(1)=8``; the answer is code, ``def f(x): return 3+(8-3)*x``, and the
``tests`` column asserts it at points the prompt does not show (``assert f(7)==38``),
which ``code_tests`` runs in the sandbox. A share ``--shortcuts`` of the SFT
demonstrations instead hard-code the two shown values, ``def f(x): return x and 8 or 3``:
right on the prompt's examples and wrong at every tested point: demonstrations of mixed
quality, as those gathered from many sources can be. The 620 functions are shuffled with
``--seed``; the first ``--n-eval`` are held out and never appear in the training files.
Files written (JSONL): ``sft_train.jsonl`` (chat rows), ``eval.jsonl`` and
``rl_prompts.jsonl`` (prompt rows with ``tests``, no solutions).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from arith.generate import write_jsonl  # noqa: E402  (examples/arith/generate.py)

TEST_POINTS = (2, 3, 7, -2)


def all_functions() -> list[tuple[int, int]]:
    return [(a, b) for a in range(1, 21) for b in range(0, 31)]


def prompt(a: int, b: int) -> str:
    return f"f(0)={b} f(1)={a + b}"


def solution(a: int, b: int) -> str:
    return f"def f(x): return {b}+({a + b}-{b})*x"


def shortcut(a: int, b: int) -> str:
    """A solution that hard-codes the two values the prompt shows: it fails every test."""
    return f"def f(x): return x and {a + b} or {b}"


def tests(a: int, b: int) -> str:
    return "\n".join(f"assert f({x})=={a * x + b}" for x in TEST_POINTS)


def sft_row(a: int, b: int, hard_coded: bool) -> dict:
    answer = shortcut(a, b) if hard_coded else solution(a, b)
    return {"messages": [{"role": "user", "content": prompt(a, b)},
                         {"role": "assistant", "content": answer}]}


def prompt_row(a: int, b: int) -> dict:
    return {"messages": [{"role": "user", "content": prompt(a, b)}], "tests": tests(a, b)}


def generate(out: Path, seed: int, n_train: int, n_eval: int, n_rl: int,
             shortcuts: float) -> dict[Path, int]:
    functions = all_functions()
    random.Random(seed).shuffle(functions)
    held_out, pool = functions[:n_eval], functions[n_eval:]
    rng = random.Random(seed + 1)
    out.mkdir(parents=True, exist_ok=True)
    demos = [sft_row(*rng.choice(pool), rng.random() < shortcuts) for _ in range(n_train)]
    files = {out / "sft_train.jsonl": demos,
             out / "eval.jsonl": [prompt_row(*f) for f in held_out],
             out / "rl_prompts.jsonl": [prompt_row(*rng.choice(pool)) for _ in range(n_rl)]}
    for path, rows in files.items():
        write_jsonl(path, rows)
    return {path: len(rows) for path, rows in files.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate the code example's tasks.")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=4000, help="SFT rows")
    parser.add_argument("--n-eval", type=int, default=150, help="held-out functions")
    parser.add_argument("--n-rl", type=int, default=2000, help="RL prompt rows")
    parser.add_argument("--shortcuts", type=float, default=0.5,
                        help="share of SFT demonstrations that hard-code the shown values")
    args = parser.parse_args(argv)
    counts = generate(args.out, args.seed, args.n_train, args.n_eval, args.n_rl, args.shortcuts)
    for path, count in counts.items():
        print(f"wrote {path} ({count} rows)")


if __name__ == "__main__":
    main()
