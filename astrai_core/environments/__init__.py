"""Environments of multi-turn rollouts: the records an environment reads and returns,
and the built-in ``single_turn`` and ``tools`` environments. Torch-free."""

from astrai_core.environments.base import (
    AssistantTurn,
    EnvMessage,
    EnvStep,
    SingleTurn,
    ToolCall,
    error_message,
)

__all__ = ["AssistantTurn", "EnvMessage", "EnvStep", "SingleTurn", "ToolCall", "error_message"]
