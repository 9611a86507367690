"""Tiny models for the sampler tests: a transformers model and its import into the native model."""

from __future__ import annotations

import pytest
import torch

from astrai_core.checkpoints.native import load_pretrained
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.rollout.batch import RolloutBatch, pad_rows

VOCAB = 96


def _hf_model(kind: str):
    import transformers

    config_cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[kind]
    # A large init range makes the next-token distributions peaked, as in a trained model,
    # so greedy choices are not near-ties and top-k/top-p really remove tokens.
    config = config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        initializer_range=0.3, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


@pytest.fixture(scope="session", params=["qwen2", "llama"])
def hf_and_imported(request, tmp_path_factory):
    """(transformers model, the same weights imported with the built-in llama importer)."""
    from astrai_core.plugins import load_plugins

    hf = _hf_model(request.param)
    root = tmp_path_factory.mktemp(f"import-{request.param}")
    hf.save_pretrained(root / "hf")
    importer = load_plugins().get("model_importer", "llama").load()()
    importer.import_checkpoint(root / "hf", root / "native")
    return hf, load_pretrained(root / "native")


@pytest.fixture(scope="session")
def imported_model(hf_and_imported):
    return hf_and_imported[1]


def tiny_native(seed: int, context: int) -> CausalLM:
    """A native model built directly (no transformers), with peaked distributions."""
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, max_position_embeddings=context)
    model = CausalLM(config)
    model.reset_parameters(std=0.3)
    return model.eval()


@pytest.fixture(scope="session")
def native_model() -> CausalLM:
    return tiny_native(seed=1, context=256)


def batch_of(prompts: list[list[int]], completions) -> RolloutBatch:
    """A RolloutBatch holding these prompts and completions (rewards zero)."""
    prompt_ids, prompt_mask = pad_rows(prompts, left=True, pad_value=0, dtype=torch.long)
    response_ids, response_mask = pad_rows([c.token_ids for c in completions], left=False,
                                           pad_value=0, dtype=torch.long)
    old, _ = pad_rows([c.logprobs for c in completions], left=False, pad_value=0.0, dtype=torch.float32)
    n = len(completions)
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                        response_mask=response_mask, old_logprobs=old, rewards=torch.zeros(n),
                        reward_components={}, group_ids=torch.arange(n))


@torch.no_grad()
def full_logits(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[len(completion), V] logits predicting each completion token, from one unpadded forward."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids)["logits"][0]
    return logits[len(prompt) - 1: len(prompt) + len(completion) - 1]


@pytest.fixture
def make_batch():
    return batch_of


@pytest.fixture
def reference_logits():
    return full_logits


@pytest.fixture
def prompts() -> list[list[int]]:
    """Prompts of different lengths (so batches are left-padded)."""
    return [[5, 9, 12], [7, 3], [1, 2, 3, 4, 5, 6, 7], [40], [11, 22, 33, 44, 55]]


@pytest.fixture(scope="session")
def char_tokenizer(tmp_path_factory):
    """The arithmetic example's character-level tokenizer (with a chat template)."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "arith" / "make_tokenizer.py"
    spec = importlib.util.spec_from_file_location("arith_make_tokenizer", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    directory = tmp_path_factory.mktemp("tokenizer")
    module.save(directory)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory)), directory


@pytest.fixture(scope="session")
def char_model_and_tokenizer(char_tokenizer):
    """A native model sized to the character tokenizer."""
    tokenizer, _ = char_tokenizer
    torch.manual_seed(2)
    config = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, max_position_embeddings=256)
    model = CausalLM(config)
    model.reset_parameters(std=0.3)
    return model.eval(), tokenizer
