"""LoRA on the transformers backend: only the adapter trains, its target modules are the
family's own (Phi-3's fused qkv_proj), and the adapter a checkpoint holds loads in peft on
the same Hugging Face model with the same logits."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.config.schema import RunConfig
from astrai_core.testing.hf_models import write_hf_model_dir
from astrai_core.testing.parity import load_hf_model
from astrai_core.training.run import train
from tests.training.conftest import tiny_config


@pytest.mark.parametrize("model_type, targets", [
    ("phi3", {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),
    ("mixtral", {"q_proj", "k_proj", "v_proj", "o_proj"}),  # experts are not nn.Linear
])
def test_lora_trains_and_loads_in_peft(tmp_path, model_type, targets):
    from peft import PeftModel

    from astrai_core.api import load_pretrained

    hf = write_hf_model_dir(tmp_path / "hf", model_type)
    config = tiny_config(tmp_path, max_steps=3, save_every=3, threads=1, lr=1e-2)
    config["model"] = {"path": str(hf), "lora": {"r": 4, "alpha": 8}}
    train(RunConfig.model_validate(config))
    step = tmp_path / "run" / "checkpoints" / "step_3"
    adapter_config = json.loads((step / "adapter" / "adapter_config.json").read_text())
    assert set(adapter_config["target_modules"]) == targets
    adapter = load_file(str(step / "adapter" / "adapter_model.safetensors"))
    assert any(name.endswith("lora_B.weight") and t.abs().max() > 0
               for name, t in adapter.items())  # it trained (B starts at zero)
    assert not (step / "model.safetensors").exists()  # the base is recorded, not copied

    reference = PeftModel.from_pretrained(load_hf_model(hf), str(step / "adapter")).eval()
    ours = load_pretrained(step)
    ids = torch.arange(1, 12)[None]
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        base = load_hf_model(hf)(input_ids=ids).logits
        assert (expected - base).abs().max() > 1e-4  # the adapter changes the logits
        assert (ours(ids)["logits"] - expected).abs().max().item() < 1e-5
