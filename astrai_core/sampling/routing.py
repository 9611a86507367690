"""The torch sampler's MoE routing record (``generate(..., record_routing=True)``; R3).

Every forward of a decode batch runs under one :class:`RoutingTape` (recording, not
replaying), and :class:`BatchRouting` files what each forward chose as small int16
tensors on the device, with no per-token Python work:

* the prefill routes every prompt position (chunk by chunk for a long prompt); it ran
  once per distinct prompt, so its routing is copied to each of the prompt's ``n``
  completions (the same rows the KV cache is copied to);
* each decode step feeds one token per active row: its routing goes to column ``step``
  of those rows, found through ``slots`` (the batch row of each active row), which
  follows the rows dropped as they finish.

At the end each request gets ``[MoE layers, prompt + response tokens, top-k]`` on the
CPU. A completion's last token is never fed back to the model, so its column is
:data:`NOT_ROUTED` (the trainer keeps its own routing there; no log-prob depends on it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from astrai_core.model.router_replay import NOT_ROUTED, RoutingTape
from astrai_core.sampling.requests import Request

ROUTING_DTYPE = torch.int16  # expert indices up to 32767: every MoE checkpoint around


class BatchRouting:
    """The experts of one decode batch's rows, filed forward by forward."""

    def __init__(self, tape: RoutingTape, rows: int, max_new: int, device: torch.device) -> None:
        self.tape = tape
        self.max_new = max_new
        self.slots = torch.arange(rows, device=device)  # batch row of each active row
        self.prompt: Tensor | None = None    # [rows, L, P, k]
        self.response: Tensor | None = None  # [rows, L, max_new, k], NOT_ROUTED until fed
        self._chunks: list[Tensor] = []      # the prefill's, chunk by chunk
        self.step = 0

    def _taken(self, batch: int, seq: int) -> Tensor:
        """The last forward's experts, [batch, L, seq, k]; the tape is emptied for the next."""
        routed = self.tape.stacked(batch, seq).to(ROUTING_DTYPE)
        self.tape.layers.clear()
        return routed

    def prefill_chunk(self, distinct: int, tokens: int) -> None:
        """After a prefill forward over ``tokens`` more positions of ``distinct`` prompts
        (a long prompt's prefill runs in chunks)."""
        self._chunks.append(self._taken(distinct, tokens))

    def prefill(self, copies: Tensor | None) -> None:
        """After the whole prefill; ``copies``: the distinct prompt of every row (None
        when each row is its own)."""
        routed = torch.cat(self._chunks, dim=2) if len(self._chunks) > 1 else self._chunks[0]
        self._chunks = []
        self.prompt = routed if copies is None else routed.index_select(0, copies)

    def decoded(self) -> None:
        """After a decode forward that fed token ``step`` of every active row."""
        routed = self._taken(len(self.slots), 1)[:, :, 0]
        if self.response is None:
            rows, layers, _, top_k = self.prompt.shape
            self.response = torch.full((rows, layers, self.max_new, top_k), NOT_ROUTED,
                                       dtype=ROUTING_DTYPE, device=routed.device)
        self.response[self.slots, :, self.step] = routed
        self.step += 1

    def keep(self, rows: Tensor) -> None:
        """Only these active rows go on (the others finished)."""
        self.slots = self.slots.index_select(0, rows)

    def assign(self, requests: list[Request]) -> None:
        """Each request's ``routed_experts``, ``requests`` in batch-row order."""
        prompt = self.prompt.cpu()
        response = self.response.cpu() if self.response is not None else None
        width = prompt.shape[2]
        for row, request in enumerate(requests):
            tokens = len(request.token_ids)
            if response is None:  # every row stopped at its first token: none fed back
                generated = torch.full((prompt.shape[1], tokens, prompt.shape[3]), NOT_ROUTED,
                                       dtype=ROUTING_DTYPE)
            else:
                generated = response[row, :, :tokens]
            request.routed_experts = torch.cat(
                [prompt[row, :, width - len(request.prompt_ids):], generated], dim=1)
