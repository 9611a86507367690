"""`astrai export` and the strategy a checkpoint records (strategy.json): a causal-LM
strategy's checkpoint exports as before; one the installed plugins do not know, or a
broken record, is one error line and nothing written."""

from __future__ import annotations

import json

from safetensors.torch import load_file

from astrai_core.checkpoints.hf.select import export_model_type, load_importer
from astrai_core.checkpoints.strategy_record import STRATEGY_FILE
from astrai_core.checkpoints.manifest import write_manifest
from astrai_core.config.schema import RunConfig
from astrai_core.plugins import process_registry
from astrai_core.testing import run_astrai
from astrai_core.training.run import train
from tests.training.reference import save_start_model, text_run_config, write_texts


def _trained(tmp_path):
    start = save_start_model(tmp_path / "start")
    config = text_run_config(tmp_path, write_texts(tmp_path / "docs.jsonl"), start,
                             max_steps=1, save_every=1)
    train(RunConfig.model_validate(config))
    return tmp_path / "run" / "checkpoints" / "step_1"


def _one_error(result) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_a_trained_checkpoint_records_its_strategy_and_exports_as_a_causal_lm(tmp_path):
    checkpoint = _trained(tmp_path)
    assert json.loads((checkpoint / STRATEGY_FILE).read_text()) == {"strategy": "seq"}
    done = run_astrai("export", str(checkpoint), str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr[-3000:]
    # what the model importer writes by itself, as `astrai export` always did
    model_type = export_model_type(checkpoint)
    load_importer(process_registry(), model_type=model_type).export_checkpoint(
        checkpoint, tmp_path / "direct", model_type=model_type)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config == json.loads((tmp_path / "direct" / "config.json").read_text())
    assert config["architectures"][0].endswith("ForCausalLM")
    ours, direct = (load_file(str(d / "model.safetensors")) for d in
                    (tmp_path / "hf", tmp_path / "direct"))
    assert ours.keys() == direct.keys() and all(ours[k].equal(direct[k]) for k in ours)


def test_a_strategy_no_plugin_provides_is_one_error_line(tmp_path):
    checkpoint = _trained(tmp_path)
    (checkpoint / STRATEGY_FILE).write_text(json.dumps({"strategy": "elsewhere"}))
    write_manifest(checkpoint)
    message = _one_error(run_astrai("export", str(checkpoint), str(tmp_path / "hf")))
    assert "strategy 'elsewhere'" in message and str(checkpoint) in message, message
    assert not (tmp_path / "hf").exists()
    (checkpoint / STRATEGY_FILE).write_text("[1, 2]")
    write_manifest(checkpoint)
    message = _one_error(run_astrai("export", str(checkpoint), str(tmp_path / "hf")))
    assert STRATEGY_FILE in message, message
    assert not (tmp_path / "hf").exists()
