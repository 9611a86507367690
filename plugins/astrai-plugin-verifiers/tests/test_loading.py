"""Loading a verifiers environment: by ``module:function`` or by installed id, and the
plugin's registration."""

from __future__ import annotations

import pytest
import verifiers.v1 as vf
from verifiers_test_envs import write_tasks

from astrai_core.api import ConfigError, process_registry
from astrai_plugin_verifiers.environment import VerifiersEnvironment
from astrai_plugin_verifiers.loading import load_env
from astrai_plugin_verifiers_harness import HARNESS_ID


def _questions(env: vf.Env) -> list[str]:
    return [task.data.prompt for task in env.taskset]


def test_by_function_and_by_installed_id_load_the_same_tasks(tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    by_function = VerifiersEnvironment(env="verifiers_test_envs:arith", args={"path": str(tasks)})
    by_id = VerifiersEnvironment(env="verifiers_test_envs", args={"path": str(tasks)})
    envs = [load_env(e.config, max_turns=3) for e in (by_function, by_id)]
    assert _questions(envs[0]) == _questions(envs[1]) == ["1+2=", "3+4=", "5+1=", "2+2="]
    for env in envs:
        agent = env.config.agent
        assert agent.harness.id == HARNESS_ID and agent.max_turns == 3
        assert agent.runtime.type == "subprocess"


def test_unknown_ids_and_wrong_returns_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="environment.env"):
        load_env(VerifiersEnvironment(env="no_such_verifiers_env").config, max_turns=1)
    with pytest.raises(ConfigError, match="expected a verifiers Taskset"):
        load_env(VerifiersEnvironment(env="verifiers_test_envs:has_digit",
                                      args={"text": "1"}).config, max_turns=1)
    with pytest.raises(ValueError, match="cannot load"):
        VerifiersEnvironment(env="verifiers_test_envs:missing")


def test_the_plugin_registers_the_environment():
    assert process_registry().has("environment", "verifiers")
