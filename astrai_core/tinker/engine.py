"""The Tinker engine on torch: base models held once, each tenant a LoRA adapter slot.

:class:`TorchEngine` implements :class:`~astrai_core.tinker.engine_types.Engine`. A call
activates its tenant's adapter (:mod:`astrai_core.tinker.adapters`) and runs the shared
base; a tenant's call touches only its own adapter tensors, gradients and AdamW state,
so no tenant changes another's outputs. Calls are serialised by a lock. In a server of
several processes (:mod:`astrai_core.tinker.lockstep`), each process's engine runs its
share of a request's datums (:attr:`TorchEngine.dist`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from astrai_core.distributed.context import SINGLE, DistContext
from astrai_core.distributed.fsdp import unsharded
from astrai_core.model.head import target_logprobs
from astrai_core.tinker import weight_files as files
from astrai_core.tinker.bases import LoadedBase
from astrai_core.tinker.batch import build_batch, check_datums
from astrai_core.tinker.engine_types import (AdamSpec, BaseModelFacts, DatumIn,
                                             EngineRequestError, ForwardOut, LoraSpec,
                                             SampleOut, SamplerTarget, SampleSpec)
from astrai_core.tinker.losses import LOSSES, loss_config
from astrai_core.tinker.rank_rows import gather_outputs, rank_rows, sum_gradients
from astrai_core.tinker.sample_backends import SampleBackend, TorchBackend
from astrai_core.tinker.sampling import prompt_logprobs as prompt_logprobs_of
from astrai_core.tinker.sampling import sampling_params
from astrai_core.tinker.tenants import Tenant


@dataclass(frozen=True)
class EngineLimits:
    max_adapters: int = 64        # tenants (training adapters) per engine
    max_sampler_adapters: int = 8  # saved adapters kept loaded for sampling (least recent out)
    max_datums: int = 4096        # datums per forward/forward_backward request
    max_tokens_per_datum: int | None = None  # None: the base's context length


class TorchEngine:
    """``TorchEngine(bases, state_dir)``: ``bases`` from :func:`astrai_core.tinker.bases.load_base`."""

    def __init__(self, bases: list[LoadedBase], state_dir: str | Path,
                 limits: EngineLimits = EngineLimits()) -> None:
        self.bases = {base.facts.name: base for base in bases}
        self.state_dir = Path(state_dir)
        self.limits = limits
        self.tenants: dict[str, Tenant] = {}
        self.sampler_slots: OrderedDict[str, tuple[LoadedBase, str]] = OrderedDict()
        self._tokenizers: dict[str, Any] = {}
        self._lock = threading.RLock()
        # False on the processes of a multi-process server other than rank 0, which writes
        # every file (each process holds the same adapters)
        self.writes_files = True
        # the processes of a multi-process server: each runs its share of every request's
        # datums (SINGLE: one process runs them all)
        self.dist: DistContext = SINGLE
        # who generates samples (sample_backends): astrai's torch sampler unless a
        # registry sampler serving adapters is set
        self.backend: SampleBackend = TorchBackend()

    # ---------------------------------------------------------------- models
    def base_models(self) -> list[BaseModelFacts]:
        return [base.facts for base in self.bases.values()]

    def create_model(self, model_id: str, base_model: str, lora: LoraSpec) -> None:
        with self._lock:
            base = self._base(base_model)
            if model_id in self.tenants:
                raise EngineRequestError(f"model {model_id!r} exists already", status=409)
            if not 1 <= lora.rank <= base.facts.max_lora_rank:
                raise EngineRequestError(f"LoRA rank {lora.rank}: {base_model} takes ranks "
                                         f"1 to {base.facts.max_lora_rank}")
            if not base.slots.targets(lora) and not lora.train_unembed:
                raise EngineRequestError("the LoRA config trains nothing: set train_attn, "
                                         "train_mlp or train_unembed")
            self._room_for_adapter()
            self.tenants[model_id] = Tenant.create(model_id, base, lora)

    def unload_model(self, model_id: str) -> None:
        with self._lock:
            tenant = self._tenant(model_id)
            tenant.base.slots.remove(tenant.slot)
            del self.tenants[model_id]

    def model_base(self, model_id: str) -> BaseModelFacts:
        return self._tenant(model_id).base.facts

    # ---------------------------------------------------------------- training
    def forward(self, model_id: str, datums: list[DatumIn], loss_fn: str,
                loss_fn_config: dict[str, float] | None = None) -> ForwardOut:
        with self._lock:
            return self._run(model_id, datums, loss_fn, loss_fn_config, backward=False)

    def forward_backward(self, model_id: str, datums: list[DatumIn], loss_fn: str,
                         loss_fn_config: dict[str, float] | None = None) -> ForwardOut:
        with self._lock:
            return self._run(model_id, datums, loss_fn, loss_fn_config, backward=True)

    def optim_step(self, model_id: str, adam: AdamSpec) -> dict[str, float]:
        with self._lock:
            if adam.learning_rate < 0 or not (0 <= adam.beta1 < 1 and 0 <= adam.beta2 < 1):
                raise EngineRequestError(f"adam_params: learning_rate {adam.learning_rate} "
                                         f"must be >= 0 and betas in [0, 1)")
            tenant = self._tenant(model_id)
            sum_gradients(list(tenant.parameters().values()), self.dist)
            return tenant.step(adam)

    def _run(self, model_id: str, datums: list[DatumIn], loss_fn: str,
             given: dict[str, float] | None, backward: bool) -> ForwardOut:
        tenant = self._tenant(model_id)
        base = tenant.base
        config = loss_config(loss_fn, given)
        if len(datums) > self.limits.max_datums:
            raise EngineRequestError(f"{len(datums)} datums in one request; at most "
                                     f"{self.limits.max_datums}", status=413)
        check_datums(datums, loss_fn, base.facts.vocab_size, self._max_tokens(base))
        rows = rank_rows(len(datums), self.dist)  # all of them in one process
        mine = datums[rows] or datums[:1]  # an empty share runs datum 0, its loss times 0
        batch = build_batch(mine, loss_fn, _device(base))
        base.slots.activate(tenant.slot)
        try:
            with torch.enable_grad() if backward else torch.no_grad():
                out = target_logprobs(base.model, batch.input_ids, batch.target_ids,
                                      attention_mask=batch.attention_mask)
                logprobs = out["logprobs"].float()
                per_token = LOSSES[loss_fn](logprobs, batch.inputs, batch.mask, config)
                loss = per_token.sum() if rows.stop > rows.start else per_token.sum() * 0.0
                if backward:
                    loss.backward()
        finally:
            base.slots.activate(None)
        outputs = [{"logprobs": _array(logprobs[row, :length]),
                    "elementwise_loss": _array(per_token[row, :length])}
                   for row, length in enumerate(batch.lengths[:rows.stop - rows.start])]
        total = float(loss.detach())
        if self.dist.enabled:
            outputs = gather_outputs(outputs, [len(d.tokens) for d in datums], self.dist)
            total = self.dist.all_reduce_sum([total])[0]
        return ForwardOut(outputs, {"loss:sum": total})

    # ---------------------------------------------------------------- weights
    def save_weights(self, model_id: str, name: str, *, for_sampler: bool) -> str:
        with self._lock:
            tenant = self._tenant(model_id)
            key = files.weights_key(model_id, name, for_sampler)
            if self.writes_files:
                self._write(tenant, key, for_sampler)
            if key in self.sampler_slots:  # saved again under its name: reload on next use
                old_base, old_slot = self.sampler_slots.pop(key)
                old_base.slots.remove(old_slot)
            return key

    def _write(self, tenant: Tenant, key: str, for_sampler: bool) -> None:
        base, state = tenant.base, tenant.adapter_state()
        peft = None
        if for_sampler:  # peft's files, Hugging Face module names
            peft = files.PeftFiles(base.slots.configs[tenant.slot], base.facts.name,
                                   base.model, base.model_type, state)
        optimizer = None if for_sampler else tenant.optimizer_state()
        files.write_weights(self.state_dir.joinpath(*key.split("/")), tenant.spec,
                            base.facts.name, state, optimizer, peft)

    def load_weights(self, model_id: str, key: str, *, with_optimizer: bool) -> None:
        with self._lock:
            tenant = self._tenant(model_id)
            record, adapter, optimizer = files.read_weights(
                files.key_directory(self.state_dir, key), with_optimizer)
            if record["base_model"] != tenant.base.facts.name:
                raise EngineRequestError(f"weights {key!r} are for {record['base_model']}, "
                                         f"model {model_id!r} runs on {tenant.base.facts.name}")
            if files.spec_of(record) != tenant.spec:
                tenant = self._recreate(tenant, files.spec_of(record))
            tenant.load_adapter_state(adapter, key)
            if optimizer is not None:
                tenant.load_optimizer_state(optimizer)
            else:
                tenant.optimizer.state.clear()
            tenant.optimizer.zero_grad(set_to_none=True)

    def _recreate(self, tenant: Tenant, spec: LoraSpec) -> Tenant:
        """The tenant with a fresh adapter of ``spec``'s shape (loading weights of another rank)."""
        tenant.base.slots.remove(tenant.slot)
        new = Tenant.create(tenant.model_id, tenant.base, spec)
        self.tenants[tenant.model_id] = new
        return new

    # ---------------------------------------------------------------- sampling
    def sample(self, target: SamplerTarget, prompt: list[int], num_samples: int,
               spec: SampleSpec, *, prompt_logprobs: bool = False) -> SampleOut:
        with self._lock:
            base = self._base(target.base_model)
            if not prompt:
                raise EngineRequestError("the prompt has no tokens")
            check_ids(prompt, base.facts.vocab_size, "prompt")
            check_ids(list(spec.stop_tokens), base.facts.vocab_size, "stop")
            room = (base.facts.max_context or 1 << 30) - len(prompt)
            params = sampling_params(spec, num_samples, room)
            slot = None if target.weights is None else self._sampler_slot(base, target.weights)
            tokenizer = self._tokenizer(base) if params.stop else None
            adapter = None if slot is None else (files.key_directory(self.state_dir, target.weights)
                                                 / files.PEFT_DIR)
            base.slots.activate(slot)
            try:  # a sharded base is gathered once for the whole request (no-op unsharded)
                with unsharded([base.model]):
                    sequences = self.backend.generate(base, adapter, prompt, params, tokenizer)
                    return SampleOut(sequences, prompt_logprobs_of(base, prompt)
                                     if prompt_logprobs else None)
            finally:
                base.slots.activate(None)

    def _sampler_slot(self, base: LoadedBase, key: str) -> str:
        """The slot holding the adapter saved under ``key`` (loaded on first use)."""
        if key in self.sampler_slots:
            self.sampler_slots.move_to_end(key)
            return self.sampler_slots[key][1]
        record, adapter, _ = files.read_weights(files.key_directory(self.state_dir, key), False)
        if record["base_model"] != base.facts.name:
            raise EngineRequestError(f"weights {key!r} are for {record['base_model']}, "
                                     f"not {base.facts.name}")
        while len(self.sampler_slots) >= max(self.limits.max_sampler_adapters, 1):
            old_base, old_slot = self.sampler_slots.popitem(last=False)[1]
            old_base.slots.remove(old_slot)
        spec = files.spec_of(record)
        slot = base.slots.add(spec)
        params = {files.canonical(n, slot): p for n, p in base.slots.parameters(slot).items()}
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(adapter[name])
        self.sampler_slots[key] = (base, slot)
        return slot

    # ---------------------------------------------------------------- helpers
    def _base(self, name: str) -> LoadedBase:
        if name not in self.bases:
            offered = ", ".join(self.bases) or "none"
            raise EngineRequestError(f"unknown base model {name!r}; this server offers: "
                                     f"{offered}", status=404)
        return self.bases[name]

    def _tenant(self, model_id: str) -> Tenant:
        if model_id not in self.tenants:
            raise EngineRequestError(f"unknown model_id {model_id!r}", status=404)
        return self.tenants[model_id]

    def _room_for_adapter(self) -> None:
        if len(self.tenants) >= self.limits.max_adapters:
            raise EngineRequestError(f"this server holds at most {self.limits.max_adapters} "
                                     "adapters; unload a model first", status=429)

    def _max_tokens(self, base: LoadedBase) -> int | None:
        return self.limits.max_tokens_per_datum or base.facts.max_context or None

    def _tokenizer(self, base: LoadedBase) -> Any:
        from astrai_core.data.tokenizer import load_tokenizer

        if base.facts.name not in self._tokenizers:
            self._tokenizers[base.facts.name] = load_tokenizer(base.facts.tokenizer_path)
        return self._tokenizers[base.facts.name]


