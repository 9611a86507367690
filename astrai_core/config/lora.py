"""The ``model.lora`` section (torch-free): LoRA adapters through peft on the native model.

The adapter is built by :mod:`astrai_core.model.lora`; this is only its validated shape,
so a bad option fails when the config is read, with the field path in the message.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The native decoder's nn.Linear modules LoRA can adapt (the same leaf names as Hugging
# Face's, so an adapter_config.json's target_modules reads the same on both sides).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSection(BaseModel):
    """``model.lora: {r, alpha, dropout, target_modules, use_rslora, use_dora, path, save_base}``."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="rank of the adapter matrices")
    alpha: float = Field(32.0, gt=0, description="scale: the update is alpha/r * B A "
                         "(alpha/sqrt(r) with use_rslora)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS),
        description=f"linear modules to adapt, by name: {', '.join(LORA_TARGETS)}")
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
        """The adapter's shape, as :func:`astrai_core.model.lora.peft_lora_config` takes it."""
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": list(self.target_modules), "use_rslora": self.use_rslora,
                "use_dora": self.use_dora}

    @field_validator("target_modules")
    @classmethod
    def _known_targets(cls, names: list[str]) -> list[str]:
        if not names:
            raise ValueError("name at least one module to adapt")
        unknown = sorted(set(names) - set(LORA_TARGETS))
        if unknown:
            raise ValueError(f"unknown module {unknown[0]!r}; LoRA adapts: {', '.join(LORA_TARGETS)}")
        return list(dict.fromkeys(names))
