"""Optimizers and learning-rate schedules."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from astrai_core.config.trainer import TrainerConfig
from astrai_core.training.muon import Muon


class OptimizerGroup(torch.optim.Optimizer):
    """Several optimizers stepped as one (Muon for hidden matrices + AdamW for the rest).

    Subclasses Optimizer only so LR schedulers accept it; its param_groups are the
    concatenation of its members' groups, so a scheduler scales every lr.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers
        self.defaults = {}
        self.state = {}  # type: ignore[assignment]
        self.param_groups = [g for opt in optimizers for g in opt.param_groups]
        self._optimizer_step_pre_hooks = {}  # type: ignore[assignment]
        self._optimizer_step_post_hooks = {}  # type: ignore[assignment]

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        for optimizer, state in zip(self.optimizers, state_dict["optimizers"], strict=True):
            optimizer.load_state_dict(state)


def _is_muon_matrix(name: str, param: nn.Parameter, experts: bool) -> bool:
    # Muon orthogonalises 2-D hidden weights (and, with muon_experts, each expert of the
    # 3-D fused expert tensors); embeddings, the output head, norms and biases stay on AdamW.
    dims = (2, 3) if experts else (2,)
    return param.ndim in dims and not name.startswith(("embed.", "lm_head."))


def build_optimizer(named_params: list[tuple[str, nn.Parameter]],
                    config: TrainerConfig) -> torch.optim.Optimizer:
    """AdamW over everything, or Muon for hidden matrices plus AdamW for the rest."""
    params = [(n, p) for n, p in named_params if p.requires_grad]
    decay = [p for n, p in params if p.ndim >= 2]
    no_decay = [p for n, p in params if p.ndim < 2]

    def adamw(groups: list[dict[str, Any]]) -> torch.optim.AdamW:
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr,
                                 betas=config.betas, eps=config.eps)

    if config.optimizer == "adamw":
        return adamw([{"params": decay, "weight_decay": config.weight_decay},
                      {"params": no_decay, "weight_decay": 0.0}])
    muon_params = [p for n, p in params if _is_muon_matrix(n, p, config.muon_experts)]
    muon_ids = {id(p) for p in muon_params}
    rest_decay = [p for p in decay if id(p) not in muon_ids]
    # astrai's Muon: torch.optim.Muon's numbers on plain tensors, whole-matrix
    # Newton–Schulz on FSDP2-sharded ones (training/muon.py).
    muon = Muon(muon_params, lr=config.muon_lr or config.lr,
                            weight_decay=config.weight_decay, momentum=config.muon_momentum,
                            adjust_lr_fn="match_rms_adamw")
    rest = adamw([{"params": rest_decay, "weight_decay": config.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}])
    return OptimizerGroup([muon, rest])


def lr_factor(step: int, config: TrainerConfig) -> float:
    """Multiplier of the peak lr after ``step`` optimizer steps (warmup, then decay)."""
    if config.warmup_steps and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    decay_steps = max(1, config.max_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    floor = config.min_lr_ratio
    if config.schedule == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer,
                    config: TrainerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config))
