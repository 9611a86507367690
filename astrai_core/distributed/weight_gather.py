"""Full tensors out of a sharded model, one size-bounded bucket at a time (weight pushes).

A weight push hands an inference engine the policy's full tensors. Under FSDP2 each rank
holds only its shard of every parameter, and gathering the whole state at once would
cost every rank the full model. :func:`iter_full_buckets` builds the full tensors in
order and hands them over in buckets of at most ``bucket_bytes``: whether a tensor still
fits the current bucket is decided from its global shape and dtype *before* it is
gathered, so the current bucket goes out first and at most one bucket of full tensors
exists at a time. The consumer sends or loads a bucket; the next request empties it.

Both are collectives: every rank of the mesh iterates them with the same names in the
same order (each DTensor's ``full_tensor()`` is an all-gather). A rank that does not send
anything still takes part and drops the buckets.

:func:`iter_push_buckets` is what a sampler pushes: the policy's state under native
names, a LoRA adapter merged into its weights one adapted layer at a time from the
gathered adapter and base weight (never the whole model), the same tensors
:func:`~astrai_core.model.lora.merged_state_dict` gives an unsharded policy. A tied LM
head has no tensor of its own in the native state (the embedding is the head), so it
travels once, as the embedding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn


PIECE_BYTES = 32 * 2**20  # per rank and collective, in gather_full


@dataclass(frozen=True)
class Deferred:
    """A full tensor computed only when its bucket is filled (``make`` is a collective
    under FSDP); ``shape`` and ``dtype`` are what it will be, so it can be placed first."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]


def nbytes(value: torch.Tensor | Deferred) -> int:
    """The full (global) size of a tensor, DTensor or deferred tensor, in bytes."""
    numel = 1
    for size in value.shape:
        numel *= int(size)
    return numel * value.dtype.itemsize


def iter_full_buckets(named_tensors: Iterable[tuple[str, torch.Tensor | Deferred]],
                      bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """The full tensors of ``named_tensors`` (DTensors gathered, plain tensors as they are,
    :class:`Deferred` made), in order, grouped in buckets of at most ``bucket_bytes``; a
    tensor larger than the bound is a bucket of its own.

    A collective: every rank calls it with the same names in the same order. A yielded
    bucket is emptied when the next one is requested, so its tensors are freed before the
    next gather even while the caller's loop variable still names it; copy what must
    outlive it."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for name, value in named_tensors:
        needed = nbytes(value)
        if bucket and size + needed > bucket_bytes:  # decided before the gather
            yield bucket
            bucket.clear()
            bucket, size = {}, 0
        with torch.no_grad():
            bucket[name] = value.make() if isinstance(value, Deferred) else gather_full(value.detach())
        size += needed
    if bucket:
        yield bucket
        bucket.clear()


def iter_push_buckets(model: nn.Module, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """``model``'s push state (the names and values of ``merged_state_dict(model)`` on the
    unsharded model) in buckets of at most ``bucket_bytes`` (see :func:`iter_full_buckets`;
    a collective)."""
    return iter_full_buckets(push_tensors(model), bucket_bytes)


def push_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor | Deferred]]:
    """(native name, shard or deferred merged weight) of every tensor a push carries."""
    from astrai_core.model.lora import ADAPTER, base_state_dict, has_lora, lora_layers

    if not has_lora(model):
        yield from model.state_dict().items()
        return
    adapted = {f"{name}.weight": layer for name, layer in lora_layers(model)
               if ADAPTER in layer.lora_A}
    for name, tensor in base_state_dict(model).items():
        layer = adapted.get(name)
        if layer is None:
            yield name, tensor
        else:
            yield name, Deferred(tuple(tensor.shape), tensor.dtype, partial(_gathered_merge, layer))


def _gathered_merge(layer: nn.Module) -> torch.Tensor:
    """One LoRA layer's merged weight, computed on its gathered parameters by the same
    code as the unsharded merge (so the result is the same, bit for bit)."""
    from astrai_core.model.lora import merged_weight

    with full_parameters(layer):
        return merged_weight(layer)


def gather_full(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective); a plain tensor as it is.

    A tensor sharded on dim 0 over one mesh dimension (FSDP2; HSDP replicates over the
    other) is all-gathered straight into one new buffer, in pieces of at most
    ``PIECE_BYTES`` per rank, so building it costs one full copy (``full_tensor()``, and a
    whole-tensor all-gather on gloo, stage a second one). Shards follow ``torch.chunk``:
    ceil(rows / n) rows each, the last ones fewer or none, so a short shard is padded to
    that size for the gather (a copy of the shard) and the padding rows are cut off (a
    view). Other layouts go through ``full_tensor()``."""
    placements = getattr(value, "placements", None)
    if placements is None:
        return value
    sharded = [dim for dim, p in enumerate(placements) if not p.is_replicate()]
    if len(sharded) != 1 or not placements[sharded[0]].is_shard(0):
        return value.full_tensor()
    import torch.distributed as dist

    mesh_dim = sharded[0]
    parts = value.device_mesh.size(mesh_dim)
    rows = value.shape[0]
    chunk = -(-rows // parts)
    local = value.to_local()
    if local.shape[0] < chunk:  # an uneven shard (or none): pad it to the common size
        local = torch.cat([local, local.new_zeros((chunk - local.shape[0], *local.shape[1:]))])
    out = torch.empty((chunk * parts, *value.shape[1:]), dtype=local.dtype, device=local.device)
    group = value.device_mesh.get_group(mesh_dim)
    row_bytes = max(1, local[:1].numel() * local.element_size())
    step = max(1, PIECE_BYTES // row_bytes)
    for start in range(0, chunk, step):  # pieces: the backend's own staging stays small
        stop = min(start + step, chunk)
        dist.all_gather([out[rank * chunk + start:rank * chunk + stop] for rank in range(parts)],
                        local[start:stop].contiguous(), group=group)
    return out[:rows] if chunk * parts != rows else out


@contextmanager
def full_parameters(module: nn.Module) -> Iterator[None]:
    """Inside the block every sharded parameter of ``module`` (and its submodules) reads
    as its full tensor (gathered here, dropped on exit); the sharded parameters are put
    back as they were. Memory: ``module``'s full parameters (use it on one layer)."""
    saved: list[tuple[nn.Module, str, nn.Parameter]] = []
    try:
        for sub in module.modules():
            for key, param in list(sub._parameters.items()):
                if param is not None and hasattr(param, "full_tensor"):
                    saved.append((sub, key, param))
                    sub._parameters[key] = gather_full(param.detach())
        yield
    finally:
        for sub, key, param in saved:
            sub._parameters[key] = param
