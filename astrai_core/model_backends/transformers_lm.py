"""Any transformers ``AutoModelForCausalLM`` (or vision-language
``AutoModelForImageTextToText``) behind the native model's interface.

:class:`TransformersCausalLM` holds the transformers model (``.hf``) and answers the same
``forward`` as :class:`astrai_core.model.CausalLM`:

- ``target_ids``: log-probs (and entropy) through the chunked head
  (:func:`astrai_core.model.head.head_logprobs`) over the base model's final hidden
  states, so no [B, S, V] float32 logits exist; Gemma's final logit soft-capping is
  applied inside the chunks;
- ``return_hidden_states``: those final hidden states (a critic's value head);
- ``attention_mask`` [B, past + S] and ``position_ids``; positions that restart (no
  cache) are packed documents: for the families astrai's attention runs
  (:mod:`~astrai_core.model_backends.hf_attention`) each document is attended on its own,
  as in the native decoder; other families' rows (without a mask) are kept apart by
  transformers' own masks;
- ``context_shard``: context parallelism (``parallel.context_parallel``) for those
  families, as in the native decoder;
- ``kv_cache``: a :class:`TransformersKVCache` (transformers' ``DynamicCache``) made by
  :meth:`TransformersCausalLM.new_kv_cache`, for the torch sampler;
- ``images``: a vision-language model's image inputs, as its processor makes them
  (``pixel_values`` and the family's others, :data:`~astrai_core.model_backends.vision.
  IMAGE_INPUTS`), for the rows' image tokens;
- ``aux_loss``: the family's own load-balancing loss for MoE models (router logits); in
  a distributed training forward the same loss over the global batch's token fractions.

Only the LM head is computed here instead of by the transformers model; everything
below it (embeddings, layers, final norm) is the family's own code, so the numbers are
transformers' numbers (Gemma's final soft-capping and Granite's ``logits_scaling``
included).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from astrai_core.model.context_parallel import ContextShard
from astrai_core.model.head import head_outputs
from astrai_core.model.masks import packed_layout
from astrai_core.model_backends.hf_attention import (FAMILIES, ROWS_KEYWORD, WholeRows,
                                                     install, register, rows_forward)

# Config attributes under which families spell their number of routed experts.
_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts")


@dataclass(frozen=True)
class BackendConfig:
    """What the trainer and the strategies read of a model's config, for a transformers
    model (the native :class:`~astrai_core.model.ModelConfig` has the same names)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    max_position_embeddings: int
    num_experts: int
    num_experts_per_tok: int
    router_aux_loss_coef: float
    tie_word_embeddings: bool
    final_logit_softcapping: float | None
    logits_scaling: float = 1.0  # Granite divides its logits by it

    @classmethod
    def of(cls, config: Any) -> BackendConfig:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        experts = next((int(getattr(text, name)) for name in _EXPERT_COUNTS
                        if getattr(text, name, None)), 0)
        return cls(model_type=str(config.model_type), vocab_size=int(text.vocab_size),
                   hidden_size=int(text.hidden_size),
                   max_position_embeddings=int(getattr(text, "max_position_embeddings", None)
                                               or 1 << 20),
                   num_experts=experts,
                   num_experts_per_tok=int(getattr(text, "num_experts_per_tok", 0) or 0),
                   router_aux_loss_coef=float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0),
                   tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
                   final_logit_softcapping=getattr(text, "final_logit_softcapping", None),
                   logits_scaling=float(getattr(text, "logits_scaling", None) or 1.0))


class TransformersKVCache:
    """The native KV cache's interface over transformers' ``DynamicCache``: ``length``
    positions are filled, ``select`` keeps batch rows, ``grow`` makes room for more, the
    model ``advance``s it."""

    def __init__(self, hf_config: Any, batch_size: int, max_length: int) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=hf_config)
        self.batch_size = batch_size
        self.max_length = max_length
        self.length = 0

    def advance(self, num_tokens: int) -> None:
        self.length += num_tokens
        if self.length > self.max_length:
            raise ValueError(f"KV cache overflow: {self.length} positions, max_length is "
                             f"{self.max_length}")

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows.to(dtype=torch.long))
        self.batch_size = int(rows.numel())

    def grow(self, columns: int) -> None:
        """Room for ``columns`` more positions (the DynamicCache grows its tensors itself)."""
        self.max_length += columns