def build_engine(models: dict[str, str], state_dir: str | Path, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 limits: EngineLimits = EngineLimits(), max_lora_rank: int | None = None,
                 cache_dir: str | None = None) -> TorchEngine:
    """An engine offering ``models`` (``--model NAME=PATH`` pairs), each loaded once on
    ``device``; a path that cannot be loaded raises AstraiError naming ``NAME=PATH``."""
    from astrai_core.tinker.bases import DEFAULT_MAX_LORA_RANK, load_base

    rank = max_lora_rank or DEFAULT_MAX_LORA_RANK
    bases = [load_base(name, path, dtype=dtype, device=device, max_lora_rank=rank,
                       cache_dir=cache_dir) for name, path in models.items()]
    return TorchEngine(bases, state_dir, limits)


def check_ids(ids: list[int], vocab_size: int, where: str) -> None:
    bad = [i for i in ids if not 0 <= int(i) < vocab_size]
    if bad:
        raise EngineRequestError(f"{where}: token id {bad[0]} is out of range (the "
                                 f"vocabulary has {vocab_size} tokens)")


def _device(base: LoadedBase) -> torch.device:
    return next(base.model.parameters()).device


def _array(values: torch.Tensor) -> np.ndarray:
    return values.detach().float().cpu().numpy().astype(np.float32)
