"""astrai-plugin-qwen3: the ``qwen3`` importer (Qwen3, Qwen3-MoE, Qwen2-MoE checkpoints)."""

from __future__ import annotations

from astrai_core import ModelImporterSpec, hookimpl


@hookimpl
def astrai_model_importers() -> list[ModelImporterSpec]:
    return [
        ModelImporterSpec(name="qwen3", target="astrai_plugin_qwen3.importer:Qwen3Importer",
                          summary="Qwen3, Qwen3-MoE and Qwen2-MoE Hugging Face checkpoints",
                          model_types=("qwen3", "qwen3_moe", "qwen2_moe")),
    ]
