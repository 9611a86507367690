"""The built-in reward functions: exact numeric answer, regex format, length penalty.

All follow the TRL convention ``f(prompts, completions, **columns) -> list[float]``.
A reward without options is a function; one with options is a class built with its
config keys (validated by its nested ``Config``) whose instances are the reward.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# A number: thousands-separated ("1,234,567.5"), plain ("42", "3.14") or ".5". A minus
# sign counts only when it cannot be a subtraction (not right after a word or ")").
_NUMBER = re.compile(
    r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")


def final_number(text: str) -> Decimal | None:
    """The last number written in ``text`` (thousands separators removed), or None."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    try:
        return Decimal(matches[-1].replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the pattern only matches valid numbers
        return None


def exact_match(prompts: list[str], completions: list[str], answer: list[Any] | None = None,
                **columns: Any) -> list[float]:
    """1.0 when the completion's final number equals the ``answer`` column numerically, else 0.0."""
    if answer is None:
        raise ValueError("needs an `answer` column in the prompt data")
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        got = final_number(completion)
        target = final_number(str(expected))
        rewards.append(1.0 if got is not None and target is not None and got == target else 0.0)
    return rewards


exact_match.required_columns = ("answer",)  # checked by the run plan against data columns


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FormatRegex:
    """1.0 when the completion matches ``pattern`` (``mode``: search anywhere, or fullmatch)."""

    class Config(_Options):
        pattern: str = Field(description="the regular expression (Python `re`)")
        mode: Literal["search", "fullmatch"] = Field(
            "search", description="search: a match anywhere; fullmatch: the whole completion")
        dotall: bool = Field(default=True, description="'.' also matches newlines")

        @field_validator("pattern")
        @classmethod
        def _compiles(cls, value: str) -> str:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"not a valid regular expression: {err}") from None
            return value

    def __init__(self, **params: Any) -> None:
        self.config = self.Config(**params)
        self._regex = re.compile(self.config.pattern, re.DOTALL if self.config.dotall else 0)

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        match = self._regex.fullmatch if self.config.mode == "fullmatch" else self._regex.search
        return [1.0 if match(completion) else 0.0 for completion in completions]


class LengthPenalty:
    """``-coef * max(0, length - target)``: a penalty growing with length beyond ``target``.

    ``unit: tokens`` counts completion tokens (the ``completion_ids`` the runner passes),
    ``unit: chars`` counts characters of the completion text.
    """

    class Config(_Options):
        target: int = Field(default=0, ge=0, description="free length")
        coef: float = Field(default=0.01, ge=0.0, description="penalty per unit beyond target")
        unit: Literal["tokens", "chars"] = Field("tokens", description="what the length "
                                                 "counts: completion tokens or characters")

    def __init__(self, **params: Any) -> None:
        self.config = self.Config(**params)

    def __call__(self, prompts: list[str], completions: list[str],
                 completion_ids: list[list[int]] | None = None, **columns: Any) -> list[float]:
        if self.config.unit == "tokens":
            if completion_ids is None:
                raise ValueError("unit 'tokens' needs completion_ids (use unit: chars without them)")
            lengths = [len(ids) for ids in completion_ids]
        else:
            lengths = [len(text) for text in completions]
        target, coef = self.config.target, self.config.coef
        return [-coef * max(0, length - target) for length in lengths]


class OverlongPenalty:
    """DAPO's soft overlong punishment: 0 up to ``max_length - cache``, then a linear ramp
    down to ``-1`` at ``max_length`` tokens, and ``-1`` beyond (completion tokens).

    ``max_length`` is the generation budget (set it to the sampler's ``max_new_tokens``);
    ``cache`` is the ramp's length L. Add it beside the task reward with a weight.
    """

    class Config(_Options):
        max_length: int = Field(ge=1, description="the generation budget L_max, in tokens")
        cache: int = Field(ge=1, description="the ramp's length L: shaping starts at L_max - L")

        @field_validator("cache")
        @classmethod
        def _fits(cls, value: int, info: Any) -> int:
            budget = info.data.get("max_length")
            if budget is not None and value > budget:
                raise ValueError(f"cache ({value}) must not exceed max_length ({budget})")
            return value

    def __init__(self, **params: Any) -> None:
        self.config = self.Config(**params)

    def __call__(self, prompts: list[str], completions: list[str],
                 completion_ids: list[list[int]] | None = None, **columns: Any) -> list[float]:
        if completion_ids is None:
            raise ValueError("needs completion_ids (the rollout runner passes them)")
        budget, ramp = self.config.max_length, self.config.cache
        start = budget - ramp
        return [0.0 if length <= start else -1.0 if length > budget
                else (start - length) / ramp
                for length in (len(ids) for ids in completion_ids)]
