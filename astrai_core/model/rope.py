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
    """cos/sin for integer positions, looked up in tables that grow on demand.

    Table rows are computed with exactly the per-position formula (positions as float
    times the inverse frequencies, then cos/sin), so a lookup equals computing them
    afresh; only "dynamic" scaling, whose frequencies depend on the call's positions,
    computes them per call.
    """

    _MIN_TABLE = 256

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        with torch.device("cpu"):  # also when the model is built on the meta device
            self.inv_freq, self.attention_scaling = compute_inv_freq(config)
        self._device_inv_freq: dict[torch.device, torch.Tensor] = {}
        # (device, dtype) -> (cos, sin, signed sin) tables [rows, head_dim]
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, ...]] = {}

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

    def _compute(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self._inv_freq(position_ids)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)

    def _table(self, rows: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, sin, signed sin of positions [0, n), n >= rows a power of two (at least 256)."""
        table = self._tables.get((device, dtype))
        if table is None or table[0].shape[0] < rows:
            size = max(self._MIN_TABLE, 1 << (rows - 1).bit_length())
            cos, sin = self._compute(torch.arange(size, device=device), dtype)
            table = (cos, sin, signed_sin(sin))
            self._tables[(device, dtype)] = table
        return table

    def _lookup(self, position_ids: torch.Tensor, dtype: torch.dtype, max_position: int | None,
                which: tuple[int, int]) -> tuple[torch.Tensor, ...] | None:
        """Two table columns' rows [B, S, head_dim] for the positions; None if the table can't serve them."""
        if self.config.rope_type == "dynamic" or position_ids.numel() == 0:
            return None
        if max_position is None:
            low, high = torch.aminmax(position_ids)
            if int(low) < 0:  # not a table row
                return None
            max_position = int(high)
        table = self._table(max_position + 1, position_ids.device, dtype)
        flat = position_ids.reshape(-1)
        shape = (*position_ids.shape, table[0].shape[-1])
        return tuple(table[i].index_select(0, flat).view(shape) for i in which)

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype,
                max_position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [B, S, head_dim] in ``dtype`` for integer positions [B, S].

        ``max_position``: an upper bound of the positions when the caller knows one (saves
        reading them back to size the table).
        """
        found = self._lookup(position_ids, dtype, max_position, (0, 1))
        return found if found is not None else self._compute(position_ids, dtype)

    def factors(self, position_ids: torch.Tensor, dtype: torch.dtype,
                max_position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [B, 1, S, head_dim], for :func:`apply_rotary_factors`."""
        found = self._lookup(position_ids, dtype, max_position, (0, 2))
        if found is None:
            cos, sin = self._compute(position_ids, dtype)
            found = (cos, signed_sin(sin))
        return found[0].unsqueeze(1), found[1].unsqueeze(1)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: rotate_half(x) * sin == x.roll(half) * signed_sin exactly."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, S, head_dim] by cos/sin [B, S, head_dim]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def apply_rotary_factors(x: torch.Tensor, cos: torch.Tensor, signed: torch.Tensor) -> torch.Tensor:
    """apply_rotary with :meth:`RotaryEmbedding.factors`: the same values in fewer operations."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed
