"""Fixtures: tiny transformers models, and their weights copied into the native model by hand.

Test-only: the real importers live in astrai_core/checkpoints/hf; this independent mapping
checks the native model's arithmetic against transformers early.
"""

from __future__ import annotations

import pytest
import torch

from astrai_core.model import CausalLM, ModelConfig

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def hf_model(kind: str, **overrides):
    import transformers

    config_cls = {
        "llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config, "qwen3_moe": transformers.Qwen3MoeConfig,
        "qwen2_moe": transformers.Qwen2MoeConfig, "mistral": transformers.MistralConfig,
    }[kind]
    kwargs = dict(SMALL)
    if kind in ("qwen3_moe", "qwen2_moe"):
        kwargs.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    if kind == "qwen2_moe":
        kwargs.update(shared_expert_intermediate_size=24)
    if kind == "qwen3":
        kwargs.update(head_dim=16)
    kwargs.update(overrides)
    torch.manual_seed(0)
    config = config_cls(**kwargs)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # HF inits norms to ones: randomise them so misplaced norms show
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                param.uniform_(0.5, 1.5)
    return model.eval()


def native_config(hf_config, kind: str) -> ModelConfig:
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_theta = rope.pop("rope_theta", None) or getattr(hf_config, "rope_theta", 10000.0)
    return ModelConfig(
        vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size, num_layers=hf_config.num_hidden_layers,
        num_heads=hf_config.num_attention_heads, num_kv_heads=hf_config.num_key_value_heads,
        head_dim=getattr(hf_config, "head_dim", None), rms_norm_eps=hf_config.rms_norm_eps,
        rope_theta=rope_theta, rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
        max_position_embeddings=hf_config.max_position_embeddings,
        attention_bias=kind in ("qwen2", "qwen2_moe") or getattr(hf_config, "attention_bias", False),
        qk_norm=kind in ("qwen3", "qwen3_moe"), tie_word_embeddings=hf_config.tie_word_embeddings,
        sliding_window=getattr(hf_config, "sliding_window", None),
        num_experts=getattr(hf_config, "num_experts", 0) or 0,
        num_experts_per_tok=getattr(hf_config, "num_experts_per_tok", 2),
        moe_intermediate_size=getattr(hf_config, "moe_intermediate_size", None),
        norm_topk_prob=getattr(hf_config, "norm_topk_prob", True),
        shared_expert_intermediate_size=getattr(hf_config, "shared_expert_intermediate_size", 0) or 0,
        decoder_sparse_step=getattr(hf_config, "decoder_sparse_step", 1) or 1,
        mlp_only_layers=list(getattr(hf_config, "mlp_only_layers", []) or []),
    )


def _rename(hf_name: str) -> str:
    name = hf_name.removeprefix("model.")
    for old, new in ((".self_attn.", ".attn."), (".input_layernorm.", ".attn_norm."),
                     (".post_attention_layernorm.", ".mlp_norm."), ("embed_tokens.", "embed."),
                     (".mlp.gate.weight", ".mlp.router.weight")):
        name = name.replace(old, new)
    return name


def native_from_hf(hf, kind: str) -> CausalLM:
    config = native_config(hf.config, kind)
    model = CausalLM(config)
    state = {}
    for hf_name, tensor in hf.state_dict().items():
        name = _rename(hf_name)
        if name.endswith("experts.gate_up_proj"):
            gate, up = tensor.chunk(2, dim=1)
            state[name.replace("gate_up_proj", "gate_proj")] = gate
            state[name.replace("gate_up_proj", "up_proj")] = up
        elif not (config.tie_word_embeddings and name == "lm_head.weight"):
            state[name] = tensor
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.fixture(name="hf_model")
def hf_model_fixture():
    """build(kind, **config_overrides) -> a tiny random transformers model in eval mode."""
    return hf_model


@pytest.fixture(name="native_from_hf")
def native_from_hf_fixture():
    """convert(hf_model, kind) -> the native CausalLM with the same weights."""
    return native_from_hf
