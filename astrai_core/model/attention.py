"""Grouped-query self-attention through scaled_dot_product_attention."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from astrai_core.model.config import ModelConfig
from astrai_core.model.context_parallel import heads_to_sequence, kv_for_context, sequence_to_heads
from astrai_core.model.document_attention import Scores, document_attention, scaled_attention
from astrai_core.model.layers import RMSNorm
from astrai_core.model.masks import AttentionBias
from astrai_core.model.rope import apply_rotary_factors

if TYPE_CHECKING:
    from astrai_core.model.kv_cache import KVCache


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        hidden, head_dim, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * head_dim, hidden, bias=False)
        # Qwen3: RMSNorm over head_dim of each q/k head, applied before RoPE.
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if config.qk_norm else None

    def _heads(self, x: torch.Tensor, proj: nn.Linear, norm: RMSNorm | None) -> torch.Tensor:
        batch, seq, _ = x.shape
        states = proj(x).view(batch, seq, -1, self.head_dim)
        if norm is not None:
            states = norm(states)
        return states.transpose(1, 2)  # [B, heads, S, head_dim]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: AttentionBias,
                kv_cache: KVCache | None = None) -> torch.Tensor:
        """cos, sin: :meth:`RotaryEmbedding.factors` of the positions ([B, 1, S, head_dim])."""
        batch, seq, _ = x.shape
        query = apply_rotary_factors(self._heads(x, self.q_proj, self.q_norm), cos, sin)
        key = apply_rotary_factors(self._heads(x, self.k_proj, self.k_norm), cos, sin)
        value = self._heads(x, self.v_proj, None)
        if kv_cache is not None:
            key, value = kv_cache.update(self.layer_index, key, value)
        return self.o_proj(attend_rows(query, key, value, bias).reshape(batch, seq, -1))


def attend_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                bias: AttentionBias, scores: Scores | None = None) -> torch.Tensor:
    """query [B, H, S, D], key/value [B, KV, S, D] of this rank's tokens -> [B, S, H, D]
    under ``bias``; under context parallelism (``bias.context``), every token of this
    rank's heads is attended between the two all-to-alls."""
    shard = bias.context
    if shard is None:
        return _attend(query, key, value, bias, scores)
    key, value = kv_for_context(key, value, query.shape[1], shard.size)
    query, key, value = (sequence_to_heads(t, shard) for t in (query, key, value))
    out = heads_to_sequence(_attend(query, key, value, bias, scores).transpose(1, 2), shard)
    return out.transpose(1, 2)


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            bias: AttentionBias, scores: Scores | None) -> torch.Tensor:
    """query [B, H, S, D], key/value [B, KV, S, D] -> [B, S, H, D]."""
    if bias.documents is not None:  # a packed row: one attention per document
        return document_attention(query, key, value, bias.documents, bias.window, scores)
    out = scaled_attention(query, key, value, bias.mask, is_causal=bias.is_causal,
                           scores=scores)
    return out.transpose(1, 2)
