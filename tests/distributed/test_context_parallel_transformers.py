"""Context parallelism in the transformers backend, on 2 gloo processes: each rank's shard of
the rows, attended through astrai's attention inside the family's own layers, gives the
one-process log-probs of its positions, and the ranks' gradients sum to the one-process
gradient: odd lengths, one KV head (replicated over the 2 ranks), packed documents that
straddle the shard boundary, padded rows, Mistral's and Gemma 3's sliding windows, and
layers recomputed in the backward (activation checkpointing)."""

from __future__ import annotations

import pytest
import torch

from astrai_core.model_backends.transformers_lm import TransformersCausalLM
from astrai_core.testing.hf_models import tiny_causal_lm
from tests.distributed.spawn_kit import spawn_checks
from tests.distributed.test_context_parallel_model import assert_shard_matches

PACKED = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]])  # documents of 5 and 6: boundary at 6

# case: (model_type, overrides of its tiny config, rows)
CASES = {
    "llama odd length": ("llama", {}, "odd"),
    "llama one kv head": ("llama", {"num_key_value_heads": 1}, "odd"),
    "llama packed": ("llama", {}, "packed"),
    "qwen3 packed one kv head": ("qwen3", {"num_key_value_heads": 1}, "packed"),
    "qwen3 packed checkpointed": ("qwen3", {}, "packed"),
    "qwen3 padded": ("qwen3", {}, "padded"),
    "mistral sliding window": ("mistral", {"sliding_window": 3}, "odd"),
    "gemma3 sliding window": ("gemma3_text", {"query_pre_attn_scalar": 4}, "odd"),
    "gemma3 packed sliding window": ("gemma3_text", {"sliding_window": 3}, "packed"),
}


def _rows(kind: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    if kind == "packed":
        return {"input_ids": torch.randint(1, 64, (1, 11), generator=generator),
                "position_ids": PACKED}
    rows = {"input_ids": torch.randint(1, 64, (2, 9), generator=generator)}  # 9: padded to 10
    if kind == "padded":  # the second row has 4 real tokens
        rows["attention_mask"] = torch.tensor([[1] * 9, [1] * 4 + [0] * 5])
    return rows


def _check(rank: int, case: str) -> None:
    model_type, overrides, kind = CASES[case]
    model = TransformersCausalLM(tiny_causal_lm(model_type, seed=5, **overrides))
    assert model.astrai_attention
    if "checkpointed" in case:  # the layers recomputed in the backward, all-to-alls too
        model.train()
        model.enable_activation_checkpointing()
    # gradients within 1e-5 of their scale: Gemma's scaled embeddings make entries ~100,
    # whose float32 sums in another order differ by ~1e-4
    assert_shard_matches(model, _rows(kind), rank, grads_scaled=True)


@pytest.mark.parametrize("case", CASES)
def test_context_parallel_equals_one_process(tmp_path, case):
    spawn_checks(tmp_path, _check, case)
