"""`astrai export` of a reward-model checkpoint: the rm strategy's spec names its exporter,
so the core command writes the sequence classifier `python -m astrai_plugin_rm export`
writes, byte for byte, not a causal LM without the score head."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from astrai_core.config.schema import RunConfig
from astrai_core.testing import run_astrai
from astrai_core.training.run import train
from astrai_plugin_rm.checkpoint import load_reward_model
from astrai_plugin_rm.hf import export_reward_model, import_reward_model


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _both_exports(tmp_path: Path, checkpoint: Path) -> tuple[Path, Path]:
    ours = run_astrai("export", str(checkpoint), str(tmp_path / "core"))
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert "exporter of strategy 'rm'" in ours.stdout
    plugin = subprocess.run([sys.executable, "-m", "astrai_plugin_rm", "export", str(checkpoint),
                             str(tmp_path / "plugin")], capture_output=True, text=True, timeout=300)
    assert plugin.returncode == 0, plugin.stderr[-3000:]
    return tmp_path / "core", tmp_path / "plugin"


def test_a_trained_rm_checkpoint_exports_as_its_plugin_exports_it(tmp_path, rm_kit):
    from transformers import AutoModelForSequenceClassification

    data = rm_kit.write_pairs(tmp_path / "pairs.jsonl")
    config = rm_kit.rm_config(tmp_path, data)
    config["trainer"].update(max_steps=1, save_every=1)
    train(RunConfig.model_validate(config))
    checkpoint = tmp_path / "run" / "checkpoints" / "step_1"
    core, plugin = _both_exports(tmp_path, checkpoint)
    assert _files(core) == _files(plugin)
    assert json.loads((core / "config.json").read_text())["architectures"][0].endswith(
        "ForSequenceClassification")
    hf = AutoModelForSequenceClassification.from_pretrained(core, dtype=torch.float32)
    model, _ = load_reward_model(checkpoint)
    ids = torch.tensor([[1, 9, 12, 30, rm_kit.EOS], [7, 3, 40, 2, 8]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits[:, 0],
                                   model(ids, mask), atol=1e-5, rtol=0)


def test_an_imported_reward_model_records_its_strategy_too(tmp_path, rm_kit):
    classifier = export_reward_model(rm_kit.native_rm(tmp_path / "rm"), tmp_path / "hf")
    imported = import_reward_model(classifier, tmp_path / "imported")
    core, plugin = _both_exports(tmp_path / "b", imported)
    assert _files(core) == _files(plugin)
