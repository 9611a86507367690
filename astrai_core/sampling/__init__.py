"""Sampling: parameters, completion records and the built-in torch sampler.

``SamplingParams`` and ``Completion`` import without torch; ``TorchSampler`` is
imported on first use.
"""

from __future__ import annotations

from typing import Any

from astrai_core.sampling.params import Completion, FinishReason, SamplingParams

__all__ = ["Completion", "FinishReason", "SamplingParams", "TorchSampler", "split_sampler_params"]


def split_sampler_params(params: dict[str, Any]) -> tuple[dict[str, Any], SamplingParams]:
    """Split a ``sampler:`` section's keys into engine options and default SamplingParams.

    The section mixes both (``{name: torch, temperature: 1.0, max_new_tokens: 16,
    max_batch_size: 32}``): the keys SamplingParams knows become the sampling defaults,
    the others go to the sampler's constructor.
    """
    fields = SamplingParams.model_fields
    sampling = {k: v for k, v in params.items() if k in fields and k != "name"}
    engine = {k: v for k, v in params.items() if k not in fields and k != "name"}
    return engine, SamplingParams(**sampling)


def __getattr__(name: str) -> Any:
    if name == "TorchSampler":
        from astrai_core.sampling.torch_sampler import TorchSampler

        return TorchSampler
    raise AttributeError(f"module 'astrai_core.sampling' has no attribute {name!r}")
