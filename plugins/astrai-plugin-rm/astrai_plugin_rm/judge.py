"""The ``judge`` reward function: an LLM judge behind any OpenAI-compatible endpoint.

::

    rewards:
      - name: judge
        base_url: http://127.0.0.1:8000/v1      # astrai serve, vLLM, a hosted API...
        model: judge-model
        prompt_template: "Question: {prompt}\\nAnswer: {completion}\\nReference: {answer}\\nScore 0-10:"
        score_pattern: "(\\\\d+(?:\\\\.\\\\d+)?)"      # the first capture group is the score
        scale: [0, 10]                          # -> (score - 0) / (10 - 0), clipped to [0, 1]

Each completion becomes one chat request (``prompt_template`` filled with ``{prompt}``,
``{completion}`` and the row's columns by name; write ``{{`` and ``}}`` for literal
braces), sent through the official ``openai`` client with its timeout and retries,
``max_concurrency`` requests at a time from a thread pool. The first match of
``score_pattern`` in the reply is the score, scaled to [0, 1] with ``scale`` or raw
without; a reply without a match scores ``default_score``. An endpoint that cannot be
reached stops the run with one line naming it.
"""

from __future__ import annotations

import os
import re
import string
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class JudgeError(RuntimeError):
    """The judge could not score (endpoint unreachable, bad template); one line."""


class Judge:
    """LLM-as-a-judge reward; see the module docstring."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")

        base_url: str = Field(description="OpenAI-compatible API root, e.g. http://host:8000/v1")
        model: str = Field(description="model name the endpoint serves")
        prompt_template: str = Field(description="the judge's user message: {prompt}, "
                                     "{completion} and column placeholders")
        system_prompt: str | None = Field(None, description="the judge's system message "
                                          "(default: none)")
        score_pattern: str = Field(r"(-?\d+(?:\.\d+)?)", description="regex; its first group "
                                   "(or whole match) is the score")
        scale: tuple[float, float] | None = Field(
            None, description="[low, high]: map the score to [0, 1] (clipped); None: raw")
        default_score: float = Field(0.0, description="score of a reply without a match")
        api_key: str | None = Field(None, description="default: $OPENAI_API_KEY, else 'EMPTY'")
        temperature: float = Field(0.0, ge=0, description="the judge's sampling temperature")
        max_tokens: int = Field(16, ge=1, description="longest judge reply, in tokens")
        timeout: float = Field(60.0, gt=0, description="seconds per request")
        max_retries: int = Field(2, ge=0, description="retries of a failed request")
        max_concurrency: int = Field(8, ge=1, description="requests in flight at once")

        @field_validator("score_pattern")
        @classmethod
        def _compiles(cls, value: str) -> str:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"score_pattern is not a regular expression: {err}") from None
            return value

        @field_validator("prompt_template")
        @classmethod
        def _placeholders(cls, value: str) -> str:
            try:
                fields = {name for _, name, _, _ in string.Formatter().parse(value) if name}
            except ValueError as err:
                raise ValueError(f"prompt_template: {err} (write {{{{ and }}}} for braces)") \
                    from None
            if "completion" not in fields:
                raise ValueError("prompt_template has no {completion} placeholder")
            return value

        @model_validator(mode="after")
        def _scale_order(self) -> Judge.Config:
            if self.scale is not None and self.scale[0] >= self.scale[1]:
                raise ValueError(f"scale must be [low, high] with low < high, got {list(self.scale)}")
            return self

    def __init__(self, **options: Any) -> None:
        self.config = self.Config(**options)
        self.pattern = re.compile(self.config.score_pattern)
        self._client: Any = None

    # -- pieces, each testable alone ---------------------------------------------------
    def render(self, prompt: str, completion: str, columns: dict[str, Any]) -> str:
        """The judge's user message for one completion."""
        try:
            return self.config.prompt_template.format_map(
                {**columns, "prompt": prompt, "completion": completion})
        except KeyError as err:
            raise JudgeError(f"judge: prompt_template names {{{err.args[0]}}}, which is neither "
                             f"prompt, completion nor a data column ({', '.join(columns) or 'none'})"
                             ) from None

    def parse(self, reply: str) -> float:
        """The score in a reply: the first match of ``score_pattern``, scaled."""
        match = self.pattern.search(reply or "")
        if match is None:
            return self.config.default_score
        try:
            value = float(match.group(1) if match.groups() else match.group(0))
        except (TypeError, ValueError):
            return self.config.default_score
        if self.config.scale is None:
            return value
        low, high = self.config.scale
        return min(1.0, max(0.0, (value - low) / (high - low)))

    # -- the requests ------------------------------------------------------------------
    def client(self) -> Any:
        if self._client is None:
            import openai

            cfg = self.config
            self._client = openai.OpenAI(
                base_url=cfg.base_url, api_key=cfg.api_key or os.environ.get("OPENAI_API_KEY")
                or "EMPTY", timeout=cfg.timeout, max_retries=cfg.max_retries)
        return self._client

    def ask(self, message: str) -> str:
        """The judge model's reply to one message."""
        import openai

        cfg = self.config
        messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
        messages.append({"role": "user", "content": message})
        try:
            response = self.client().chat.completions.create(
                model=cfg.model, messages=messages, temperature=cfg.temperature,
                max_tokens=cfg.max_tokens)
        except openai.APIConnectionError as err:  # includes timeouts, after the retries
            raise JudgeError(f"judge: cannot reach {cfg.base_url} ({type(err).__name__}: "
                             f"{err}); is the server running?") from None
        except openai.APIStatusError as err:
            raise JudgeError(f"judge: {cfg.base_url} answered {err.status_code}: "
                             f"{_short(err.message)}") from None
        return response.choices[0].message.content or ""

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        columns.pop("completion_ids", None)
        rows = [{name: values[i] for name, values in columns.items() if values is not None}
                for i in range(len(completions))]
        messages = [self.render(p, c, row) for p, c, row in zip(prompts, completions, rows,
                                                                strict=True)]
        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            replies = list(pool.map(self.ask, messages))  # in order, whatever finishes first
        return [self.parse(reply) for reply in replies]


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."
