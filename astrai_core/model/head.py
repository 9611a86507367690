"""The LM head applied in chunks of tokens: log-probs and entropy without [B, S, V] logits.

A full-logits forward keeps float32 logits of every position (and, for backward, their
softmax): for a 151,936-token vocabulary and [4, 2048] tokens that is 5 GB per copy.
Here the model's own forward (``target_ids=``, see :func:`target_logprobs`) runs the
head over a chunk of rows at a time, sized so that one chunk's float32 logits hold about
2**26 numbers (256 MB: 441 tokens of a 151,936-token vocabulary, 2,048 of a 32,768 one).
Each chunk runs under ``torch.utils.checkpoint``, so backward recomputes that chunk's
logits instead of keeping them: at any moment only one chunk's logits
exist. The numbers are those of the unchunked path (the same per-row operations; the
head matmul is only split by rows). Running inside the forward also makes it work under
FSDP2: the head (the root unit's, with the embedding) is gathered only during the
model's forward, and its gradient is reduce-scattered by the same unit's backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

CHUNK_LOGITS = 2**26  # float32 logits per chunk: ~256 MB, whatever the vocabulary
# Rows of logits turned into float32 at a time: bounds the transient float32 copy
# of bf16 logits to about this many rows x vocab instead of the whole [B, T, V].
_LOGIT_ROWS_PER_CHUNK = 1024


def has_chunked_head(model: torch.nn.Module) -> bool:
    """True for a model whose forward takes ``target_ids`` (a native :class:`CausalLM`,
    sharded or not, and the LoRA reference around one): it computes log-probs with the
    chunked head inside its own forward. Other models return logits."""
    return bool(getattr(model, "chunked_head", False))


def target_logprobs(model: torch.nn.Module, input_ids: Tensor, target_ids: Tensor,
                    temperature: float = 1.0, *, with_entropy: bool = False,
                    **forward: Any) -> dict[str, Any]:
    """The model's forward output plus ``logprobs`` [B, T] (and ``entropy`` [B, T] when
    asked) of ``target_ids`` [B, T], the last T tokens of ``input_ids`` [B, S], each
    scored from the position before it (T < S).

    The one way every strategy gets log-probs. A native model computes them inside its
    forward with the chunked head (:func:`head_logprobs`): no [B, S, V] logits exist, and
    under FSDP2 the forward is where the sharded head is gathered. Any other model's
    float32 logits are scored. ``forward``: further arguments of the model's forward.
    """
    if has_chunked_head(model):
        return model(input_ids, target_ids=target_ids, temperature=temperature,
                     return_entropy=with_entropy, **forward)
    out = model(input_ids, **forward)
    logits = out["logits"][:, predicting_positions(input_ids.shape[1], target_ids.shape[1])]
    out["logprobs"] = token_logprobs(logits, target_ids, temperature)
    if with_entropy:
        out["entropy"] = entropy_from_logits(logits, temperature)
    return out


def head_logprobs(hidden: Tensor, weight: Tensor, target_ids: Tensor, temperature: float,
                  with_entropy: bool, softcap: float | None = None) -> dict[str, Tensor]:
    """The model-side half of :func:`target_logprobs`: hidden [B, S, H] (after the final
    norm), the head ``weight`` [V, H] -> {"logprobs" [B, T], "entropy" [B, T] if asked}.
    ``softcap``: the logits are ``softcap * tanh(logits / softcap)`` (Gemma's final
    soft-capping), before the temperature."""
    positions = predicting_positions(hidden.shape[1], target_ids.shape[1])
    logprobs, entropy = chunked_logprobs(hidden[:, positions], weight, target_ids, temperature,
                                         with_entropy=with_entropy, softcap=softcap)
    # Fresh [B, T] tensors, not views of the chunks' concatenation: FSDP2 hooks a module's
    # outputs for its pre-backward, and an in-place op on a view would bypass that hook.
    out = {"logprobs": logprobs.clone()}
    if entropy is not None:
        out["entropy"] = entropy.clone()
    return out


def head_outputs(hidden: Tensor, weight: Tensor, *, logits_to_keep: int = 0,
                 target_ids: Tensor | None = None, temperature: float = 1.0,
                 return_entropy: bool = False,
                 head: Callable[[Tensor, Tensor], dict[str, Any]] | None = None,
                 softcap: float | None = None) -> dict[str, Any]:
    """What a causal LM's forward returns from its final hidden states [B, S, H] and head
    ``weight`` [V, H], for either backend: a custom ``head``'s dict, the chunked
    log-probs of ``target_ids``, or the logits of the last ``logits_to_keep`` positions
    (0: all)."""
    if head is not None:
        return dict(head(hidden, weight))
    if target_ids is not None:
        return head_logprobs(hidden, weight, target_ids, temperature, return_entropy, softcap)
    seq = hidden.shape[1]
    kept = hidden[:, -logits_to_keep:] if 0 < logits_to_keep < seq else hidden
    return {"logits": head_logits(kept, weight, softcap)}


def predicting_positions(seq: int, targets: int) -> slice:
    """The positions predicting the last ``targets`` tokens of a ``seq``-token sequence."""
    if not 0 <= targets < seq:
        raise ValueError(f"target_ids must be the last T < S tokens: T={targets}, S={seq}")
    return slice(seq - targets - 1, seq - 1)


def head_logits(hidden: Tensor, weight: Tensor, softcap: float | None = None) -> Tensor:
    """``hidden @ weight.T`` in at least float32 (bf16/fp16 logits are widened, float64
    stays), soft-capped when ``softcap`` is set."""
    logits = F.linear(hidden, weight)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def _chunk_stats(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,
                 with_entropy: bool, softcap: float | None = None) -> tuple[Tensor, Tensor]:
    logits = head_logits(hidden, weight, softcap)
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
                     *, with_entropy: bool = False, chunk_tokens: int | None = None,
                     softcap: float | None = None) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each ``target_ids`` entry under log_softmax(hidden @ weight.T /
    temperature), and the entropy of that distribution when asked, in float32 (float64
    for float64 inputs).

    hidden [..., H] (the positions predicting the targets), weight [V, H],
    target_ids [...] -> (logprobs [...], entropy [...] or None). ``chunk_tokens``: rows per
    chunk (default: as many as make :data:`CHUNK_LOGITS` logits); ``softcap``: as
    :func:`head_logits`.
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
        args = (flat_hidden[rows], weight, flat_targets[rows], temperature, with_entropy, softcap)
        if recompute:
            logp, ent = checkpoint(_chunk_stats, *args, use_reentrant=False)
        else:
            logp, ent = _chunk_stats(*args)
        logprobs.append(logp)
        entropies.append(ent)
    shape = target_ids.shape
    if not logprobs:  # no tokens at all
        empty = hidden.new_zeros(shape, dtype=torch.promote_types(hidden.dtype, torch.float32))
        return empty, (empty if with_entropy else None)
    entropy = torch.cat(entropies).reshape(shape) if with_entropy else None
    return torch.cat(logprobs).reshape(shape), entropy


def chunked_logits_map(fn: Callable[..., Tensor], heads: Sequence[tuple[Tensor, Tensor]],
                       *rows: Tensor, chunk_tokens: int | None = None) -> Tensor:
    """``fn`` over the logits of several heads, a chunk of rows at a time: no [N, V] logits.

    ``heads``: (hidden [N, H_i], weight [V_i, H_i]) pairs over the same N rows (a student's
    and a teacher's final hidden states at the same positions, with their head weights).
    For each chunk of rows, ``fn(logits_1, ..., logits_k, *row_chunks)`` gets each head's
    logits [n, V_i] (at least float32, as :func:`chunked_logprobs`) and that chunk of each
    extra ``rows`` tensor [N, ...], and returns a [n, ...] tensor (a per-token loss); the
    results are concatenated: [N, ...]. With gradients, each chunk runs under
    ``torch.utils.checkpoint``, so backward recomputes its logits: the logits of one chunk
    exist at a time. ``chunk_tokens`` defaults to as many rows as make
    :data:`CHUNK_LOGITS` logits over all the heads together. Call it inside the model's
    forward (its ``head=`` argument) so that FSDP2 has gathered the head weight.
    """
    if not heads:
        raise ValueError("chunked_logits_map needs at least one (hidden, weight) head")
    count = heads[0][0].shape[0]
    if any(hidden.shape[0] != count for hidden, _ in heads) or \
            any(extra.shape[0] != count for extra in rows):
        raise ValueError("every hidden and extra tensor must have the same number of rows")
    if chunk_tokens is None:
        chunk_tokens = max(1, CHUNK_LOGITS // sum(weight.shape[0] for _, weight in heads))
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    tensors = [t for pair in heads for t in pair]
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)

    def chunk(*args: Tensor) -> Tensor:
        pairs, extra = args[:2 * len(heads)], args[2 * len(heads):]
        logits = []
        for hidden, weight in zip(pairs[0::2], pairs[1::2]):
            logits.append(head_logits(hidden, weight))
        return fn(*logits, *extra)

    results = []
    for start in range(0, max(count, 1), chunk_tokens):
        span = slice(start, start + chunk_tokens)
        # hidden states are cut into chunks of rows, weights (odd places) go whole
        args = [t if i % 2 else t[span] for i, t in enumerate(tensors)]
        args += [extra[span] for extra in rows]
        results.append(checkpoint(chunk, *args, use_reentrant=False) if recompute
                       else chunk(*args))
    return torch.cat(results)


# ---------------------------------------------------------------- log-probs, entropy of full logits
# (models without the chunked head; :mod:`astrai_core.rl.functional` exposes them too)

def _scaled_float_chunks(logits: Tensor, temperature: float):
    """Yield (row slice, logits / temperature) over the flattened rows, widened to float32
    (float64 logits stay float64, so a float64 reference stays exact)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    flat = logits.reshape(-1, logits.shape[-1])
    for start in range(0, flat.shape[0], _LOGIT_ROWS_PER_CHUNK):
        rows = slice(start, start + _LOGIT_ROWS_PER_CHUNK)
        chunk = flat[rows].to(torch.promote_types(flat.dtype, torch.float32))
        yield rows, (chunk if temperature == 1.0 else chunk / temperature)


def token_logprobs(logits: Tensor, target_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """float32 log-prob of each ``target_ids`` entry under log_softmax(logits / temperature)."""
    targets = target_ids.reshape(-1, 1)
    pieces = [
        scaled.gather(-1, targets[rows]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
        for rows, scaled in _scaled_float_chunks(logits, temperature)
    ]
    return torch.cat(pieces).reshape(target_ids.shape)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """float32 entropy of softmax(logits / temperature) at every position."""
    pieces = []
    for _, scaled in _scaled_float_chunks(logits, temperature):
        # H = logsumexp(x) - sum softmax(x) * x, without a log_softmax copy.
        expected_logit = (torch.softmax(scaled, dim=-1) * scaled).sum(-1)
        pieces.append(torch.logsumexp(scaled, dim=-1) - expected_logit)
    return torch.cat(pieces).reshape(logits.shape[:-1])
