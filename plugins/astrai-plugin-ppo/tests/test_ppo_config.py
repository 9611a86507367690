"""ppo through the registry, and clear errors for bad input (before any work starts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astrai_core.config.schema import RunConfig
from astrai_core.errors import ConfigError
from astrai_core.plugins import load_plugins
from astrai_core.training.run import train

PACKAGE = Path(__file__).resolve().parents[1] / "astrai_plugin_ppo"

# `astrai train` with astrai-plugin-gae's entry point hidden: as if it were not installed.
WITHOUT_GAE = """
import sys
import astrai_core.plugins.discovery as plugins
from astrai_core.cli.main import main
listed = plugins._entry_points
plugins._entry_points = lambda: [ep for ep in listed() if ep.name != "gae"]
sys.exit(main(["train", sys.argv[1]]))
"""


def test_ppo_loads_by_name_and_finds_gae_through_the_registry(ppo, tmp_path):
    registry = load_plugins()
    spec = registry.get("strategy", "ppo")
    assert spec.default_advantage == "gae"
    assert registry.provider("strategy", "ppo").distribution == "astrai-plugin-ppo"
    from astrai_plugin_ppo.strategy import PPO

    assert spec.load() is PPO
    _, run = ppo.make_strategy(tmp_path, ppo.run_config(tmp_path, {}))
    assert type(run.estimator) is registry.get("advantage_estimator", "gae").load()
    # ...by name only: the plugin never imports astrai_plugin_gae.
    for source in PACKAGE.glob("*.py"):
        assert "astrai_plugin_gae" not in source.read_text(), source.name


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]


def test_ppo_with_gae_disabled_fails_with_one_clear_line(ppo, tmp_path):
    config_path = _write(tmp_path, ppo.run_config(tmp_path, {}))
    env = {**os.environ, "ASTRAI_DISABLE_PLUGINS": "gae"}
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train",
                             str(config_path)], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 2
    lines = _error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "strategy.name: 'ppo' needs the advantage estimator 'gae'" in lines[0]
    assert "astrai-plugin-gae" in lines[0] and "ASTRAI_DISABLE_PLUGINS" in lines[0]
    assert not (tmp_path / "run").exists(), "it failed only after starting work"


def test_ppo_with_gae_not_installed_names_the_pip_install(ppo, tmp_path):
    config_path = _write(tmp_path, ppo.run_config(tmp_path, {}))
    result = subprocess.run([sys.executable, "-c", WITHOUT_GAE, str(config_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = _error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "pip install astrai-plugin-gae" in lines[0]


@pytest.mark.parametrize("field,value", [("gamma", 1.5), ("gamma", -0.1), ("lambda", 2.0),
                                         ("lam", -1.0)])
def test_gae_parameters_outside_unit_interval_name_the_field(ppo, tmp_path, field, value):
    config = ppo.run_config(tmp_path, {})
    config["advantage"] = {"name": "gae", field: value}
    with pytest.raises(ConfigError, match=rf"advantage\.{field}\b"):
        train(RunConfig.model_validate(config))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field,value", [("value_clip_eps", -0.1), ("critic_lr", 0.0),
                                         ("loss_aggregation", "seq-mean-token-sum"),
                                         ("critic_init", "checkpoint")])
def test_bad_strategy_option_names_the_field(ppo, tmp_path, field, value):
    with pytest.raises(ConfigError, match=rf"strategy\.{field}\b"):
        train(RunConfig.model_validate(ppo.run_config(tmp_path, {field: value})))
