"""Tiny Hugging Face model directories that train on the arithmetic example's data.

:func:`write_hf_model_dir` saves a randomly initialised transformers model of a family
(tiny sizes, ``TINY_FAMILIES``) with the arithmetic tokenizer's files, so that a run
config can point ``model.path`` at it as a user points it at a downloaded model.
Imports torch and transformers; nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from astrai_core.testing.parity import TINY_COMMON, TINY_FEATURES, randomize_
from astrai_core.testing.runs import ARITH_TOKENIZER

ARITH_VOCAB = 64  # the arithmetic tokenizer's 55 tokens, rounded up

# Families without a native importer, at tiny sizes that build and run on a CPU.
TINY_FAMILIES: dict[str, dict[str, Any]] = {
    "gemma3_text": {"head_dim": 8, "sliding_window": 4, "layer_types": ["sliding_attention",
                                                                         "full_attention"],
                    "query_pre_attn_scalar": 8},
    "phi3": {"pad_token_id": 0},
    "olmo2": {},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    "gpt_neox": {"rotary_pct": 0.5},  # query_key_value, dense, dense_h_to_4h, dense_4h_to_h
    "granite": {"embedding_multiplier": 2.0, "residual_multiplier": 0.5,
                "attention_multiplier": 0.25, "logits_scaling": 2.0},
}


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """The transformers config of a tiny ``model_type`` over the arithmetic vocabulary."""
    from transformers import AutoConfig

    features = {**TINY_FEATURES, **TINY_FAMILIES}[model_type]
    kwargs = {**TINY_COMMON, "vocab_size": ARITH_VOCAB, "pad_token_id": 0, "eos_token_id": 5,
              "bos_token_id": None, **features, **overrides}
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_causal_lm(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised float32 transformers model of ``model_type`` (tiny)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides),
                                             dtype=torch.float32)
    return randomize_(model, seed, std=0.05).eval()


def write_hf_model_dir(directory: Path, model_type: str, seed: int = 0,
                       **overrides: Any) -> Path:
    """A Hugging Face checkpoint directory (safetensors, config, the arithmetic tokenizer
    and its chat template) of a tiny random ``model_type``."""
    model = tiny_causal_lm(model_type, seed, **overrides)
    model.save_pretrained(str(directory))
    for source in ARITH_TOKENIZER.iterdir():
        shutil.copy2(source, Path(directory) / source.name)
    return Path(directory)
