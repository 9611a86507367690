"""Every checkpoint holds manifest.json (size and sha256 of each file), and loading checks
it: sizes on every load, sha256 on export; a checkpoint without one is refused until its
owner accepts it with `astrai manifest DIR`."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch

from astrai_core.checkpoints.manifest import MANIFEST_FILE, verify_manifest
from astrai_core.checkpoints.native import load_pretrained, save_pretrained
from astrai_core.errors import CheckpointError
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.testing import ARITH_TOKENIZER

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2)


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    return save_pretrained(CausalLM(ModelConfig(**CONFIG)), tmp_path / "ckpt",
                           tokenizer_dir=ARITH_TOKENIZER, max_shard_bytes=20_000)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "astrai_core.cli.main", *args],
                          capture_output=True, text=True, timeout=300)


def test_the_manifest_lists_every_other_file_with_its_size_and_sha256(saved):
    files = json.loads((saved / MANIFEST_FILE).read_text())["files"]
    on_disk = {p.name for p in saved.iterdir()} - {MANIFEST_FILE}
    assert set(files) == on_disk
    assert any(name.startswith("model-00002-of-") for name in files)  # shards
    assert "tokenizer.json" in files
    for name, entry in files.items():
        data = (saved / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_checkpoint_without_a_manifest_is_refused_until_accepted(saved):
    (saved / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointError, match=rf"no manifest\.json.*`astrai manifest {saved}`"):
        load_pretrained(saved)
    accepted = _cli("manifest", str(saved))
    assert accepted.returncode == 0, accepted.stderr
    load_pretrained(saved)
    again = _cli("manifest", str(saved))  # never replaced silently
    assert again.returncode != 0 and "already exists" in again.stderr


def test_an_unlisted_file_is_refused(saved):
    (saved / "extra.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"extra\.bin is not listed in the checkpoint"):
        load_pretrained(saved)


def test_a_changed_tokenizer_file_is_refused_by_size(saved):
    path = saved / "tokenizer.json"
    path.write_text(path.read_text() + " ")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json is truncated or corrupt: "
                                              r"\d+ bytes, the manifest says \d+"):
        load_pretrained(saved)


def test_same_size_corruption_passes_a_load_and_fails_hashing_and_export(saved, tmp_path):
    shard = sorted(saved.glob("model-00001-of-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last tensor's data: the same size
    shard.write_bytes(bytes(data))
    load_pretrained(saved)  # sizes only: documented as not catching this
    with pytest.raises(CheckpointError, match=rf"{shard.name} is corrupt or was changed"):
        verify_manifest(saved, hashes=True)
    exported = _cli("export", str(saved), str(tmp_path / "hf"))
    assert exported.returncode != 0
    lines = exported.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and shard.name in lines[0]
    assert not (tmp_path / "hf").exists()


@pytest.fixture
def with_dcp(tmp_path):
    """A training checkpoint whose trained module went through torch.distributed.checkpoint
    (dcp/ holds the shards and the hidden dcp/.metadata), after one optimizer step."""
    from types import SimpleNamespace

    from astrai_core.checkpoints.training_state import save_checkpoint

    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**CONFIG))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]]))["logits"].sum().backward()
    optimizer.step()
    target = tmp_path / "run" / "checkpoints" / "step_1"
    return save_checkpoint(
        target, model=model, tokenizer_dir=ARITH_TOKENIZER, extra_modules={},
        training_state={"step": 1}, summary={"step": 1},
        sharded_modules=[SimpleNamespace(name="policy", module=model, optimizer=optimizer)])


def test_every_file_of_a_dcp_checkpoint_is_listed_hidden_ones_included(with_dcp):
    files = json.loads((with_dcp / MANIFEST_FILE).read_text())["files"]
    on_disk = {p.relative_to(with_dcp).as_posix() for p in with_dcp.rglob("*") if p.is_file()}
    assert "dcp/.metadata" in files
    assert set(files) == on_disk - {MANIFEST_FILE}
    assert any(name.startswith("dcp/") and name.endswith(".distcp") for name in files)
    metadata = (with_dcp / "dcp" / ".metadata").read_bytes()
    assert files["dcp/.metadata"] == {"size": len(metadata),
                                      "sha256": hashlib.sha256(metadata).hexdigest()}
    verify_manifest(with_dcp, hashes=True)


def test_a_changed_hidden_dcp_metadata_fails_verification(with_dcp):
    from astrai_core.checkpoints.training_state import latest_checkpoint

    path = with_dcp / "dcp" / ".metadata"
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF  # the same size: only its sha256 tells
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"dcp/\.metadata is corrupt or was changed"):
        verify_manifest(with_dcp, hashes=True)
    with pytest.raises(CheckpointError, match=r"no complete checkpoint .* step_1: .*"
                                              r"dcp/\.metadata is corrupt"):
        latest_checkpoint(with_dcp.parent.parent)  # --resume refuses it
    path.write_bytes(bytes(data) + b"\0")
    with pytest.raises(CheckpointError, match=r"dcp/\.metadata is truncated or corrupt"):
        verify_manifest(with_dcp)


def test_an_unlisted_hidden_file_is_refused(with_dcp):
    (with_dcp / "dcp" / ".extra").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"dcp/\.extra is not listed in the checkpoint"):
        verify_manifest(with_dcp)


def _flip_a_byte(saved):
    shard = sorted(saved.glob("model-00001-of-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the same size: only a hash sees it
    shard.write_bytes(bytes(data))
    return shard


def test_generate_hashes_a_small_checkpoint_by_default_and_on_verify(saved):
    shard = _flip_a_byte(saved)
    for flags in ((), ("--verify",)):
        done = _cli("generate", str(saved), "--prompt", "1+1", "--max-new-tokens", "1",
                    "--device", "cpu", *flags)
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{shard} is corrupt or was changed" in lines[0], lines
    done = _cli("generate", str(saved), "--prompt", "1+1", "--max-new-tokens", "1",
                "--device", "cpu", "--no-verify")
    assert done.returncode == 0, done.stderr[-2000:]  # sizes only, as asked


def test_serve_verifies_like_generate(saved, monkeypatch):
    from astrai_core.checkpoints import manifest
    from astrai_core.cli.serve import build_engine
    from astrai_core.plugins import process_registry

    shard = _flip_a_byte(saved)
    registry = process_registry()
    for verify in (None, True):
        with pytest.raises(CheckpointError, match=f"{shard.name} is corrupt or was changed"):
            build_engine(registry, "torch", saved, "cpu", 1, verify=verify)
    build_engine(registry, "torch", saved, "cpu", 1, verify=False).close()
    monkeypatch.setattr(manifest, "HASH_BY_DEFAULT_BYTES", 1000)  # larger: sizes only
    build_engine(registry, "torch", saved, "cpu", 1, verify=None).close()
