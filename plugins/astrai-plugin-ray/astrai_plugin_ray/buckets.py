"""Weights cut into size-bounded buckets: each bucket is one flat byte buffer.

The trainer packs the tensors of a bucket back to back as raw bytes (any dtype, bf16
included), the buffer travels whole (one broadcast, or one object in Ray's store), and a
worker unpacks views of it by the layout that went ahead in the actor call. A tensor
larger than the bound travels alone in its own bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ALIGN = 16  # bytes


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in its bucket."""

    name: str
    dtype: str           # "float32", "bfloat16", ...
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    nbytes: int
    entries: tuple[Entry, ...]


def plan_buckets(tensors: dict[str, Tensor], limit_bytes: int) -> list[Bucket]:
    """Consecutive tensors grouped into buckets of at most ``limit_bytes`` each."""
    buckets: list[Bucket] = []
    entries: list[Entry] = []
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        offset = -(-size // ALIGN) * ALIGN  # a view as a wider dtype needs an aligned start
        if entries and offset + nbytes > limit_bytes:
            buckets.append(Bucket(size, tuple(entries)))
            entries, size, offset = [], 0, 0
        dtype = str(tensor.dtype).removeprefix("torch.")
        entries.append(Entry(name, dtype, tuple(tensor.shape), offset, nbytes))
        size = offset + nbytes
    if entries:
        buckets.append(Bucket(size, tuple(entries)))
    return buckets


def pack(bucket: Bucket, tensors: dict[str, Tensor], device: torch.device) -> Tensor:
    """The bucket's tensors as one uint8 buffer on ``device``."""
    buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
    for entry in bucket.entries:
        flat = tensors[entry.name].detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[entry.offset:entry.offset + entry.nbytes].copy_(flat)
    return buffer


def unpack(bucket: Bucket, buffer: Tensor) -> dict[str, Tensor]:
    """Views of ``buffer`` as the bucket's tensors."""
    return {entry.name: buffer[entry.offset:entry.offset + entry.nbytes]
            .view(getattr(torch, entry.dtype)).view(entry.shape)
            for entry in bucket.entries}
