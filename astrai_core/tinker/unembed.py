"""LoRA on the unembedding (LM head), for tenants created with ``train_unembed``.

astrai's models never call the head as a module: their forward scores the final hidden
states against ``model.head_weight()`` (the chunked head, :mod:`astrai_core.model.head`),
so a peft LoRA wrapped around ``lm_head`` would never run. Here the active tenant's update
is folded into that weight instead: ``head_weight()`` returns ``W + alpha/r * B @ A``,
which is peft's ``x W^T + alpha/r * (x A^T) B^T`` for the same ``A`` and ``B``, and
gradients reach ``A`` and ``B`` through it. The merged ``[V, H]`` weight is built once per
forward (one extra ``V x H`` float32 tensor while it lives), and kept across the tokens of
one sampling call when no gradient is wanted.

The tensors live in the model under ``tinker_unembed.lora_A.<slot>.weight`` and
``….lora_B.<slot>.weight``, so a slot's parameters, gradients and saved files include
them like its other LoRA tensors; peft's files name them after the Hugging Face model's
output embedding (``lm_head``, or e.g. GPT-NeoX's ``embed_out``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

MODULE = "tinker_unembed"  # the attribute on the model, and its tensors' name prefix


class UnembedAdapters(nn.Module):
    """The unembedding LoRAs of one base model, by slot, and the one in effect."""

    def __init__(self, base_weight: Callable[[], torch.Tensor], alpha: float) -> None:
        super().__init__()
        self.lora_A = nn.ModuleDict()
        self.lora_B = nn.ModuleDict()
        self.alpha = alpha
        self._base_weight = base_weight
        self._active: str | None = None
        self._merged: torch.Tensor | None = None  # a no-grad merge, until the next activate

    def add(self, slot: str, rank: int) -> None:
        """A fresh adapter as peft starts one: A Kaiming-uniform (the current RNG), B zero."""
        weight = self._base_weight()
        vocab, hidden = weight.shape
        self.lora_A[slot] = nn.Linear(hidden, rank, bias=False, device=weight.device)
        self.lora_B[slot] = nn.Linear(rank, vocab, bias=False, device=weight.device)
        nn.init.zeros_(self.lora_B[slot].weight)

    def remove(self, slot: str) -> None:
        for table in (self.lora_A, self.lora_B):
            if slot in table:
                del table[slot]
        if self._active == slot:
            self.activate(None)

    def activate(self, slot: str | None) -> None:
        self._active = slot if slot in self.lora_A else None
        self._merged = None

    def head_weight(self) -> torch.Tensor:
        """The head weight [V, H] with the active slot's update (the base's without one)."""
        weight = self._base_weight()
        if self._active is None:
            return weight
        if self._merged is not None:
            return self._merged
        a = self.lora_A[self._active].weight
        b = self.lora_B[self._active].weight
        # in the base's dtype, as the head's matmul with the hidden states needs
        merged = (weight + (self.alpha / a.shape[0]) * (b @ a)).to(weight.dtype)
        if not torch.is_grad_enabled():
            self._merged = merged
        return merged


def attach(model: nn.Module, alpha: float) -> UnembedAdapters:
    """Install the unembedding adapters on ``model``: its ``head_weight()`` then answers
    with the active one's update folded in."""
    adapters = UnembedAdapters(model.head_weight, alpha)
    setattr(model, MODULE, adapters)
    model.head_weight = adapters.head_weight  # the instance's, in place of the class's
    return adapters


def hf_module_name(model: nn.Module) -> str:
    """The Hugging Face module name of ``model``'s output embedding, as peft names it."""
    hf = getattr(model, "hf", None)
    if hf is not None:
        head = hf.get_output_embeddings()
        for name, module in hf.named_modules():
            if module is head:
                return name
    return "lm_head"  # every family astrai imports natively calls it so
