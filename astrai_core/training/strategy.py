"""The strategy base class: every training algorithm (seq, sft, dpo, grpo, ppo) extends it.

The trainer owns the loop: it builds every optimizer and schedule, accumulates, clips,
steps, evaluates, publishes weights to the sampler and checkpoints. A strategy owns the
loss and says what it needs. In the order they are used:

    needs(config)                 classmethod: data formats, rollouts, advantage, values
                                  (read by the run plan before anything is built)
    check_run(config, run_config) classmethod: its own cross-section checks (FieldError)
    __init__(config, run)         build what the loss needs (reference, critic) from the
                                  run's components (:class:`RunComponents`)
    trained_modules()             modules trained beside the policy (a critic)
    frozen_modules()              modules kept frozen beside it (a reference)
    batch_source()                where each optimizer step's micro-batches come from
    compute_loss(batch)           -> (loss, metrics) for one micro-batch
    eval_metrics                  class attribute: compute_loss metrics that evaluation by
                                  the loss also logs as eval/<name>
    after_optimizer_step(step)    anything after the optimizers stepped
    step_metrics()                metrics logged once per optimizer step
    state_dict() / load_state_dict(state)   the strategy's own resume state, if any
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.training.batch_sources import BatchSource, LoaderSource
from astrai_core.training.modules import TrainedModule

if TYPE_CHECKING:
    from astrai_core.config.schema import RunConfig
    from astrai_core.training.run_components import RunComponents


class EmptyConfig(BaseModel):
    """A strategy without options."""

    model_config = ConfigDict(extra="forbid")


class Strategy:
    """Base class; see the module docstring for the hook order."""

    Config: ClassVar[type[BaseModel]] = EmptyConfig
    data_formats: ClassVar[tuple[str, ...]] = ()   # dataset formats it reads offline
    # compute_loss metrics that evaluation on held-out data also logs as eval/<name>
    eval_metrics: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def needs(cls, config: BaseModel) -> StrategyNeeds:
        """What a run with these options must provide (default: offline ``data_formats``)."""
        return StrategyNeeds(data_formats=cls.data_formats)

    @classmethod
    def check_run(cls, config: BaseModel, run_config: RunConfig) -> None:
        """Cross-section checks of this strategy; raise FieldError naming the field."""

    def __init__(self, config: BaseModel, run: RunComponents) -> None:
        self.config = config
        self.run = run

    # -- what the trainer drives ------------------------------------------------------
    def trained_modules(self) -> dict[str, TrainedModule]:
        """Modules trained beside the policy, by checkpoint name (``critic``)."""
        return {}

    def frozen_modules(self) -> dict[str, nn.Module]:
        """Modules kept frozen beside the policy (``reference``); rebuilt, not saved."""
        return {}

    def batch_source(self) -> BatchSource:
        """Offline strategies: ``grad_accum_steps`` training-loader batches per step."""
        return LoaderSource(self.run.train_loader, self.run.trainer.grad_accum_steps)

    def compute_loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """Loss of one micro-batch and metrics to log (``tokens`` counts throughput)."""
        raise NotImplementedError

    def after_optimizer_step(self, step: int) -> None:
        """Called once every optimizer stepped (and the schedules advanced)."""

    def step_metrics(self) -> dict[str, float]:
        """Metrics logged once per optimizer step."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Resume state beyond modules, optimizers and the batch source (which the
        trainer saves itself)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; called after every module's weights are back."""

    # -- helpers for subclasses -----------------------------------------------------
    def add_aux_loss(self, loss: torch.Tensor, aux_loss: torch.Tensor | None,
                     metrics: dict[str, Any], name: str = "moe/aux_loss") -> torch.Tensor:
        """``loss`` plus the MoE load-balancing loss, weighted by the strategy's
        ``aux_loss_coef`` (default: the model config's); unchanged for dense models."""
        model_config = self.run.model.config
        if not model_config.num_experts or aux_loss is None:
            return loss
        coef = getattr(self.config, "aux_loss_coef", None)
        coef = model_config.router_aux_loss_coef if coef is None else coef
        metrics[name] = aux_loss.detach()
        scaled = aux_loss * self._aux_loss_share(aux_loss, metrics)
        return loss + coef * (scaled + (aux_loss - scaled).detach())  # aux's value, scaled's gradient

    def _aux_loss_share(self, aux_loss: torch.Tensor, metrics: dict[str, Any]) -> float:
        """1 in one process. Distributed, a training forward's load-balancing loss is the
        global micro-batch's (each rank's gradient through its own tokens), but the trainer
        weights each rank's loss by its share (``loss_weight``: w_r / sum of w; unweighted:
        the ranks' mean); this factor undoes that share, so the ranks' gradients sum to the
        one-process gradient."""
        dist = self.run.dist
        if not dist.enabled or not aux_loss.requires_grad:
            return 1.0
        weight = metrics.get("loss_weight")
        if weight is None:
            return float(dist.world_size)
        local = float(weight)
        total = dist.all_reduce_sum([local])[0]  # the ranks compute their losses in step
        return total / local if local else 0.0

    def forward(self, batch: dict[str, torch.Tensor], **kwargs: Any) -> dict[str, Any]:
        """The policy's forward over a token batch (packed documents included)."""
        return self.run.model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                              position_ids=batch.get("position_ids"), **kwargs)

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A dataset batch's tensors on the run's device."""
        return {name: tensor.to(self.run.device) for name, tensor in batch.items()}
