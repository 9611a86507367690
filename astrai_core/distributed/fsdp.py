"""FSDP2 over the data-parallel mesh: sharding the run's modules, and generating on
unsharded parameters.

Each decoder layer is its own ``fully_shard`` unit (its parameters are all-gathered just
before it runs and freed after), and the root unit holds the rest (embeddings, final
norm, head; a critic's value head). Gradients are reduce-scattered in float32 whatever
the parameter dtype (``MixedPrecisionPolicy(reduce_dtype=float32)``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from astrai_core.distributed.context import DistContext
from astrai_core.model.decoder import enable_activation_checkpointing
from astrai_core.model_backends.transformers_lm import transformers_models

PARAM_DTYPES = {"no": None, "bf16": torch.bfloat16}


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The decoder layers inside ``module`` (one FSDP unit each): the native model's, and a
    transformers model's (the classes its ``_no_split_modules`` names)."""
    from astrai_core.model.decoder import DecoderLayer
    from astrai_core.model_backends.transformers_lm import decoder_layers as hf_layers

    return [sub for sub in module.modules() if isinstance(sub, DecoderLayer)] + hf_layers(module)


def shard_module(module: nn.Module, dist: DistContext, mixed_precision: str = "no") -> nn.Module:
    """``fully_shard`` every decoder layer of ``module`` and then ``module`` itself, in place."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[mixed_precision],
                                  reduce_dtype=torch.float32)
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=dist.mesh, mp_policy=policy)
    fully_shard(module, mesh=dist.mesh, mp_policy=policy)
    return module


def shard_run(run: Any, strategy: Any) -> None:
    """Apply activation checkpointing and FSDP2 to every module of the run: the policy,
    the modules the strategy trains beside it (a critic) and its frozen ones (a reference)."""
    parallel = run.plan.config.parallel
    trained = [m.module for m in strategy.trained_modules().values()]
    if parallel.activation_checkpointing:  # every model inside: policy, critic
        for module in [run.model, *trained]:
            enable_activation_checkpointing(module)
            for model in transformers_models(module):
                model.enable_activation_checkpointing()
    if not run.dist.enabled:
        return
    for module in [run.model, *trained, *strategy.frozen_modules().values()]:
        shard_module(module, run.dist, run.trainer.mixed_precision)
    balance_over_ranks([run.model, *trained], run.dist)


def balance_over_ranks(modules: Iterable[nn.Module], dist: DistContext) -> None:
    """The MoE load-balancing loss of every model inside ``modules`` (the trained ones),
    native or transformers, takes its token fractions from the global batch
    (model/moe.py)."""
    from astrai_core.model.decoder import CausalLM
    from astrai_core.model_backends.transformers_lm import TransformersCausalLM

    for module in modules:
        for sub in module.modules():
            if isinstance(sub, (CausalLM, TransformersCausalLM)) and sub.config.num_experts:
                sub.balance_over_ranks = dist.sum_tensor


def fsdp_units(module: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [sub for sub in module.modules() if isinstance(sub, FSDPModule)]


@contextlib.contextmanager
def unsharded(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Every FSDP unit of ``modules`` gathered once for the whole block, then resharded.

    Generation runs one forward per token, and ranks generate different numbers of
    tokens: inside this block a forward issues no collective at all, so that is safe,
    and the parameters travel once per rollout instead of once per token."""
    units = [unit for module in modules for unit in fsdp_units(module)]
    if not units:
        yield
        return
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


class UnshardedSampler:
    """A sampler of the live (sharded) policy whose ``generate`` runs on gathered weights;
    every other attribute is the wrapped sampler's."""

    def __init__(self, sampler: Any, model: nn.Module) -> None:
        self._sampler, self._model = sampler, model
        self._held = False

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if self._held:  # inside gathered(): the weights are already there
            return self._sampler.generate(*args, **kwargs)
        with torch.no_grad(), unsharded([self._model]):
            return self._sampler.generate(*args, **kwargs)

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Every ``generate`` inside the block runs on one gathering of the policy, so the
        ranks may call it different numbers of times (each its own share of prompts)."""
        with torch.no_grad(), unsharded([self._model]):
            self._held = True
            try:
                yield
            finally:
                self._held = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)


def full_tensor(value: Any) -> Any:
    """A DTensor's full value (a collective); anything else as it is."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value
