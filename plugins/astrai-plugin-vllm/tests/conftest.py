"""Tiny Qwen3 / Qwen3-MoE models for the vLLM sampler tests (run by `make test-vllm`).

vLLM's CPU attention needs head_dim >= 32, and its CPU MoE kernel dimensions that are
multiples of 32. Each model exists as two weight sets, M0 and M1 (different seeds), as
a transformers model (the reference) and imported with astrai's importer.
Nothing here imports vLLM: in an environment without it the test modules skip.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

VOCAB = 128
HAS_VLLM = importlib.util.find_spec("vllm") is not None
# Small engines: the machine running the tests may have two cores and other jobs.
ENGINE_OPTIONS = dict(enforce_eager=True, max_model_len=256, max_num_seqs=16, cpu_kv_cache_gib=1)


@dataclass
class TinyModel:
    """One weight set of a tiny model: the transformers reference and the native import."""

    hf: object            # transformers model, eval mode, float32
    hf_dir: Path
    native_dir: Path

    def native(self):
        from astrai_core.api import load_pretrained

        return load_pretrained(self.native_dir)


def _hf_config(kind: str, tie: bool = False):
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                  # peaked next-token distributions (as in a trained model): greedy
                  # choices are not near-ties and top-k/top-p really remove tokens
                  initializer_range=0.3, tie_word_embeddings=tie)
    if kind == "dense":
        return transformers.Qwen3Config(intermediate_size=128, **common)
    return transformers.Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=64, num_experts=4,
                                       num_experts_per_tok=2, norm_topk_prob=True, **common)


def build_tiny_model(kind: str, seed: int, root: Path, tie: bool = False) -> TinyModel:
    """``kind`` (dense, moe) with weights of ``seed`` under ``root``; ``tie``: the LM head is
    the embedding (tie_word_embeddings)."""
    import torch
    import transformers

    from astrai_core.checkpoints.hf.select import importer_for_hf_dir
    from astrai_core.plugins import load_plugins

    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(_hf_config(kind, tie), attn_implementation="eager")
    hf = hf.float().eval()
    hf.save_pretrained(root / "hf")
    importer_for_hf_dir(load_plugins(), root / "hf").import_checkpoint(root / "hf", root / "native")
    return TinyModel(hf=hf, hf_dir=root / "hf", native_dir=root / "native")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[tuple[str, int], TinyModel]:
    """{(kind, seed): TinyModel} for kind in dense/moe and seeds 0 (M0) and 1 (M1)."""
    return {(kind, seed): build_tiny_model(kind, seed, tmp_path_factory.mktemp(f"{kind}-{seed}"))
            for kind in ("dense", "moe") for seed in (0, 1)}


def hf_greedy(hf, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation of ``prompt``."""
    import torch

    out = hf.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                      attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                      pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def hf_logprobs(hf, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of each completion token under the transformers model."""
    import torch

    with torch.no_grad():
        logits = hf(torch.tensor([prompt + completion])).logits[0].float()
    scaled = (logits[len(prompt) - 1:-1] / temperature).log_softmax(-1)
    return scaled.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


class Helpers:
    """The helpers above, for test modules (importlib mode cannot import this conftest)."""

    engine_options = ENGINE_OPTIONS
    build_tiny_model = staticmethod(build_tiny_model)
    hf_greedy = staticmethod(hf_greedy)
    hf_logprobs = staticmethod(hf_logprobs)
    max_abs_diff = staticmethod(max_abs_diff)


@pytest.fixture(scope="session")
def helpers() -> type[Helpers]:
    return Helpers
