"""Preallocated key/value cache for incremental decoding."""

from __future__ import annotations

import torch

from astrai_core.model.config import ModelConfig


class KVCache:
    """Per layer k/v tensors [B, kv_heads, max_length, head_dim]; ``length`` positions are filled.

    A forward with ``kv_cache=`` writes its keys/values at [length, length + S), attends
    over [0, length + S) and then advances ``length`` by S. All rows share ``length``:
    the caller describes left padding with the attention mask.
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_length: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (batch_size, config.num_kv_heads, max_length, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.max_length = max_length
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    def update(self, layer_index: int, key: torch.Tensor, value: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new k/v [B, kv_heads, S, head_dim] after ``length``; return all filled k/v."""
        end = self.length + key.shape[2]
        if end > self.max_length:
            raise ValueError(f"KV cache overflow: {end} positions needed, max_length is {self.max_length}")
        self.keys[layer_index][:, :, self.length:end] = key
        self.values[layer_index][:, :, self.length:end] = value
        return self.keys[layer_index][:, :, :end], self.values[layer_index][:, :, :end]

    def advance(self, num_tokens: int) -> None:
        """Mark ``num_tokens`` more positions as filled (the model calls this after each forward)."""
        self.length += num_tokens

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (e.g. drop finished sequences), in this order."""
        rows = rows.to(device=self.keys[0].device, dtype=torch.long)
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]

    def reset(self) -> None:
        self.length = 0
