"""Attention computed per packed document instead of over the whole packed row.

A packed row holds several documents one after the other; a dense block-diagonal mask
keeps them apart but still costs O(row²). Here each document's queries meet only its own
keys: flash-attn's varlen kernel on CUDA (half precision) when it is installed, one
causal ``scaled_dot_product_attention`` per document otherwise, so the cost is the sum
of the documents' squares. A padding query (``attention_mask`` 0) attends only to its own
position, as in the dense mask, so its output is its own value; it is ignored anyway.

A segment may also see a prefix elsewhere in the row: the G completions of a group that
share one prompt (``trainer.share_prompt``) are packed as the prompt once, then each
completion, whose queries meet the prompt's keys and their own, causally
(:func:`~astrai_core.rollout.packing.packed_forward` builds that layout).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DocumentLayout:
    """The segments of the flattened [B * S] tokens, in order, which together cover them.

    spans: (start, end, real) per segment: a run of real tokens of one document, or a run
    of padding. cu_seqlens [n + 1] int32: the boundaries for a varlen kernel, with every
    padding token a segment of its own; max_len: its longest segment. prefixes: per span,
    None or the (start, end) of tokens it also sees, all of them, before its own (a shared
    prompt; its positions precede the span's); None: no span has one.
    """

    spans: list[tuple[int, int, bool]]
    cu_seqlens: torch.Tensor
    max_len: int
    prefixes: list[tuple[int, int] | None] | None = None


@dataclass(frozen=True)
class Scores:
    """How attention scores are made before the softmax: q·k times ``scale`` (None: the
    default 1/sqrt(head_dim)), then, with ``softcap``, softcap * tanh(score / softcap)
    (Gemma 2's attention logit capping)."""

    scale: float | None = None
    softcap: float | None = None

    def flash_kwargs(self) -> dict[str, float]:
        """The flash-attn arguments that differ from its defaults (none: any version)."""
        given = {"softmax_scale": self.scale, "softcap": self.softcap}
        return {name: value for name, value in given.items() if value is not None}


def scaled_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     mask: torch.Tensor | None, *, is_causal: bool = False,
                     scores: Scores | None = None) -> torch.Tensor:
    """``scaled_dot_product_attention`` of query [B, H, L, D] over key/value [B, KV, T, D]
    (``mask``: boolean, True = attend, or additive); with a softcap, which SDPA cannot
    apply, the same attention written out."""
    scores = scores or Scores()
    group = query.shape[1] // key.shape[1]
    if scores.softcap is None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                              is_causal=is_causal, scale=scores.scale,
                                              enable_gqa=group > 1)
    if group > 1:
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    scale = scores.scale if scores.scale is not None else query.shape[-1] ** -0.5
    logits = torch.matmul(query, key.transpose(-1, -2)) * scale
    logits = torch.tanh(logits / scores.softcap) * scores.softcap
    if is_causal:
        mask = torch.ones(logits.shape[-2:], dtype=torch.bool, device=logits.device).tril()
    if mask is not None and mask.dtype == torch.bool:
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    elif mask is not None:
        logits = logits + mask
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(weights, value)


def document_layout(documents: torch.Tensor, attention_mask: torch.Tensor | None
                    ) -> DocumentLayout | None:
    """The layout of ``documents`` [B, S] (:func:`~astrai_core.model.masks.document_ids`)
    with padding where ``attention_mask`` is 0; None when a document's real tokens are
    interrupted by padding (the dense mask handles that rare case)."""
    batch, seq = documents.shape
    real = torch.ones_like(documents, dtype=torch.bool) if attention_mask is None \
        else attention_mask.bool()
    # Documents numbered across rows, so that a new row always starts a new segment.
    doc = (documents + torch.arange(batch, device=documents.device)[:, None] * (seq + 1)).reshape(-1)
    real = real.reshape(-1)
    starts = torch.ones_like(real)
    starts[1:] = (doc[1:] != doc[:-1]) | (real[1:] != real[:-1])
    begin = starts.nonzero().squeeze(-1)
    real_runs = real[begin]
    run_doc = doc[begin][real_runs]
    if bool((run_doc[1:] == run_doc[:-1]).any()):
        return None  # padding inside a document
    bounds = torch.cat([begin, begin.new_tensor([real.numel()])]).tolist()
    flags = real_runs.tolist()
    spans = [(bounds[i], bounds[i + 1], flags[i]) for i in range(len(flags))]
    varlen_starts = (starts | ~real).nonzero().squeeze(-1)
    cu_seqlens = torch.cat([varlen_starts, varlen_starts.new_tensor([real.numel()])]).to(torch.int32)
    return DocumentLayout(spans, cu_seqlens, max(end - start for start, end, _ in spans))


