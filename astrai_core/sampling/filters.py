"""Top-k, top-p (nucleus) and min-p filters over a batch of logits, one setting per row.

Each function is pure: it returns a NEW tensor with the removed tokens set to -inf and
never writes into its input, because the sampler takes the log-probabilities it reports
from the unfiltered logits. A row whose setting is the neutral value (k = 0, p = 1.0,
min_p = 0) is returned unchanged; at least one token per row always survives.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _per_row(value: Tensor | float | int, logits: Tensor, dtype: torch.dtype) -> Tensor:
    """A [B, 1] tensor of per-row settings from a scalar or a [B] tensor."""
    return torch.as_tensor(value, dtype=dtype, device=logits.device).expand(logits.shape[0]).reshape(-1, 1)


def top_k_filter(logits: Tensor, top_k: Tensor | int) -> Tensor:
    """Keep each row's ``top_k`` largest logits (ties with the k-th kept); 0 = keep all."""
    k = _per_row(top_k, logits, torch.long).clamp(max=logits.shape[-1])
    k_max = int(k.max())
    if k_max <= 0:
        return logits.clone()
    kth_value = logits.topk(k_max, dim=-1).values.gather(-1, (k - 1).clamp(min=0))
    remove = (logits < kth_value) & (k > 0)
    return logits.masked_fill(remove, float("-inf"))


def top_p_filter(logits: Tensor, top_p: Tensor | float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p``."""
    p = _per_row(top_p, logits, logits.dtype)
    if bool((p >= 1.0).all()):
        return logits.clone()
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more likely tokens
    remove_sorted = (mass_before > p) & (p < 1.0)  # the most likely token has 0 before it: kept
    remove = torch.empty_like(remove_sorted).scatter(-1, order, remove_sorted)  # back to vocab order
    return logits.masked_fill(remove, float("-inf"))


def min_p_filter(logits: Tensor, min_p: Tensor | float) -> Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's top probability."""
    scale = _per_row(min_p, logits, logits.dtype)
    if bool((scale <= 0.0).all()):
        return logits.clone()
    probs = logits.softmax(dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * scale
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_filters(logits: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """top-k, then top-p, then min-p (the order of transformers and vLLM); a new tensor."""
    filtered = top_k_filter(logits, top_k)
    filtered = top_p_filter(filtered, top_p)
    return min_p_filter(filtered, min_p)
