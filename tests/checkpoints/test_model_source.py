"""``model.path``: a native checkpoint, a Hugging Face directory (imported on the fly into a
cache, the same files as ``astrai import``), or a hub id from the Hugging Face cache; and
``model.backend``'s default and its errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from astrai_core.checkpoints.hf.base import HFImporter
from astrai_core.checkpoints.import_cache import cache_root, import_key
from astrai_core.checkpoints.model_source import describe, model_directory
from astrai_core.errors import FieldError
from astrai_core.plugins import process_registry
from astrai_core.testing.hf_models import write_hf_model_dir

ASTRAI = str(Path(sys.executable).with_name("astrai"))


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_hf_directory_is_imported_once_and_equals_astrai_import(tmp_path, monkeypatch):
    hf = write_hf_model_dir(tmp_path / "hf", "llama")
    source = describe(str(hf), None, process_registry())
    assert (source.backend, source.importer, source.model_type) == ("native", "llama", "llama")
    cached = model_directory(source, process_registry(), tmp_path / "cache")
    assert cached.is_relative_to(tmp_path / "cache" / "imports")

    result = subprocess.run([ASTRAI, "import", str(hf), str(tmp_path / "imported")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert _files(cached) == _files(tmp_path / "imported")  # bit for bit, manifest included

    def no_second_import(*args, **kwargs):
        raise AssertionError("imported again")

    monkeypatch.setattr(HFImporter, "import_checkpoint", no_second_import)
    assert model_directory(source, process_registry(), tmp_path / "cache") == cached


def test_the_cache_key_follows_the_source_files(tmp_path):
    hf = write_hf_model_dir(tmp_path / "hf", "llama")
    key = import_key(hf, "llama")
    assert import_key(hf, "llama") == key
    assert import_key(hf, "other") != key
    copy = shutil.copytree(hf, tmp_path / "copy")
    assert import_key(copy, "llama") == key  # content, not place
    write_hf_model_dir(tmp_path / "copy", "llama", seed=1)  # other weights
    assert import_key(copy, "llama") != key


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ASTRAI_CACHE_DIR", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    assert cache_root(tmp_path / "b") == tmp_path / "b"
    monkeypatch.delenv("ASTRAI_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "astrai"


@pytest.mark.parametrize("model_type", ["gemma3_text", "phi3", "olmo2", "mixtral"])
def test_a_family_without_importer_defaults_to_transformers(tmp_path, model_type):
    hf = write_hf_model_dir(tmp_path / "hf", model_type)
    source = describe(str(hf), None, process_registry())
    assert (source.backend, source.importer, source.model_type) == \
        ("transformers", None, model_type)
    assert model_directory(source, process_registry()) == hf  # nothing to import
    with pytest.raises(FieldError, match=f"model.backend: native: model_type '{model_type}' "
                       "has no native importer"):
        describe(str(hf), "native", process_registry())


def test_backend_transformers_is_explicit_for_a_native_family(tmp_path):
    hf = write_hf_model_dir(tmp_path / "hf", "llama")
    source = describe(str(hf), "transformers", process_registry())
    assert (source.backend, source.importer, source.imports) == ("transformers", None, False)


def test_a_native_checkpoint_runs_natively_only(tmp_path):
    hf = write_hf_model_dir(tmp_path / "hf", "llama")
    native = model_directory(describe(str(hf), None, process_registry()), process_registry(),
                             tmp_path / "cache")
    source = describe(str(native), None, process_registry())
    assert (source.native_checkpoint, source.backend, source.imports) == (True, "native", False)
    with pytest.raises(FieldError, match="model.backend: transformers runs Hugging Face "
                       "directories"):
        describe(str(native), "transformers", process_registry())


def test_a_missing_path_that_is_no_hub_id(tmp_path):
    with pytest.raises(FieldError, match="does not exist"):
        describe(str(tmp_path / "nothing"), None, process_registry())


def _fake_hub_cache(cache: Path, repo_id: str, files_from: Path) -> Path:
    """The layout huggingface_hub writes: refs/main names a snapshot of the files."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    shutil.copytree(files_from, snapshot)
    return snapshot


def test_a_hub_id_is_found_in_the_cache_offline(tmp_path, monkeypatch):
    hf = write_hf_model_dir(tmp_path / "hf", "phi3")
    snapshot = _fake_hub_cache(tmp_path / "hub", "someone/tiny-phi3", hf)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = describe("someone/tiny-phi3", None, process_registry())
    assert source.directory == snapshot and source.backend == "transformers"


def test_a_hub_id_offline_and_not_cached_is_one_line(tmp_path):
    """The CLI: one error line naming the id, HF_HUB_OFFLINE and the cache directory."""
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path / 'run'}\nmodel: {{path: someone/not-here}}\n"
                      f"data: {{sources: [{{path: {tmp_path / 'run.yaml'}, format: chat}}]}}\n"
                      "strategy: {name: sft}\ntrainer: {max_steps: 1}\n")
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1",
           "HF_HUB_CACHE": str(tmp_path / "hub")}
    result = subprocess.run([ASTRAI, "train", str(config)], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "model.path: 'someone/not-here' is not a local directory and not in the Hugging " \
           f"Face cache {tmp_path / 'hub'} (HF_HUB_OFFLINE=1)" in lines[0]


def test_model_code_the_directory_ships_runs_only_when_trusted(tmp_path):
    import json

    hf = write_hf_model_dir(tmp_path / "hf", "olmo2")
    config = json.loads((hf / "config.json").read_text())
    config.update(model_type="my_own_lm", auto_map={"AutoModelForCausalLM": "modeling.MyLM"})
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(FieldError, match="model.trust_remote_code: model_type 'my_own_lm' runs "
                       "only with the model code its directory ships"):
        describe(str(hf), None, process_registry())
    assert describe(str(hf), None, process_registry(), trust_remote_code=True).backend == \
        "transformers"
    del config["auto_map"]
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(FieldError, match="model.path: model_type 'my_own_lm' is not a causal LM "
                       "that transformers"):
        describe(str(hf), None, process_registry())
