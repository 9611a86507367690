"""The ``model.lora`` section (torch-free): LoRA adapters through peft on the native model.

The adapter is built by :mod:`astrai_core.model.lora`; this is only its validated shape,
so a bad option fails when the config is read, with the field path in the message.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The native decoder's nn.Linear modules LoRA can adapt (the same leaf names as Hugging
# Face's, so an adapter_config.json's target_modules reads the same on both sides).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR = "all-linear"


class LoraSection(BaseModel):
    """``model.lora: {r, alpha, dropout, target_modules, use_rslora, use_dora, path, save_base}``."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="rank of the adapter matrices")
    alpha: float = Field(32.0, gt=0, description="scale: the update is alpha/r * B A "
                         "(alpha/sqrt(r) with use_rslora)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] | Literal["all-linear"] | None = Field(
        None, description=f"linear modules to adapt, by name ({', '.join(LORA_TARGETS)}, or "
        "a transformers family's own names, e.g. query_key_value), or all-linear (every "
        "linear layer but the LM head); default: those projections, else the family's peft "
        "default")
    use_rslora: bool = Field(False, description="rank-stabilised scaling alpha/sqrt(r)")
    use_dora: bool = Field(False, description="DoRA: weight-decomposed LoRA (a learned "
                           "magnitude per output row)")
    path: str | None = Field(None, description="start from this PEFT adapter directory "
                             "(adapter_config.json + adapter_model.safetensors); its own "
                             "r/alpha/targets apply")
    save_base: bool = Field(False, description="also write the (frozen) base weights into "
                            "every checkpoint; off: checkpoints record where the base is "
                            "(a from-scratch base is always saved)")

    def adapter_settings(self) -> dict[str, Any]:
        """The adapter's shape, as :func:`astrai_core.model.lora.peft_lora_config` takes it,
        for the native model (a transformers family's names are resolved on its model)."""
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": self.native_targets(), "use_rslora": self.use_rslora,
                "use_dora": self.use_dora}

    def native_targets(self) -> list[str]:
        """``target_modules`` on the native decoder (whose linear layers are LORA_TARGETS)."""
        if self.target_modules is None or self.target_modules == ALL_LINEAR:
            return list(LORA_TARGETS)
        return list(self.target_modules)

    def unknown_native_target(self) -> str | None:
        """The message for a name the native decoder has no linear module of, or None."""
        unknown = sorted(set(self.native_targets()) - set(LORA_TARGETS))
        return (f"unknown module {unknown[0]!r}; LoRA on the native model adapts: "
                f"{', '.join(LORA_TARGETS)} (or {ALL_LINEAR})") if unknown else None

    @field_validator("target_modules")
    @classmethod
    def _named_targets(cls, names: list[str] | str | None) -> list[str] | str | None:
        if not isinstance(names, list):
            return names
        if not names:
            raise ValueError(f"name at least one module to adapt, or {ALL_LINEAR}")
        odd = [name for name in names if not name.replace("_", "a").isalnum()]
        if odd:
            raise ValueError(f"{odd[0]!r} is not a module name (a leaf name such as q_proj)")
        return list(dict.fromkeys(names))
