"""Many tenants' LoRA adapters on one base model held once (peft's named adapters).

Each tenant gets its own peft adapter (``t0``, ``t1``, …) injected next to the others in
the same LoRA layers; :meth:`AdapterSlots.activate` makes one of them the only active
adapter, so a forward runs the base plus that tenant's update and a backward reaches
only that tenant's tensors (peft's ``set_adapter`` sets ``requires_grad`` on the active
adapter's tensors only). The base weights stay frozen and shared. A tenant with
``train_unembed`` also gets a LoRA on the unembedding (:mod:`astrai_core.tinker.unembed`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from astrai_core.config.lora import LORA_TARGETS
from astrai_core.model.lora import lora_layers
from astrai_core.tinker.engine_types import LoraSpec
from astrai_core.tinker.unembed import attach

LORA_ALPHA = 32.0  # the update is alpha/r * B A, as astrai's model.lora default
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def requested_targets(spec: LoraSpec) -> list[str]:
    """The native projection names a tenant's ``LoraSpec`` adapts (its ``train_unembed``
    LoRA is not a peft layer: see :mod:`astrai_core.tinker.unembed`)."""
    names = (ATTN if spec.train_attn else ()) + (MLP if spec.train_mlp else ())
    return [name for name in LORA_TARGETS if name in names]


def model_targets(model: nn.Module, names: list[str]) -> list[str]:
    """``names`` in the model's own module names (a transformers family's, e.g. Phi-3's
    fused ``qkv_proj``); a family with none of the native names (GPT-NeoX's
    ``query_key_value``) takes peft's default targets for its model type."""
    from astrai_core.model_backends.lora_targets import family_targets, peft_default_targets
    from astrai_core.model_backends.transformers_lm import is_transformers_model

    if not is_transformers_model(model) or not names:
        return names
    found, _ = family_targets(model.hf, model.model_type, names)
    if not found:
        found, _ = family_targets(model.hf, model.model_type,
                                  peft_default_targets(model.model_type))
    return found


class AdapterSlots:
    """The adapters injected into one base model, by slot name, and which one is active."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.configs: dict[str, Any] = {}
        self._next = 0
        # resolved now, on the bare model: once peft wraps a linear layer, its leaf name
        # is the wrapper's and the family's names are no longer found by type
        self._targets = {(attn, mlp): model_targets(model, requested_targets(
            LoraSpec(rank=1, train_attn=attn, train_mlp=mlp)))
            for attn in (False, True) for mlp in (False, True)}
        for param in model.parameters():
            param.requires_grad_(False)
        self.unembed = attach(model, LORA_ALPHA)

    def add(self, spec: LoraSpec) -> str:
        """Inject a fresh adapter (peft's init, seeded by ``spec.seed``); returns its slot."""
        from peft import LoraConfig, inject_adapter_in_model

        targets = self.targets(spec)

        slot = f"t{self._next}"
        self._next += 1
        config = LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                            target_modules=list(targets), bias="none")
        seed = spec.seed if spec.seed is not None else torch.seed() % 2**31
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # peft warns that a second adapter joins the model: that is the point here
            warnings.simplefilter("ignore", UserWarning)
            torch.manual_seed(seed)
            if targets:
                inject_adapter_in_model(config, self.model, adapter_name=slot)
            if spec.train_unembed:
                self.unembed.add(slot, spec.rank)
        self.configs[slot] = config
        for param in self.parameters(slot).values():
            param.data = param.data.float()
        self.activate(None)
        return slot

    def targets(self, spec: LoraSpec) -> list[str]:
        """The model's module names ``spec`` adapts (empty: it trains nothing)."""
        return self._targets[(spec.train_attn, spec.train_mlp)]

    def remove(self, slot: str) -> None:
        for _, layer in lora_layers(self.model):
            if slot in layer.lora_A:
                layer.delete_adapter(slot)
        self.unembed.remove(slot)
        self.configs.pop(slot, None)
        self.activate(None)

    def parameters(self, slot: str) -> dict[str, nn.Parameter]:
        """The slot's own tensors, by state-dict name (``…q_proj.lora_A.<slot>.weight``)."""
        marks = (f".lora_A.{slot}.", f".lora_B.{slot}.")
        return {name: param for name, param in self.model.named_parameters()
                if any(mark in name for mark in marks)}

    def activate(self, slot: str | None) -> None:
        """Make ``slot`` the only adapter in effect (None: the bare base); only its tensors
        require grad."""
        for _, layer in lora_layers(self.model):
            names = [slot] if slot is not None and slot in layer.lora_A else []
            layer.set_adapter(names)
            layer.enable_adapters(bool(names))
        self.unembed.activate(slot)
        for name, param in self.model.named_parameters():
            param.requires_grad_(slot is not None and f".{slot}." in name and "lora_" in name)
