"""The modules a strategy declares beside the policy: trained ones and frozen ones.

A strategy never builds an optimizer or steps one. It declares each extra trained module
(PPO's critic) with the optimizer settings that differ from the trainer's, and each
frozen module (a reference); the trainer builds, clips, steps, schedules, checkpoints and
restores them all, in one place, whether there is one process or many.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from torch import nn

_INHERIT: Any = object()  # "use the trainer's value"


@dataclass(frozen=True)
class TrainedModule:
    """A module trained beside the policy, with its own optimizer and lr schedule.

    ``overrides`` replace fields of the ``trainer:`` section for this module's optimizer
    (``lr``, ``weight_decay``, ``optimizer``, ``betas``...); ``max_grad_norm`` clips its
    gradients separately from the policy's (None: no clipping; default: the trainer's).
    It is saved as ``<name>.safetensors`` in every checkpoint.
    """

    module: nn.Module
    overrides: dict[str, Any] = field(default_factory=dict)
    max_grad_norm: float | None = _INHERIT

    def grad_norm_limit(self, trainer_limit: float | None) -> float | None:
        return trainer_limit if self.max_grad_norm is _INHERIT else self.max_grad_norm


def frozen_copy(module: nn.Module) -> nn.Module:
    """A frozen, eval-mode deep copy of ``module`` (a reference policy)."""
    frozen = copy.deepcopy(module)
    frozen.eval()
    for param in frozen.parameters():
        param.requires_grad_(False)
    return frozen


def frozen_reference(policy: nn.Module) -> nn.Module:
    """A strategy's frozen reference policy (DPO, KL terms): for a LoRA policy, the policy
    itself with its adapter disabled (no copy, no weights of its own); otherwise a frozen
    copy of the starting policy."""
    from astrai_core.model.lora import DisabledAdapterReference, has_lora

    return DisabledAdapterReference(policy) if has_lora(policy) else frozen_copy(policy)
