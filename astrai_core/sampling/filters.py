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


def top_k_top_p_filter(logits: Tensor, top_k: Tensor | int, top_p: Tensor | float) -> Tensor:
    """``top_p_filter(top_k_filter(logits, top_k), top_p)`` without sorting the vocabulary.

    After top-k a nucleus row holds at most k_max finite logits, and the k_max best
    (from ``topk``, put in stable descending order) ARE the sorted row top-p needs. The
    sorted row is rebuilt at full width with the -inf tail a full sort would give, so
    its softmax is bitwise the one top-p computes; the cumulative sum, a sequential
    scan, needs only its first k_max columns. The result is identical to the two filters,
    except that among tokens of exactly equal logits on the nucleus boundary the stable
    order decides (where the vocabulary sort's order among ties is unspecified). Falls
    back to the two filters when a nucleus row has no top-k, or ties with its k-th value
    carry its kept set past k_max.
    """
    k = _per_row(top_k, logits, torch.long).clamp(max=logits.shape[-1])
    p = _per_row(top_p, logits, logits.dtype)
    nucleus = p < 1.0
    k_max = int(k.max())
    if k_max <= 0 or not bool(nucleus.any()) or bool((nucleus & (k <= 0)).any()):
        return top_p_filter(top_k_filter(logits, top_k), top_p)
    width = min(k_max + 1, logits.shape[-1])  # one more: tells whether ties run past k_max
    values, indices = _top_candidates(logits, width)
    no_top_k = k <= 0
    kth_value = values.gather(-1, (k - 1).clamp(min=0)).masked_fill(no_top_k, float("-inf"))
    beyond = values[:, k_max:] >= kth_value if width > k_max else torch.zeros_like(nucleus)
    if bool((beyond & nucleus).any()):
        return top_p_filter(top_k_filter(logits, top_k), top_p)
    values, indices = values[:, :k_max], indices[:, :k_max]
    kept_values = values.masked_fill(values < kth_value, float("-inf"))
    sorted_logits = torch.full_like(logits, float("-inf"))
    sorted_logits[:, :k_max] = kept_values
    sorted_probs = sorted_logits.softmax(dim=-1)[:, :k_max]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    final_values = kept_values.masked_fill((mass_before > p) & nucleus, float("-inf"))
    if bool((no_top_k | beyond).any()):  # some row keeps tokens outside the candidates
        filtered = logits.masked_fill(logits < kth_value, float("-inf"))
    else:
        filtered = torch.full_like(logits, float("-inf"))
    return filtered.scatter_(-1, indices, final_values)


def _top_candidates(logits: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """The ``count`` largest logits of each row and their indices, in stable descending order
    (equal values by index)."""
    indices = logits.topk(count, dim=-1).indices.sort(dim=-1).values
    values, order = logits.gather(-1, indices).sort(dim=-1, descending=True, stable=True)
    return values, indices.gather(-1, order)


def min_p_filter(logits: Tensor, min_p: Tensor | float) -> Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's top probability."""
    scale = _per_row(min_p, logits, logits.dtype)
    if bool((scale <= 0.0).all()):
        return logits.clone()
    probs = logits.softmax(dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * scale
    return logits.masked_fill(probs < threshold, float("-inf"))

