"""Sampling for the Tinker engine: astrai's torch sampler on the shared base, with one
adapter slot (or none: the bare base) in effect."""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.model.head import target_logprobs
from astrai_core.sampling.params import SamplingParams
from astrai_core.tinker.bases import LoadedBase
from astrai_core.tinker.engine_types import EngineRequestError, SampledOut, SampleSpec

DEFAULT_MAX_TOKENS = 64


def sampling_params(spec: SampleSpec, num_samples: int, room: int) -> SamplingParams:
    """astrai's SamplingParams of a Tinker request (``room``: tokens left in the context)."""
    if num_samples < 1:
        raise EngineRequestError(f"num_samples must be at least 1, got {num_samples}")
    max_tokens = spec.max_tokens if spec.max_tokens is not None else min(DEFAULT_MAX_TOKENS, room)
    if max_tokens < 1 or max_tokens > room:
        raise EngineRequestError(f"max_tokens {max_tokens}: between 1 and the {room} tokens "
                                 "the context has left after the prompt")
    if spec.temperature < 0 or not 0 < spec.top_p <= 1:
        raise EngineRequestError(f"temperature {spec.temperature} must be >= 0 and top_p "
                                 f"{spec.top_p} in (0, 1]")
    if any(not s for s in spec.stop_strings):
        raise EngineRequestError("stop strings must not be empty")
    return SamplingParams(max_new_tokens=max_tokens, temperature=spec.temperature,
                          top_k=max(spec.top_k, 0), top_p=spec.top_p, seed=spec.seed,
                          stop_token_ids=tuple(spec.stop_tokens), stop=tuple(spec.stop_strings),
                          n=num_samples)


def generate(base: LoadedBase, prompt: list[int], params: SamplingParams,
             tokenizer: Any) -> list[SampledOut]:
    """``params.n`` completions of ``prompt`` with the active adapter."""
    from astrai_core.sampling.torch_sampler import TorchSampler

    sampler = TorchSampler(base.model, tokenizer=tokenizer if params.stop else None)
    return sampled_outs(sampler.generate([prompt], params))


def sampled_outs(completions: list[Any]) -> list[SampledOut]:
    """A sampler's completions as the engine reports them."""
    return [SampledOut(tokens=list(c.token_ids), logprobs=[float(x) for x in c.logprobs or []],
                       stop_reason="stop" if c.finish_reason == "stop" else "length")
            for c in completions]


@torch.no_grad()
def prompt_logprobs(base: LoadedBase, prompt: list[int]) -> list[float | None]:
    """Each prompt token's log-prob given the tokens before it (None for the first)."""
    if len(prompt) < 2:
        return [None] * len(prompt)
    device = next(base.model.parameters()).device
    ids = torch.as_tensor([prompt], dtype=torch.long, device=device)
    out = target_logprobs(base.model, ids, ids[:, 1:])
    return [None] + [float(x) for x in out["logprobs"][0].tolist()]

