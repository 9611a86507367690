"""Every byte a checkpoint load reads lies inside the checkpoint and is listed (hashed) in
its manifest: an index naming a shard outside, DCP metadata whose items point outside the
checkpoint or beyond their file, are refused with one line naming the file, before any
read, even when the attacker rewrote the manifest so that it verifies."""

from __future__ import annotations

import json
import pickle
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from astrai_core.checkpoints.manifest import MANIFEST_FILE, write_manifest
from astrai_core.checkpoints.native import load_pretrained, save_pretrained
from astrai_core.errors import CheckpointError
from astrai_core.model import CausalLM, ModelConfig
from astrai_core.testing import ARITH_TOKENIZER
from tests.checkpoints.test_no_code_runs import trained  # noqa: F401 - a fixture
from tests.training.conftest import astrai

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2)


def one_error_line(done, prefix: str = "error:") -> str:
    """The one line starting with ``prefix`` of a failed command without a traceback."""
    assert done.returncode != 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith(prefix)]
    assert len(errors) == 1, done.stderr[-3000:]
    return errors[0]


# ------------------------------------------------------------ an index naming a shard

@pytest.fixture
def outside_shard(tmp_path):
    """A sharded checkpoint whose index names ``../outside/other.safetensors`` (a copy of
    its last shard, moved out), with a manifest rewritten so that it verifies."""
    torch.manual_seed(0)
    saved = save_pretrained(CausalLM(ModelConfig(**CONFIG)), tmp_path / "ckpt",
                            tokenizer_dir=ARITH_TOKENIZER, max_shard_bytes=20_000)
    index_path = saved / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (tmp_path / "outside").mkdir()
    shutil.move(saved / shard, tmp_path / "outside" / "other.safetensors")
    index["weight_map"] = {name: "../outside/other.safetensors" if file == shard else file
                           for name, file in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    write_manifest(saved)  # the attacker's manifest: it verifies
    return saved


def test_an_index_naming_a_file_outside_is_refused_on_load(outside_shard):
    with pytest.raises(CheckpointError, match=r"names '\.\./outside/other\.safetensors', "
                                              r"outside the checkpoint") as raised:
        load_pretrained(outside_shard)
    assert "model.safetensors.index.json" in str(raised.value)


def test_an_index_naming_a_file_outside_is_refused_on_export(outside_shard, tmp_path):
    line = one_error_line(astrai("export", str(outside_shard), str(tmp_path / "hf")))
    assert "model.safetensors.index.json names '../outside/other.safetensors'" in line
    assert not (tmp_path / "hf").exists()


def test_a_listed_link_leading_out_of_the_checkpoint_is_refused(outside_shard):
    index_path = outside_shard / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: v.replace("../outside/other", "extra")
                           for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    (outside_shard / "extra.safetensors").symlink_to(
        outside_shard.parent / "outside" / "other.safetensors")
    write_manifest(outside_shard)  # lists the link, hashing what it leads to
    with pytest.raises(CheckpointError, match="lists 'extra.safetensors', outside the "
                                              "checkpoint"):
        load_pretrained(outside_shard)


def test_an_import_refuses_an_index_naming_a_file_outside(tmp_path):
    """A Hugging Face directory (no manifest): its shards must lie inside it too, before
    the import cache hashes them or the import reads them."""
    from astrai_core.checkpoints.hf.files import read_hf_weights
    from astrai_core.checkpoints.import_cache import source_files

    source = tmp_path / "hf"
    source.mkdir()
    (tmp_path / "outside.safetensors").write_bytes(b"not read")
    (source / "config.json").write_text("{}")
    (source / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../outside.safetensors"}}))
    for read in (source_files, read_hf_weights):
        with pytest.raises(CheckpointError, match=r"names '\.\./outside\.safetensors', "
                                                  r"outside the checkpoint"):
            read(source)


# ------------------------------------------------------------ DCP storage items

@contextmanager
def hostile_metadata(checkpoint: Path, rewrite):
    """``dcp/.metadata`` with its storage items changed by ``rewrite(storage_data)`` and the
    manifest rewritten to match; everything restored afterwards."""
    path = checkpoint / "dcp" / ".metadata"
    original, manifest = path.read_bytes(), (checkpoint / MANIFEST_FILE).read_text()
    metadata = pickle.loads(original)  # our own file: trusted here
    rewrite(metadata.storage_data)
    try:
        path.write_bytes(pickle.dumps(metadata))
        write_manifest(checkpoint)
        yield path
    finally:
        path.write_bytes(original)
        (checkpoint / MANIFEST_FILE).write_text(manifest)


def tensor_items(storage):
    return sorted((k for k in storage if "optimizers" not in k.fqn and "exp_avg" not in k.fqn),
                  key=lambda k: (storage[k].relative_path, storage[k].offset))


def _point_at(target):
    def rewrite(storage):
        for index in storage:
            storage[index].relative_path = target(storage[index])
    return rewrite


def _outside_copy(checkpoint: Path) -> str:
    shard = sorted((checkpoint / "dcp").glob("*.distcp"))[0]
    copy = checkpoint.parent.parent / "outside.distcp"
    shutil.copy(shard, copy)
    return str(copy)


@pytest.mark.parametrize("where", ["absolute", "parent", "unlisted"])
def test_dcp_items_outside_the_checkpoint_are_refused_on_resume(trained, where):
    config_path, checkpoint = trained
    outside = _outside_copy(checkpoint)
    name = {"absolute": outside, "parent": "../../../outside.distcp",
            "unlisted": "nowhere.distcp"}[where]
    with hostile_metadata(checkpoint, _point_at(lambda info: name)) as metadata:
        line = one_error_line(astrai("train", str(config_path), "--resume"))
    assert f"{metadata} names {name!r}" in line
    assert ("does not list" if where == "unlisted" else "outside the checkpoint") in line


def test_a_dcp_item_beyond_its_file_is_refused_before_any_read(trained, monkeypatch):
    """/dev/zero with 3 GB, or a real shard with 3 GB: refused from the metadata alone."""
    from torch.distributed.checkpoint import FileSystemReader

    from astrai_core.checkpoints.sharded import read_sharded

    def no_read(*args, **kwargs):
        raise AssertionError("a storage item was read")

    monkeypatch.setattr(FileSystemReader, "read_data", no_read)
    _, checkpoint = trained
    for name in ("/dev/zero", None):
        def rewrite(storage):
            first = tensor_items(storage)[0]
            if name is not None:
                storage[first].relative_path = name
            storage[first].length = 3 * 1024**3
        with hostile_metadata(checkpoint, rewrite) as metadata:
            with pytest.raises(CheckpointError) as raised:
                read_sharded(checkpoint)
        message = str(raised.value)
        assert str(metadata) in message and "\n" not in message
        assert ("outside the checkpoint" if name else "lies outside its file") in message


def test_a_dcp_item_beyond_its_file_is_one_line_on_resume(trained):
    config_path, checkpoint = trained

    def rewrite(storage):
        storage[tensor_items(storage)[0]].offset = 3 * 1024**3

    with hostile_metadata(checkpoint, rewrite) as metadata:
        line = one_error_line(astrai("train", str(config_path), "--resume"))
    assert str(metadata) in line and "lies outside its file" in line


def test_a_hostile_item_inside_its_file_is_one_line_naming_the_file(trained):
    """Two tensor items swapped (each within bounds, different shapes): the read fails,
    and the message names the shard file."""
    config_path, checkpoint = trained

    def rewrite(storage):
        items = tensor_items(storage)
        first = items[0]
        other = next(k for k in items if storage[k].length != storage[first].length)
        storage[first], storage[other] = storage[other], storage[first]

    with hostile_metadata(checkpoint, rewrite) as metadata:
        line = one_error_line(astrai("train", str(config_path), "--resume"))
    shard = sorted((checkpoint / "dcp").glob("*.distcp"))[0]
    assert str(shard) in line and "cannot read the checkpoint's state" in line
    assert str(metadata) not in line  # its locations were valid
