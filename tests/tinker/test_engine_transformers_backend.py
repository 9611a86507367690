"""A base without a native importer runs through transformers: its adapter trains, its
sampled log-probs equal a forward pass's, and its sampler weights load in peft."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from astrai_core.testing.hf_models import write_hf_model_dir
from astrai_core.tinker.bases import load_base
from astrai_core.tinker.engine import TorchEngine
from astrai_core.tinker.engine_types import AdamSpec, DatumIn, LoraSpec, SamplerTarget, SampleSpec
from tests.tinker.conftest import sft_datums


@pytest.mark.parametrize("model_type", ["gpt_neox", "phi3"])
def test_a_transformers_base_trains_samples_and_exports(tmp_path, model_type):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    directory = write_hf_model_dir(tmp_path / model_type, model_type)
    base = load_base("hf", str(directory))
    assert type(base.model).__name__ == "TransformersCausalLM"
    engine = TorchEngine([base], tmp_path / "state")
    engine.create_model("m", "hf", LoraSpec(rank=4, seed=0))
    datums, _, _ = sft_datums()
    losses = []
    for _ in range(5):
        losses.append(engine.forward_backward("m", datums, "cross_entropy").metrics["loss:sum"])
        engine.optim_step("m", AdamSpec(learning_rate=2e-2))
    assert losses[-1] < losses[0]
    key = engine.save_weights("m", "s", for_sampler=True)
    prompt = [1, 7, 9]
    sequence = engine.sample(SamplerTarget("hf", key), prompt, 1,
                             SampleSpec(max_tokens=5, seed=2)).sequences[0]
    tokens = prompt + sequence.tokens
    datum = DatumIn(tokens[:-1], {"target_tokens": np.asarray(tokens[1:], dtype=np.int64),
                                  "weights": np.ones(len(tokens) - 1, dtype=np.float32)})
    forward = engine.forward("m", [datum], "cross_entropy").outputs[0]["logprobs"]
    np.testing.assert_allclose(sequence.logprobs, forward[len(prompt) - 1:], atol=1e-5)

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(tmp_path / "state" / key / "adapter")).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1].float()
    hf = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    np.testing.assert_allclose(hf.numpy(), forward, atol=1e-5)
