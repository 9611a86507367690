"""LoRA on transformers families whose module names are not Llama's: the default targets
(the native projections where the family has them, else peft's default for the family),
``all-linear`` and the family's own names all train, and the adapter a checkpoint holds
loads in peft on the Hugging Face base with the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_core.config.schema import RunConfig
from astrai_core.testing.hf_models import write_hf_model_dir
from astrai_core.testing.parity import load_hf_model
from astrai_core.training.run import train
from tests.training.conftest import tiny_config

NATIVE = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
NEOX_LINEAR = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}


@pytest.mark.parametrize("model_type, target_modules, targets", [
    ("gpt_neox", None, {"query_key_value"}),  # peft's default for the family
    ("gpt_neox", ["query_key_value", "dense"], {"query_key_value", "dense"}),
    ("gpt_neox", "all-linear", NEOX_LINEAR),
    ("phi3", None, {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),
    ("gemma3_text", None, NATIVE),
    ("granite", None, NATIVE),
])
def test_family_lora_trains_saves_and_loads_in_peft(tmp_path, model_type, target_modules,
                                                    targets):
    from peft import PeftModel

    from astrai_core.api import load_pretrained

    hf = write_hf_model_dir(tmp_path / "hf", model_type)
    config = tiny_config(tmp_path, max_steps=2, save_every=2, threads=1, lr=1e-2)
    lora = {"r": 4, "alpha": 8}
    if target_modules is not None:
        lora["target_modules"] = target_modules
    config["model"] = {"path": str(hf), "lora": lora}
    train(RunConfig.model_validate(config))
    step = tmp_path / "run" / "checkpoints" / "step_2"
    adapter_config = json.loads((step / "adapter" / "adapter_config.json").read_text())
    assert set(adapter_config["target_modules"]) == targets

    reference = PeftModel.from_pretrained(load_hf_model(hf), str(step / "adapter")).eval()
    ours = load_pretrained(step).eval()
    ids = torch.arange(1, 12)[None]
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        base = load_hf_model(hf)(input_ids=ids).logits
        assert (expected - base).abs().max() > 1e-4  # the adapter trained and changes the logits
        assert (ours(ids)["logits"] - expected).abs().max().item() < 1e-5


def test_a_name_the_family_lacks_is_one_error_listing_its_linear_modules(tmp_path):
    from astrai_core.errors import AstraiError

    hf = write_hf_model_dir(tmp_path / "hf", "gpt_neox")
    config = tiny_config(tmp_path, max_steps=2)
    config["model"] = {"path": str(hf), "lora": {"target_modules": ["q_proj"]}}
    with pytest.raises(AstraiError, match=r"model\.lora\.target_modules: model_type 'gpt_neox' "
                       r"has no linear module q_proj to adapt; its linear modules: "
                       r"query_key_value, dense, dense_h_to_4h, dense_4h_to_h"):
        train(RunConfig.model_validate(config))
