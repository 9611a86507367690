"""Which modules of a transformers model ``model.lora.target_modules`` adapts.

``target_modules`` names the native decoder's projections (``q_proj`` ... ``down_proj``,
which most families spell the same way). A family that fuses some of them into one
linear module is translated here (Phi-3's ``qkv_proj`` and ``gate_up_proj``); a name the
family has no linear module for (the experts of an MoE family whose experts are fused
parameters, not ``nn.Linear``) adapts nothing, and the caller says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

# model_type -> {native name: the family's module name}
FUSED_NAMES: dict[str, dict[str, str]] = {
    "phi3": {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
             "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"},
}


def family_targets(model: nn.Module, model_type: str, requested: Sequence[str]
                   ) -> tuple[list[str], list[str]]:
    """(the family's linear module names for ``requested``, the requested names it has
    no linear module for) in ``model`` (a transformers model)."""
    leaves = {name.rpartition(".")[2] for name, module in model.named_modules()
              if isinstance(module, nn.Linear)}
    renames = FUSED_NAMES.get(model_type, {})
    found: list[str] = []
    missing: list[str] = []
    for name in requested:
        target = renames.get(name, name)
        if target in leaves:
            found.append(target)
        else:
            missing.append(name)
    return list(dict.fromkeys(found)), missing
