"""The parts of a transformers vision-language model (``AutoModelForImageTextToText``).

Such a model is a vision tower (the image encoder), a projector (image features into the
language model's embedding space) and a language model (the decoder under the LM head).
Families name these parts differently; the names below are transformers' own.
:func:`freeze_parts` keeps named parts out of training (``model.freeze``), and
:func:`language_model_prefix` is where LoRA's targets are looked for by default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

# transformers' attribute names, on the model under the LM head (``hf.model``)
VISION_TOWERS = ("vision_tower", "vision_model", "visual")
PROJECTORS = ("multi_modal_projector", "connector")
PARTS = {"vision": VISION_TOWERS, "projector": PROJECTORS}
# What a processor adds to input_ids and attention_mask that the model takes, per image
# batch: pixels and, by family, image sizes or grids, patch masks or image-token types.
IMAGE_INPUTS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "token_type_ids",
                "mm_token_type_ids", "image_sizes")


def is_vision_language(hf_config: Mapping[str, Any] | Any) -> bool:
    """A Hugging Face config (dict or transformers config) of a vision-language model:
    one with a vision tower's config."""
    if isinstance(hf_config, Mapping):
        return isinstance(hf_config.get("vision_config"), Mapping)
    return getattr(hf_config, "vision_config", None) is not None


def part_modules(hf_model: nn.Module, part: str) -> list[tuple[str, nn.Module]]:
    """(name under ``hf_model``, module) of ``part`` (``vision`` or ``projector``)."""
    base_name = hf_model.base_model_prefix
    base = getattr(hf_model, base_name)
    return [(f"{base_name}.{name}", getattr(base, name)) for name in PARTS[part]
            if isinstance(getattr(base, name, None), nn.Module)]


def freeze_parts(hf_model: nn.Module, parts: Iterable[str]) -> int:
    """Stop gradients to ``parts`` of a vision-language model; the number of parameters
    frozen (0 for a text-only model, which has none of these parts)."""
    if not is_vision_language(hf_model.config):
        return 0
    frozen = 0
    for part in parts:
        for _, module in part_modules(hf_model, part):
            for param in module.parameters():
                param.requires_grad_(False)
                frozen += param.numel()
    return frozen


def language_model_prefix(hf_model: nn.Module) -> str | None:
    """The name of a vision-language model's language model under ``hf_model``
    (``model.language_model``, ``model.text_model``); None for a text-only model."""
    if not is_vision_language(hf_model.config):
        return None
    decoder = hf_model.get_decoder()
    return next(name for name, module in hf_model.named_modules() if module is decoder)
