"""A tenant: one LoRA adapter slot on a base model and its own AdamW.

Plain ``torch.optim.AdamW`` per tenant rather than the trainer's optimizer owner
(:mod:`astrai_core.training.optim`): that one is built once from a run config with a
schedule, while a Tinker client sends the learning rate, betas, eps and weight decay
with every step, and each tenant's moments must live and be saved apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from astrai_core.tinker.bases import LoadedBase
from astrai_core.tinker.engine_types import AdamSpec, LoraSpec
from astrai_core.tinker.weight_files import canonical

MOMENTS = ("exp_avg", "exp_avg_sq", "step")


@dataclass
class Tenant:
    model_id: str
    base: LoadedBase
    slot: str
    spec: LoraSpec
    optimizer: torch.optim.AdamW

    @classmethod
    def create(cls, model_id: str, base: LoadedBase, spec: LoraSpec) -> Tenant:
        slot = base.slots.add(spec)
        params = list(base.slots.parameters(slot).values())
        return cls(model_id, base, slot, spec, torch.optim.AdamW(params, lr=0.0))

    def parameters(self) -> dict[str, torch.nn.Parameter]:
        return self.base.slots.parameters(self.slot)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The adapter's tensors under file names (the slot name made ``default``)."""
        return {canonical(name, self.slot): p.detach() for name, p in self.parameters().items()}

    def load_adapter_state(self, tensors: dict[str, torch.Tensor], source: str) -> None:
        from astrai_core.tinker.engine_types import EngineRequestError

        params = {canonical(name, self.slot): p for name, p in self.parameters().items()}
        if set(params) != set(tensors):
            missing = sorted(set(params) - set(tensors))[:2]
            raise EngineRequestError(f"{source} does not fit this adapter (missing {missing})")
        with torch.no_grad():
            for name, param in params.items():
                if tensors[name].shape != param.shape:
                    raise EngineRequestError(f"{source}: {name} has shape "
                                             f"{list(tensors[name].shape)}, the adapter "
                                             f"{list(param.shape)}")
                param.copy_(tensors[name])

    def step(self, adam: AdamSpec) -> dict[str, float]:
        """One AdamW step on the accumulated gradients, then clear them."""
        params = [p for p in self.parameters().values() if p.grad is not None]
        for group in self.optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)
        norm = grad_norm(params)
        if adam.grad_clip_norm > 0 and params:
            torch.nn.utils.clip_grad_norm_(params, adam.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm:mean": norm, "learning_rate:mean": adam.learning_rate}

    def optimizer_state(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, param in self.parameters().items():
            for key, value in self.optimizer.state.get(param, {}).items():
                out[f"{canonical(name, self.slot)}/{key}"] = torch.as_tensor(value)
        return out

    def load_optimizer_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.optimizer.state.clear()
        for name, param in self.parameters().items():
            state = {key: tensors[f"{canonical(name, self.slot)}/{key}"].clone()
                     for key in MOMENTS if f"{canonical(name, self.slot)}/{key}" in tensors}
            if state:
                self.optimizer.state[param] = state


def grad_norm(params: list[torch.nn.Parameter]) -> float:
    """The global L2 norm of the gradients (0 without any)."""
    if not params:
        return 0.0
    norms = torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params])
    value = float(torch.linalg.vector_norm(norms))
    return value if math.isfinite(value) else float("nan")
