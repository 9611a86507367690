"""Expanding a generate() call into one request per completion, and their random streams."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from astrai_core.sampling.params import Completion, SamplingParams


@dataclass
class Request:
    """One completion to produce: a prompt, its parameters and its own random stream."""

    index: int                      # position in the generate() output
    prompt_index: int
    prompt_ids: list[int]
    params: SamplingParams
    rng: random.Random | None       # None for greedy requests
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_text_at: int | None = None  # where a matched stop string starts in the decoded text
    routed_experts: Any = None  # [MoE layers, prompt + tokens, top-k] when recorded (routing.py)
    images: Any = None  # a vision-language model's image tensors of the prompt, by name

    def completion(self, tokenizer: Any = None) -> Completion:
        """The finished request as the sampler contract's record (text when a tokenizer is known)."""
        text = None
        if tokenizer is not None:
            text = tokenizer.decode(self.token_ids, skip_special_tokens=True)
            if self.stop_text_at is not None:
                text = text[:self.stop_text_at]
        return Completion(token_ids=self.token_ids, logprobs=self.logprobs,
                          finish_reason=self.finish_reason or "length", text=text,
                          prompt_index=self.prompt_index, routed_experts=self.routed_experts)


def expand_requests(prompts: Sequence[Sequence[int]],
                    params: SamplingParams | Sequence[SamplingParams],
                    images: Sequence[Any] | None = None) -> list[Request]:
    """One Request per completion, grouped by prompt in order (n per prompt); ``images``:
    each prompt's image tensors (None for a prompt without)."""
    if images is not None and len(images) != len(prompts):
        raise ValueError(f"got images for {len(images)} prompts, and {len(prompts)} prompts")
    if isinstance(params, SamplingParams):
        per_prompt = [params] * len(prompts)
    else:
        per_prompt = list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"got {len(per_prompt)} SamplingParams for {len(prompts)} prompts")
    requests: list[Request] = []
    for prompt_index, (prompt, request_params) in enumerate(zip(prompts, per_prompt, strict=True)):
        prompt_ids = [int(t) for t in prompt]
        if not prompt_ids:
            raise ValueError(f"prompt {prompt_index} is empty: a prompt needs at least one token")
        for copy in range(request_params.n):
            requests.append(Request(index=len(requests), prompt_index=prompt_index,
                                    prompt_ids=prompt_ids, params=request_params,
                                    rng=request_rng(request_params, copy),
                                    images=None if images is None else images[prompt_index]))
    return requests


def request_rng(params: SamplingParams, copy: int) -> random.Random | None:
    """The random stream of copy ``copy`` of a request: a function of (seed, copy) only.

    Each completion draws one uniform number per step from its own stream, so a seeded
    request gives the same tokens whatever else shares its batch. Without a seed the
    stream is seeded from torch's global generator, so ``torch.manual_seed`` still makes
    a whole run reproducible.
    """
    if params.greedy:
        return None
    if params.seed is None:
        import torch

        return random.Random(int(torch.randint(0, 2**62, ()).item()))
    return random.Random(f"astrai-sampling-{params.seed}-{copy}")
