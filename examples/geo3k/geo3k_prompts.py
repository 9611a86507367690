"""Geometry3K rows as prompts with images: the `transform` of the recipe's data sources.

`hiyouga/geometry3k` has `images` (one diagram per problem), `problem` (text starting
with an `<image>` marker) and `answer` (`"3"`, `"2\\sqrt{3}"`, ...). The recipe's
`columns` rename `problem` to `prompt`; this transform drops the marker (the diagram goes
before the text of the user turn) and asks for reasoning in <think> tags and the answer
in \\boxed{}, as verl's and EasyR1's Geometry3K recipes do. `images` and `answer` are kept
(the answer for the `math_verify` reward).
"""

from __future__ import annotations

INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and "
               "then provide the final answer. The reasoning process MUST BE enclosed within "
               "<think> </think> tags. The final answer MUST BE put in \\boxed{}.")


def to_prompt(row: dict) -> dict:
    question = row["prompt"].replace("<image>", "").strip()
    return {**row, "prompt": f"{question} {INSTRUCTION}"}
