"""Native checkpoint directories: round trips, sharding, tokenizer files and every CheckpointError."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from astrai_core.checkpoints import native_files as checkpoint_module
from astrai_core.checkpoints.manifest import write_manifest
from astrai_core.checkpoints.native import load_pretrained, load_state_dict_strict, save_pretrained
from astrai_core.errors import CheckpointError
from astrai_core.model import CausalLM, ModelConfig

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2, num_experts=4, moe_intermediate_size=16, decoder_sparse_step=2,
              qk_norm=True, rope_scaling={"rope_type": "linear", "factor": 2.0}, eos_token_id=3)


def make_model(**overrides) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(ModelConfig(**{**CONFIG, **overrides})).eval()


def assert_same_model(a: CausalLM, b: CausalLM) -> None:
    assert a.config == b.config
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    for name in state_a:
        assert torch.equal(state_a[name], state_b[name]), name
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(a(ids)["logits"], b(ids)["logits"])


def test_round_trip_is_bit_identical(tmp_path):
    model = make_model()
    save_pretrained(model, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["format"] == "astrai" and "astrai_version" in config
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    loaded = load_pretrained(tmp_path / "ckpt")
    assert_same_model(model, loaded)
    assert not loaded.training and all(p.requires_grad for p in loaded.parameters())


def test_sharded_save_loads_identically(tmp_path):
    model = make_model()
    save_pretrained(model, tmp_path / "ckpt", max_shard_bytes=20_000)
    files = sorted(p.name for p in (tmp_path / "ckpt").glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / "ckpt" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in model.state_dict().values())
    assert_same_model(model, load_pretrained(tmp_path / "ckpt"))


def test_tied_embeddings_saved_once(tmp_path):
    model = make_model(tie_word_embeddings=True)
    save_pretrained(model, tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
    assert "lm_head.weight" not in names and "embed.weight" in names
    loaded = load_pretrained(tmp_path / "ckpt")
    assert loaded.lm_head is None
    assert_same_model(model, loaded)


def test_load_with_dtype(tmp_path):
    model = make_model()
    save_pretrained(model, tmp_path / "ckpt")
    loaded = load_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    reference = model.state_dict()
    for name, tensor in loaded.state_dict().items():  # the float32 weights, rounded once
        assert torch.equal(tensor, reference[name].to(torch.bfloat16)), name
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = model(ids)["logits"], loaded(ids)["logits"]
    assert got.dtype == torch.float32
    # bf16 keeps 8 mantissa bits (relative step 2^-8): within a few steps of the logit scale,
    # while a wrong weight would be off by the logits' whole spread
    scale = expected.abs().max()
    assert (got - expected).abs().max() <= 4 * 2 ** -8 * scale
    assert (got - expected).abs().max() < 0.1 * expected.std()


def test_tokenizer_files_are_copied(tmp_path):
    tokenizer_dir = tmp_path / "tok"
    tokenizer_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "unrelated.bin"):
        (tokenizer_dir / name).write_text(name)
    save_pretrained(make_model(), tmp_path / "ckpt", tokenizer_dir=tokenizer_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "ckpt" / name).read_text() == name
    assert not (tmp_path / "ckpt" / "unrelated.bin").exists()


def test_existing_destination_is_refused_unless_overwrite(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "keep.txt").write_text("x")
    with pytest.raises(CheckpointError, match="already exists"):
        save_pretrained(make_model(), tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "keep.txt").exists()
    save_pretrained(make_model(), tmp_path / "ckpt", overwrite=True)
    assert not (tmp_path / "ckpt" / "keep.txt").exists()
    assert_same_model(make_model(), load_pretrained(tmp_path / "ckpt"))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_failed_save_leaves_no_directory(tmp_path, monkeypatch):
    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(make_model(), tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_missing_tokenizer_dir_fails_before_writing(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer directory"):
        save_pretrained(make_model(), tmp_path / "ckpt", tokenizer_dir=tmp_path / "nope")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "ckpt"
    save_pretrained(make_model(), path)
    return path


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'nope'} does not exist"):
        load_pretrained(tmp_path / "nope")


def test_missing_config(saved):
    (saved / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json is missing"):
        load_pretrained(saved)


def test_hf_config_is_not_an_astrai_config(saved):
    (saved / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    with pytest.raises(CheckpointError, match=r"config\.json is not an astrai config.*astrai import"):
        load_pretrained(saved)


def test_invalid_config_field(saved):
    data = json.loads((saved / "config.json").read_text())
    data["num_kv_heads"] = 3
    (saved / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="invalid model config.*num_kv_heads"):
        load_pretrained(saved)


def test_missing_weight_file(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"weight file .*model\.safetensors is missing"):
        load_pretrained(saved)


def test_truncated_weight_file(saved):
    path = saved / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated or corrupt"):
        load_pretrained(saved)


def test_missing_shard(tmp_path):
    save_pretrained(make_model(), tmp_path / "ckpt", max_shard_bytes=20_000)
    shard = sorted((tmp_path / "ckpt").glob("model-00002-of-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard.name} is missing"):
        load_pretrained(tmp_path / "ckpt")


def _rewrite(saved, edit):
    """Rewrite the weights as a checkpoint writer would: manifest included, so what is
    tested is the strict load of consistent files, not the manifest."""
    tensors = load_file(str(saved / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(saved / "model.safetensors"))
    write_manifest(saved)


def test_missing_and_unexpected_tensor_names(saved):
    _rewrite(saved, lambda t: t.update(extra=torch.zeros(1), **{"norm.weight": t.pop("norm.weight")}) or
             t.pop("layers.0.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError) as info:
        load_pretrained(saved)
    message = str(info.value)
    assert "model.safetensors" in message
    assert "missing tensors: layers.0.mlp.up_proj.weight" in message
    assert "unexpected tensors: extra" in message


def test_shape_mismatch_names_tensor_and_shapes(saved):
    _rewrite(saved, lambda t: t.update({"layers.1.mlp.router.weight": torch.zeros(5, 32)}))
    with pytest.raises(CheckpointError, match=r"tensor layers\.1\.mlp\.router\.weight has shape \[5, 32\], "
                                              r"the model expects \[4, 32\]"):
        load_pretrained(saved)


def test_load_state_dict_strict_helper():
    model = make_model()
    state = {k: v.clone() + 1 for k, v in model.state_dict().items()}
    load_state_dict_strict(model, state, "src/model.safetensors")
    assert torch.equal(model.embed.weight, state["embed.weight"])
    state["embed.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match=r"src/model\.safetensors: tensor embed\.weight has shape"):
        load_state_dict_strict(model, state, "src/model.safetensors")
