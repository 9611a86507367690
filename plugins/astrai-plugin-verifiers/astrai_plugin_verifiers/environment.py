"""The ``verifiers`` environment: ``environment: {name: verifiers, env: ..., args: {...}}``.

``env`` names the verifiers environment, either as ``module:function`` (called with
``args``; it returns a ``vf.Taskset``, a ``vf.Env`` or a ``vf.EnvConfig``) or as an
installed environment id (a taskset package such as ``gsm8k`` or ``owner/name@version``,
loaded by verifiers itself, ``args`` being its taskset options). The taskset's tasks are
the prompts, in order and again each epoch (``data.batch_size`` tasks per rollout); the
rubric of each task (its weighted ``@vf.reward`` functions) is the reward.
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class VerifiersEnvironment:
    """A verifiers environment whose taskset gives the prompts and whose rubric scores the
    episodes; verifiers plays them (``episode_runner``: VerifiersEpisodes) and astrai
    samples every turn and trains on the sampled tokens."""

    rewards_episodes = True  # the rubric scores every episode: no reward function is needed

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")
        env: str = Field(description='the verifiers environment: "module:function" or an '
                         "installed environment (taskset) id")
        args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of "
                                     "the function, or the installed taskset's options")
        harness: str | None = Field(None, description="verifiers harness id of the agent "
                                    "(default: verifiers' chat loop run with this Python)")
        timeout: float = Field(600.0, gt=0, description="seconds the episodes of one rollout "
                               "may take together")

        @field_validator("env")
        @classmethod
        def _loadable(cls, value: str) -> str:
            if ":" in value:
                module, _, name = value.partition(":")
                try:
                    target = getattr(importlib.import_module(module), name)
                except (ImportError, AttributeError) as error:
                    raise ValueError(f"cannot load {value!r}: {error}") from None
                if not callable(target):
                    raise ValueError(f"{value!r} is not callable")
            return value

    def __init__(self, **options: Any) -> None:
        self.config = self.Config(**options)

    def reset(self, row: Any) -> None:  # the runner below plays the episodes
        raise NotImplementedError("a verifiers environment plays its own episodes")

    def step(self, state: Any, turn: Any) -> Any:
        raise NotImplementedError("a verifiers environment plays its own episodes")

    def episode_runner(self, *, sampler: Any, tokenizer: Any, rewards: Any, config: Any,
                       pad_token_id: int = 0) -> Any:
        from astrai_plugin_verifiers.episodes import VerifiersEpisodes
        from astrai_plugin_verifiers.loading import load_env

        env = load_env(self.config, max_turns=config.max_turns)
        return VerifiersEpisodes(env, sampler, tokenizer, rewards, config,
                                 pad_token_id=pad_token_id, timeout=self.config.timeout)
