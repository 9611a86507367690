"""What to sample (SamplingParams) and what comes back (Completion). No torch here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

FinishReason = Literal["stop", "length", "abort"]


class SamplingParams(BaseModel):
    """Per-request sampling parameters; every filter's neutral value switches it off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(default=64, ge=1, description="tokens generated at most")
    temperature: float = Field(default=1.0, ge=0.0, description="0 = greedy (argmax)")
    top_k: int = Field(default=0, ge=0, description="keep the k most likely tokens; 0 = off")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus mass; 1.0 = off")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0,
                         description="drop tokens below min_p x the top probability; 0 = off")
    seed: int | None = Field(default=None, description="makes the request reproducible")
    stop_token_ids: tuple[int, ...] = Field(default=(), description="token ids that end a completion "
                                            "(kept as its last token)")
    stop: tuple[str, ...] = Field(default=(), description="strings that end a completion "
                                  "(needs a tokenizer; cut from the text)")
    n: int = Field(default=1, ge=1, description="completions per prompt")

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not s for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Completion:
    """One sampled continuation of one prompt.

    ``logprobs[i]`` is log_softmax(logits / temperature)[token_ids[i]] before any
    top-k/top-p/min-p filtering (temperature 1 for greedy requests). A stop token is the
    last entry of ``token_ids``; ``text`` (when the sampler has a tokenizer) is decoded
    without special tokens and cut before a matched stop string. An engine that cannot
    report log-probs returns ``None`` (strategies then need ``recompute_old_logprobs``).

    ``routed_experts``, only from a sampler whose spec sets ``reports_routing`` and only
    when ``generate(..., record_routing=True)`` asks: the MoE experts each position of
    ``prompt + token_ids`` went through, an int16 tensor ``[MoE layers, positions,
    top-k]``; -1 where the model never saw the token (the last one). Else ``None``.

    ``finish_reason`` is ``stop`` (a stop token or string), ``length`` (``max_new_tokens``)
    or ``abort``: the generate call was interrupted (a sampler's ``interrupt``, used by
    partial rollouts when a weight update arrives) before this completion finished, and
    it holds the tokens sampled so far.
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    text: str | None = None
    prompt_index: int = 0     # which prompt of the generate() call this continues
    routed_experts: Any = None  # a torch tensor when asked for (no torch import here)
