"""How native tensors correspond to Hugging Face tensors.

A :class:`TensorMap` ties one group of native state-dict names to one group of HF
names, with a conversion each way. Most are 1:1 renames; MoE experts stack per-expert
HF tensors into one fused native tensor, or split HF's fused ``gate_up_proj``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Convert = Callable[[Sequence["torch.Tensor"]], list["torch.Tensor"]]


def same(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return list(tensors)


@dataclass(frozen=True)
class TensorMap:
    """``native`` names <-> ``hf`` names; ``to_native``/``to_hf`` convert the groups."""

    native: tuple[str, ...]
    hf: tuple[str, ...]
    to_native: Convert = same
    to_hf: Convert = same


def rename(native: str, hf: str) -> TensorMap:
    return TensorMap((native,), (hf,))


def stack_experts(native: str, hf_per_expert: Sequence[str]) -> TensorMap:
    """Native fused ``[E, ...]`` <-> one HF tensor per expert (``...experts.{j}...``)."""
    import torch

    def to_native(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.stack(list(tensors))]

    def to_hf(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        # clone: safetensors refuses views that share one storage
        return [expert.clone() for expert in tensors[0].unbind(0)]

    return TensorMap((native,), tuple(hf_per_expert), to_native, to_hf)


def split_gate_up(native_gate: str, native_up: str, hf_gate_up: str) -> TensorMap:
    """Native gate ``[E, I, H]`` and up ``[E, I, H]`` <-> HF fused ``gate_up_proj``
    ``[E, 2I, H]`` (gate first, as transformers' experts chunk it)."""
    import torch

    def to_native(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        gate, up = tensors[0].chunk(2, dim=1)
        return [gate.contiguous(), up.contiguous()]

    def to_hf(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat(list(tensors), dim=1)]

    return TensorMap((native_gate, native_up), (hf_gate_up,), to_native, to_hf)
