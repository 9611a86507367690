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

from astrai_core.data.image_batch import (PER_TOKEN, PREFIX, ROWS, collate_prompt_images,
                                          model_images)
from astrai_core.errors import ConfigError
from astrai_core.plugins.sampler_capabilities import sampler_capabilities

# each image tensor's shape past the rows, and its dtype, by name (image_layout)
ImageLayout = dict[str, tuple[tuple[int, ...], torch.dtype]]


def rollout_images(images: Sequence[dict[str, Any] | None], prompt_width: int
                   ) -> dict[str, Tensor]:
    """The row-aligned image tensors of rollout rows whose prompts (left-padded to
    ``prompt_width``) have these processor outputs; empty when none has images."""
    if not any(images):
        return {}
    return collate_prompt_images(list(images), prompt_width)


def image_request(records: Sequence[Any], sampler: Any, capabilities: Any = None
                  ) -> dict[str, Any]:
    """The sampler's ``images`` keyword for ``records`` (prompt records), given only when
    a prompt holds images (other samplers lack it); a ConfigError when the sampler (its
    ``capabilities``, read from it when not given) takes none."""
    if not any(r.images for r in records):
        return {}
    if capabilities is None:
        capabilities = sampler_capabilities(sampler)
    if not capabilities.images:
        raise ConfigError(f"the prompts hold images, and the sampler "
                          f"({type(sampler).__name__}) takes none; use the torch or ray "
                          "sampler")
    return {"images": [r.images for r in records]}


def forward_images(model: torch.nn.Module, images: dict[str, Tensor], response_width: int
                   ) -> dict[str, Tensor] | None:
    """``images`` (a rollout's, see the module docstring) as ``model``'s forward takes them
    for [prompt | response] rows: per-token tensors extended over the response (text
    tokens: 0). None when the rows hold no image."""
    if not images:
        return None
    full = {key: F.pad(value, (0, response_width)) if _per_token(key) else value
            for key, value in images.items()}
    return model_images(model, full)


def widened_images(images: dict[str, Tensor], prompt_width: int) -> dict[str, Tensor]:
    """``images`` of rows whose prompts are left-padded to ``prompt_width`` columns."""
    return {key: _pad_to(value, 1, prompt_width, left=True) if _per_token(key) else value
            for key, value in images.items()}


def concat_images(parts: Sequence[dict[str, Tensor]], counts: Sequence[int],
                  prompt_width: int) -> dict[str, Tensor]:
    """The image tensors of rollouts of ``counts`` rows each, joined row-wise with their
    prompts left-padded to ``prompt_width``: a part without images gets rows of none,
    and each image tensor is padded to the most images of a row."""
    layout = joint_layout([image_layout(part) for part in parts])
    if not layout:
        return {}
    device = next(value.device for part in parts for value in part.values())
    conformed = [conformed_images(part, n, layout, prompt_width, device)
                 for part, n in zip(parts, counts)]
    return {key: torch.cat([part[key] for part in conformed]) for key in layout}


def image_layout(images: dict[str, Tensor]) -> ImageLayout:
    """Each of a rollout's image tensors (see the module docstring) by name: its shape past
    the rows, and its dtype; small, so that ranks can exchange it as an object."""
    return {key: (tuple(value.shape[1:]), value.dtype) for key, value in images.items()}


def joint_layout(layouts: Sequence[ImageLayout]) -> ImageLayout:
    """The layout that holds the rows of every one of ``layouts``: each name of any, with
    the most images of a row over all (per-token tensors are widened apart)."""
    out: ImageLayout = {}
    for layout in layouts:
        for key, (shape, dtype) in layout.items():
            if key not in out:
                out[key] = (shape, dtype)
            elif shape and not _per_token(key):  # [images of a row, ...]: the most
                (most, *rest), kept = out[key]
                out[key] = ((max(most, shape[0]), *rest), kept)
    return dict(sorted(out.items()))


def conformed_images(images: dict[str, Tensor], count: int, layout: ImageLayout,
                     prompt_width: int, device: torch.device | str = "cpu"
                     ) -> dict[str, Tensor]:
    """``images`` of ``count`` rows in ``layout`` (a :func:`joint_layout`), prompts
    left-padded to ``prompt_width``: each image tensor zero-padded to the layout's most
    images of a row, and a name these rows lack given as rows of no image."""
    out: dict[str, Tensor] = {}
    for key, (shape, dtype) in layout.items():
        value = images.get(key)
        if key.endswith(ROWS):
            out[key] = value if value is not None else torch.zeros(count, dtype=dtype,
                                                                    device=device)
        elif _per_token(key):
            out[key] = (_pad_to(value, 1, prompt_width, left=True) if value is not None else
                        torch.zeros((count, prompt_width), dtype=dtype, device=device))
        else:
            out[key] = (_pad_to(value, 1, shape[0], left=False) if value is not None else
                        torch.zeros((count, *shape), dtype=dtype, device=device))
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
                        world: int = 1, mixed: bool = False) -> None:
    """Refuse, before training, the options a run on prompts with images cannot honour
    (``config``: the run's RunConfig, ``capabilities``: its sampler's, ``multi_turn``: an
    environment plays episodes, ``world``: processes, ``mixed``: some prompts hold no
    image): each prompt sample is one padded row whose image features fill its own image
    tokens, so rows are neither packed nor prompt-shared nor split over a context group;
    the sampler must take images; episodes and partial rollouts do not carry them. Over
    several processes every rank runs the sharded vision tower in step with the others
    (each of its layers is gathered by a collective), so a rank's forward over rows
    without images would leave its peers waiting: there, every prompt holds images."""
    refused = [("trainer.micro_batch_tokens", config.trainer.micro_batch_tokens is not None),
               ("trainer.share_prompt", bool(config.trainer.share_prompt)),
               ("parallel.context_parallel", config.parallel.context_parallel > 1),
               ("rollout.partial", bool(config.rollout.partial))]
    for field, set_ in refused:
        if set_:
            raise ConfigError(f"{field}: the prompts hold images, and rollouts with images "
                              "are trained one whole row per sample (a row's image "
                              f"features fill its own image tokens); leave {field} out")
    if world > 1 and mixed:
        raise ConfigError(f"data.sources: some prompts hold images and others none, and "
                          f"over several processes ({world} were started) every prompt must "
                          "hold images (each rank's forwards run the sharded vision tower "
                          "together); give every prompt an image, or train in one process")
    if multi_turn:
        raise ConfigError("environment: the prompts hold images, and multi-turn episodes do "
                          "not carry them yet; use single-turn rollouts")
    if not capabilities.images:
        raise ConfigError(f"sampler.name: the prompts hold images, and the "
                          f"{config.sampler.name} sampler takes none; use torch or ray")
