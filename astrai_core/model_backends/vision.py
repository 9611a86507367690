"""The parts of a transformers vision-language model (``AutoModelForImageTextToText``).

Such a model is a vision tower (the image encoder), a projector (image features into the
language model's embedding space) and a language model (the decoder under the LM head).
Families name these parts differently; the names below are transformers' own. The
Qwen-VL families keep their projector (the patch merger, and Qwen3-VL's deepstack
mergers) inside the vision tower: there the vision part is the tower less the projector.
:func:`freeze_parts` keeps named parts out of training (``model.freeze``), and
:func:`language_model_prefix` is where LoRA's targets are looked for by default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

# transformers' attribute names, on the model under the LM head (``hf.model``)
VISION_TOWERS = ("vision_tower", "vision_model", "visual")
PROJECTORS = ("multi_modal_projector", "connector", "visual.merger",
              "visual.deepstack_merger_list")
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
    """(name under ``hf_model``, module) of ``part`` (``vision`` or ``projector``); no
    module of one part holds a module of the other."""
    base_name = hf_model.base_model_prefix
    base = getattr(hf_model, base_name)
    found = [(name, base.get_submodule(name)) for name in PARTS[part] if _has(base, name)]
    if part == "vision":
        found = [pair for name, tower in found for pair in _less_projectors(name, tower, base)]
    return [(f"{base_name}.{name}", module) for name, module in found]


def _has(base: nn.Module, name: str) -> bool:
    try:
        return isinstance(base.get_submodule(name), nn.Module)
    except AttributeError:
        return False


def _less_projectors(name: str, tower: nn.Module, base: nn.Module
                     ) -> list[tuple[str, nn.Module]]:
    """The tower, or its children but the projectors when it holds some (Qwen-VL)."""
    inside = {path.removeprefix(f"{name}.") for path in PROJECTORS
              if path.startswith(f"{name}.") and _has(base, path)}
    if not inside:
        return [(name, tower)]
    return [(f"{name}.{child}", module) for child, module in tower.named_children()
            if child not in inside]


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
