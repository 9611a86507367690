"""What a strategy can reach during a run: model, tokenizer, device, registry, data, rollouts."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from astrai_core.config.schema import RunConfig
from astrai_core.devices.base import DeviceBackend
from astrai_core.errors import ConfigError
from astrai_core.registry import Registry
from astrai_core.training.config import TrainerConfig

class _RecordStream:
    """Prompt records one by one from a loader that yields lists of them."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            yield from batch

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


if TYPE_CHECKING:
    from astrai_core.training.strategy import Strategy


@dataclass
class TrainContext:
    """Everything built from the run config that strategies share."""

    run_config: RunConfig
    trainer_config: TrainerConfig
    registry: Registry
    backend: DeviceBackend
    device: torch.device
    model: nn.Module
    tokenizer: Any
    tokenizer_dir: Path
    base_dir: Path                       # the config file's directory: data paths resolve here
    output_dir: Path
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def initial_model_dir(self) -> Path | None:
        """The checkpoint the run started from (None for a from-scratch model)."""
        path = self.run_config.model.path
        return Path(path) if path is not None else None

    # -- data -----------------------------------------------------------------------
    @property
    def data_config(self) -> Any:
        """The validated `data:` section."""
        if "data_config" not in self._cache:
            from astrai_core.data import DataConfig

            self._cache["data_config"] = DataConfig.model_validate(self.run_config.data)
        return self._cache["data_config"]

    def train_loader(self, formats: tuple[str, ...]) -> Any:
        """The resumable training loader over the configured sources (of these formats)."""
        from astrai_core.data import build_train_loader

        return build_train_loader(self.data_config, self.tokenizer, base_dir=self.base_dir,
                                  formats=formats)

    # -- models ---------------------------------------------------------------------
    def frozen_copy(self, module: nn.Module | None = None) -> nn.Module:
        """A frozen, eval-mode deep copy (a reference or old-policy model)."""
        frozen = copy.deepcopy(module if module is not None else self.model)
        frozen.eval()
        for param in frozen.parameters():
            param.requires_grad_(False)
        return frozen

    def autocast(self):
        """The run's mixed-precision context on this device."""
        dtypes = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
        return self.backend.autocast(dtypes[self.trainer_config.mixed_precision])

    # -- sampling and rewards ---------------------------------------------------------
    def sampler_options(self) -> tuple[Any, dict[str, Any]]:
        """(default SamplingParams, engine options) from the `sampler:` section.

        Without an explicit ``stop_token_ids`` a completion stops at the tokenizer's EOS,
        as in evaluation; ``stop_token_ids: []`` means no stop token.
        """
        from astrai_core.config.components import component_params
        from astrai_core.sampling.params import SamplingParams

        section = self.run_config.sampler
        name = section.name if section is not None else "torch"
        user_params = section.params if section is not None else {}
        params = component_params(self.registry, "sampler", name, user_params, ("sampler",),
                                  getattr(self.run_config, "_source", None))
        sampling_fields = set(SamplingParams.model_fields)
        sampling = {k: v for k, v in params.items() if k in sampling_fields}
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if "stop_token_ids" not in user_params and eos is not None:
            sampling["stop_token_ids"] = (eos,)
        engine = {k: v for k, v in params.items() if k not in sampling_fields}
        return SamplingParams(**sampling), engine

    def sampler(self) -> Any:
        """The configured sampler (default `torch`) over the live policy, built once."""
        if "sampler" not in self._cache:
            section = self.run_config.sampler
            name = section.name if section is not None else "torch"
            sampler_class = self.registry.get("sampler", name).load()
            _, engine = self.sampler_options()
            self._cache["sampler"] = sampler_class(model=self.model, tokenizer=self.tokenizer,
                                                   **engine)
        return self._cache["sampler"]

    def rewards(self) -> Any:
        """The weighted reward functions of the `rewards:` section, built once."""
        if "rewards" not in self._cache:
            from astrai_core.rewards.reward_set import RewardSet

            self._cache["rewards"] = RewardSet.from_config(self.run_config.rewards, self.registry)
        return self._cache["rewards"]

    def advantage_estimator(self, default: str | None) -> Any:
        """The `advantage:` section's estimator, or ``default`` (the strategy's choice)."""
        from astrai_core.config.components import component_params

        section = self.run_config.advantage
        name = section.name if section is not None else default
        if name is None:
            raise ConfigError("advantage: this strategy needs an `advantage: {name: ...}` section")
        params = component_params(self.registry, "advantage_estimator", name,
                                  section.params if section is not None else {},
                                  ("advantage",), getattr(self.run_config, "_source", None))
        return self.registry.get("advantage_estimator", name).load()(**params)

    def rollout_runner(self, *, group_size: int, steps_per_rollout: int) -> Any:
        """The RolloutRunner over the `prompt`-format training data (its state_dict holds
        the prompt position for resume)."""
        from astrai_core.rollout.runner import RolloutRunner

        loader = self.train_loader(("prompt",))
        records = _RecordStream(loader)
        sampling, _ = self.sampler_options()
        if not self.run_config.rewards:
            raise ConfigError("rewards: an online strategy needs at least one reward function")
        pad_id = getattr(self.tokenizer, "pad_token_id", None) or 0
        runner = RolloutRunner(self.sampler(), self.tokenizer, self.rewards(), sampling,
                               group_size=group_size, prompt_source=records,
                               prompts_per_rollout=self.data_config.batch_size,
                               rollout_interval=steps_per_rollout, pad_token_id=pad_id)
        return runner

    # -- evaluation -----------------------------------------------------------------
    def evaluate(self, strategy: Strategy) -> dict[str, float]:
        """Default evaluation: held-out loss and, for prompt data, accuracy by generation."""
        from astrai_core.training.evaluation import evaluate_run

        return evaluate_run(self, strategy)
