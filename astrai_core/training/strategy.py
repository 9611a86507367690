"""The strategy base class: every training algorithm (seq, sft, dpo, grpo, ppo) extends it.

The trainer owns the loop (accumulation, clipping, optimizer, schedule, checkpoints,
metrics); a strategy owns the loss and where its batches come from:

* offline strategies read dataset batches (`data_formats` says which kinds of rows);
* online strategies (RL) set ``online = True`` and get their batches from a rollout
  runner built by :meth:`TrainContext.rollout_runner`.

Hooks a strategy may override, in the order the trainer calls them::

    setup()                       once, before the first step (reference model, critic...)
    train_batches()               iterator of micro-batches; the trainer pulls
                                  `grad_accum_steps` of them per optimizer step
    compute_loss(batch)           -> (loss, metrics) for one micro-batch
    after_optimizer_step(step)    e.g. resync an old-policy model, publish weights
    evaluate()                    -> {"eval/...": value}
    state_dict() / load_state_dict(state)   whatever exact resume needs
    extra_modules()               modules trained by the trainer's optimizer, checkpointed
    checkpoint_modules()          modules with their own optimizer, checkpointed (a critic)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from astrai_core.training.context import TrainContext


class EmptyConfig(BaseModel):
    """A strategy without options."""

    model_config = ConfigDict(extra="forbid")


class Strategy:
    """Base class; see the module docstring for the hook order."""

    Config: ClassVar[type[BaseModel]] = EmptyConfig
    data_formats: ClassVar[tuple[str, ...]] = ()   # dataset formats it reads offline
    online: ClassVar[bool] = False

    def __init__(self, config: BaseModel, context: TrainContext) -> None:
        self.config = config
        self.ctx = context
        self.loader: Any = None

    # -- lifecycle ------------------------------------------------------------------
    def setup(self) -> None:
        """Build what the loss needs; offline strategies get their training loader here."""
        if not self.online:
            self.loader = self.ctx.train_loader(self.data_formats)

    def train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Micro-batches, forever; the trainer decides how many to take."""
        if self.loader is None:
            raise NotImplementedError(f"{type(self).__name__} must override train_batches()")
        return iter(self.loader)

    def compute_loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """Loss of one micro-batch and metrics to log (``tokens`` counts throughput)."""
        raise NotImplementedError

    def after_optimizer_step(self, step: int) -> None:
        """Called once the policy's optimizer stepped (and the schedule advanced)."""

    def step_metrics(self) -> dict[str, float]:
        """Metrics logged once per optimizer step (e.g. statistics of the current rollout)."""
        return {}

    def evaluate(self) -> dict[str, float]:
        """Evaluation metrics, each named ``eval/...``; default: the context's evaluation."""
        return self.ctx.evaluate(self)

    # -- checkpointing --------------------------------------------------------------
    def extra_modules(self) -> dict[str, nn.Module]:
        """Trainable modules besides the policy, saved as ``<name>.safetensors``."""
        return {}

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        """Modules the strategy optimizes itself (a critic with its own optimizer and lr).

        Saved as ``<name>.safetensors`` and restored on resume like :meth:`extra_modules`,
        but kept out of the trainer's optimizer and gradient clipping; their optimizer
        state belongs in :meth:`state_dict`.
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.loader.state_dict()} if self.loader is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.loader is not None and "data" in state:
            self.loader.load_state_dict(state["data"])

    # -- helpers for subclasses -----------------------------------------------------
    def add_aux_loss(self, loss: torch.Tensor, aux_loss: torch.Tensor | None,
                     metrics: dict[str, Any], name: str = "moe/aux_loss") -> torch.Tensor:
        """``loss`` plus the MoE load-balancing loss, weighted by the strategy's
        ``aux_loss_coef`` (default: the model config's); unchanged for dense models."""
        model_config = self.ctx.model.config
        if not model_config.num_experts or aux_loss is None:
            return loss
        coef = getattr(self.config, "aux_loss_coef", None)
        coef = model_config.router_aux_loss_coef if coef is None else coef
        metrics[name] = aux_loss.detach()
        return loss + coef * aux_loss

    def forward(self, batch: dict[str, torch.Tensor], **kwargs: Any) -> dict[str, Any]:
        """The policy's forward over a token batch (packed documents included)."""
        return self.ctx.model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                              position_ids=batch.get("position_ids"), **kwargs)
