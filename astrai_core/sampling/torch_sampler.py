"""The built-in ``torch`` sampler: batched KV-cached generation with the live native model.

Prompts of different lengths are left-padded into one batch; each request keeps its own
temperature, filters, seed, stops and length (``sampling.rows.RowSampling``, which the
server's continuous-batching engine shares). Finished rows leave the batch (and the KV
cache) at once, so they stop costing compute. With more requests than
``max_batch_size``, batching is continuous: a finished row's slot goes to the next
waiting request at the next step (``sampling.running_batch``, the server engine's
machinery), so a long completion never holds back the requests behind it. Each request
samples from its own random stream, so its tokens do not depend on what shares its batch. The reported log-probabilities are
log_softmax(logits / T) of the chosen token before filtering: exactly what the trainer's
``policy_forward`` computes for the same tokens. With ``record_routing=True`` each
completion also reports the MoE experts of every position (``sampling/routing.py``).
A call given an ``interrupt`` event stops after the decode step during which the event
is set: its unfinished completions come back as they stand, ``finish_reason="abort"``
(partial rollouts continue them later under newer weights).

Long prompts (``sampling/prefill.py``): prompts share a batch only while its padding
stays bounded, so a 32k-token prompt does not widen the KV cache rows of short ones; a
prompt's prefill runs ``prefill_chunk`` tokens per forward; a batch whose prompts are
mostly padding (lengths far apart, as partial rollouts' carried sequences are) is
prefilled in runs of similar lengths; and a batch's cache holds its prompts and then
grows a chunk of columns at a time as tokens are generated.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from astrai_core.data.image_batch import prompt_images
from astrai_core.model.kv_cache import KVCache
from astrai_core.model.masks import positions_from_attention_mask
from astrai_core.model.router_replay import RoutingTape, has_moe
from astrai_core.model.router_replay import record_routing as routing_recorder
from astrai_core.plugins.sampler_capabilities import SamplerCapabilities
from astrai_core.sampling.kept import KeptRows, Row, prefill_continuing
from astrai_core.sampling.params import Completion, SamplingParams
from astrai_core.sampling.prefill import (PREFILL_CHUNK, chunked_prefill, fits, mostly_padding,
                                          new_cache, padded_batches, ragged_prefill)
from astrai_core.sampling.requests import Request, expand_requests
from astrai_core.sampling.routing import BatchRouting
from astrai_core.sampling.rows import RowSampling
from astrai_core.sampling.running_batch import (GROWTH, RunningBatch, decode, last_logits_only,
                                                 prefill)

TokenCallback = Callable[[int, int], None]  # (completion index, token id)


class TorchSampler:
    """``TorchSampler(model=..., tokenizer=None, max_batch_size=64, prefill_chunk=2048)``;
    see the sampler contract."""

    # generates with the very model it was given (the trainer's policy, updated in place),
    # and its generate takes `interrupt`; a subclass that changes either declares its own
    capabilities = SamplerCapabilities(interruptible=True, shares_policy=True, images=True)

    class Config(SamplingParams):
        """The ``sampler:`` config section: default SamplingParams plus engine options."""

        max_batch_size: int = Field(64, ge=1, description="most sequences decoded together")
        prefill_chunk: int = Field(PREFILL_CHUNK, ge=1, description="prompt tokens per prefill "
                                   "forward: a longer prompt is prefilled in chunks")
        keep_unfinished: bool = Field(False, description="keep the KV cache of completions "
                                      "left unfinished until the next call, which continues "
                                      "them (their prompt plus their tokens) without "
                                      "recomputing it while the weights are unchanged: "
                                      "partial rollouts' segments; costs that memory between "
                                      "calls")

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None, max_batch_size: int = 64,
                 prefill_chunk: int = PREFILL_CHUNK, keep_unfinished: bool = False) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk
        self.policy_version = 0
        self.kept = KeptRows() if keep_unfinished else None  # (sampling/kept.py)

    # ---------------------------------------------------------------- weights
    def update_weights(self, state_dict: dict[str, Tensor] | None = None) -> int:
        """Take new policy weights (None: the live model was updated in place); returns the version."""
        if self.kept is not None:  # computed by the weights before
            self.kept.clear()
        if state_dict is not None:
            from astrai_core.checkpoints.native import load_state_dict_strict

            with torch.no_grad():
                load_state_dict_strict(self.model, state_dict, "update_weights(state_dict)")
        self.policy_version += 1
        return self.policy_version

    # ---------------------------------------------------------------- generation
    def generate(self, prompts: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams],
                 on_token: TokenCallback | None = None,
                 record_routing: bool = False,
                 interrupt: threading.Event | None = None,
                 images: Sequence[dict[str, Any] | None] | None = None) -> list[Completion]:
        """Completions for each prompt (``n`` per prompt, grouped in prompt order).

        ``params`` is one SamplingParams for all prompts or one per prompt. ``on_token``
        is called with (completion index, token id) as each token is produced.
        ``record_routing``: fill each completion's ``routed_experts`` (an MoE model).
        ``interrupt``: once set, the call ends after the current decode step; completions
        not finished by then have ``finish_reason="abort"`` and the tokens so far.
        ``images``: a vision-language model's image tensors of each prompt (None for a
        prompt without), by the processor's names (``pixel_values``, ...), the processor's
        output for that one prompt; such prompts prefill in one forward.
        """
        requests = expand_requests(prompts, params, images)
        if self.tokenizer is None and any(r.params.stop for r in requests):
            raise ValueError("stop strings need a tokenizer: TorchSampler(model, tokenizer=...)")
        if record_routing and not has_moe(self.model):
            raise ValueError("record_routing: the model has no MoE layer, so no routing")
        # Similar lengths share a batch: less padding. Results do not depend on the grouping.
        ordered = sorted(requests, key=lambda r: len(r.prompt_ids))
        # the continuous batch's cache joins and trims are the native cache's
        continuous = (len(ordered) > self.max_batch_size and not record_routing
                      and getattr(self.model, "new_kv_cache", None) is None
                      and not any(r.images for r in ordered))
        kept = {} if self.kept is None else self.kept.take_all(self.model)
        kept = {} if continuous else kept  # (the continuous decoder prefills as it admits)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), (routing_recorder(self.model) if record_routing
                                          else nullcontext()) as tape:
                if continuous:
                    _ContinuousDecode(self, ordered, on_token, interrupt).run()
                else:  # batch by batch (routing is recorded batch by batch)
                    lengths = [len(r.prompt_ids) for r in ordered]
                    for rows in padded_batches(lengths, self.max_batch_size):
                        _DecodeBatch(self, ordered[rows.start:rows.stop], on_token, tape,
                                     interrupt, kept).run()
        finally:
            self.model.train(was_training)
        for request in requests:
            if request.finish_reason is None:  # only an interrupted call leaves one unfinished
                request.finish_reason = "abort"
        return [r.completion(self.tokenizer) for r in requests]


class _DecodeBatch:
    """One batch of requests decoded together; rows are dropped as they finish."""

    def __init__(self, sampler: TorchSampler, requests: list[Request],
                 on_token: TokenCallback | None, tape: RoutingTape | None = None,
                 interrupt: threading.Event | None = None,
                 kept: dict[tuple[int, ...], list[Row]] | None = None) -> None:
        self.model = sampler.model
        # the rows the last call left unfinished (to take), and where this call's go
        self.kept, self.keep_into = kept or {}, sampler.kept
        self.chunk = sampler.prefill_chunk
        self.interrupt = interrupt
        self.tokenizer = sampler.tokenizer
        self.on_token = on_token
        self.requests = list(requests)
        self.rows = list(requests)  # the active requests, in batch-row order
        self.device = next(self.model.parameters()).device
        self.sampling = RowSampling([r.params for r in requests], [r.rng for r in requests],
                                    self.device, never=image_token_ids(self.model))
        self.routing = None if tape is None else BatchRouting(
            tape, len(requests), max(r.params.max_new_tokens for r in requests), self.device)

    # ---------------------------------------------------------------- loop
    def run(self) -> None:
        self._decode()
        if self.routing is not None:
            self.routing.assign(self.requests)

    def _decode(self) -> None:
        if _interrupted(self.interrupt):
            return
        prompt_len = max(len(r.prompt_ids) for r in self.rows)
        max_new = max(r.params.max_new_tokens for r in self.rows)
        input_ids, prompt_mask = self._left_pad(prompt_len)
        padded = not bool(prompt_mask.all())
        # The attention mask of the whole sequence, preallocated: generated tokens are real.
        full_mask = torch.ones(len(self.rows), prompt_len + max_new, dtype=torch.long, device=self.device)
        full_mask[:, :prompt_len] = prompt_mask
        positions = positions_from_attention_mask(prompt_mask)
        cache, logits = self._prefill(input_ids, prompt_mask if padded else None, positions,
                                      prompt_len + min(max_new, GROWTH))
        next_position = positions[:, -1:] + 1
        while True:
            tokens = self._choose(logits)
            keep = self._record(tokens.tolist())
            stopped = not keep or _interrupted(self.interrupt)
            if self.keep_into is not None and (stopped or len(keep) < len(tokens)):
                staying = set() if stopped else set(keep)
                self._keep_unfinished(cache, prompt_len, [row for row in range(len(self.rows))
                                                          if row not in staying])
            if stopped:
                return
            if len(keep) < len(tokens):
                full_mask, next_position, tokens = self._drop_finished(keep, cache, full_mask,
                                                                       next_position, tokens)
            if cache.length + 1 > cache.max_length:  # a chunk of columns at a time
                cache.grow(GROWTH)
            step_mask = full_mask[:, :cache.length + 1] if padded else None
            logits = self.model(tokens[:, None], attention_mask=step_mask, position_ids=next_position,
                                kv_cache=cache)["logits"][:, -1]
            if self.routing is not None:
                self.routing.decoded()
            next_position = next_position + 1

    def _prefill(self, input_ids: Tensor, prompt_mask: Tensor | None, positions: Tensor,
                 capacity: int):
        """(the KV cache of every row's prompt, the logits [B, V] of every row's first token).

        The n completions of a prompt share its prefill: one row per distinct prompt, its
        logits and KV cache copied to every completion afterwards."""
        first, copies = self._distinct_prompts()
        cache = new_cache(self.model, len(first), capacity, self.device)
        routing = self.routing
        extra, chunk = last_logits_only(self.model), self.chunk
        rows = [self.rows[row] for row in first.tolist()]
        if any(r.images for r in rows):  # the pixels fill their image tokens in one forward
            extra["images"] = prompt_images([r.images for r in rows], input_ids.shape[1],
                                            getattr(self.model.config, "model_type", ""),
                                            self.device)
            chunk = input_ids.shape[1]
        ids, mask = input_ids[first], None if prompt_mask is None else prompt_mask[first]
        kept = self._take_kept(rows) if routing is None and "images" not in extra else []
        if any(k is not None for k in kept) and isinstance(cache, KVCache):
            logits = prefill_continuing(
                self.model, ids, cache, attention_mask=mask, position_ids=positions[first],
                kept=kept, extra=extra,
                prefill=lambda index, part: self._forward_prompts(
                    ids[index], None if mask is None else mask[index], positions[first][index],
                    part, chunk, extra))
        else:
            logits = self._forward_prompts(ids, mask, positions[first], cache, chunk, extra)
        shared = len(first) < len(self.rows)
        if routing is not None:
            routing.prefill(copies if shared else None)
        if shared:
            cache.select(copies)
            logits = logits.index_select(0, copies)
        return cache, logits

    def _forward_prompts(self, input_ids: Tensor, prompt_mask: Tensor | None, positions: Tensor,
                         cache, chunk: int, extra: dict) -> Tensor:
        """Fill ``cache`` with these left-padded prompts; their next-token logits [B, V]."""
        routing = self.routing
        if prompt_mask is not None and routing is None and "images" not in extra \
                and mostly_padding(prompt_mask) and isinstance(cache, KVCache):
            # lengths far apart (carried sequences): no forward over the padding
            return ragged_prefill(self.model, input_ids, cache, attention_mask=prompt_mask,
                                  position_ids=positions, chunk=chunk, extra=extra)
        return chunked_prefill(
            self.model, input_ids, cache, attention_mask=prompt_mask, position_ids=positions,
            chunk=chunk, extra=extra,
            after_chunk=None if routing is None else
            lambda n: routing.prefill_chunk(len(input_ids), n))

    def _take_kept(self, rows: list[Request]) -> list[Row | None]:
        """Each row's kept cache from the last call (the row continues a sequence that call
        left unfinished, under the same weights), or None."""
        taken = []
        for request in rows:
            waiting = self.kept.get(tuple(request.prompt_ids))
            taken.append(waiting.pop() if waiting else None)
        return taken

    def _keep_unfinished(self, cache, prompt_len: int, leaving: list[int]) -> None:
        """Keep the cache of the rows ``leaving`` the batch unfinished (their length reached,
        or the call interrupted) for the next call to continue (``keep_unfinished``): each
        holds its prompt and all its tokens but the last, which no forward has seen yet."""
        if not isinstance(cache, KVCache):
            return
        rows = []
        for row in leaving:
            request = self.rows[row]
            if request.finish_reason == "stop":
                continue
            start = prompt_len - len(request.prompt_ids)  # its first real column
            keys = [k[row, :, start:cache.length].clone() for k in cache.keys]
            values = [v[row, :, start:cache.length].clone() for v in cache.values]
            rows.append((request.prompt_ids + request.token_ids, (keys, values)))
        self.keep_into.keep(self.model, rows)

    def _distinct_prompts(self) -> tuple[Tensor, Tensor]:
        """(the first row of each distinct prompt, the distinct index of every row)."""
        index: dict[tuple[int, ...], int] = {}
        first: list[int] = []
        copies = []
        for row, request in enumerate(self.rows):
            # the completions of one prompt share its images object
            key = (tuple(request.prompt_ids), id(request.images))
            if key not in index:
                index[key] = len(first)
                first.append(row)
            copies.append(index[key])
        as_tensor = lambda rows: torch.tensor(rows, dtype=torch.long, device=self.device)  # noqa: E731
        return as_tensor(first), as_tensor(copies)

    def _left_pad(self, length: int) -> tuple[Tensor, Tensor]:
        input_ids = torch.zeros(len(self.rows), length, dtype=torch.long)
        mask = torch.zeros(len(self.rows), length, dtype=torch.long)
        for row, request in enumerate(self.rows):
            ids = request.prompt_ids
            input_ids[row, length - len(ids):] = torch.tensor(ids)
            mask[row, length - len(ids):] = 1
        return input_ids.to(self.device), mask.to(self.device)

    # ---------------------------------------------------------------- one step
    def _choose(self, logits: Tensor) -> Tensor:
        return choose(self.rows, self.sampling, logits)

    def _record(self, tokens: list[int]) -> list[int]:
        return record(self.rows, tokens, self.on_token, self.tokenizer)

    def _drop_finished(self, keep: list[int], cache, full_mask: Tensor, next_position: Tensor,
                       tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        cache.select(rows)
        if self.routing is not None:
            self.routing.keep(rows)
        self.rows = [self.rows[i] for i in keep]
        self.sampling.select(keep)
        return full_mask.index_select(0, rows), next_position.index_select(0, rows), tokens.index_select(0, rows)


class _ContinuousDecode:
    """More requests than batch rows: each finished row's slot is refilled at the next step
    by the next waiting request (prefilled with the others of its prompt length, then
    merged into a running batch whose padding it keeps bounded, else running on its own:
    a long prompt's cache columns are not given to short prompts' rows)."""

    def __init__(self, sampler: TorchSampler, requests: list[Request],
                 on_token: TokenCallback | None, interrupt: threading.Event | None = None) -> None:
        self.model, self.tokenizer, self.on_token = sampler.model, sampler.tokenizer, on_token
        self.interrupt = interrupt
        self.max_batch_size, self.chunk = sampler.max_batch_size, sampler.prefill_chunk
        self.device = next(self.model.parameters()).device
        self.waiting = deque(requests)
        self.batches: list[RunningBatch] = []

    def run(self) -> None:
        while (self.waiting or self.batches) and not _interrupted(self.interrupt):
            self._admit()
            stepped = [self._step(batch, decode(self.model, batch)) for batch in self.batches]
            self.batches = [batch for batch in stepped if batch is not None]

    def _admit(self) -> None:
        free = self.max_batch_size - sum(len(b.rows) for b in self.batches)
        groups: dict[int, list[Request]] = {}
        for _ in range(min(free, len(self.waiting))):
            request = self.waiting.popleft()
            groups.setdefault(len(request.prompt_ids), []).append(request)
        for length, group in groups.items():
            sampling = RowSampling([r.params for r in group], [r.rng for r in group], self.device,
                                   never=image_token_ids(self.model))
            joined, logits = prefill(self.model, group, [r.prompt_ids for r in group], sampling,
                                     chunk=self.chunk)
            joined = self._step(joined, logits)
            if joined is None:
                continue
            host = next((b for b in self.batches if _fits_with(b, len(joined.rows), length)), None)
            if host is None:
                self.batches.append(joined)
            else:
                host.extend(joined)

    def _step(self, batch: RunningBatch, logits: Tensor) -> RunningBatch | None:
        """Sample every row's next token; the batch without its finished rows (None: empty)."""
        batch.tokens = choose(batch.rows, batch.sampling, logits)
        keep = record(batch.rows, batch.tokens.tolist(), self.on_token, self.tokenizer)
        if not keep:
            return None
        if len(keep) < len(batch.rows):
            batch.keep(keep)
        return batch


