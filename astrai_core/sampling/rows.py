"""The per-row sampling state of a decode batch, shared by the torch sampler and the server engine.

Each row keeps its own temperature, filters, random stream and (for the server) logit
bias; rows can be dropped (finished) or appended (continuous batching) between steps.
``choose`` picks every row's next token exactly as the sampler contract describes: the
log-prob is taken from the temperature-scaled logits before top-k/top-p/min-p.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch
from torch import Tensor

from astrai_core.sampling.filters import min_p_filter, top_k_filter, top_k_top_p_filter, top_p_filter
from astrai_core.sampling.params import SamplingParams

_FIELDS = ("greedy", "temperature", "top_k", "top_p", "min_p")


class RowSampling:
    """``RowSampling(params, rngs, device, logit_bias=None)``: one entry per batch row.
    ``never``: token ids no row draws (a vision-language model's image placeholders, whose
    positions a forward fills with image features); their log-probs still count in the
    reported log-probs, as filtered tokens' do."""

    def __init__(self, params: Sequence[SamplingParams], rngs: Sequence[random.Random | None],
                 device: torch.device, logit_bias: Sequence[dict[int, float] | None] | None = None,
                 vocab_size: int | None = None, never: Sequence[int] = ()) -> None:
        self.params = list(params)
        self.rngs = list(rngs)
        self.device = device
        as_tensor = lambda values, dtype: torch.tensor(values, dtype=dtype, device=device)  # noqa: E731
        # Greedy rows: T = 1 for their log-probs, and neutral filters.
        self.greedy = as_tensor([p.greedy for p in params], torch.bool)
        self.temperature = as_tensor([p.temperature if not p.greedy else 1.0 for p in params], torch.float32)
        self.top_k = as_tensor([p.top_k if not p.greedy else 0 for p in params], torch.long)
        self.top_p = as_tensor([p.top_p if not p.greedy else 1.0 for p in params], torch.float32)
        self.min_p = as_tensor([p.min_p if not p.greedy else 0.0 for p in params], torch.float32)
        self.bias = _dense_bias(logit_bias, len(self.params), vocab_size, device)
        self.never = as_tensor(list(never), torch.long) if never else None
        self._refresh_flags()

    def __len__(self) -> int:
        return len(self.params)

    def _refresh_flags(self) -> None:
        """Python-side facts about the rows, so a step skips work no row needs."""
        params = self.params
        self.any_sampled = any(not p.greedy for p in params)
        self.unit_temperature = all(p.greedy or p.temperature == 1.0 for p in params)
        self.any_top_k = any(p.top_k > 0 and not p.greedy for p in params)
        self.any_top_p = any(p.top_p < 1.0 and not p.greedy for p in params)
        self.any_min_p = any(p.min_p > 0.0 and not p.greedy for p in params)

    # ---------------------------------------------------------------- rows
    def select(self, rows: list[int]) -> None:
        """Keep only these rows, in this order."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.params = [self.params[i] for i in rows]
        self.rngs = [self.rngs[i] for i in rows]
        for name in _FIELDS:
            setattr(self, name, getattr(self, name).index_select(0, index))
        if self.bias is not None:
            self.bias = self.bias.index_select(0, index) if rows else None
        self._refresh_flags()

    def extend(self, other: RowSampling) -> None:
        """Append ``other``'s rows after these."""
        for name in _FIELDS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        if self.bias is not None or other.bias is not None:
            vocab = (self.bias if self.bias is not None else other.bias).shape[1]
            mine = self.bias if self.bias is not None else torch.zeros(len(self), vocab, device=self.device)
            theirs = other.bias if other.bias is not None else torch.zeros(len(other), vocab, device=self.device)
            self.bias = torch.cat([mine, theirs])
        self.params += other.params
        self.rngs += other.rngs
        self._refresh_flags()

    # ---------------------------------------------------------------- one step
    def choose(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(next token [B], its log-prob [B], the scaled logits [B, V] the log-probs come from)."""
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 stays exact
        if self.bias is not None:
            logits = logits + self.bias
        scaled = logits if self.unit_temperature else logits / self.temperature[:, None]
        drawable = scaled if self.never is None else scaled.index_fill(-1, self.never, -math.inf)
        tokens = drawable.argmax(dim=-1)
        if self.any_sampled:
            tokens = torch.where(self.greedy, tokens, self._sample(drawable))
        # From the unfiltered scaled logits: what the trainer computes for the same token.
        logprobs = scaled.gather(-1, tokens[:, None]).squeeze(-1) - scaled.logsumexp(dim=-1)
        return tokens, logprobs, scaled

    def _sample(self, scaled: Tensor) -> Tensor:
        """Inverse-CDF sampling with one uniform draw per row from the row's own stream
        (``scaled``: the ``never`` tokens already removed, as a filter would)."""
        filtered = scaled
        if self.any_top_k and self.any_top_p:
            filtered = top_k_top_p_filter(filtered, self.top_k, self.top_p)
        elif self.any_top_k:
            filtered = top_k_filter(filtered, self.top_k)
        elif self.any_top_p:
            filtered = top_p_filter(filtered, self.top_p)
        if self.any_min_p:
            filtered = min_p_filter(filtered, self.min_p)
        cdf = filtered.softmax(dim=-1).cumsum(dim=-1)
        uniform = torch.tensor([r.random() if r is not None else 0.0 for r in self.rngs],
                               dtype=cdf.dtype, device=cdf.device)
        # The first token whose cumulative mass exceeds u: never one of probability 0.
        chosen = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).squeeze(-1)
        return chosen.clamp(max=cdf.shape[-1] - 1)


def _dense_bias(logit_bias: Sequence[dict[int, float] | None] | None, rows: int,
                vocab_size: int | None, device: torch.device) -> Tensor | None:
    """[rows, V] additive logit bias, or None when no row has one."""
    if not logit_bias or not any(logit_bias):
        return None
    if vocab_size is None:
        raise ValueError("logit_bias needs vocab_size")
    bias = torch.zeros(rows, vocab_size, device=device)
    for row, entries in enumerate(logit_bias):
        for token, value in (entries or {}).items():
            bias[row, int(token)] = float(value)
    return bias
