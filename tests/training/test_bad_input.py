"""Bad input to `astrai train`: one clear message, a non-zero exit, no traceback, and
nothing written that a later run would take for a checkpoint."""

from __future__ import annotations

import pytest

from tests.training.conftest import astrai, tiny_config, write_config


def _train_fails(tmp_path, config, *extra):
    result = astrai("train", str(write_config(tmp_path, config)), *extra)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
    return result.stderr


def test_unknown_strategy_lists_available_and_the_plugin(tmp_path):
    config = tiny_config(tmp_path)
    config["strategy"] = {"name": "ppoo"}
    message = _train_fails(tmp_path, config)
    assert "strategy.name: unknown strategy 'ppoo'" in message
    assert "sft" in message and "seq" in message


def test_field_of_the_wrong_type_names_field_and_line(tmp_path):
    config = tiny_config(tmp_path)
    config["trainer"]["max_steps"] = "many"
    message = _train_fails(tmp_path, config)
    assert "trainer.max_steps" in message and "run.yaml:" in message


def test_unknown_strategy_option(tmp_path):
    config = tiny_config(tmp_path)
    config["strategy"]["clip_eps"] = 0.2
    assert "strategy.clip_eps: unknown field" in _train_fails(tmp_path, config)


def test_missing_data_file(tmp_path):
    config = tiny_config(tmp_path)
    config["data"]["sources"][0]["path"] = str(tmp_path / "nope.jsonl")
    message = _train_fails(tmp_path, config)
    assert "nope.jsonl" in message and "data.sources" in message


def test_malformed_jsonl_row_names_file_and_line(tmp_path):
    config = tiny_config(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "1+1="}, '
                   '{"role": "assistant", "content": "2"}]}\n{"messages": "oops"}\n')
    config["data"]["sources"][0]["path"] = str(bad)
    message = _train_fails(tmp_path, config)
    assert f"{bad}, line 2" in message and "messages" in message


def test_resume_without_checkpoint(tmp_path):
    message = _train_fails(tmp_path, tiny_config(tmp_path), "--resume")
    assert "--resume: no complete checkpoint" in message


def test_fresh_run_refuses_to_mix_with_existing_checkpoints(tmp_path):
    config = tiny_config(tmp_path, max_steps=2, save_every=0)
    path = write_config(tmp_path, config)
    assert astrai("train", str(path)).returncode == 0
    again = astrai("train", str(path))
    assert again.returncode == 2 and "--resume" in again.stderr and "--overwrite" in again.stderr


@pytest.mark.parametrize("override,expected", [
    ("trainer.lr=-1", "trainer.lr"),
    ("model.config.num_heads=3", "model.config"),
])
def test_invalid_values(tmp_path, override, expected):
    message = _train_fails(tmp_path, tiny_config(tmp_path), "--set", override)
    assert expected in message
