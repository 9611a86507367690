"""Reading the fields shared by the Llama / Mistral / Qwen family of HF ``config.json``.

Both spellings of RoPE are accepted: transformers 5 writes ``rope_parameters``
(holding ``rope_theta``, ``rope_type`` and the scaling parameters); older checkpoints
have a top-level ``rope_theta`` and ``rope_scaling`` (with ``type`` or ``rope_type``).
Exports write the older spelling, which transformers 4 and 5 both read.
"""

from __future__ import annotations

from typing import Any

from astrai_core.errors import CheckpointError

# RoPE types whose HF implementation reads original_max_position_embeddings; transformers 5
# fills it from max_position_embeddings when a config omits it, and so do we.
_ROPE_WITH_ORIGINAL_LENGTH = ("llama3", "yarn")


def require(hf: dict[str, Any], key: str) -> Any:
    """A field the model cannot be built without."""
    value = hf.get(key)
    if value is None:
        raise CheckpointError(f"config.json has no {key!r} (model_type {hf.get('model_type')!r})")
    return value


def first_token_id(value: Any) -> int | None:
    """HF allows a list of eos ids; the native config keeps one (the first)."""
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def rope_from_hf(hf: dict[str, Any], default_theta: float = 10000.0) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from either config spelling."""
    params = hf.get("rope_parameters")
    if params is None:
        params = hf.get("rope_scaling")
    params = dict(params or {})
    if params and all(isinstance(value, dict) for value in params.values()):
        raise CheckpointError(f"config.json has RoPE parameters per layer type ({', '.join(params)}); "
                              "astrai's decoder uses one RoPE for all layers")
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = hf.get("rope_theta", default_theta)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if rope_type == "default":
        return float(theta), None
    if rope_type in _ROPE_WITH_ORIGINAL_LENGTH:
        params.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    return float(theta), {"rope_type": rope_type, **params}


def rope_to_hf(rope_theta: float, rope_scaling: dict | None) -> dict[str, Any]:
    """The older spelling: transformers 5 converts it to ``rope_parameters`` on load."""
    scaling = None if rope_scaling is None else dict(rope_scaling)
    return {"rope_theta": rope_theta, "rope_scaling": scaling}


def check_silu(hf: dict[str, Any]) -> None:
    activation = hf.get("hidden_act", "silu")
    if activation != "silu":
        raise CheckpointError(f"config.json has hidden_act={activation!r}; the native decoder's "
                              "SwiGLU uses silu")


def qwen_sliding_window(hf: dict[str, Any]) -> int | None:
    """Qwen2/Qwen3 use a sliding window only with ``use_sliding_window`` and only on the
    layers that ``layer_types`` (or ``max_window_layers``) mark; the native decoder has one
    window for all layers, so a mixed layout is refused rather than silently changed."""
    if not hf.get("use_sliding_window", False):
        return None
    window = require(hf, "sliding_window")
    num_layers = require(hf, "num_hidden_layers")
    layer_types = hf.get("layer_types") or [
        "sliding_attention" if i >= hf.get("max_window_layers", 0) else "full_attention"
        for i in range(num_layers)
    ]
    if any(kind != "sliding_attention" for kind in layer_types):
        raise CheckpointError("config.json uses a sliding window on some layers only "
                              "(use_sliding_window with layer_types/max_window_layers); the native "
                              "decoder applies one window to every layer")
    return int(window)


def qwen_sliding_window_to_hf(sliding_window: int | None, num_layers: int) -> dict[str, Any]:
    """Qwen's spelling of "this window on every layer" (or none)."""
    if sliding_window is None:
        return {"use_sliding_window": False, "sliding_window": None, "max_window_layers": num_layers,
                "layer_types": ["full_attention"] * num_layers}
    return {"use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": 0,
            "layer_types": ["sliding_attention"] * num_layers}


def common_fields_from_hf(hf: dict[str, Any], *, max_position_default: int = 4096,
                          head_dim_default: int | None = None) -> dict[str, Any]:
    """The native config fields every family spells the same way."""
    check_silu(hf)
    num_heads = require(hf, "num_attention_heads")
    rope_theta, rope_scaling = rope_from_hf(hf)
    return {
        "vocab_size": require(hf, "vocab_size"),
        "hidden_size": require(hf, "hidden_size"),
        "intermediate_size": require(hf, "intermediate_size"),
        "num_layers": require(hf, "num_hidden_layers"),
        "num_heads": num_heads,
        "num_kv_heads": hf.get("num_key_value_heads") or num_heads,
        "head_dim": hf.get("head_dim") or head_dim_default,
        "rms_norm_eps": hf.get("rms_norm_eps", 1e-6),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": hf.get("max_position_embeddings") or max_position_default,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "bos_token_id": first_token_id(hf.get("bos_token_id")),
        "eos_token_id": first_token_id(hf.get("eos_token_id")),
        "pad_token_id": first_token_id(hf.get("pad_token_id")),
    }


def common_fields_to_hf(cfg: Any, model_type: str, architecture: str) -> dict[str, Any]:
    """The HF fields every family spells the same way, from a native ModelConfig."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        **rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "attention_dropout": 0.0,
        "use_cache": True,
    }
