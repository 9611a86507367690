"""The native decoder-only language model (Llama / Mistral / Qwen2 / Qwen3 / Qwen-MoE)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from astrai_core.model.attention import Attention
from astrai_core.model.config import ModelConfig
from astrai_core.model.context_parallel import ContextShard
from astrai_core.model.head import head_outputs
from astrai_core.model.kv_cache import KVCache
from astrai_core.model.layers import RMSNorm, SwiGLU
from astrai_core.model.document_attention import DocumentLayout
from astrai_core.model.masks import AttentionBias, build_attention_bias, given_layout_bias
from astrai_core.model.moe import (MoEBlock, RouterOutput, balancing_loss, balancing_terms,
                                  global_balancing_terms, router_statistics)
from astrai_core.model.rope import RotaryEmbedding


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config, layer_index)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.is_moe = config.is_moe_layer(layer_index)
        self.mlp = MoEBlock(config) if self.is_moe else SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: AttentionBias,
                kv_cache: KVCache | None = None) -> tuple[torch.Tensor, RouterOutput | None]:
        x = x + self.attn(self.attn_norm(x), cos, sin, bias, kv_cache)
        router = None
        if self.is_moe:
            mlp_out, router = self.mlp(self.mlp_norm(x))
        else:
            mlp_out = self.mlp(self.mlp_norm(x))
        return x + mlp_out, router


class CausalLM(nn.Module):
    """Decoder with an LM head. ``forward`` returns a dict (see its docstring)."""

    chunked_head = True  # forward(target_ids=...) gives log-probs (model/head.py)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Tied: the head reuses embed.weight, so there is no lm_head parameter to save twice.
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config)
        # Activation checkpointing (see enable_activation_checkpointing): each layer's
        # activations are recomputed in the backward instead of kept.
        self.gradient_checkpointing = False
        # A sum over the data-parallel ranks (a distributed run sets it): the MoE
        # load-balancing loss of a training forward is then the global batch's.
        self.balance_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """From-scratch init: normal(0, std) for matrices, ones for norms, zeros for biases."""
        for name, param in self.named_parameters():
            if param.device.type == "meta":
                continue
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, std)

    def head_weight(self) -> torch.Tensor:
        """The output projection [V, H]: lm_head's, or the embedding when tied."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def _run_layer(self, layer: DecoderLayer, *args: Any) -> tuple[torch.Tensor, RouterOutput | None]:
        # Only training forwards are checkpointed: generation (a KV cache) and no-grad
        # forwards keep nothing for a backward anyway. Non-reentrant, so it composes with
        # FSDP2's per-layer hooks (the recompute all-gathers the layer again).
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled() and args[-1] is None:
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        return_hidden_states: bool = False,
        logits_to_keep: int = 0,
        target_ids: torch.Tensor | None = None,
        temperature: float = 1.0,
        return_entropy: bool = False,
        head: Callable[[torch.Tensor, torch.Tensor], dict[str, Any]] | None = None,
        document_layout: DocumentLayout | None = None,
        context_shard: ContextShard | None = None,
    ) -> dict[str, Any]:
        """input_ids [B, S] -> {"logits" [B, S, V] float32, "aux_loss" 0-d, "router_stats" list,
        "hidden_states" [B, S, H] (after the final norm) when asked}.

        attention_mask [B, past + S]: 1 = real token, 0 = padding. position_ids [B, S]:
        default arange from the cache length; without a cache, positions that do not follow
        their predecessor by exactly 1 start a new packed document. logits_to_keep > 0:
        logits only for the last that many positions ([B, logits_to_keep, V]; generation
        needs only the last one); 0 keeps all.

        target_ids [B, T] (the last T tokens of input_ids): no logits; instead "logprobs"
        [B, T] of each target under softmax(logits / temperature) at the position before
        it, and "entropy" [B, T] of that distribution with return_entropy, computed by the
        chunked head (model/head.py) here, where FSDP2 has gathered the head.

        head: a custom head in place of the logits: called here with the final hidden
        states [B, S, H] and the head weight [V, H]; the dict it returns is the output's
        (distillation's losses over two models' logits, :func:`chunked_logits_map`).

        document_layout: the attention's segments of a packed batch given, not detected
        from the positions (a shared prompt's completions see it: rollout/packing.py); no
        KV cache, no attention_mask.

        context_shard: context parallel (model/context_parallel.py): input_ids are this
        rank's shard of the rows, whose whole positions and mask the shard carries (no
        attention_mask, position_ids or KV cache then).
        """
        if context_shard is not None:
            position_ids = context_shard.local(context_shard.positions)
            if context_shard.attention_mask is not None:
                attention_mask = context_shard.local(context_shard.attention_mask)
        x, routers = self._decode(input_ids, attention_mask, position_ids, kv_cache,
                                  document_layout, context_shard)
        hidden = self.norm(x)
        out = head_outputs(hidden, self.head_weight(), logits_to_keep=logits_to_keep,
                           target_ids=target_ids, temperature=temperature,
                           return_entropy=return_entropy, head=head)
        if return_hidden_states:
            out["hidden_states"] = hidden
        out.update(self._router_outputs(routers, attention_mask, input_ids.shape[1], x.device))
        return out

    def _decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None, kv_cache: KVCache | None,
                document_layout: DocumentLayout | None = None,
                context_shard: ContextShard | None = None,
                ) -> tuple[torch.Tensor, list[RouterOutput]]:
        """The embedding and the decoder layers (before the final norm): the last layer's
        output [B, S, H] and the router outputs of the MoE layers; the cache advanced."""
        batch, seq = input_ids.shape
        past = kv_cache.length if kv_cache is not None else 0
        if position_ids is not None and position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        packed_positions = position_ids if kv_cache is None else None
        max_position = None
        if position_ids is None:
            position_ids = torch.arange(past, past + seq, device=input_ids.device).expand(batch, seq)
            max_position = past + seq - 1
        x = self.embed(input_ids)
        if document_layout is not None:
            bias = given_layout_bias(document_layout, self.config.sliding_window, seq)
        else:
            # context parallel: the whole rows' bias, attended head-sharded
            rows = (seq, attention_mask, packed_positions) if context_shard is None else (
                context_shard.positions.shape[1], context_shard.attention_mask,
                context_shard.positions)
            bias = build_attention_bias(
                query_len=rows[0], past_len=past, attention_mask=rows[1], position_ids=rows[2],
                sliding_window=self.config.sliding_window, dtype=x.dtype, device=x.device)
            bias.context = context_shard
        cos, sin = self.rotary.factors(position_ids, x.dtype, max_position)

        routers: list[RouterOutput] = []
        for layer in self.layers:
            x, router = self._run_layer(layer, x, cos, sin, bias, kv_cache)
            if router is not None:
                routers.append(router)
        if kv_cache is not None:
            kv_cache.advance(seq)
        return x, routers

    def _router_outputs(self, routers: list[RouterOutput], attention_mask: torch.Tensor | None,
                        seq: int, device: torch.device) -> dict[str, Any]:
        """Aux loss averaged over MoE layers (0 for dense models) and per-layer router stats."""
        if not routers:
            return {"aux_loss": torch.zeros((), device=device), "router_stats": []}
        valid = None if attention_mask is None else attention_mask[:, -seq:].reshape(-1)
        num_experts = self.config.num_experts
        terms = torch.stack([balancing_terms(r, num_experts, valid) for r in routers])
        # A training forward of a distributed run: the global batch's token fractions (the
        # ranks run these forwards in step; generation and no-grad forwards stay local).
        if self.balance_over_ranks is not None and self.training and torch.is_grad_enabled():
            terms = global_balancing_terms(terms, self.balance_over_ranks)
        losses = [balancing_loss(layer_terms, num_experts) for layer_terms in terms]
        return {
            "aux_loss": torch.stack(losses).mean(),
            "router_stats": [router_statistics(r, num_experts, valid) for r in routers],
        }


def enable_activation_checkpointing(module: nn.Module, enabled: bool = True) -> int:
    """Checkpoint every decoder layer of every native model inside ``module`` (a policy,
    or a critic around its backbone): the layer's forward runs under
    ``torch.utils.checkpoint`` (non-reentrant), its activations recomputed in the backward,
    which trades about one more forward of compute for the layers' activation memory.
    Returns how many models were switched; 0 means ``module`` holds no native model."""
    models = [sub for sub in module.modules() if isinstance(sub, CausalLM)]
    for model in models:
        model.gradient_checkpointing = enabled
    return len(models)