def document_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       layout: DocumentLayout, window: int | None,
                       scores: Scores | None = None) -> torch.Tensor:
    """query [B, H, S, D], key/value [B, KV, S, D] -> [B, S, H, D]: causal attention
    within each segment of ``layout`` (keys at most ``window`` - 1 positions back when a
    sliding window is given; the scores scaled and capped as ``scores`` says)."""
    scores = scores or Scores()
    batch, heads, seq, dim = query.shape
    # Token-major [B * S, heads, D]: a document is a contiguous slice of rows.
    q, k, v = (t.transpose(1, 2).reshape(batch * seq, t.shape[1], dim) for t in (query, key, value))
    kernel = _varlen_kernel(q)
    if layout.prefixes is not None:  # shared prompts: each span over its prefix and itself
        if kernel is not None:
            out = _varlen_prefixed(kernel, q, k, v, layout, window, scores)
        else:
            out = torch.cat([_prefixed_attention(q[a:b], k, v, (a, b), prefix, window, scores)
                             for (a, b, _), prefix in zip(layout.spans, layout.prefixes,
                                                          strict=True)])
        return out.reshape(batch, seq, heads, dim)
    if kernel is not None:
        out = kernel(q, k, v, layout.cu_seqlens, layout.cu_seqlens, layout.max_len, layout.max_len,
                     dropout_p=0.0, causal=True,
                     window_size=(-1, -1) if window is None else (window - 1, 0),
                     **scores.flash_kwargs())
    else:
        out = torch.cat([_span_attention(q[a:b], k[a:b], v[a:b], real, window, scores)
                         for a, b, real in layout.spans])
    return out.reshape(batch, seq, heads, dim)


def _span_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, real: bool,
                    window: int | None, scores: Scores) -> torch.Tensor:
    """One segment, [L, heads, D] each -> [L, H, D]."""
    group = q.shape[1] // k.shape[1]
    if not real:  # each padding query sees only itself: softmax of one score is 1
        return v.repeat_interleave(group, dim=1) if group > 1 else v
    length = q.shape[0]
    mask = None
    if window is not None and window < length:
        pos = torch.arange(length, device=q.device)
        mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    out = scaled_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        mask, is_causal=mask is None, scores=scores)
    return out[0].transpose(0, 1)


def _prefixed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        span: tuple[int, int], prefix: tuple[int, int] | None,
                        window: int | None, scores: Scores) -> torch.Tensor:
    """One span's queries [L, heads, D] over its prefix's keys, all visible, then its own,
    causally (k, v: the whole row's [T, KV, D]). The prefix's positions come right before
    the span's, so one causal rule on positions covers both (and the sliding window)."""
    start, end = span
    if prefix is None:
        return _span_attention(q, k[start:end], v[start:end], True, window, scores)
    keys = torch.cat([k[prefix[0]:prefix[1]], k[start:end]])
    values = torch.cat([v[prefix[0]:prefix[1]], v[start:end]])
    offset = prefix[1] - prefix[0]
    query_pos = torch.arange(offset, offset + end - start, device=q.device)[:, None]
    key_pos = torch.arange(offset + end - start, device=q.device)[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed = allowed & (key_pos > query_pos - window)
    out = scaled_attention(
        q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
        allowed, scores=scores)
    return out[0].transpose(0, 1)


def _varlen_prefixed(kernel: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, layout: DocumentLayout, window: int | None,
                     scores: Scores) -> torch.Tensor:
    """The varlen kernel over spans with prefixes (every span real): each span's keys are
    gathered as its prefix then itself, and flash-attn's causal mask, aligned to the end
    of the keys when they outnumber the queries, lets every query see the whole prefix."""
    pieces, key_lengths = [], []
    for (start, end, _), prefix in zip(layout.spans, layout.prefixes or [], strict=True):
        if prefix is not None:
            pieces.append(torch.arange(prefix[0], prefix[1], device=q.device))
        pieces.append(torch.arange(start, end, device=q.device))
        key_lengths.append(end - start + (prefix[1] - prefix[0] if prefix else 0))
    index = torch.cat(pieces)
    cu_q = layout.cu_seqlens.to(q.device)  # the spans' bounds: every span is real
    cu_k = torch.tensor([0, *key_lengths], device=q.device).cumsum(0).to(torch.int32)
    return kernel(q, k[index], v[index], cu_q, cu_k, layout.max_len, max(key_lengths),
                  dropout_p=0.0, causal=True,
                  window_size=(-1, -1) if window is None else (window - 1, 0),
                  **scores.flash_kwargs())


def _varlen_kernel(q: torch.Tensor) -> Callable[..., torch.Tensor] | None:
    """flash-attn's ``flash_attn_varlen_func`` where it applies (CUDA, half precision,
    installed), else None."""
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    return _flash_varlen()


@functools.cache
def _flash_varlen() -> Callable[..., torch.Tensor] | None:
    try:  # optional: imported on first use, never required
        from flash_attn import flash_attn_varlen_func
    except Exception:  # not installed, or built for another torch/CUDA
        return None
    return flash_attn_varlen_func
