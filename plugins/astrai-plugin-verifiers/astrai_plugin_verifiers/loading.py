"""A verifiers ``Env`` from the environment section: by ``module:function`` or installed id.

The agent plays in the local ``subprocess`` runtime with the plugin's harness (verifiers'
chat loop run with this Python) unless ``harness`` names another; ``max_turns`` is the
episode's own limit.
"""

from __future__ import annotations

import importlib
from typing import Any

import verifiers.v1 as vf

from astrai_core.api import ConfigError
from astrai_plugin_verifiers_harness import HARNESS_ID


def agent_config(harness: str | None, max_turns: int) -> dict[str, Any]:
    return {"harness": {"id": harness or HARNESS_ID}, "runtime": {"type": "subprocess"},
            "max_turns": max_turns}


def load_env(config: Any, *, max_turns: int) -> vf.Env:
    """The verifiers environment ``config.env`` names (see the module docstring)."""
    agent = agent_config(config.harness, max_turns)
    if ":" not in config.env:  # an installed environment id
        return _from_config({"taskset": {"id": config.env, **config.args}, "agent": agent},
                            config.env)
    module, _, name = config.env.partition(":")
    made = getattr(importlib.import_module(module), name)(**config.args)
    if isinstance(made, vf.Env):
        return made
    if isinstance(made, vf.EnvConfig):
        return _from_config(made.model_dump(), config.env)
    if isinstance(made, vf.Taskset):
        taskset_id = type(made).__module__
        env = _from_config({"taskset": {"id": taskset_id}, "agent": agent}, config.env)
        env.taskset = made  # the function's own instance (its data and options)
        return env
    raise ConfigError(f"environment.env: {config.env} returned {type(made).__name__}; "
                      "expected a verifiers Taskset, Env or EnvConfig")


def _from_config(data: dict[str, Any], where: str) -> vf.Env:
    try:
        return vf.load_environment(vf.resolve_env_config(data))
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        raise ConfigError(f"environment.env: cannot load the verifiers environment {where!r}: "
                          f"{str(error).splitlines()[0]}") from None
