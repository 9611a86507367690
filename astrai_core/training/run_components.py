"""RunComponents: everything a run is made of, built once and handed to the strategy.

A plain record: :func:`astrai_core.training.run.prepare_run` fills it from the run plan,
and nothing in it builds anything on demand, so the wiring of a run is all in one place.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from astrai_core.config.plan import RunPlan
from astrai_core.config.trainer import TrainerConfig
from astrai_core.data.config import DataConfig
from astrai_core.devices.base import DeviceBackend
from astrai_core.distributed.context import SINGLE, DistContext
from astrai_core.plugins.registry import Registry
from astrai_core.plugins.sampler_capabilities import NO_CAPABILITIES, SamplerCapabilities
from astrai_core.rewards.reward_set import RewardSet
from astrai_core.rollout.runner import RolloutRunner
from astrai_core.sampling.params import SamplingParams

AUTOCAST_DTYPES = {"no": None, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class RunComponents:
    """The built run; see the module docstring. Absent parts are None."""

    plan: RunPlan
    trainer: TrainerConfig
    data: DataConfig                     # with every path resolved
    registry: Registry
    backend: DeviceBackend
    device: torch.device
    model: nn.Module                     # the policy
    tokenizer: Any
    tokenizer_dir: Path
    output_dir: Path
    initial_model_dir: Path | None       # the checkpoint the run started from
    sampling: SamplingParams             # the sampler section's defaults for rollouts
    rewards: RewardSet
    train_loader: Any                    # batches of the strategy's data formats
    eval_loader: Any | None
    sampler: Any | None                  # built when rollouts or evaluation generate
    estimator: Any | None                # the advantage estimator, built with its options
    rollouts: RolloutRunner | None       # online strategies: draws rollouts
    policy_loss: Any | None = None       # the policy loss, built with its options
    dist: DistContext = SINGLE           # this process's rank, the world size, the mesh
    episodes: Any | None = None          # multi-turn environment: the EpisodeRunner
    eval_sets: dict[str, Any] = field(default_factory=dict)  # data.eval_sets: name -> loader
    sampler_capabilities: SamplerCapabilities = NO_CAPABILITIES  # the sampler's, read once

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the behaviour log-probs (1 for greedy sampling)."""
        return self.sampling.temperature or 1.0

    def autocast(self) -> AbstractContextManager:
        """The run's mixed-precision context on its device."""
        return self.backend.autocast(AUTOCAST_DTYPES[self.trainer.mixed_precision])
