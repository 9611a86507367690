"""ModelConfig: the architecture of the native decoder (Llama/Mistral/Qwen family)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")

# Parameters each RoPE type needs (beyond rope_type) and those it may take.
_ROPE_REQUIRED: dict[str, set[str]] = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor"},
    "yarn": {"factor"},
}
_ROPE_OPTIONAL: dict[str, set[str]] = {
    "default": set(),
    "linear": set(),
    "dynamic": set(),
    "llama3": {"original_max_position_embeddings"},
    "yarn": {"original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
             "mscale", "mscale_all_dim", "truncate"},
}
# Keys tolerated in every rope dict: HF writes them alongside the type's own parameters.
_ROPE_COMMON = {"rope_type", "rope_theta", "partial_rotary_factor"}


class ModelConfig(BaseModel):
    """Architecture hyper-parameters; field names follow the HF configs where they exist."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = []
    router_aux_loss_coef: float = 0.001
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    @field_validator("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "max_position_embeddings", "decoder_sparse_step")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be a positive integer")
        return value

    @field_validator("rope_scaling")
    @classmethod
    def _check_rope_scaling(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        rope = dict(value)
        if "rope_type" not in rope and "type" in rope:  # the older HF spelling
            rope["rope_type"] = rope.pop("type")
        rope_type = rope.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        rope["rope_type"] = rope_type
        missing = _ROPE_REQUIRED[rope_type] - rope.keys()
        if missing:
            raise ValueError(f"rope_type {rope_type!r} needs {', '.join(sorted(missing))}")
        unknown = rope.keys() - _ROPE_REQUIRED[rope_type] - _ROPE_OPTIONAL[rope_type] - _ROPE_COMMON
        if unknown:
            raise ValueError(f"unknown keys for rope_type {rope_type!r}: {', '.join(sorted(unknown))}")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor other than 1.0 is not supported")
        rope.pop("partial_rotary_factor", None)
        return rope

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelConfig:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError("hidden_size must be a multiple of num_heads when head_dim is not set")
            self.head_dim = self.hidden_size // self.num_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        rope_theta_in_dict = (self.rope_scaling or {}).pop("rope_theta", None)
        if rope_theta_in_dict is not None and float(rope_theta_in_dict) != self.rope_theta:
            raise ValueError(f"rope_scaling.rope_theta ({rope_theta_in_dict}) differs from rope_theta "
                             f"({self.rope_theta})")
        if self.sliding_window == 0:  # Qwen2-MoE configs spell "no window" as 0
            self.sliding_window = None
        if self.sliding_window is not None and self.sliding_window < 0:
            raise ValueError("sliding_window must be positive (or null/0 for none)")
        if self.num_experts < 0:
            raise ValueError("num_experts must be >= 0")
        if self.num_experts > 0:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                                 f"[1, num_experts={self.num_experts}]")
            if self.moe_intermediate_size is None:
                self.moe_intermediate_size = self.intermediate_size
        return self

    @property
    def rope_type(self) -> str:
        return (self.rope_scaling or {}).get("rope_type", "default")

    def is_moe_layer(self, layer_index: int) -> bool:
        """The HF Qwen2-MoE/Qwen3-MoE rule for which layers use the sparse MLP."""
        return (self.num_experts > 0 and layer_index not in self.mlp_only_layers
                and (layer_index + 1) % self.decoder_sparse_step == 0)