class TransformersCausalLM(nn.Module):
    """A transformers causal LM with the native forward; see the module docstring."""

    chunked_head = True  # forward(target_ids=...) gives log-probs (model/head.py)
    # Where the transformers model sits, as transformers spells it: peft's injection asks
    # transformers for the weight conversions of the model it adapts, which reads this.
    base_model_prefix = "hf"

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model
        self.config = BackendConfig.of(hf_model.config)
        self._cache_argument = _cache_argument(self.decoder())
        # astrai's attention in the family's layers: packed rows per document, and
        # context parallelism (model_backends/hf_attention.py)
        self.astrai_attention = install(hf_model)
        # Set for the trained policy of a distributed run (distributed/fsdp.py): the MoE
        # load-balancing loss then takes the global batch's token fractions.
        self.balance_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.astrai_attention:  # a copy unpickled in another process: register it there
            register(self.hf.config._attn_implementation)

    @property
    def image_token_ids(self) -> tuple[int, ...]:
        """A vision-language model's image placeholder tokens (the family's config names
        them ``image_token_id`` or ``image_token_index``; none for a text model)."""
        config = self.hf.config
        ids = {getattr(config, name, None) for name in ("image_token_id", "image_token_index")}
        return tuple(sorted(int(i) for i in ids if i is not None))

    @property
    def model_type(self) -> str:
        return self.config.model_type

    def decoder(self) -> nn.Module:
        """The base model under the LM head (embeddings, layers, final norm)."""
        return getattr(self.hf, self.hf.base_model_prefix)

    def head_weight(self) -> torch.Tensor:
        return self.hf.get_output_embeddings().weight

    def decoder_layer_classes(self) -> tuple[str, ...]:
        """The class names of the decoder layers (FSDP2 wraps each: ``_no_split_modules``)."""
        return tuple(getattr(self.hf, "_no_split_modules", None) or ())

    def new_kv_cache(self, batch_size: int, max_length: int, dtype: torch.dtype,
                     device: torch.device | str) -> TransformersKVCache:
        """An empty cache for generation (the torch sampler); its tensors are made by
        the first forward, in the model's dtype and on its device."""
        return TransformersKVCache(self.hf.config, batch_size, max_length)

    def enable_activation_checkpointing(self, enabled: bool = True) -> None:
        """transformers' own per-layer checkpointing, non-reentrant (it composes with FSDP2)."""
        renamed = hasattr(self.hf, "activation_checkpointing_enable")  # transformers >= 5.x
        if enabled and renamed:
            self.hf.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False})
        elif enabled:
            self.hf.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        elif renamed:
            self.hf.activation_checkpointing_disable()
        else:
            self.hf.gradient_checkpointing_disable()

    @property
    def activation_checkpointing(self) -> bool:
        hf = self.hf
        return bool(hf.is_activation_checkpointing if hasattr(hf, "is_activation_checkpointing")
                    else hf.is_gradient_checkpointing)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: TransformersKVCache | None = None,
        return_hidden_states: bool = False,
        logits_to_keep: int = 0,
        target_ids: torch.Tensor | None = None,
        temperature: float = 1.0,
        return_entropy: bool = False,
        head: Callable[[torch.Tensor, torch.Tensor], dict[str, Any]] | None = None,
        context_shard: ContextShard | None = None,
        images: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """As :meth:`astrai_core.model.CausalLM.forward` (``context_shard``: input_ids are
        this rank's shard of the rows, whose whole positions and mask the shard carries)."""
        seq = input_ids.shape[1]
        if position_ids is not None and position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        moe = self.config.num_experts > 0
        kwargs, attention_mask = self._inputs(input_ids, attention_mask, position_ids,
                                              kv_cache, context_shard)
        kwargs["use_cache"] = kv_cache is not None
        if images:  # the vision tower's inputs; the base model puts its features in place
            kwargs.update(images)
        if kv_cache is not None:
            kwargs[self._cache_argument] = kv_cache.cache
        if moe:
            kwargs["output_router_logits"] = True
        with rows_forward(ROWS_KEYWORD in kwargs):
            out = self.decoder()(**kwargs)
        if kv_cache is not None:
            kv_cache.advance(seq)
        hidden = out.last_hidden_state
        # Granite's logits are the head's divided by logits_scaling: the same as the head
        # applied to the hidden states so divided (the head is linear)
        scaled = hidden if self.config.logits_scaling == 1.0 else hidden / self.config.logits_scaling
        result = head_outputs(scaled, self.head_weight(), logits_to_keep=logits_to_keep,
                              target_ids=target_ids, temperature=temperature,
                              return_entropy=return_entropy, head=head,
                              softcap=self.config.final_logit_softcapping)
        if return_hidden_states:
            result["hidden_states"] = hidden
        result["aux_loss"] = self._aux_loss(out, attention_mask, hidden.device) if moe \
            else torch.zeros((), device=hidden.device)
        result["router_stats"] = []
        return result

    def _inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None, kv_cache: TransformersKVCache | None,
                context_shard: ContextShard | None) -> tuple[dict[str, Any], torch.Tensor | None]:
        """(the transformers model's inputs, the mask of this forward's tokens). Packed
        rows and a context shard go through astrai's attention with the whole rows."""
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask,
                                  "position_ids": position_ids}
        if context_shard is not None:
            if not self.astrai_attention:
                raise ValueError(f"context parallelism needs astrai's attention, which "
                                 f"model_type {self.model_type!r} does not use (supported: "
                                 f"{', '.join(FAMILIES)})")
            shard_mask = context_shard.attention_mask
            local_mask = None if shard_mask is None else context_shard.local(shard_mask)
            return {"input_ids": input_ids, "attention_mask": None,
                    "position_ids": context_shard.local(context_shard.positions),
                    ROWS_KEYWORD: WholeRows.of_shard(context_shard)}, local_mask
        if self.astrai_attention and kv_cache is None and position_ids is not None:
            positions = position_ids.expand(input_ids.shape[0], -1)
            layout = packed_layout(attention_mask, positions)
            if layout is not None:  # several documents in a row: attended one by one
                kwargs.update(attention_mask=None, position_ids=positions, **{
                    ROWS_KEYWORD: WholeRows(input_ids.shape[1], attention_mask, positions,
                                            layout=layout)})
        return kwargs, attention_mask

    def _aux_loss(self, out: Any, attention_mask: torch.Tensor | None,
                  device: torch.device) -> torch.Tensor:
        """The family's load-balancing loss over the router logits of this forward; in a
        distributed training forward, over the global batch's token fractions."""
        router_logits = getattr(out, "router_logits", None)
        loss_fn = getattr(sys.modules[type(self.hf).__module__], "load_balancing_loss_func", None)
        if not router_logits or loss_fn is None:
            return torch.zeros((), device=device)
        mask = None if attention_mask is None else attention_mask[:, -out.last_hidden_state.shape[1]:]
        if self.balance_over_ranks is not None and self.training and torch.is_grad_enabled():
            return global_switch_loss(router_logits, self.config.num_experts,
                                      self.config.num_experts_per_tok, mask,
                                      self.balance_over_ranks)
        loss = loss_fn(router_logits, self.config.num_experts, self.config.num_experts_per_tok,
                       mask)
        return loss if torch.is_tensor(loss) else torch.zeros((), device=device)


