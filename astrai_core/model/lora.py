"""LoRA on the native model, through peft (``model.lora`` in a run config).

peft's ``inject_adapter_in_model`` swaps the targeted ``nn.Linear`` modules for its LoRA
layers in place, so the model stays a :class:`CausalLM` (its config, KV cache and
forward are unchanged) and only the adapter tensors require grad. What peft does not
offer on an injected model is wrapped here, with peft's own layer methods:

- :func:`adapter_disabled`: the base model's forward (a strategy's frozen reference);
- :class:`DisabledAdapterReference`: that context as a parameter-free module, so a
  strategy's ``reference`` is the policy itself and no copy of the model exists;
- :func:`merged_state_dict` / :func:`base_state_dict`: native state dicts with the
  adapter merged (export, weight pushes to vLLM) or left out, without touching the
  live weights (peft's ``merge_safe``/``get_delta_weight`` on copies); one layer's
  merge is :func:`merged_weight`.

PEFT-format files with Hugging Face module names are in :mod:`astrai_core.checkpoints.lora_files`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

ADAPTER = "default"  # peft's adapter name; one adapter per model


def has_lora(model: nn.Module) -> bool:
    """True when peft injected an adapter into ``model`` (cheap: peft is not imported)."""
    return bool(getattr(model, "peft_config", None))


def peft_lora_config(*, r: int, alpha: float, dropout: float, target_modules: Sequence[str],
                     use_rslora: bool, use_dora: bool) -> Any:
    """peft's LoraConfig for these adapter settings (a ``model.lora`` section gives them:
    ``LoraSection.adapter_settings()``)."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                      target_modules=list(target_modules), use_rslora=use_rslora,
                      use_dora=use_dora, bias="none")


def inject_lora(model: nn.Module, lora_config: Any) -> nn.Module:
    """Inject a fresh adapter (peft's init: B = 0, so the model is unchanged) in place.

    peft freezes every base parameter and keeps the adapter in float32 whatever the base
    dtype (bf16 base, float32 adapter = master weights for the trained part)."""
    from peft import inject_adapter_in_model

    if has_lora(model):
        raise ValueError("the model already carries a LoRA adapter")
    inject_adapter_in_model(lora_config, model, adapter_name=ADAPTER)
    for param in adapter_parameters(model).values():
        param.data = param.data.float()
    return model


def lora_layers(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """(module name, peft LoRA layer) of every adapted module."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The adapter's own tensors, by state-dict name (``...q_proj.lora_A.default.weight``)."""
    return {name: param for name, param in model.named_parameters() if "lora_" in name}


@contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` computes its base forward inside the block (peft's ``enable_adapters``);
    which tensors require grad is restored on exit (peft's toggle resets it)."""
    layers = [layer for _, layer in lora_layers(model)]
    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for name, param in model.named_parameters():
            param.requires_grad_(trainable[name])


class DisabledAdapterReference(nn.Module):
    """A frozen reference that IS the policy with its adapter disabled: no weights of its
    own (the policy is held outside the module tree, so freezing or moving this module
    never touches the policy), no gradients, the policy's config."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "policy", policy)  # not a submodule: no second registration
        self.config = policy.config

    @property
    def chunked_head(self) -> bool:  # forwards target_ids= to the policy (model/head.py)
        return bool(getattr(self.__dict__["policy"], "chunked_head", False))

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        policy: nn.Module = self.__dict__["policy"]
        was_training = policy.training
        policy.eval()  # no adapter dropout anyway; eval keeps the base forward deterministic
        try:
            with torch.no_grad(), adapter_disabled(policy):
                return policy(*args, **kwargs)
        finally:
            policy.train(was_training)


def base_name(name: str) -> str:
    """Native state-dict name of a base tensor (peft inserts ``base_layer.``)."""
    return name.replace(".base_layer.", ".")


def base_state_dict(model: nn.Module, state: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The frozen base weights under native names (no adapter tensors), from ``state``
    (the model's state dict, e.g. gathered from its FSDP shards; default: its own)."""
    state = model.state_dict() if state is None else state
    return {base_name(name): t for name, t in state.items() if "lora_" not in name}


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Native names, the adapter merged into each adapted weight (``model`` is not
    modified); a model without LoRA gives its plain state dict."""
    if not has_lora(model):
        return model.state_dict()
    state = base_state_dict(model)
    for name, layer in lora_layers(model):
        if ADAPTER in layer.lora_A:
            state[f"{name}.weight"] = merged_weight(layer)
    return state


@torch.no_grad()
def merged_weight(layer: Any) -> torch.Tensor:
    """One peft LoRA layer's base weight with its adapter merged in (a new tensor; the
    layer is not modified)."""
    weight = layer.get_base_layer().weight
    if ADAPTER in getattr(layer, "lora_variant", {}):  # DoRA: peft's own merge, on a copy
        merged = layer.lora_variant[ADAPTER].merge_safe(layer, ADAPTER, weight.detach().clone())
    else:
        merged = weight + layer.get_delta_weight(ADAPTER).to(weight.dtype)
    return merged.to(weight.dtype)


def merge_and_unload(model: nn.Module) -> nn.Module:
    """``model`` as a plain native model holding the merged weights (in place)."""
    if not has_lora(model):
        return model
    merged = merged_state_dict(model)
    for name, layer in list(lora_layers(model)):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.get_base_layer())
    del model.peft_config
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(merged[name])
    return model
