"""What a native checkpoint knows of its Hugging Face origin (``hf_source.json``), and
which HF family a model exports as without one.

Kept apart from :mod:`astrai_core.checkpoints.hf.base` (the importers' base class, which
reads and writes whole checkpoints) so that choosing an importer and naming LoRA tensors
need no checkpoint I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from astrai_core.checkpoints.hf.files import read_json
from astrai_core.plugins.known import MODEL_TYPES

if TYPE_CHECKING:
    from astrai_core.model import ModelConfig

HF_SOURCE_FILE = "hf_source.json"


def default_model_type(cfg: ModelConfig) -> str:
    """A model without an HF origin exports as the simplest family that expresses it."""
    if cfg.num_experts > 0:
        return "qwen2_moe" if cfg.shared_expert_intermediate_size > 0 else "qwen3_moe"
    if cfg.qk_norm:
        return "qwen3"
    if cfg.attention_bias:
        return "qwen2"
    return "mistral" if cfg.sliding_window is not None else "llama"


def read_hf_source(native_dir: Path) -> dict[str, Any]:
    """What the import recorded about the HF source, or {} for a from-scratch model."""
    path = native_dir / HF_SOURCE_FILE
    return read_json(path) if path.is_file() else {}


def unsupported_model_type_message(model_type: Any, handled: str) -> str:
    """Why ``model_type`` cannot be imported, and which plugin would add it."""
    message = f"model_type {model_type!r} is not supported ({handled})."
    distribution = MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if distribution and distribution != "astrai-core":
        return f"{message} {model_type!r} is handled by {distribution}: pip install {distribution}"
    by_plugin: dict[str, list[str]] = {}
    for known_type, provider in sorted(MODEL_TYPES.items()):
        if provider != "astrai-core":
            by_plugin.setdefault(provider, []).append(known_type)
    adds = "; ".join(f"{provider} adds {', '.join(types)}" for provider, types in by_plugin.items())
    return f"{message} {adds}. Other families need an importer plugin." if adds else message
