"""The LM head applied in chunks of tokens: log-probs and entropy without [B, S, V] logits.

A full-logits forward keeps float32 logits of every position (and, for backward, their
softmax): for a 151,936-token vocabulary and [4, 2048] tokens that is 5 GB per copy.
Here the model returns its final hidden states and the head runs over a chunk of rows at
a time, sized so that one chunk's float32 logits hold about 2**26 numbers (256 MB: 441
tokens of a 151,936-token vocabulary, 2,048 of a 32,768 one). Each chunk runs under ``torch.utils.checkpoint``, so backward recomputes
that chunk's logits instead of keeping them: at any moment only one chunk's logits
exist. The numbers are those of the unchunked path (the same per-row operations; the
head matmul is only split by rows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

CHUNK_LOGITS = 2**26  # float32 logits per chunk: ~256 MB, whatever the vocabulary


def head_weight(model: torch.nn.Module) -> Tensor | None:
    """The output projection [V, H] of a native model (the embedding when tied), or None
    for a model without one (then callers use its logits). Also None under FSDP2: outside
    the model's own forward the head is a sharded DTensor, gathered only inside it, so the
    chunked head would see a shard; such runs take the model's logits."""
    get = getattr(model, "head_weight", None)
    if not callable(get):
        return None
    weight = get()
    return None if type(weight).__name__ == "DTensor" else weight


def _chunk_stats(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,
                 with_entropy: bool) -> tuple[Tensor, Tensor]:
    logits = F.linear(hidden, weight).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logprobs, logprobs.new_zeros(())
    # H = logsumexp(x) - sum softmax(x) * x, without a log_softmax copy.
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, entropy


def chunked_logprobs(hidden: Tensor, weight: Tensor, target_ids: Tensor, temperature: float = 1.0,
                     *, with_entropy: bool = False, chunk_tokens: int | None = None
                     ) -> tuple[Tensor, Tensor | None]:
    """float32 log-prob of each ``target_ids`` entry under log_softmax(hidden @ weight.T /
    temperature), and the entropy of that distribution when asked.

    hidden [..., H] (the positions predicting the targets), weight [V, H],
    target_ids [...] -> (logprobs [...], entropy [...] or None). ``chunk_tokens``: rows per
    chunk (default: as many as make :data:`CHUNK_LOGITS` logits).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens is None:
        chunk_tokens = max(1, CHUNK_LOGITS // weight.shape[0])
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = target_ids.reshape(-1)
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logprobs, entropies = [], []
    for start in range(0, flat_hidden.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        args = (flat_hidden[rows], weight, flat_targets[rows], temperature, with_entropy)
        if recompute:
            logp, ent = checkpoint(_chunk_stats, *args, use_reentrant=False)
        else:
            logp, ent = _chunk_stats(*args)
        logprobs.append(logp)
        entropies.append(ent)
    shape = target_ids.shape
    if not logprobs:  # no tokens at all
        empty = hidden.new_zeros(shape, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    entropy = torch.cat(entropies).reshape(shape) if with_entropy else None
    return torch.cat(logprobs).reshape(shape), entropy
