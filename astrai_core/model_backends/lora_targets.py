"""Which modules of a model ``model.lora.target_modules`` adapts.

``target_modules`` takes three forms:

- not given: the native decoder's projections (``q_proj`` ... ``down_proj``, which most
  families spell the same way); a family that fuses some of them into one linear module
  is translated (Phi-3's ``qkv_proj`` and ``gate_up_proj``). A family with none of them
  (GPT-NeoX's ``query_key_value``) takes peft's default targets for its model type, and a
  family peft has no default for takes every linear layer;
- ``all-linear``: every linear layer of the language model (not the LM head), as peft's
  ``all-linear`` means it;
- a list of names: the native names (translated as above) or the family's own module
  names (``query_key_value``, ``dense``). A name the family has no linear module for
  (the experts of an MoE family whose experts are fused parameters, not ``nn.Linear``)
  adapts nothing, and the caller says so.

On a vision-language model every form means the language model's modules only (the
vision tower and projector stay as they are): :func:`lora_scope` is the module the names
are looked for in, and :func:`scoped_targets` spells each chosen module by its full name.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

ALL_LINEAR = "all-linear"

# model_type -> {native name: the family's module name}
FUSED_NAMES: dict[str, dict[str, str]] = {
    "phi3": {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
             "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"},
}


def linear_leaves(model: nn.Module, head: nn.Module | None = None) -> list[str]:
    """The leaf names of ``model``'s ``nn.Linear`` modules, in model order, leaving out
    ``head`` (the LM head: peft's ``all-linear`` does not adapt it either)."""
    names = [name.rpartition(".")[2] for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and module is not head]
    return list(dict.fromkeys(names))


def family_targets(model: nn.Module, model_type: str, requested: Sequence[str]
                   ) -> tuple[list[str], list[str]]:
    """(the family's linear module names for ``requested``, the requested names it has
    no linear module for) in ``model`` (a transformers model)."""
    leaves = set(linear_leaves(model))
    renames = FUSED_NAMES.get(model_type, {})
    found: list[str] = []
    missing: list[str] = []
    for name in requested:
        target = renames.get(name, name)
        if target in leaves:
            found.append(target)
        elif name in leaves:
            found.append(name)
        else:
            missing.append(name)
    return list(dict.fromkeys(found)), missing


def peft_default_targets(model_type: str) -> list[str]:
    """peft's default LoRA target modules for ``model_type`` (empty when it has none)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    return list(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type, ()))


def default_targets(model: nn.Module, model_type: str, native: Sequence[str],
                    head: nn.Module | None) -> tuple[list[str], str]:
    """(the targets when ``target_modules`` is not given, where they come from): the
    ``native`` projections the family has, else peft's default for the family, else
    every linear layer but the head."""
    found, _ = family_targets(model, model_type, native)
    if found:
        return found, "the native projections"
    found, _ = family_targets(model, model_type, peft_default_targets(model_type))
    if found:
        return found, f"peft's default for model_type {model_type!r}"
    return linear_leaves(model, head), ALL_LINEAR


def lora_scope(hf_model: nn.Module) -> nn.Module:
    """Where LoRA's targets are looked for: a vision-language model's language model, a
    text model whole."""
    from astrai_core.model_backends.vision import language_model_prefix

    prefix = language_model_prefix(hf_model)
    return hf_model if prefix is None else hf_model.get_submodule(prefix)


def scoped_targets(hf_model: nn.Module, leaves: Sequence[str]) -> list[str]:
    """``leaves`` as peft's ``target_modules``: unchanged for a text model; for a
    vision-language model, the full name (under ``hf_model``) of each linear module of its
    language model with one of those leaf names, so no vision module of the same name is
    adapted."""
    from astrai_core.model_backends.vision import language_model_prefix

    prefix = language_model_prefix(hf_model)
    if prefix is None:
        return list(leaves)
    wanted = set(leaves)
    return [f"{prefix}.{name}" for name, module in hf_model.get_submodule(prefix).named_modules()
            if isinstance(module, nn.Linear) and name.rpartition(".")[2] in wanted]
