"""The qwen3 importer (qwen3, qwen3_moe, qwen2_moe) computes what transformers computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from astrai_core.api import load_pretrained
from astrai_core.checkpoints.hf.base import HF_SOURCE_FILE
from astrai_core.checkpoints.manifest import write_manifest
from astrai_core.checkpoints.hf.select import load_importer
from astrai_core.testing.parity import (
    load_hf_model,
    max_packed_diff,
    max_padded_diff,
    padded_batch,
    safetensors_tensors,
    save_hf_model,
    tiny_hf_model,
)
from astrai_core.plugins import load_plugins

TYPES = ["qwen3", "qwen3_moe", "qwen2_moe"]
TOL = 1e-4
VOCAB = 128


def importer_for(model_type):
    return load_importer(load_plugins(), model_type=model_type)


def import_tiny(tmp_path, model_type):
    hf_model = tiny_hf_model(model_type)
    save_hf_model(hf_model, tmp_path / "hf")
    importer_for(model_type).import_checkpoint(tmp_path / "hf", tmp_path / "native")
    return hf_model, load_pretrained(tmp_path / "native")


def test_registry_selects_the_plugin_for_its_types():
    registry = load_plugins()
    assert registry.get("model_importer", "qwen3").model_types == tuple(TYPES)
    for model_type in TYPES:
        assert importer_for(model_type).name == "qwen3"


@pytest.mark.parametrize("model_type", TYPES)
def test_padded_batch_matches_transformers(tmp_path, model_type):
    hf_model, native = import_tiny(tmp_path, model_type)
    ids, mask = padded_batch(VOCAB, [12, 9, 4])
    assert max_padded_diff(hf_model, native, ids, mask) <= TOL


@pytest.mark.parametrize("model_type", TYPES)
def test_left_padded_batch_with_positions_matches_transformers(tmp_path, model_type):
    hf_model, native = import_tiny(tmp_path, model_type)
    ids, mask = padded_batch(VOCAB, [12, 9, 4], left=True)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    assert max_padded_diff(hf_model, native, ids, mask, positions) <= TOL


@pytest.mark.parametrize("model_type", TYPES)
def test_packed_documents_match_each_document_alone(tmp_path, model_type):
    hf_model, native = import_tiny(tmp_path, model_type)
    assert max_packed_diff(hf_model, native, VOCAB, [5, 8, 3]) <= TOL


def test_moe_config_fields_are_carried(tmp_path):
    _, qwen2_moe = import_tiny(tmp_path / "a", "qwen2_moe")
    cfg = qwen2_moe.config
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.decoder_sparse_step) == (4, 2, 2)
    assert cfg.shared_expert_intermediate_size == 24 and cfg.norm_topk_prob is False
    assert cfg.attention_bias and not cfg.qk_norm
    _, qwen3_moe = import_tiny(tmp_path / "b", "qwen3_moe")
    assert qwen3_moe.config.mlp_only_layers == [1] and qwen3_moe.config.norm_topk_prob is True
    assert qwen3_moe.config.qk_norm and qwen3_moe.config.shared_expert_intermediate_size == 0


@pytest.mark.parametrize("model_type", TYPES)
def test_export_round_trip_is_exact_and_loads_in_transformers(tmp_path, model_type):
    hf_model, _ = import_tiny(tmp_path, model_type)
    importer_for(model_type).export_checkpoint(tmp_path / "native", tmp_path / "exported")
    original = safetensors_tensors(tmp_path / "hf")
    exported = safetensors_tensors(tmp_path / "exported")
    assert sorted(exported) == sorted(original)
    assert all(torch.equal(exported[name], tensor) for name, tensor in original.items())
    reloaded = load_hf_model(tmp_path / "exported")
    ids, mask = padded_batch(VOCAB, [12, 9, 4])
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids, attention_mask=mask).logits,
                           hf_model(input_ids=ids, attention_mask=mask).logits)


@pytest.mark.parametrize("model_type", TYPES)
def test_fresh_config_export_loads_in_transformers(tmp_path, model_type):
    """Without the import record, config_to_hf writes the config from the native one."""
    hf_model, _ = import_tiny(tmp_path, model_type)
    (tmp_path / "native" / HF_SOURCE_FILE).unlink()
    write_manifest(tmp_path / "native")  # as a checkpoint written without one
    importer_for(model_type).export_checkpoint(tmp_path / "native", tmp_path / "fresh")
    assert json.loads((tmp_path / "fresh" / "config.json").read_text())["model_type"] == model_type
    reloaded = load_hf_model(tmp_path / "fresh")
    ids, mask = padded_batch(VOCAB, [12, 9, 4])
    with torch.no_grad():
        diff = (reloaded(input_ids=ids, attention_mask=mask).logits
                - hf_model(input_ids=ids, attention_mask=mask).logits).abs().max().item()
    assert diff <= 1e-5


def write_fused_layout(src: Path, dst: Path, num_experts: int) -> None:
    """The same checkpoint with experts stored fused, as transformers 5 holds them in memory."""
    tensors = safetensors_tensors(src)
    prefixes = sorted({name.split("experts.")[0] for name in tensors if ".experts.0." in name})
    for prefix in prefixes:
        take = lambda proj: torch.stack([tensors.pop(f"{prefix}experts.{j}.{proj}_proj.weight")  # noqa: E731
                                         for j in range(num_experts)])
        gate, up, down = take("gate"), take("up"), take("down")
        tensors[f"{prefix}experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        tensors[f"{prefix}experts.down_proj"] = down
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe"])
def test_fused_expert_layout_on_disk(tmp_path, model_type):
    hf_model = tiny_hf_model(model_type)
    save_hf_model(hf_model, tmp_path / "hf")
    write_fused_layout(tmp_path / "hf", tmp_path / "fused", num_experts=4)
    importer = importer_for(model_type)
    importer.import_checkpoint(tmp_path / "fused", tmp_path / "native")
    native = load_pretrained(tmp_path / "native")
    ids, mask = padded_batch(VOCAB, [12, 9, 4])
    assert max_padded_diff(hf_model, native, ids, mask) <= TOL
    importer.export_checkpoint(tmp_path / "native", tmp_path / "exported")
    original = safetensors_tensors(tmp_path / "fused")
    exported = safetensors_tensors(tmp_path / "exported")
    assert sorted(exported) == sorted(original)
    assert all(torch.equal(exported[name], tensor) for name, tensor in original.items())


def astrai_cli(*args, env=None):
    astrai = str(Path(sys.executable).with_name("astrai"))
    return subprocess.run([astrai, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_list_plugins_shows_the_importer():
    result = astrai_cli("list-plugins", "--json")
    plugins = {p["name"]: p for p in json.loads(result.stdout)}
    assert plugins["qwen3"]["status"] == "ok"
    assert plugins["qwen3"]["provides"] == {"model_importer": ["qwen3"]}


def test_without_the_plugin_the_error_names_it(tmp_path):
    save_hf_model(tiny_hf_model("qwen3"), tmp_path / "hf")
    result = astrai_cli("import", tmp_path / "hf", tmp_path / "native",
                        env={"ASTRAI_DISABLE_PLUGINS": "qwen3"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: model_type 'qwen3' is not supported")
    assert "pip install astrai-plugin-qwen3" in result.stderr
    assert not (tmp_path / "native").exists()
