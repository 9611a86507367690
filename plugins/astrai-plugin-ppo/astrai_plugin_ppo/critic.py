"""The PPO critic: a native decoder backbone with a scalar value head on its final hidden states."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from astrai_core.api import CausalLM, load_pretrained, merge_and_unload
from astrai_core.api import RolloutBatch
from astrai_core.api import rollout_forward


class ValueCritic(nn.Module):
    """V(s_t) for every response token: ``value_head(hidden state at the position before t)``.

    The hidden states come from :func:`policy_forward` (through :func:`rollout_forward`),
    which already takes them at the positions whose logits score the response tokens, so
    the values line up with the policy's log-probs with no extra shift.
    """

    def __init__(self, backbone: CausalLM, head_init_std: float = 0.0) -> None:
        super().__init__()
        self.backbone = backbone
        hidden_size = backbone.config.hidden_size
        self.value_head = nn.Linear(hidden_size, 1)
        # A zero (or tiny) head starts every value near 0, so early returns dominate the loss
        # instead of a random projection of the backbone's features.
        with torch.no_grad():
            if head_init_std > 0:
                self.value_head.weight.normal_(0.0, head_init_std)
            else:
                self.value_head.weight.zero_()
            self.value_head.bias.zero_()
        self.value_head.to(next(backbone.parameters()).dtype)

    def forward(self, batch: RolloutBatch, micro_batch_tokens: int | None = None,
                dist: Any = None) -> dict[str, Tensor]:
        """``values`` [N, R] float32 aligned with ``batch.response_ids``; ``aux_loss`` (MoE).

        ``micro_batch_tokens``: a whole rollout's values (the no-grad forward before the
        advantages) computed in packed micro-batches of at most that many tokens, as many
        on every rank of ``dist`` (the run's DistContext; see :func:`rollout_forward`).
        """
        out = rollout_forward(self.backbone, batch, 1.0, micro_batch_tokens,
                              return_hidden_states=True, dist=dist)
        values = self.value_head(out["hidden_states"]).squeeze(-1).float()
        return {"values": values, "aux_loss": out["aux_loss"]}


def build_critic(policy: CausalLM, init: Literal["policy", "random"] = "policy",
                 path: str | Path | None = None, head_init_std: float = 0.0) -> ValueCritic:
    """A critic on the policy's device and dtype.

    ``path``: a native checkpoint directory whose weights become the backbone (any
    architecture); otherwise the policy's config with the policy's weights
    (``init="policy"``) or freshly initialised ones (``init="random"``). Every backbone
    weight trains, also beside a LoRA policy (a full-parameter critic).
    """
    parameter = next(policy.parameters())
    if path is not None:
        backbone = load_pretrained(path, dtype=parameter.dtype)
    elif init == "policy":
        backbone = merge_and_unload(copy.deepcopy(policy))  # a LoRA policy: its merged weights
    else:
        backbone = CausalLM(policy.config)
    backbone = backbone.to(device=parameter.device, dtype=parameter.dtype)
    for param in backbone.parameters():
        param.requires_grad_(True)
    critic = ValueCritic(backbone, head_init_std).to(parameter.device)
    return critic.train()

