"""The ``dpo`` strategy: direct preference optimization against a frozen reference, or
reference-free SimPO (``loss_type: simpo``).

Pairs come from preference data or from rollouts (see :mod:`astrai_plugin_dpo.pair_strategy`).
The reference is a frozen copy of the starting policy (a LoRA policy with its adapter
disabled); ``loss_type: simpo`` needs none, so none is built or held. SimPO scores each
response by its length-normalised log-prob (the mean over its tokens).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, Field, model_validator
from torch import Tensor

from astrai_core.api import RunComponents, frozen_reference
from astrai_plugin_dpo.losses import dpo_loss, simpo_loss
from astrai_plugin_dpo.pair_strategy import PairConfig, PairStrategy


class DPOConfig(PairConfig):
    """The ``strategy:`` section of a dpo run."""

    beta: float = Field(0.1, gt=0, description="strength of the KL anchor to the reference "
                        "(simpo: the reward scale)")
    loss_type: Literal["sigmoid", "ipo", "hinge", "simpo"] = Field(
        "sigmoid", description="sigmoid (DPO), ipo, hinge, or simpo (reference-free)")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="sigmoid and simpo: "
                                   "assumed probability that a preference label is flipped")
    gamma: float = Field(0.5, description="simpo only: the target reward margin")

    @model_validator(mode="after")
    def _options_of_their_loss(self) -> DPOConfig:
        if self.label_smoothing and self.loss_type not in ("sigmoid", "simpo"):
            raise ValueError(f"label_smoothing applies to loss_type sigmoid and simpo only, "
                             f"not {self.loss_type}")
        if "gamma" in self.model_fields_set and self.loss_type != "simpo":
            raise ValueError(f"gamma is the margin of loss_type simpo, not of {self.loss_type}")
        return self


class DPO(PairStrategy):
    """Direct preference optimization against a frozen reference; ``loss_type: simpo`` is
    reference-free SimPO on length-normalised log-probs (no reference is built)."""

    Config: ClassVar[type[BaseModel]] = DPOConfig

    def __init__(self, config: DPOConfig, run: RunComponents) -> None:
        super().__init__(config, run)
        self.reference = None if config.loss_type == "simpo" else frozen_reference(run.model)

    def frozen_modules(self) -> dict[str, torch.nn.Module]:
        return {} if self.reference is None else {"reference": self.reference}

    # -- the loss ---------------------------------------------------------------------
    def compute_loss(self, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        batch = self.on_device(batch)
        chosen, rejected, aux_loss, tokens = self.pair_logprobs(self.run.model, batch)
        cfg = self.config
        if self.reference is None:  # simpo
            losses, chosen_rewards, rejected_rewards, metrics = simpo_loss(
                *self.average_logprobs(batch, chosen, rejected), beta=cfg.beta, gamma=cfg.gamma,
                label_smoothing=cfg.label_smoothing)
        else:
            with torch.no_grad():
                ref_chosen, ref_rejected, _, _ = self.pair_logprobs(self.reference, batch)
            losses, chosen_rewards, rejected_rewards, metrics = dpo_loss(
                chosen, rejected, ref_chosen, ref_rejected, beta=cfg.beta,
                loss_type=cfg.loss_type, label_smoothing=cfg.label_smoothing)
        loss = losses.mean()
        metrics.update(chosen_reward=chosen_rewards.mean(), rejected_reward=rejected_rewards.mean(),
                       chosen_logp=chosen.detach().mean(), rejected_logp=rejected.detach().mean(),
                       tokens=tokens, loss_weight=len(losses))  # the loss is a mean over pairs
        return self.add_aux_loss(loss, aux_loss, metrics), metrics
