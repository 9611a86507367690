"""Sparse mixture-of-experts MLP (Qwen2-MoE / Qwen3-MoE semantics) and router statistics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from astrai_core.model.config import ModelConfig
from astrai_core.model.layers import SwiGLU


@dataclass
class RouterOutput:
    """Router decisions for one MoE layer: probs [T, E] (float32), selected experts [T, k]."""

    probs: torch.Tensor
    selected: torch.Tensor


class Experts(nn.Module):
    """All experts' SwiGLU weights as fused tensors: gate/up [E, I, H], down [E, H, I]."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, x: torch.Tensor, selected: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, H]; selected/weights [T, k]. Tokens are grouped per expert by sorting, so each
        expert that received tokens runs one matmul over exactly those tokens."""
        top_k = selected.shape[1]
        flat_experts = selected.reshape(-1)
        order = torch.argsort(flat_experts, stable=True)
        token_index = order // top_k
        counts = torch.bincount(flat_experts, minlength=self.gate_proj.shape[0]).tolist()
        grouped = x.index_select(0, token_index)
        outputs, start = [], 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = grouped[start:start + count]
            hidden = F.silu(F.linear(rows, self.gate_proj[expert])) * F.linear(rows, self.up_proj[expert])
            outputs.append(F.linear(hidden, self.down_proj[expert]))
            start += count
        routed = torch.cat(outputs) * weights.reshape(-1)[order, None]
        # Back to (token, slot) order and sum the k slots: deterministic, unlike index_add_ on GPU.
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        return routed[inverse].view(-1, top_k, x.shape[-1]).sum(dim=1).to(x.dtype)


class MoEBlock(nn.Module):
    """Top-k routed experts, plus an optional shared expert behind a sigmoid gate (Qwen2-MoE)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        if config.shared_expert_intermediate_size > 0:
            self.shared_expert = SwiGLU(config.hidden_size, config.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)
        else:
            self.shared_expert = None
            self.shared_expert_gate = None
        self.routing = None  # set while routing is recorded or replayed (router_replay.py)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RouterOutput]:
        batch, seq, hidden = x.shape
        flat = x.reshape(-1, hidden)
        logits = self.router(flat)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        top_weights, selected = torch.topk(probs, self.top_k, dim=-1)
        if self.routing is not None:  # record, or replay recorded experts (router_replay.py)
            selected = self.routing(probs, selected)
            top_weights = probs.gather(-1, selected)
        if self.norm_topk_prob:
            top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
        out = self.experts(flat, selected, top_weights.to(logits.dtype))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(batch, seq, hidden), RouterOutput(probs, selected)


def load_balancing_loss(router: RouterOutput, num_experts: int,
                        valid: torch.Tensor | None = None) -> torch.Tensor:
    """Switch/HF auxiliary loss: E * sum_e f_e * P_e over valid tokens.

    f_e = (tokens routed to e, counting every top-k slot) / tokens; P_e = mean router prob.
    ``valid`` [T] is 1 for real tokens, 0 for padding.
    """
    return balancing_loss(balancing_terms(router, num_experts, valid), num_experts)


def balancing_terms(router: RouterOutput, num_experts: int,
                    valid: torch.Tensor | None = None) -> torch.Tensor:
    """[2E + 1]: tokens routed to each expert (every top-k slot counts; no gradient), the
    sum of each expert's router probability (with gradient), and the number of valid
    tokens. Sums, so the terms of a batch split over ranks add up to the whole batch's."""
    probs, selected = router.probs, router.selected
    if valid is None:
        valid = torch.ones(probs.shape[0], dtype=torch.float32, device=probs.device)
    valid = valid.to(torch.float32)
    slot_weights = valid[:, None].expand_as(selected).reshape(-1)
    counts = torch.zeros(num_experts, dtype=torch.float32, device=probs.device)
    counts = counts.scatter_add(0, selected.reshape(-1), slot_weights)
    prob_sums = (probs * valid[:, None]).sum(0)
    return torch.cat([counts, prob_sums, valid.sum()[None]])


def global_balancing_terms(terms: torch.Tensor, sum_over_ranks: Callable[[torch.Tensor], torch.Tensor]
                           ) -> torch.Tensor:
    """``terms`` [..., 2E + 1] of this rank's tokens -> those of the global batch (summed
    over the data-parallel ranks by ``sum_over_ranks``, one collective): the values are
    the global batch's, the gradient flows through this rank's probabilities only (each
    rank backpropagates its own tokens; the gradients are summed over the ranks later)."""
    total = sum_over_ranks(terms.detach())
    return total + (terms - terms.detach())


def balancing_loss(terms: torch.Tensor, num_experts: int) -> torch.Tensor:
    """E * sum_e f_e * P_e from :func:`balancing_terms` (f_e = count_e / tokens, P_e =
    prob_sum_e / tokens)."""
    counts, prob_sums = terms[:num_experts].detach(), terms[num_experts:2 * num_experts]
    num_valid = terms[2 * num_experts].detach().clamp_min(1.0)
    token_fraction = counts / num_valid
    mean_prob = prob_sums / num_valid
    return num_experts * torch.sum(token_fraction * mean_prob)


@torch.no_grad()
def router_statistics(router: RouterOutput, num_experts: int,
                      valid: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Detached 0-d tensors: mean router entropy, fraction of experts that got no token,
    and max load / mean load — over valid tokens only."""
    probs, selected = router.probs, router.selected
    if valid is None:
        valid = torch.ones(probs.shape[0], dtype=torch.float32, device=probs.device)
    valid = valid.to(torch.float32)
    num_valid = valid.sum().clamp_min(1.0)
    entropy = -(probs * torch.log(probs.clamp_min(1e-20))).sum(-1)
    counts = torch.zeros(num_experts, dtype=torch.float32, device=probs.device)
    counts.scatter_add_(0, selected.reshape(-1), valid[:, None].expand_as(selected).reshape(-1))
    return {
        "entropy": (entropy * valid).sum() / num_valid,
        "dead_fraction": (counts == 0).float().mean(),
        "load_imbalance": counts.max() / counts.mean().clamp_min(1e-20),
    }
