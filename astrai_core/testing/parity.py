"""Tools to prove an importer against transformers (used by the core's and plugins' tests).

Build a tiny random HF model, save it with a tiny tokenizer, import it, and compare
the native logits with transformers' on padded and on packed batches. Imports torch
and transformers; nothing here downloads anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TOKENIZER_WORDS = [f"w{i}" for i in range(40)]


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.1) -> torch.nn.Module:
    """Give every parameter random values (HF zero-inits biases and one-inits norms,
    which would hide a misplaced bias or norm from a parity test)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * std
            param.copy_(1.0 + noise if "norm" in name else noise)
    return model


def write_tiny_tokenizer(directory: Path) -> None:
    """A word-level tokenizer (tokenizer.json + tokenizer_config.json) trained here."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator([" ".join(TOKENIZER_WORDS)] * 3, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(directory))


def save_hf_model(model: Any, directory: Path, *, tokenizer: bool = True, **save_kwargs: Any) -> Path:
    """``model.save_pretrained`` (safetensors) plus, by default, the tiny tokenizer."""
    model.save_pretrained(str(directory), **save_kwargs)
    if tokenizer:
        write_tiny_tokenizer(directory)
    return directory


def load_hf_model(directory: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.eval()


def padded_batch(vocab_size: int, lengths: list[int], seed: int = 0,
                 left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids [B, max(lengths)] and the attention mask (1 = token, 0 = padding)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(0, vocab_size, (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        if left:
            mask[row, width - length:] = 1
        else:
            mask[row, :length] = 1
    return ids, mask


@torch.no_grad()
def max_padded_diff(hf_model: Any, native_model: Any, ids: torch.Tensor, mask: torch.Tensor,
                    position_ids: torch.Tensor | None = None) -> float:
    """Largest |native - transformers| logit difference over the non-padding positions."""
    hf_logits = hf_model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    native_logits = native_model(ids, attention_mask=mask, position_ids=position_ids)["logits"]
    valid = mask.bool()
    return (hf_logits[valid].float() - native_logits[valid]).abs().max().item()


@torch.no_grad()
def max_packed_diff(hf_model: Any, native_model: Any, vocab_size: int, doc_lengths: list[int],
                    seed: int = 1) -> float:
    """Documents packed into one row (position ids restart at each) vs each document alone."""
    generator = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, vocab_size, (1, n), generator=generator) for n in doc_lengths]
    packed = torch.cat(docs, dim=1)
    positions = torch.cat([torch.arange(n) for n in doc_lengths])[None]
    native_logits = native_model(packed, position_ids=positions)["logits"][0]
    diffs, start = [], 0
    for doc in docs:
        alone = hf_model(input_ids=doc).logits[0].float()
        diffs.append((alone - native_logits[start:start + doc.shape[1]]).abs().max().item())
        start += doc.shape[1]
    return max(diffs)


def safetensors_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor stored in a directory's safetensors files (single or sharded)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


# Tiny models of each supported family: GQA (4 heads, 2 kv heads), >= 2 layers, and for
# MoE 4 experts top-2, with the features that distinguish each family switched on.
TINY_COMMON: dict[str, Any] = dict(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
TINY_FEATURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": 6},
    "qwen2": {"tie_word_embeddings": True},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {"num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 16, "norm_topk_prob": True, "mlp_only_layers": [1]},
    "qwen2_moe": {"num_hidden_layers": 4, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
                  "norm_topk_prob": False, "decoder_sparse_step": 2},
}


def tiny_hf_model(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised float32 transformers model of ``model_type``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {**TINY_COMMON, **TINY_FEATURES[model_type], **overrides}
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return randomize_(model, seed).eval()
