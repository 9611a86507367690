"""Key/value cache for incremental decoding, grown in chunks of columns as it fills."""

from __future__ import annotations

import torch

from astrai_core.model.config import ModelConfig


class KVCache:
    """Per layer k/v tensors [B, kv_heads, max_length, head_dim]; ``length`` positions are filled.

    A forward with ``kv_cache=`` writes its keys/values at [length, length + S), attends
    over [0, length + S) and then advances ``length`` by S. All rows share ``length``:
    the caller describes left padding with the attention mask. ``grow`` adds columns at
    the end (the torch sampler allocates a prompt's columns and then a chunk at a time, not
    the longest possible sequence up front).
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
        for tensors in (self.keys, self.values):  # layer by layer: no second whole cache
            for layer, tensor in enumerate(tensors):
                tensors[layer] = tensor.index_select(0, rows)

    @property
    def allocated_positions(self) -> int:
        """Rows x columns held per layer (filled or not): what the cache costs."""
        return self.batch_size * self.max_length

    @property
    def nbytes(self) -> int:
        """Bytes of every layer's keys and values."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def grow(self, columns: int) -> None:
        """Add ``columns`` empty positions at the end of every layer's keys and values.

        One layer at a time, so growing costs one layer's copy beyond the cache, not a
        second whole cache."""
        pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, columns))  # noqa: E731  [B, H, S, D] on S
        for tensors in (self.keys, self.values):
            for layer, tensor in enumerate(tensors):
                tensors[layer] = pad(tensor)
        self.max_length += columns

    def reset(self) -> None:
        self.length = 0
