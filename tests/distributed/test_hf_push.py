"""``iter_hf_push_buckets``: a policy's push state under Hugging Face names, in bounded
buckets, for both backends (on one process; the gathers are those of
``iter_full_buckets``, tested sharded in test_weight_gather.py)."""

from __future__ import annotations

import pytest
import torch

from astrai_core.api import (iter_hf_push_buckets, load_importer, merged_state_dict,
                             process_registry)
from astrai_core.model.lora import inject_lora, peft_lora_config
from astrai_core.model_backends.transformers_lm import TransformersCausalLM
from astrai_core.testing.hf_models import tiny_causal_lm

BUCKET = 4096  # bytes: many buckets for a tiny model


def _collect(buckets) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        assert not state.keys() & bucket.keys()
        state.update({k: v.clone() for k, v in bucket.items()})
    return state


def _lora(model, targets):
    inject_lora(model, peft_lora_config(r=4, alpha=8, dropout=0.0, target_modules=targets,
                                        use_rslora=False, use_dora=False))
    with torch.no_grad():  # a non-zero adapter, so merging changes the weights
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.1)
    return model


def test_transformers_policy_pushes_the_familys_own_names():
    hf = tiny_causal_lm("gemma3_text")  # a tied output head: it travels as the embedding
    assert hf.config.tie_word_embeddings
    expected = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    got = _collect(iter_hf_push_buckets(TransformersCausalLM(hf), BUCKET))
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_transformers_lora_policy_pushes_merged_weights():
    model = _lora(TransformersCausalLM(tiny_causal_lm("olmo2")), ["q_proj", "v_proj"])
    got = _collect(iter_hf_push_buckets(model, BUCKET))
    merged = {k.removeprefix("hf."): v for k, v in merged_state_dict(model).items()}
    assert got.keys() == merged.keys() and not any("lora" in k for k in got)
    assert all(torch.equal(got[k], merged[k]) for k in merged)
    name = "model.layers.0.self_attn.q_proj.weight"
    base = model.hf.get_submodule("model.layers.0.self_attn.q_proj").base_layer.weight
    assert not torch.equal(got[name], base)  # the adapter is in


@pytest.mark.parametrize("lora", [False, True])
def test_native_policy_pushes_through_its_importer(lora):
    from astrai_core.api import CausalLM, ModelConfig
    from astrai_core.testing import TINY_MODEL

    torch.manual_seed(0)
    model = CausalLM(ModelConfig(vocab_size=32, **TINY_MODEL))
    if lora:
        _lora(model, ["q_proj", "v_proj"])
    importer = load_importer(process_registry(), model_type="llama")
    expected = importer.state_dict_to_hf(model.config, merged_state_dict(model))
    got = _collect(iter_hf_push_buckets(model, BUCKET, importer))
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    with pytest.raises(ValueError, match="importer"):
        next(iter(iter_hf_push_buckets(model, BUCKET)))