def global_switch_loss(router_logits: tuple[torch.Tensor, ...], num_experts: int, top_k: int,
                       attention_mask: torch.Tensor | None,
                       sum_over_ranks: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The Switch load-balancing loss transformers' ``load_balancing_loss_func`` computes
    (the layers' router logits taken as one token set: E * sum_e f_e * P_e, f_e counting
    every top-k slot), with f_e and the token count those of the global batch (summed over
    the data-parallel ranks by ``sum_over_ranks``, as the native MoE does). On one process
    it equals the family's own function."""
    from astrai_core.model.moe import (RouterOutput, balancing_loss, balancing_terms,
                                       global_balancing_terms)

    valid = None if attention_mask is None else attention_mask.reshape(-1)
    terms = []
    for logits in router_logits:
        probs = torch.softmax(logits.reshape(-1, num_experts).float(), dim=-1)
        selected = torch.topk(probs, top_k, dim=-1).indices
        terms.append(balancing_terms(RouterOutput(probs, selected), num_experts, valid))
    total = global_balancing_terms(torch.stack(terms).sum(0), sum_over_ranks)
    return balancing_loss(total, num_experts)


def _cache_argument(decoder: nn.Module) -> str:
    """The name of the base model's cache argument (``cache`` since transformers 5.x's
    rename, ``past_key_values`` before)."""
    parameters = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def is_transformers_model(module: nn.Module) -> bool:
    """True for a :class:`TransformersCausalLM` (sharded or not)."""
    return isinstance(module, TransformersCausalLM)


def transformers_models(module: nn.Module) -> list[TransformersCausalLM]:
    """Every :class:`TransformersCausalLM` inside ``module`` (a policy, a critic's backbone)."""
    return [sub for sub in module.modules() if isinstance(sub, TransformersCausalLM)]


def shipped_code_modules(module: nn.Module) -> list[ModuleType]:
    """The Python modules of model code a checkpoint directory ships (``auto_map``, run
    with ``trust_remote_code``) that ``module``'s transformers models are built from:
    transformers imports them under ``transformers_modules``, a package another process
    has only once it loaded the same directory, so a copy of the model sent to another
    process carries them by value."""
    names = {type(sub).__module__ for model in transformers_models(module)
             for sub in (*model.hf.modules(), model.hf.config)}
    return [sys.modules[name] for name in sorted(names)
            if name.split(".")[0] == "transformers_modules" and name in sys.modules]


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The decoder layers of every transformers model inside ``module``, found by the
    class names in its ``_no_split_modules``."""
    layers = []
    for model in transformers_models(module):
        names = set(model.decoder_layer_classes())
        layers += [sub for sub in model.hf.modules() if type(sub).__name__ in names]
    return layers
