"""Rotary position embeddings with the scaling types real checkpoints use.

Layout: the Hugging Face "rotate_half" layout — the rotation pairs dimension i with
dimension i + head_dim/2 (first half / second half), not adjacent (even, odd) pairs.
HF checkpoints store q/k projections for this layout, so they import without any
per-head permutation of q_proj/k_proj (or of q_norm/k_norm).

The inverse frequencies follow transformers' ``modeling_rope_utils`` exactly, so the
logits match theirs.
"""

from __future__ import annotations

import math

import torch

from astrai_core.model.config import ModelConfig


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    return 1.0 / (base ** exponents)


def _llama3_inv_freq(config: ModelConfig, rope: dict) -> torch.Tensor:
    inv_freq = _base_inv_freq(config.rope_theta, config.head_dim)
    factor = rope["factor"]
    low_freq_factor = rope["low_freq_factor"]
    high_freq_factor = rope["high_freq_factor"]
    old_context_len = rope.get("original_max_position_embeddings", config.max_position_embeddings)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(config: ModelConfig, rope: dict) -> tuple[torch.Tensor, float]:
    base, dim = config.rope_theta, config.head_dim
    original_max = rope.get("original_max_position_embeddings", config.max_position_embeddings)
    factor = rope["factor"]
    if factor is None:
        factor = config.max_position_embeddings / original_max
    attention_factor = rope.get("attention_factor")
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a division by zero in the ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


def _dynamic_inv_freq(config: ModelConfig, rope: dict, seq_len: int | None) -> torch.Tensor:
    dim = config.head_dim
    max_positions = config.max_position_embeddings
    seq_len = max_positions if seq_len is None else max(seq_len, max_positions)
    factor = rope["factor"]
    base = config.rope_theta * ((factor * seq_len / max_positions) - (factor - 1)) ** (dim / (dim - 2))
    return _base_inv_freq(base, dim)


def compute_inv_freq(config: ModelConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] (float32, CPU) and the cos/sin scale for the config's RoPE type.

    ``seq_len`` only matters for "dynamic" (NTK) scaling, which stretches the base once a
    sequence is longer than ``max_position_embeddings``.
    """
    rope = config.rope_scaling or {}
    rope_type = config.rope_type
    if rope_type == "default":
        # HF's default path computes the exponents directly in float (no int64 arange).
        dim = config.head_dim
        return 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    if rope_type == "linear":
        return _base_inv_freq(config.rope_theta, config.head_dim) / rope["factor"], 1.0
    if rope_type == "dynamic":
        return _dynamic_inv_freq(config, rope, seq_len), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(config, rope), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(config, rope)
    raise ValueError(f"unsupported rope_type {rope_type!r}")


class RotaryEmbedding:
    """Computes cos/sin once per forward; every layer reuses them."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        with torch.device("cpu"):  # also when the model is built on the meta device
            self.inv_freq, self.attention_scaling = compute_inv_freq(config)
        self._device_inv_freq: dict[torch.device, torch.Tensor] = {}

    def _inv_freq(self, position_ids: torch.Tensor) -> torch.Tensor:
        if self.config.rope_type == "dynamic":
            # Dynamic NTK: stretch the base once positions go past max_position_embeddings
            # (stateless version of HF's dynamic_rope_update: depends only on this call's positions).
            seq_len = int(position_ids.max()) + 1
            if seq_len > self.config.max_position_embeddings:
                with torch.device("cpu"):
                    inv_freq = compute_inv_freq(self.config, seq_len)[0]
                return inv_freq.to(position_ids.device)
        device = position_ids.device
        if device not in self._device_inv_freq:
            self._device_inv_freq[device] = self.inv_freq.to(device)
        return self._device_inv_freq[device]

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [B, S, head_dim] in ``dtype`` for integer positions [B, S]."""
        freqs = position_ids[..., None].float() * self._inv_freq(position_ids)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, S, head_dim] by cos/sin [B, S, head_dim]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin
