"""The images of a rollout's prompts, from the sampler's prompts to the trainer's forwards.

A prompt record of a vision-language model carries its image inputs (the processor's
output for that prompt alone, ``PromptRecord.images``); the sampler prefills them with
the prompt, and every sample of the prompt keeps them in ``RolloutBatch.images``, row
by row as a training batch keeps them (data/image_batch.py): ``image/<name>``
[N, most images of a row, ...] zero-padded with ``image/<name>.rows`` [N] each row's
count, per-token tensors (``token_type_ids``) [N, P] left-padded like ``prompt_ids``.
Every forward over the rollout (the policy's, the old and reference log-probs, a
critic's values) takes them through :func:`forward_images`, so the trainer scores the
tokens the sampler drew under the same image.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from astrai_core.data.image_batch import (PER_TOKEN, PREFIX, ROWS, batch_images,
                                          collate_prompt_images)
from astrai_core.errors import ConfigError


def rollout_images(images: Sequence[dict[str, Any] | None], prompt_width: int
                   ) -> dict[str, Tensor]:
    """The row-aligned image tensors of rollout rows whose prompts (left-padded to
    ``prompt_width``) have these processor outputs; empty when none has images."""
    if not any(images):
        return {}
    return collate_prompt_images(list(images), prompt_width)


def forward_images(model: torch.nn.Module, images: dict[str, Tensor], response_width: int
                   ) -> dict[str, Tensor] | None:
    """``images`` (a rollout's, see the module docstring) as ``model``'s forward takes them
    for [prompt | response] rows: per-token tensors extended over the response (text
    tokens: 0). None when the rows hold no image."""
    if not images:
        return None
    full = {key: F.pad(value, (0, response_width)) if _per_token(key) else value
            for key, value in images.items()}
    return batch_images(full, model_type(model))


def model_type(model: torch.nn.Module) -> str:
    """The Hugging Face ``model_type`` of ``model`` (its image inputs' layout), or ''."""
    return getattr(getattr(model, "config", None), "model_type", "") or ""


def widened_images(images: dict[str, Tensor], prompt_width: int) -> dict[str, Tensor]:
    """``images`` of rows whose prompts are left-padded to ``prompt_width`` columns."""
    return {key: _pad_to(value, 1, prompt_width, left=True) if _per_token(key) else value
            for key, value in images.items()}


def concat_images(parts: Sequence[dict[str, Tensor]], counts: Sequence[int],
                  prompt_width: int) -> dict[str, Tensor]:
    """The image tensors of rollouts of ``counts`` rows each, joined row-wise with their
    prompts left-padded to ``prompt_width``: a part without images gets rows of none,
    and each image tensor is padded to the most images of a row."""
    names = sorted({key for part in parts for key in part})
    out: dict[str, Tensor] = {}
    for key in names:
        sample = next(part[key] for part in parts if key in part)
        if key.endswith(ROWS):
            pieces = [part.get(key, torch.zeros(n, dtype=torch.long)) for part, n in zip(parts, counts)]
            out[key] = torch.cat(pieces)
            continue
        if _per_token(key):
            pieces = [_pad_to(part[key], 1, prompt_width, left=True) if key in part
                      else sample.new_zeros((n, prompt_width)) for part, n in zip(parts, counts)]
            out[key] = torch.cat(pieces)
            continue
        most = max(part[key].shape[1] for part in parts if key in part)
        pieces = [_pad_to(part[key], 1, most, left=False) if key in part
                  else sample.new_zeros((n, most, *sample.shape[2:]))
                  for part, n in zip(parts, counts)]
        out[key] = torch.cat(pieces)
    return out


def _per_token(key: str) -> bool:
    return key.removeprefix(PREFIX) in PER_TOKEN


def _pad_to(tensor: Tensor, dim: int, size: int, left: bool) -> Tensor:
    """``tensor`` zero-padded along ``dim`` to ``size`` (on the left or the right)."""
    extra = size - tensor.shape[dim]
    if extra <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = extra
    pad = tensor.new_zeros(shape)
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=dim)


def check_image_prompts(config: Any, capabilities: Any, multi_turn: bool = False,
                        world: int = 1) -> None:
    """Refuse, before training, the options a run on prompts with images cannot honour
    (``config``: the run's RunConfig, ``capabilities``: its sampler's, ``multi_turn``: an
    environment plays episodes, ``world``: processes): each prompt sample is one padded row whose image
    features fill its own image tokens, so rows are neither packed nor prompt-shared nor
    split over a context group; the sampler must take images; episodes and partial
    rollouts do not carry them, and neither does a run of several processes yet."""
    refused = [("trainer.micro_batch_tokens", config.trainer.micro_batch_tokens is not None),
               ("trainer.share_prompt", bool(config.trainer.share_prompt)),
               ("parallel.context_parallel", config.parallel.context_parallel > 1),
               ("rollout.partial", bool(config.rollout.partial))]
    for field, set_ in refused:
        if set_:
            raise ConfigError(f"{field}: the prompts hold images, and rollouts with images "
                              "are trained one whole row per sample (a row's image "
                              f"features fill its own image tokens); leave {field} out")
    if world > 1:
        raise ConfigError(f"the prompts hold images, and online training on them runs in one "
                          f"process for now ({world} were started); run it without torchrun")
    if multi_turn:
        raise ConfigError("environment: the prompts hold images, and multi-turn episodes do "
                          "not carry them yet; use single-turn rollouts")
    if not capabilities.images:
        raise ConfigError(f"sampler.name: the prompts hold images, and the "
                          f"{config.sampler.name} sampler takes none; use torch or ray")
