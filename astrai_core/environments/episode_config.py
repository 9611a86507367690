"""The episode keys of the ``environment:`` section (the rest configures the environment).

``environment: {name: tools, tools: [...], max_turns: 4}``: ``max_turns``, ``max_tokens``,
``step_timeout`` and ``stop_at_tool_call`` belong to the episode runner, every other key
to the environment's own ``Config``. Torch-free, so the run plan can validate it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_ENVIRONMENT = "single_turn"


class EpisodeConfig(BaseModel):
    """How long an episode may run and how long the environment may take."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(4, ge=1, description="assistant turns per episode at most")
    max_tokens: int | None = Field(
        None, ge=1, description="response tokens per episode at most, the model's and the "
        "environment's together (default: the sampler's max_new_tokens x max_turns); each "
        "turn is also capped by the sampler's max_new_tokens")
    step_timeout: float = Field(
        60.0, gt=0, description="seconds one environment step may take before every call "
        "of that turn gets a timeout error (tools have their own per-call timeout)")
    stop_at_tool_call: bool = Field(
        True, description="end an assistant turn at the end of each complete tool call "
        "(one call per turn); false: at the end-of-turn token only")

    @classmethod
    def split(cls, params: dict) -> tuple[dict, dict]:
        """(the episode keys of a section's options, the environment's own)."""
        own = set(cls.model_fields)
        return ({k: v for k, v in params.items() if k in own},
                {k: v for k, v in params.items() if k not in own})