def _fits_with(batch: RunningBatch, rows: int, length: int) -> bool:
    """Whether ``rows`` more rows of ``length`` cached tokens may join ``batch``."""
    width = max(batch.cache.length, length)
    real = int(batch.mask[:, :batch.cache.length].sum()) + rows * length
    return fits(len(batch.rows) + rows, width, real)


# ---------------------------------------------------------------- one step, both decoders
def choose(rows: list[Request], sampling: RowSampling, logits: Tensor) -> Tensor:
    """Next token of every row, and its log-prob appended to each request."""
    tokens, logprobs, _ = sampling.choose(logits)
    for request, logprob in zip(rows, logprobs.tolist(), strict=True):
        request.logprobs.append(logprob)
    return tokens


def record(rows: list[Request], tokens: list[int], on_token: TokenCallback | None,
           tokenizer: Any) -> list[int]:
    """Append each row's token, mark finished requests; returns the rows still active."""
    keep = []
    for row, (request, token) in enumerate(zip(rows, tokens, strict=True)):
        request.token_ids.append(token)
        if on_token is not None:
            on_token(request.index, token)
        if token in request.params.stop_token_ids or _hit_stop_string(request, tokenizer):
            request.finish_reason = "stop"
        elif len(request.token_ids) >= request.params.max_new_tokens:
            request.finish_reason = "length"
        else:
            keep.append(row)
    return keep


def image_token_ids(model: torch.nn.Module) -> tuple[int, ...]:
    """The image placeholder tokens of a vision-language model (none for a text model):
    never sampled, since a forward puts image features at their positions, so a drawn one
    would be scored by the trainer as an image."""
    return tuple(getattr(model, "image_token_ids", ()))


def _interrupted(interrupt: threading.Event | None) -> bool:
    return interrupt is not None and interrupt.is_set()


def _hit_stop_string(request: Request, tokenizer: Any) -> bool:
    if not request.params.stop:
        return False
    text = tokenizer.decode(request.token_ids, skip_special_tokens=True)
    found = [at for at in (text.find(stop) for stop in request.params.stop) if at >= 0]
    if found:
        request.stop_text_at = min(found)
    return bool(found)
