"""The ``vllm`` sampler: the sampler contract on a vLLM engine.

``VllmSampler(model=..., tokenizer=None, **engine options)`` exports the policy to a
Hugging Face directory and starts ``vllm.LLM`` on it (in this process by default).
``generate`` maps astrai's SamplingParams onto vLLM's and returns the same
:class:`~astrai_core.sampling.params.Completion` records as the torch sampler;
``update_weights`` pushes the policy's weights into the running engine (no restart), in
buckets of at most ``weight_bucket_mb``, under Hugging Face names (a native policy's
converted by its family's importer, a transformers-backend policy's as they are), and
resets its prefix cache, whose KV blocks were
computed with the old weights. ``push: delta`` sends only the values that changed since
the last push, each updated tensor checked by digest (see :mod:`astrai_plugin_vllm.delta`);
``verify_weights`` compares the engine's copy of the pushed state with the trainer's.

In an N-process run (torchrun) every rank, or every group of ``tensor_parallel_size``
ranks, drives its own engine colocated with its trainer shards and samples its own
prompts (see :mod:`astrai_plugin_vllm.colocated`). ``sleep=True`` frees the engine's KV
cache and offloads its weights while the trainer steps (vLLM's sleep mode; accelerators
only), and brings them back before a push or a generation.

A vision-language policy's prompts may carry images (``generate(..., images=...)``, each
prompt's processor output, as the torch sampler takes them): vLLM gets the trainer's ids
and pixels already processed (see :mod:`astrai_plugin_vllm.images`).

Built with ``max_adapters=N``, the engine serves peft LoRA adapters on the base with
vLLM's own LoRA support: ``generate(..., adapter=directory)`` samples with that adapter
(see :mod:`astrai_plugin_vllm.adapters`).

Log-probs follow the contract (temperature-scaled, before top-k/top-p/min-p): vLLM's
``processed_logprobs`` for unfiltered requests, the trainer's forward for filtered ones
(see :mod:`astrai_plugin_vllm.logprobs`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from astrai_core.api import PER_EXPERT, ConfigError, iter_push_buckets, state_digest, unsharded
from astrai_core.api import hf_name_prefix, iter_hf_push_buckets
from astrai_core.api import Completion, SamplerCapabilities, SamplingParams
from astrai_core.api import Request, expand_requests
from astrai_plugin_vllm import adapters as adapters_lib
from astrai_plugin_vllm import colocated
from astrai_plugin_vllm import delta as delta_lib
from astrai_plugin_vllm import engine as engine_lib
from astrai_plugin_vllm import images as images_lib
from astrai_plugin_vllm import weights as weights_lib
from astrai_plugin_vllm.logprobs import is_truncated, trainer_logprobs

TokenCallback = Callable[[int, int], None]  # (completion index, token id)
MB = 2**20


class VllmSampler:
    """A vLLM engine behind the sampler contract; see the module docstring."""

    # It generates from the engine's own copy of the weights, never from the trainer's
    # parameters (a sharded trainer need not gather them for it); update_weights(None)
    # pushes the policy it was built with into the engine; a push's time; close() stops
    # the engine; prompts may carry images (the families images.py serves).
    capabilities = SamplerCapabilities(owns_weights=True, shares_policy=True,
                                       reports_metrics=True, needs_close=True, images=True,
                                       adapters=True)

    class Config(SamplingParams):
        """The ``sampler:`` section: default SamplingParams plus these engine options."""

        dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
            None, description="engine dtype; default: the policy's (never vLLM's 'auto')")
        gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
        tensor_parallel_size: int = Field(1, ge=1)
        max_model_len: int | None = Field(None, ge=1, description="default: the model's")
        max_num_seqs: int | None = Field(None, ge=1, description="sequences decoded together")
        enforce_eager: bool = Field(False, description="no torch.compile / CUDA graphs")
        engine_seed: int = Field(0, description="vLLM's own seed (requests carry their own)")
        enable_prefix_caching: bool = True
        multiprocess: bool = Field(False, description="run the engine core in its own process "
                                   "(weights then travel as safetensors bytes)")
        cpu_kv_cache_gib: int | None = Field(None, ge=1, description="KV cache size on CPU, "
                                             "whole GiB (VLLM_CPU_KVCACHE_SPACE)")
        model_type: str | None = Field(None, description="Hugging Face model_type to export as")
        fix_cpu_moe_reload: bool | None = Field(
            None, description="re-prepack CPU MoE experts after a weight push; None: where "
            "the installed vLLM needs it (0.31-0.32 on CPU)")
        weight_bucket_mb: int = Field(512, ge=1, description="a weight push gathers and loads "
                                      "at most this many MiB of full tensors at a time")
        push: Literal["full", "delta"] = Field(
            "full", description="full: every tensor, every push; delta: only the values that "
            "changed since the last push, each updated tensor checked by digest on arrival "
            "(the engine keeps a CPU copy of the pushed state and reloads from it)")
        sleep: bool = Field(False, description="free the KV cache and offload the weights "
                            "while the trainer steps (vLLM sleep mode; accelerators only)")
        max_adapters: int = Field(0, ge=0, description="peft LoRA adapters served at once "
                                  "with vLLM's enable_lora (generate's adapter=); 0: none")
        max_adapter_rank: int = Field(16, ge=1, description="the largest adapter rank served")
        engine_kwargs: dict[str, Any] = Field(default_factory=dict,
                                              description="more vllm.LLM keyword arguments")

    def __init__(self, model: torch.nn.Module | str | os.PathLike, tokenizer: Any = None, *,
                 dtype: str | None = None, gpu_memory_utilization: float = 0.9,
                 tensor_parallel_size: int = 1, max_model_len: int | None = None,
                 max_num_seqs: int | None = None, enforce_eager: bool = False,
                 engine_seed: int = 0, enable_prefix_caching: bool = True,
                 multiprocess: bool = False, cpu_kv_cache_gib: int | None = None,
                 model_type: str | None = None, fix_cpu_moe_reload: bool | None = None,
                 weight_bucket_mb: int = 512, push: str = "full", sleep: bool = False,
                 max_adapters: int = 0, max_adapter_rank: int = 16,
                 engine_kwargs: dict[str, Any] | None = None) -> None:
        native_dir = None
        if isinstance(model, (str, os.PathLike)):
            from astrai_core.api import load_pretrained

            native_dir = Path(model)
            model = load_pretrained(native_dir)
        self.model = model            # the policy: log-prob recomputation and weight pushes
        self.tokenizer = tokenizer
        self.policy_version = 0
        self._metrics: dict[str, float] = {}
        self.multiprocess = multiprocess
        self._delta = delta_lib.DeltaPusher(multiprocess) if push == "delta" else None
        self.weight_bucket_bytes = weight_bucket_mb * 2**20
        self.world_size = colocated.world()[1]
        if multiprocess and self.world_size > 1:
            raise ConfigError("sampler.multiprocess: in an N-process run each rank's engine "
                              "runs in that rank's process; leave multiprocess off")
        self._vision = images_lib.VisionPolicy.of(model, tokenizer)  # None: a text model
        self._work_dir = tempfile.TemporaryDirectory(prefix="astrai-vllm-")
        hf_dir = engine_lib.export_policy(model, native_dir, Path(self._work_dir.name), model_type)
        if self._vision is not None:  # vLLM builds its model's processor from the directory
            self._vision.processor.save_pretrained(str(hf_dir))
        # a transformers-backend policy's names are already the family's: no importer
        self._importer = None if hf_name_prefix(model) is not None else _importer_for(hf_dir)
        engine_args = dict(gpu_memory_utilization=gpu_memory_utilization,
                           tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                           max_num_seqs=max_num_seqs, enforce_eager=enforce_eager, seed=engine_seed,
                           enable_prefix_caching=enable_prefix_caching,
                           worker_extension_cls=weights_lib.EXTENSION,
                           **colocated.launcher_args(self.world_size, tensor_parallel_size),
                           **engine_lib.sleep_args(sleep), **(engine_kwargs or {}),
                           **adapters_lib.lora_engine_args(max_adapters, max_adapter_rank))
        self._adapters = adapters_lib.AdapterRequests()
        self.sleeps, self._asleep = sleep, False
        self._pool = colocated.PromptPool(tensor_parallel_size)
        colocated.clear_stale_cpu_shm(tensor_parallel_size)
        self.engine = engine_lib.start_engine(
            hf_dir, dtype=dtype or engine_lib.policy_dtype(model), multiprocess=multiprocess,
            cpu_kv_cache_gib=cpu_kv_cache_gib, engine_args=engine_args,
            tokenizer=self._vision is not None)
        self.fix_cpu_moe_reload = (weights_lib.cpu_moe_reload_bug_present()
                                   if fix_cpu_moe_reload is None else fix_cpu_moe_reload)

    # ---------------------------------------------------------------- weights
    def update_weights(self, state_dict: dict[str, torch.Tensor] | None = None) -> int:
        """Push new weights into the running engine; returns the new policy version.

        ``state_dict`` (native names, complete) is first loaded into the policy this
        sampler holds; None means that policy was updated in place (the trainer's model).
        """
        if state_dict is not None:
            from astrai_core.api import load_state_dict_strict

            with torch.no_grad():
                load_state_dict_strict(self.model, state_dict, "update_weights(state_dict)")
        started = time.perf_counter()
        self._wake()
        if self._delta is not None:
            sent, full = self._delta.push(self.engine, self._hf_buckets(), self.fix_cpu_moe_reload)
            metrics = {"rollout/weight_push_mb": sent / MB,
                       "rollout/weight_push_full_mb": full / MB}
        else:
            metrics = {"rollout/weight_push_mb": self._push_whole() / MB}
        self.engine.reset_prefix_cache()  # cached KV blocks hold the old weights' keys/values
        if self._vision is not None:  # and cached image features the old vision tower's
            self.engine.llm_engine.reset_encoder_cache()
        metrics["rollout/weight_push_seconds"] = time.perf_counter() - started
        self._metrics = metrics
        self.policy_version += 1
        return self.policy_version

    def _push_whole(self) -> int:
        """Every tensor of the policy into the engine (``push: full``); the bytes sent."""
        sent = [0]
        if self._importer is None:  # transformers backend: the family's own names
            pairs = _counted((item for bucket in self._hf_buckets() for item in bucket.items()),
                             sent)
            payload: Any = weights_lib.serialize(dict(pairs)) if self.multiprocess else pairs
        elif self.multiprocess:  # tensors do not cross processes: one safetensors payload
            payload = weights_lib.serialize(
                weights_lib.hf_weights(self._importer, self.model, PER_EXPERT))
        else:  # streamed: full tensors exist one bucket at a time (a collective under FSDP)
            payload = _counted(colocated.hf_stream(
                self._importer, self.model.config,
                iter_push_buckets(self.model, self.weight_bucket_bytes), PER_EXPERT), sent)
        self.engine.collective_rpc("astrai_reload_weights", args=(payload, self.fix_cpu_moe_reload))
        return len(payload) if isinstance(payload, bytes) else sent[0]

    def _hf_buckets(self) -> Any:
        """The policy's push state under Hugging Face names, one bucket of full tensors at
        a time (a collective under FSDP)."""
        return iter_hf_push_buckets(self.model, self.weight_bucket_bytes, self._importer,
                                    PER_EXPERT)

    def verify_weights(self) -> None:
        """Compare the digest of every tensor of the engine's copy of the last push with
        the trainer's (``state_digest``); raises ``WeightPushMismatch`` naming the first
        tensor that differs. A collective under FSDP, like :meth:`update_weights`."""
        if self._delta is None:
            raise ConfigError("sampler.push: verify_weights() compares the engine's copy of "
                              "the pushed state, which only push: delta keeps")
        self._delta.verify(self.engine, state_digest(self._hf_buckets()))

    def metrics(self) -> dict[str, float]:
        """The last weight push's bytes (``rollout/weight_push_mb``; with ``push: delta``
        also ``rollout/weight_push_full_mb``, what a full push sends) and time (gather,
        conversion and load), once per push."""
        metrics, self._metrics = self._metrics, {}
        return metrics

    # ---------------------------------------------------------------- generation
    def generate(self, prompts: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams],
                 on_token: TokenCallback | None = None,
                 images: Sequence[dict[str, Any] | None] | None = None,
                 adapter: str | os.PathLike | None = None) -> list[Completion]:
        """Completions for each prompt (``n`` per prompt, grouped in prompt order).

        ``on_token`` is called with (completion index, token id) for every token once
        the engine has produced the batch (vLLM's offline API does not stream).
        ``images``: each prompt's processor output (None: no images), as the torch
        sampler takes them; the prompt's ids hold the expanded image tokens.
        ``adapter``: a peft LoRA adapter directory on the base to sample with (the sampler
        built with ``max_adapters``); None: the engine's own weights.
        """
        requests = expand_requests(prompts, params, images)
        if self.tokenizer is None and any(r.params.stop for r in requests):
            raise ValueError("stop strings need a tokenizer: VllmSampler(model, tokenizer=...)")
        images_lib.check_requests(self._vision, requests)
        self._wake()
        lora = self._adapters.request(self.engine, adapter, images)
        outputs = self._pool.run(
            [images_lib.vllm_prompt(self._vision, r.prompt_ids, r.images) for r in requests],
            [_vllm_params(r) for r in requests],
            partial(images_lib.generate, self.engine, lora_request=lora))
        self._sleep()
        for request, output in zip(requests, outputs, strict=True):
            self._record(request, output.outputs[0])
        self._recompute_truncated(requests)
        if on_token is not None:
            for request in requests:
                for token in request.token_ids:
                    on_token(request.index, token)
        return [r.completion(self.tokenizer) for r in requests]

    # ---------------------------------------------------------------- sleep mode
    def _wake(self) -> None:
        if self._asleep:
            self.engine.wake_up()
            self._asleep = False

    def _sleep(self) -> None:
        """Between generations the trainer steps: the engine gives its memory back."""
        if self.sleeps:
            self.engine.sleep(level=1)  # KV cache freed, weights offloaded to host memory
            self._asleep = True

    def _record(self, request: Request, sequence: Any) -> None:
        if sequence.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM ended a request with finish_reason={sequence.finish_reason!r}")
        request.token_ids = list(sequence.token_ids)
        request.logprobs = [step[token].logprob for step, token in
                            zip(sequence.logprobs, request.token_ids, strict=True)]
        request.finish_reason = sequence.finish_reason
        if request.params.stop:
            _cut_at_stop_string(request, self.tokenizer)

    def _recompute_truncated(self, requests: list[Request]) -> None:
        """Contract log-probs for filtered requests, from the trainer's forward (per temperature)."""
        if not any(is_truncated(r.params) for r in requests):
            return
        # under FSDP the trainer's forward needs the gathered policy: every rank enters here
        # together (the sampling params are the run's), gathers once, then runs alone
        with torch.no_grad(), unsharded([self.model]):
            self._recompute(requests)

    def _recompute(self, requests: list[Request]) -> None:
        truncated = [r for r in requests if is_truncated(r.params) and r.token_ids]
        for temperature in sorted({r.params.temperature for r in truncated}):
            group = [r for r in truncated if r.params.temperature == temperature]
            values = trainer_logprobs(self.model, [r.prompt_ids for r in group],
                                      [r.token_ids for r in group], temperature)
            for request, logprobs in zip(group, values, strict=True):
                request.logprobs = logprobs

    # ---------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Stop the engine and remove the exported weights."""
        engine = self.__dict__.pop("engine", None)
        if engine is not None:
            shutdown = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
            if shutdown is not None and hasattr(shutdown, "shutdown"):
                shutdown.shutdown()
            del engine
        self._work_dir.cleanup()


def _counted(pairs: Iterator[tuple[str, torch.Tensor]], total: list[int]
             ) -> Iterator[tuple[str, torch.Tensor]]:
    """``pairs`` as they are, their bytes added to ``total[0]`` as they go by."""
    for name, tensor in pairs:
        total[0] += tensor.numel() * tensor.element_size()
        yield name, tensor


def _cut_at_stop_string(request: Request, tokenizer: Any) -> None:
    """End at the first token whose text completes a stop string, as the torch sampler does.

    The engine has no tokenizer, so it ran on; the tokens up to that point are the
    ones it would have produced had it stopped there.
    """
    for length in range(1, len(request.token_ids) + 1):
        text = tokenizer.decode(request.token_ids[:length], skip_special_tokens=True)
        found = [at for at in (text.find(stop) for stop in request.params.stop) if at >= 0]
        if found:
            request.stop_text_at = min(found)
            del request.token_ids[length:], request.logprobs[length:]
            request.finish_reason = "stop"
            return


def _vllm_params(request: Request) -> Any:
    """vLLM's SamplingParams for one completion (n=1: astrai expands n itself)."""
    from vllm import SamplingParams as VllmSamplingParams

    params = request.params
    greedy = params.greedy
    # The request's own stream gives its vLLM seed: seeded requests reproduce, unseeded
    # ones follow torch's global generator (torch.manual_seed makes a run repeatable).
    seed = request.rng.getrandbits(63) if request.rng is not None else None
    return VllmSamplingParams(
        n=1, max_tokens=params.max_new_tokens, temperature=params.temperature,
        top_k=0 if greedy else params.top_k, top_p=1.0 if greedy else params.top_p,
        min_p=0.0 if greedy else params.min_p, seed=seed,
        stop_token_ids=list(params.stop_token_ids), ignore_eos=True, logprobs=0,
        detokenize=False)


def _importer_for(hf_dir: Path) -> Any:
    """The importer of the exported directory's model_type (for the weight names)."""
    from astrai_core.api import read_hf_config
    from astrai_core.api import load_importer
    from astrai_core.api import process_registry

    return load_importer(process_registry(), model_type=read_hf_config(hf_dir)["model_type"])
