"""Pushing new policy weights into a running vLLM engine.

The weights travel under their Hugging Face names (the importer's tensor map) and go
through vLLM's own ``reload_weights`` (layerwise reload): on CPU vLLM repacks linear
weights after loading, so a parameter-by-parameter ``load_weights`` fails ("'Parameter'
object has no attribute 'weight_loader'") and copying into parameters is silently
ignored. The whole model is pushed every time: a partial fused group (q without k and
v, gate without up) would leave uninitialised memory that poisons the KV cache.

vLLM 0.31-0.32 on CPU prepacks MoE expert weights only on the first load; after a
reload they stay in checkpoint layout and the experts compute garbage without any
error. :func:`repack_cpu_moe_experts` redoes that prepack.

A tied LM head (``tie_word_embeddings``) shares its weight with the embedding and gets
no tensor of its own in a push (checkpoints and vLLM's loaders skip ``lm_head.weight``),
so the layerwise reload never processes it again. On CPU its logits come from a kernel
over a copy of the weight packed at the first load (``cpu_linear``): the embedding takes
the new weights, the head keeps multiplying by the old ones. :func:`refresh_tied_heads`
processes such heads again after every reload.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

EXTENSION = "astrai_plugin_vllm.weights.WeightSyncExtension"

# (major, minor) releases whose CPU MoE experts are left unpacked after a reload.
CPU_MOE_RELOAD_BUG = {(0, 31), (0, 32)}


def hf_weights(importer: Any, model: torch.nn.Module, moe_layout: str) -> dict[str, torch.Tensor]:
    """The policy's full state under Hugging Face names (what vLLM's loaders expect); a
    LoRA policy's adapter is merged into its weights (docs/lora.md: why merged)."""
    from astrai_core.api import merged_state_dict

    state = {name: tensor.detach() for name, tensor in merged_state_dict(model).items()}
    return importer.state_dict_to_hf(model.config, state, moe_layout)


def serialize(weights: dict[str, torch.Tensor]) -> bytes:
    """Safetensors bytes: tensors do not pickle across vLLM's engine processes."""
    from safetensors.torch import save

    return save({name: t.detach().cpu().contiguous() for name, t in weights.items()})


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``), so the weight push is a
    named RPC that works in-process (tensors) and across processes (bytes)."""

    def astrai_reload_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | bytes,
                              repack_moe: bool) -> int:
        """Reload every weight in place from (HF name, tensor) pairs, streamed (in-process)
        or as safetensors bytes; returns how many MoE layers were repacked."""
        if isinstance(weights, (bytes, bytearray, memoryview)):
            from safetensors.torch import load

            weights = load(bytes(weights)).items()
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        refresh_tied_heads(self.get_model())
        return repack_cpu_moe_experts(self.get_model()) if repack_moe else 0

    # ``push: delta`` (astrai_plugin_vllm.delta): a CPU copy of the last push, updated by
    # each delta bucket; the engine reloads whole from it.
    def astrai_apply_delta(self, payload: dict[str, torch.Tensor] | bytes, manifest: list,
                           fresh: bool) -> str:
        """Apply one delta bucket (tensors, or safetensors bytes) to the copy; returns ""
        or the mismatch's message (one line, the copy dropped)."""
        from astrai_core.api import DeltaManifest, WeightPushMismatch

        if isinstance(payload, (bytes, bytearray, memoryview)):
            from safetensors.torch import load

            payload = load(bytes(payload))
        try:
            self._astrai_mirror().apply(payload, DeltaManifest.from_plain(manifest), fresh)
        except WeightPushMismatch as exc:
            return str(exc)
        return ""

    def astrai_reload_from_mirror(self, repack_moe: bool) -> int:
        """Reload the whole engine from the copy of the last push (see astrai_reload_weights)."""
        return self.astrai_reload_weights(list(self._astrai_mirror().tensors.items()), repack_moe)

    def astrai_mirror_digests(self, names: list[str]) -> dict[str, str]:
        """The digest of each named tensor of the copy (a name it lacks is left out)."""
        return self._astrai_mirror().digests(names)

    def _astrai_mirror(self) -> Any:
        from astrai_core.api import DeltaMirror

        if getattr(self, "_astrai_delta_mirror", None) is None:
            self._astrai_delta_mirror = DeltaMirror("the vLLM engine")
        return self._astrai_delta_mirror


def refresh_tied_heads(model: torch.nn.Module) -> int:
    """Redo the post-load processing of vocabulary layers that share their weight with
    another (a tied LM head and its embedding), so that kernels built from the weight
    (CPU: the packed ``cpu_linear``) see the new values; returns how many layers."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    sharing: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if isinstance(module, VocabParallelEmbedding) and weight is not None and weight.numel():
            sharing.setdefault(weight.data_ptr(), []).append(module)
    tied = [module for group in sharing.values() if len(group) > 1 for module in group]
    for module in tied:
        module.quant_method.process_weights_after_loading(module)
    return len(tied)


def repack_cpu_moe_experts(model: torch.nn.Module) -> int:
    """Prepack the CPU MoE experts' weights again (after a reload); returns how many layers."""
    from vllm._custom_ops import cpu_prepack_moe_weight
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    repacked = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
            continue
        for name in ("w13_weight", "w2_weight"):
            weight = getattr(module, name)
            weight.data.copy_(cpu_prepack_moe_weight(weight.data, experts.isa))
        repacked += 1
    return repacked


def cpu_moe_reload_bug_present() -> bool:
    """True where vLLM leaves CPU MoE experts unpacked after a reload (0.31-0.32 on CPU)."""
    import vllm
    from packaging.version import Version
    from vllm.platforms import current_platform

    release = Version(vllm.__version__).release[:2]
    return current_platform.is_cpu() and release in CPU_MOE_RELOAD_BUG
