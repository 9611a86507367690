"""Bad input: one clear CheckpointError, and nothing written at (or beside) DST."""

from __future__ import annotations

import json

import pytest

from astrai_core.checkpoints.hf.llama import LlamaImporter
from astrai_core.checkpoints.hf.select import importer_for_hf_dir
from astrai_core.errors import CheckpointError, PluginError
from astrai_core.testing.parity import save_hf_model, tiny_hf_model
from astrai_core.plugins import load_plugins


@pytest.fixture()
def hf_dir(tmp_path):
    return save_hf_model(tiny_hf_model("llama"), tmp_path / "hf")


def import_fails(src, dst, match, importer_name=None):
    with pytest.raises((CheckpointError, PluginError), match=match) as error:
        importer = importer_for_hf_dir(load_plugins(), src, importer_name)
        importer.import_checkpoint(src, dst)
    assert not dst.exists()
    leftovers = [p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}")]
    assert leftovers == []
    return str(error.value)


def edit_config(directory, **changes):
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_unknown_model_type_lists_supported_types(hf_dir, tmp_path):
    edit_config(hf_dir, model_type="gpt2")
    message = import_fails(hf_dir, tmp_path / "out", "model_type 'gpt2' is not supported")
    for model_type in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe"):
        assert model_type in message
    assert "astrai-plugin-qwen3" in message


def test_importer_that_does_not_handle_the_type_names_what_it_handles(hf_dir, tmp_path):
    edit_config(hf_dir, model_type="gpt2")
    with pytest.raises(CheckpointError, match="importer 'llama' handles: llama, mistral, qwen2"):
        LlamaImporter().import_checkpoint(hf_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_importer_name_lists_importers(hf_dir, tmp_path):
    message = import_fails(hf_dir, tmp_path / "out", "unknown model importer 'nope'", "nope")
    assert "llama" in message


def test_missing_shard(tmp_path):
    src = save_hf_model(tiny_hf_model("llama"), tmp_path / "hf", max_shard_size="20KB")
    shard = sorted(src.glob("model-*.safetensors"))[-1]
    shard.unlink()
    import_fails(src, tmp_path / "out", f"weight file .*{shard.name} is missing")


def test_missing_weights_entirely(hf_dir, tmp_path):
    (hf_dir / "model.safetensors").unlink()
    (hf_dir / "pytorch_model.bin").write_bytes(b"pickle")
    import_fails(hf_dir, tmp_path / "out", "no weights.*pytorch_model.bin.*never pickle")


def test_truncated_weight_file(hf_dir, tmp_path):
    path = hf_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    import_fails(hf_dir, tmp_path / "out", "model.safetensors is truncated or corrupt")


def test_shape_mismatch_names_tensor_and_both_shapes(hf_dir, tmp_path):
    edit_config(hf_dir, intermediate_size=48)
    import_fails(hf_dir, tmp_path / "out",
                 r"tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[64, 32\], the config "
                 r"implies \[48, 32\]")


def test_missing_tensor_is_named(hf_dir, tmp_path):
    edit_config(hf_dir, num_hidden_layers=3)
    import_fails(hf_dir, tmp_path / "out", "no tensor 'model.layers.2.")


def test_existing_destination_is_left_untouched(hf_dir, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists"):
        LlamaImporter().import_checkpoint(hf_dir, dst)
    assert [p.name for p in dst.iterdir()] == ["keep.txt"]
    assert (dst / "keep.txt").read_text() == "mine"


def test_source_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    import_fails(tmp_path / "empty", tmp_path / "out", "has no config.json")


def test_export_refuses_a_hugging_face_directory(hf_dir, tmp_path):
    with pytest.raises(CheckpointError, match="not an astrai config.*astrai import"):
        LlamaImporter().export_checkpoint(hf_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_source_without_tokenizer_imports_without_one(tmp_path):
    src = save_hf_model(tiny_hf_model("llama"), tmp_path / "hf", tokenizer=False)
    LlamaImporter().import_checkpoint(src, tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert not (tmp_path / "out" / "tokenizer.json").exists()
