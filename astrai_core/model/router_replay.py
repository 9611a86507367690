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
  layer: ``tape.mismatch()`` (``router/replay_mismatch`` is their fraction). An entry
  of -1 (:data:`NOT_ROUTED`) is a position nobody recorded (R3: padding, and the last
  generated token, which the sampler never feeds back): it keeps its own top-k and is
  not counted.
* :func:`aligned_routing` lays the sampler's per-completion routing (R3) out on a
  rollout's ``[prompt | response]`` positions; :func:`widened_routing` re-pads it when
  rollouts of other widths are joined (dynamic sampling, the ranks' shares).

The MoE block hands its top-k choice to :meth:`RoutingTape.route` (``MoEBlock.routing``); outside these
contexts it is untouched (``MoEBlock.routing`` is None).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

# rollout.extras key of the recorded MoE experts, [N, MoE layers, P + R, top-k] (R2, R3)
ROUTED_EXPERTS = "routed_experts"
NOT_ROUTED = -1  # an expert index meaning "no recorded choice: route by your own top-k"


class RoutingTape:
    """The experts of each MoE layer of one forward: recorded, or to be replayed."""

    def __init__(self, replay: list[torch.Tensor] | None = None,
                 valid: torch.Tensor | None = None) -> None:
        self.layers: dict[int, torch.Tensor] = {}  # recorded [T, k] per MoE layer
        self._replay = replay                  # [T, k] per MoE layer to force, or None
        self._valid = valid                    # [T] bool: tokens the mismatch counts
        self._known: torch.Tensor | None = None  # [T] bool: tokens with a recorded choice
        self._differs: torch.Tensor | None = None  # [T] bool: some layer chose otherwise

    def route(self, layer: int, probs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        """The experts MoE layer ``layer`` uses: its own (recorded) or the replayed ones.
        Keyed by layer, so activation checkpointing's recomputation routes alike."""
        if self._replay is None:
            self.layers[layer] = selected.detach()
            return selected
        forced = self._replay[layer].to(selected.device, torch.long)
        if forced.shape != selected.shape:
            raise ValueError(f"router replay: {tuple(forced.shape)} recorded experts for a "
                             f"layer routing {tuple(selected.shape)}")
        with torch.no_grad():
            known = (forced != NOT_ROUTED).all(-1)
            forced = torch.where(known[:, None], forced, selected)
            differs = (forced.sort(-1).values != selected.sort(-1).values).any(-1)
            self._differs = differs if self._differs is None else self._differs | differs
            self._known = known if self._known is None else self._known & known
        return forced

    def stacked(self, batch: int, seq: int) -> torch.Tensor:
        """[B, L, S, k] of the recorded layers."""
        per_layer = [self.layers[i].reshape(batch, seq, -1) for i in sorted(self.layers)]
        return torch.stack(per_layer, dim=1)

    def mismatch(self) -> tuple[int, int]:
        """(tokens whose own top-k differed from the replay in some layer, tokens counted:
        the valid ones with a recorded choice)."""
        if self._differs is None:
            return 0, 0
        counted = self._known
        if self._valid is not None:
            counted = counted & self._valid.to(counted.device)
        return int(self._differs[counted].sum()), int(counted.sum())


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


def aligned_routing(routings: list[torch.Tensor], prompt_lengths: list[int],
                    prompt_width: int, response_width: int) -> torch.Tensor:
    """``[N, L, P + R, k]`` int16 experts on a rollout's positions (prompts left-padded to
    ``prompt_width``, responses right-padded to ``response_width``), :data:`NOT_ROUTED`
    on padding; ``routings[i]`` is completion i's ``[L, prompt + response tokens, k]``
    (``Completion.routed_experts``) and its prompt ``prompt_lengths[i]`` tokens long."""
    layers, _, top_k = routings[0].shape
    out = torch.full((len(routings), layers, prompt_width + response_width, top_k),
                     NOT_ROUTED, dtype=torch.int16)
    for row, (routing, prompt) in enumerate(zip(routings, prompt_lengths, strict=True)):
        start = prompt_width - prompt
        out[row, :, start:start + routing.shape[1]] = routing
    return out


def widened_routing(experts: torch.Tensor, prompt_width: int, new_prompt_width: int,
                    new_response_width: int) -> torch.Tensor:
    """``experts`` ``[N, L, P + R, k]`` of a rollout whose prompts are ``prompt_width``
    wide, re-padded (:data:`NOT_ROUTED`) to prompts ``new_prompt_width`` wide on the left
    and responses ``new_response_width`` wide on the right."""
    response_width = experts.shape[2] - prompt_width
    return torch.nn.functional.pad(
        experts, (0, 0, new_prompt_width - prompt_width, new_response_width - response_width),
        value=NOT_ROUTED)
