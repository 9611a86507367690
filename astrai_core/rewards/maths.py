"""Maths rewards: GSM8K's ``#### N`` answers, and answer equivalence through ``math-verify``.

Both follow the TRL convention ``f(prompts, completions, **columns) -> list[float]`` and
score 1.0 for a right final answer, 0.0 otherwise (unparseable text included).
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astrai_core.rewards.builtin import final_number

# GSM8K's answer line: "#### 1,234" (a sign, separators, a decimal part or a "$" allowed).
_HASHES = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")


def gsm8k_answer(text: str, extract: str = "flexible") -> Decimal | None:
    """The number after ``####``; ``flexible`` falls back to the last number written."""
    found = _HASHES.findall(text)
    if found:
        try:
            return Decimal(found[-1].replace(",", ""))
        except InvalidOperation:
            return None
    return final_number(text) if extract == "flexible" else None


def answer_pairs(completions: list[str], columns: dict[str, Any], column: str
                 ) -> list[tuple[str, str]]:
    """(completion, expected answer as text) pairs; the answer column must be there."""
    if column not in columns:
        raise ValueError(f"needs a {column!r} column in the prompt data (answer_column)")
    return [(c, str(a)) for c, a in zip(completions, columns[column], strict=True)]


class Gsm8k:
    """1.0 when the completion's answer equals the row's answer numerically.

    The expected answer is read from the ``answer_column`` the same way (GSM8K's answer
    column is a worked solution ending in ``#### N``; a bare number works too).
    """

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        extract: Literal["strict", "flexible"] = Field(
            "flexible", description="strict: only a `#### N` line counts; flexible: else the "
            "completion's last number")
        answer_column: str = Field("answer", description="the data column holding the answer")

    def __init__(self, **params: Any) -> None:
        self.config = self.Config(**params)

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        rewards = []
        for completion, expected in answer_pairs(completions, columns, self.config.answer_column):
            got = gsm8k_answer(completion, self.config.extract)
            want = gsm8k_answer(expected, "flexible")
            rewards.append(1.0 if got is not None and got == want else 0.0)
        return rewards


class MathVerify:
    """1.0 when ``math-verify`` finds the completion's answer equal to the row's.

    Both sides are parsed by ``math_verify.parse`` (LaTeX, ``\\boxed{}``, fractions,
    numbers, plain expressions); the comparison is ``math_verify.verify(gold, answer)``.
    """

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        answer_column: str = Field("answer", description="the data column holding the answer")
        float_rounding: int = Field(6, ge=0, description="decimal places numbers are "
                                    "rounded to before comparing")

    requires = ("math_verify",)
    install = "astrai-core[math]"

    def __init__(self, **params: Any) -> None:
        self.config = self.Config(**params)

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [self._score(expected, completion) for completion, expected
                in answer_pairs(completions, columns, self.config.answer_column)]

    def _score(self, expected: str, completion: str) -> float:
        from math_verify import parse, verify

        # math-verify's timeouts use SIGALRM, which only the main thread may set.
        timeout: Any = 5 if threading.current_thread() is threading.main_thread() else None
        try:
            gold = parse(expected, parsing_timeout=timeout)
            answer = parse(completion, parsing_timeout=timeout)
            if not gold or not answer:
                return 0.0
            return 1.0 if verify(gold, answer, float_rounding=self.config.float_rounding,
                                 timeout_seconds=timeout) else 0.0
        except Exception:  # noqa: BLE001 - garbage that breaks the parser scores 0
            return 0.0
