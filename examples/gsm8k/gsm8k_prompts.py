"""GSM8K rows as chat prompts: the `transform` of the recipe's data sources.

GSM8K's parquet files have a `question` and an `answer` (a worked solution ending in
`#### N`). The question becomes a user message asking for the `#### N` line the `gsm8k`
reward reads; the answer column is kept for the reward.
"""

from __future__ import annotations

INSTRUCTION = ("Solve the problem step by step. Write the final answer on its own last "
               "line as '#### <number>'.")


def to_messages(row: dict) -> dict:
    return {"messages": [{"role": "user", "content": f"{row['question']}\n\n{INSTRUCTION}"}],
            "answer": row["answer"]}
