"""MoE router replay: record the experts each MoE layer picks, and force them later.

In RL the routing of a rollout can change between the forward that scored it and the
training forwards (another kernel, another micro-batch, a few optimizer steps later):
a token then goes through other experts, its log-prob jumps and the importance ratio
mixes a routing change with the policy change. Replaying the recorded experts keeps the
expert choice fixed while the router's probabilities (the weights of the chosen
experts) still get their gradient.

* :func:`record_routing` (a context manager) records, for every MoE layer of ``model``
  in order, the experts each token of one forward chose: ``tape.stacked(batch, seq)``
  is ``[B, L, S, k]``.
* :func:`replay_routing` makes one forward use the given ``[B, L, S, k]`` experts
  instead of its own top-k, with weights ``probs.gather(selected)`` (renormalised like
  top-k when the model does), and counts the tokens whose own top-k differed in some
  layer: ``tape.mismatch()`` (``router/replay_mismatch`` is their fraction).

The MoE block hands its top-k choice to :meth:`RoutingTape.route` (``MoEBlock.routing``); outside these
contexts it is untouched (``MoEBlock.routing`` is None).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn


class RoutingTape:
    """The experts of each MoE layer of one forward: recorded, or to be replayed."""

    def __init__(self, replay: list[torch.Tensor] | None = None,
                 valid: torch.Tensor | None = None) -> None:
        self.layers: dict[int, torch.Tensor] = {}  # recorded [T, k] per MoE layer
        self._replay = replay                  # [T, k] per MoE layer to force, or None
        self._valid = valid                    # [T] bool: tokens the mismatch counts
        self._differs: torch.Tensor | None = None  # [T] bool: some layer chose otherwise

    def route(self, layer: int, probs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        """The experts MoE layer ``layer`` uses: its own (recorded) or the replayed ones.
        Keyed by layer, so activation checkpointing's recomputation routes alike."""
        if self._replay is None:
            self.layers[layer] = selected.detach()
            return selected
        forced = self._replay[layer].to(selected.device)
        if forced.shape != selected.shape:
            raise ValueError(f"router replay: {tuple(forced.shape)} recorded experts for a "
                             f"layer routing {tuple(selected.shape)}")
        with torch.no_grad():
            differs = (forced.sort(-1).values != selected.sort(-1).values).any(-1)
            self._differs = differs if self._differs is None else self._differs | differs
        return forced

    def stacked(self, batch: int, seq: int) -> torch.Tensor:
        """[B, L, S, k] of the recorded layers."""
        per_layer = [self.layers[i].reshape(batch, seq, -1) for i in sorted(self.layers)]
        return torch.stack(per_layer, dim=1)

    def mismatch(self) -> tuple[int, int]:
        """(tokens whose own top-k differed from the replay in some layer, tokens counted)."""
        if self._differs is None:
            return 0, 0
        differs = self._differs
        if self._valid is not None:
            differs = differs[self._valid.to(differs.device)]
        return int(differs.sum()), differs.numel()


def _moe_blocks(model: nn.Module) -> list[nn.Module]:
    from astrai_core.model.moe import MoEBlock

    return [module for module in model.modules() if isinstance(module, MoEBlock)]


def has_moe(model: nn.Module) -> bool:
    """Whether ``model`` routes tokens through experts at all."""
    return bool(_moe_blocks(model))


@contextmanager
def _taped(model: nn.Module, tape: RoutingTape) -> Iterator[RoutingTape]:
    blocks = _moe_blocks(model)
    for index, block in enumerate(blocks):
        block.routing = partial(tape.route, index)
    try:
        yield tape
    finally:
        for block in blocks:
            block.routing = None


def record_routing(model: nn.Module):
    """``with record_routing(model) as tape:`` one forward; then ``tape.stacked(B, S)``."""
    return _taped(model, RoutingTape())


def replay_routing(model: nn.Module, experts: torch.Tensor, valid: torch.Tensor | None = None):
    """``with replay_routing(model, experts [B, L, S, k], valid [B, S]) as tape:`` one
    forward over those B x S tokens routes them through ``experts``."""
    batch, layers, seq, top_k = experts.shape
    per_layer = [experts[:, i].reshape(batch * seq, top_k) for i in range(layers)]
    flat_valid = valid.reshape(-1).to(torch.bool) if valid is not None else None
    return _taped(model, RoutingTape(per_layer, flat_valid))
