"""`astrai import` / `astrai export` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from astrai_core.testing.parity import load_hf_model, save_hf_model, tiny_hf_model

ASTRAI = str(Path(sys.executable).with_name("astrai"))


def astrai(*args):
    return subprocess.run([ASTRAI, "--log-format", "json", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_import_then_export_round_trip(tmp_path):
    hf_model = tiny_hf_model("qwen2")
    save_hf_model(hf_model, tmp_path / "hf")
    result = astrai("import", tmp_path / "hf", tmp_path / "native")
    assert result.returncode == 0, result.stderr
    assert "importer llama" in result.stdout
    assert json.loads((tmp_path / "native" / "config.json").read_text())["attention_bias"] is True
    result = astrai("export", tmp_path / "native", tmp_path / "exported")
    assert result.returncode == 0, result.stderr
    assert "model_type qwen2" in result.stdout
    ids = torch.arange(10)[None]
    with torch.no_grad():
        assert torch.equal(load_hf_model(tmp_path / "exported")(input_ids=ids).logits,
                           hf_model(input_ids=ids).logits)


def test_import_error_is_one_line_with_exit_code_2(tmp_path):
    save_hf_model(tiny_hf_model("llama"), tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    result = astrai("import", tmp_path / "hf", tmp_path / "native")
    assert result.returncode == 2
    assert result.stderr.startswith("error: model_type 'gpt2' is not supported")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "native").exists()


def test_export_of_missing_checkpoint_is_a_clean_error(tmp_path):
    result = astrai("export", tmp_path / "nothing", tmp_path / "hf")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
