"""Export: transformers loads what astrai writes, and import -> export is lossless."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_core.checkpoints.hf.base import HF_SOURCE_FILE
from astrai_core.checkpoints.manifest import write_manifest
from astrai_core.checkpoints.hf.llama import LlamaImporter
from astrai_core.checkpoints.native import save_pretrained
from astrai_core.testing.parity import (
    load_hf_model,
    padded_batch,
    safetensors_tensors,
    save_hf_model,
    tiny_hf_model,
)
from astrai_core.model import CausalLM, ModelConfig

TYPES = ["llama", "mistral", "qwen2"]


def round_trip(tmp_path, model_type, **save_kwargs):
    hf_model = tiny_hf_model(model_type)
    save_hf_model(hf_model, tmp_path / "hf", **save_kwargs)
    importer = LlamaImporter()
    importer.import_checkpoint(tmp_path / "hf", tmp_path / "native")
    importer.export_checkpoint(tmp_path / "native", tmp_path / "exported")
    return hf_model


@pytest.mark.parametrize("model_type", TYPES)
def test_export_reproduces_every_tensor_and_the_config(tmp_path, model_type):
    round_trip(tmp_path, model_type)
    original = safetensors_tensors(tmp_path / "hf")
    exported = safetensors_tensors(tmp_path / "exported")
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert exported[name].dtype == tensor.dtype, name
        assert torch.equal(exported[name], tensor), name
    read = lambda d: json.loads((d / "config.json").read_text())  # noqa: E731
    assert read(tmp_path / "exported") == read(tmp_path / "hf")


@pytest.mark.parametrize("model_type", TYPES)
def test_transformers_loads_the_export_with_equal_logits(tmp_path, model_type):
    hf_model = round_trip(tmp_path, model_type)
    reloaded = load_hf_model(tmp_path / "exported")
    assert type(reloaded) is type(hf_model)
    ids, mask = padded_batch(128, [12, 9, 4])
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask).logits
        got = reloaded(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, expected)


def test_tokenizer_files_travel_both_ways(tmp_path):
    from transformers import AutoTokenizer

    round_trip(tmp_path, "llama")
    text = "w1 w7 w30 w2"
    expected = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))(text)["input_ids"]
    for directory in ("native", "exported"):
        assert (tmp_path / directory / "tokenizer.json").read_bytes() == \
            (tmp_path / "hf" / "tokenizer.json").read_bytes()
        got = AutoTokenizer.from_pretrained(str(tmp_path / directory))(text)["input_ids"]
        assert got == expected and len(got) == 4


def test_sharded_source_round_trips(tmp_path):
    round_trip(tmp_path, "llama", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    original = safetensors_tensors(tmp_path / "hf")
    exported = safetensors_tensors(tmp_path / "exported")
    assert sorted(exported) == sorted(original)
    assert all(torch.equal(exported[n], t) for n, t in original.items())


@pytest.mark.parametrize("model_type", TYPES)
def test_export_without_import_record_writes_a_fresh_loadable_config(tmp_path, model_type):
    """A checkpoint without hf_source.json (e.g. trained from scratch) gets config_to_hf."""
    hf_model = round_trip(tmp_path, model_type)
    (tmp_path / "native" / HF_SOURCE_FILE).unlink()
    write_manifest(tmp_path / "native")  # as a checkpoint written without one
    LlamaImporter().export_checkpoint(tmp_path / "native", tmp_path / "fresh")
    config = json.loads((tmp_path / "fresh" / "config.json").read_text())
    assert config["model_type"] == model_type
    reloaded = load_hf_model(tmp_path / "fresh")
    ids, mask = padded_batch(128, [12, 9, 4])
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask).logits
        got = reloaded(input_ids=ids, attention_mask=mask).logits
    assert (got - expected).abs().max().item() <= 1e-5


def test_from_scratch_native_model_exports_as_llama(tmp_path):
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, rope_theta=1e4,
                         rope_scaling={"rope_type": "linear", "factor": 2.0})
    torch.manual_seed(0)
    native = CausalLM(config).eval()
    save_pretrained(native, tmp_path / "native")
    LlamaImporter().export_checkpoint(tmp_path / "native", tmp_path / "hf")
    reloaded = load_hf_model(tmp_path / "hf")
    assert reloaded.config.model_type == "llama"
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (reloaded(input_ids=ids).logits - native(ids)["logits"]).abs().max().item()
    assert diff <= 1e-5


def test_bfloat16_checkpoint_round_trips_in_its_dtype(tmp_path):
    save_hf_model(tiny_hf_model("llama").to(torch.bfloat16), tmp_path / "hf")
    importer = LlamaImporter()
    importer.import_checkpoint(tmp_path / "hf", tmp_path / "native")
    assert all(t.dtype == torch.bfloat16 for t in safetensors_tensors(tmp_path / "native").values())
    importer.export_checkpoint(tmp_path / "native", tmp_path / "exported")
    original = safetensors_tensors(tmp_path / "hf")
    exported = safetensors_tensors(tmp_path / "exported")
    assert sorted(exported) == sorted(original)
    assert all(exported[n].dtype == torch.bfloat16 and torch.equal(exported[n], t)
               for n, t in original.items())
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["dtype"] == "bfloat16"
