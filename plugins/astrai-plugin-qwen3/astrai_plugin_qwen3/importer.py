"""Qwen3 (q/k RMSNorm per head), Qwen3-MoE and Qwen2-MoE (shared expert) importer.

Everything but the config spellings and the MoE tensor names comes from
:class:`astrai_core.checkpoints.hf.base.HFImporter`. On disk, transformers 5 writes experts
one tensor per expert (``mlp.experts.{j}.gate_proj.weight``) although it fuses them in
memory; a checkpoint holding the fused form (``mlp.experts.gate_up_proj`` [E, 2I, H],
``mlp.experts.down_proj`` [E, H, I]) is read as well, and exported back the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astrai_core.api import CheckpointError
from astrai_core.api import FUSED, HFImporter, dense_mlp_map
from astrai_core.api import (
    common_fields_from_hf,
    common_fields_to_hf,
    qwen_sliding_window,
    qwen_sliding_window_to_hf,
    require,
)
from astrai_core.api import TensorMap, rename, split_gate_up, stack_experts

if TYPE_CHECKING:
    from astrai_core.api import ModelConfig

_QWEN3_HEAD_DIM = 128  # Qwen3Config's default when config.json omits head_dim


class Qwen3Importer(HFImporter):
    name = "qwen3"
    model_types = ("qwen3", "qwen3_moe", "qwen2_moe")
    architectures = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                     "qwen2_moe": "Qwen2MoeForCausalLM"}

    # ------------------------------------------------------------------ config
    def fields_from_hf(self, hf_config: dict[str, Any], model_type: str) -> dict[str, Any]:
        head_dim = _QWEN3_HEAD_DIM if model_type == "qwen3" else None
        fields = common_fields_from_hf(hf_config, max_position_default=32768,
                                       head_dim_default=head_dim)
        fields["sliding_window"] = qwen_sliding_window(hf_config)
        if model_type == "qwen2_moe":
            # q/k/v bias: transformers 5 spells it qkv_bias; earlier versions always had it
            fields["attention_bias"] = bool(hf_config.get("qkv_bias", True))
            fields.update(_moe_fields(hf_config, shared=True))
        else:
            if hf_config.get("attention_bias"):
                raise CheckpointError("config.json has attention_bias=true: Qwen3 then has a bias "
                                      "on o_proj too, which the native decoder does not support")
            fields["qk_norm"] = True
            if model_type == "qwen3_moe":
                fields.update(_moe_fields(hf_config, shared=False))
        return fields

    def fields_to_hf(self, cfg: ModelConfig, model_type: str) -> dict[str, Any]:
        hf = common_fields_to_hf(cfg, model_type, self.architectures[model_type])
        hf.update(qwen_sliding_window_to_hf(cfg.sliding_window, cfg.num_layers))
        if model_type == "qwen2_moe":
            hf["qkv_bias"] = cfg.attention_bias
        else:
            hf["attention_bias"] = False
        if model_type != "qwen3":
            hf.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                      moe_intermediate_size=cfg.moe_intermediate_size,
                      norm_topk_prob=cfg.norm_topk_prob, decoder_sparse_step=cfg.decoder_sparse_step,
                      mlp_only_layers=list(cfg.mlp_only_layers),
                      router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=False)
        if model_type == "qwen2_moe":
            hf["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size
        return hf

    # ------------------------------------------------------------------ weights
    def moe_map(self, cfg: ModelConfig, layer: int, moe_layout: str) -> list[TensorMap]:
        native, hf = f"layers.{layer}.mlp.", f"model.layers.{layer}.mlp."
        maps = [rename(native + "router.weight", hf + "gate.weight")]
        if moe_layout == FUSED:
            maps += [split_gate_up(native + "experts.gate_proj", native + "experts.up_proj",
                                   hf + "experts.gate_up_proj"),
                     rename(native + "experts.down_proj", hf + "experts.down_proj")]
        else:
            experts = range(cfg.num_experts)
            for proj in ("gate", "up", "down"):
                maps.append(stack_experts(native + f"experts.{proj}_proj",
                                          [f"{hf}experts.{j}.{proj}_proj.weight" for j in experts]))
        if cfg.shared_expert_intermediate_size > 0:
            maps += dense_mlp_map(native + "shared_expert.", hf + "shared_expert.")
            maps.append(rename(native + "shared_expert_gate.weight", hf + "shared_expert_gate.weight"))
        return maps


def _moe_fields(hf_config: dict[str, Any], *, shared: bool) -> dict[str, Any]:
    """MoE fields; transformers 5 writes Qwen3-MoE's expert count as num_local_experts."""
    num_experts = hf_config.get("num_experts") or hf_config.get("num_local_experts")
    if not num_experts:
        raise CheckpointError("config.json has neither 'num_experts' nor 'num_local_experts'")
    fields = {
        "num_experts": num_experts,
        "num_experts_per_tok": require(hf_config, "num_experts_per_tok"),
        "moe_intermediate_size": require(hf_config, "moe_intermediate_size"),
        # both Qwen MoE config classes default to False
        "norm_topk_prob": bool(hf_config.get("norm_topk_prob", False)),
        "decoder_sparse_step": hf_config.get("decoder_sparse_step", 1),
        "mlp_only_layers": list(hf_config.get("mlp_only_layers") or []),
        "router_aux_loss_coef": hf_config.get("router_aux_loss_coef", 0.001),
    }
    if shared:
        fields["shared_expert_intermediate_size"] = hf_config.get("shared_expert_intermediate_size", 0)
    return fields
