"""A policy's push state under Hugging Face names, in size-bounded buckets, for either
model backend: what an inference engine that loads Hugging Face checkpoints (vLLM's
``reload_weights``) takes.

* **native**: the push state of :func:`~astrai_core.distributed.weight_gather.push_tensors`
  (LoRA merged) converted by the family's importer (``state_dict_to_hf``), one tensor
  map at a time: a map's native tensors are gathered together (a fused map needs all of
  them), so a bucket may exceed the bound by at most one map.
* **transformers**: the wrapper's state names minus its prefix, which are the family's
  own names (LoRA merged; a tied output head travels once, as the embedding, as
  ``save_pretrained`` writes it).

Like :func:`~astrai_core.distributed.weight_gather.iter_full_buckets` this is a
collective under FSDP: every rank iterates it, and a yielded bucket is emptied when the
next one is requested.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from astrai_core.distributed.weight_gather import (Deferred, gather_full, iter_full_buckets,
                                                   nbytes, push_tensors)


def hf_name_prefix(model: nn.Module) -> str | None:
    """The prefix of a transformers-backend policy's state names before the family's own
    names (``"hf."``); None for a native policy."""
    from astrai_core.model_backends.transformers_lm import is_transformers_model

    if not is_transformers_model(model):
        return None
    return f"{model.base_model_prefix}."


def iter_hf_push_buckets(model: nn.Module, bucket_bytes: int, importer: Any = None,
                         moe_layout: str | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """``model``'s push state (LoRA merged) under Hugging Face names, in buckets of at
    most ``bucket_bytes`` (a collective under FSDP). A native policy needs the
    ``importer`` of the family to push as (``load_importer``) and optionally its
    ``moe_layout`` (default: per expert); a transformers-backend policy needs neither."""
    prefix = hf_name_prefix(model)
    if prefix is not None:
        return iter_full_buckets(_transformers_named(model, prefix), bucket_bytes)
    if importer is None:
        raise ValueError("a native policy's Hugging Face names come from its family's "
                         "importer: pass importer=load_importer(...)")
    return _native_buckets(model, bucket_bytes, importer, moe_layout)


def _transformers_named(model: nn.Module, prefix: str
                        ) -> Iterator[tuple[str, torch.Tensor | Deferred]]:
    from astrai_core.checkpoints.hf_model import output_head_names

    tied = (set(output_head_names(model)) if model.config.tie_word_embeddings else set())
    for name, tensor in push_tensors(model):
        hf_name = name.removeprefix(prefix)
        if hf_name not in tied:
            yield hf_name, tensor


def _native_buckets(model: nn.Module, bucket_bytes: int, importer: Any,
                    moe_layout: str | None) -> Iterator[dict[str, torch.Tensor]]:
    from astrai_core.checkpoints.hf.base import PER_EXPERT

    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    tensors = dict(push_tensors(model))
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for tensor_map in importer.weight_map(model.config, moe_layout or PER_EXPERT):
        needed = sum(nbytes(tensors[name]) for name in tensor_map.native)
        if bucket and size + needed > bucket_bytes:  # decided before the gather
            yield bucket
            bucket.clear()
            bucket, size = {}, 0
        with torch.no_grad():
            full = [_full(tensors[name]) for name in tensor_map.native]
            bucket.update(zip(tensor_map.hf, tensor_map.to_hf(full), strict=True))
        size += needed
    if bucket:
        yield bucket
        bucket.clear()


def _full(value: torch.Tensor | Deferred) -> torch.Tensor:
    return value.make() if isinstance(value, Deferred) else gather_full(value.detach())
