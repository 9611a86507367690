"""MoE router replay in the forwards of an online strategy (``strategy.router_replay``).

R2 records the experts of the trainer's first (no-grad) forward over each rollout, R3
takes the sampler's (the rollout runner asks the sampler for them); either way the
training forwards route each token through its recorded experts, and the tokens whose own
routing differed are counted per optimizer step (``router/replay_mismatch``). The rest of
the loop talks to one :class:`RouterReplay`; with ``router_replay: disabled`` every one of
its contexts does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from astrai_core.errors import ConfigError
from astrai_core.model.router_replay import ROUTED_EXPERTS, has_moe, record_routing, replay_routing
from astrai_core.rollout.batch import RolloutBatch


class RouterReplay:
    """``router_replay`` (disabled, R2 or R3) around the rollout's forwards."""

    def __init__(self, mode: str = "disabled") -> None:
        self.mode = mode
        self.differing = 0  # tokens of this step whose own routing differed from the record
        self.counted = 0  # tokens of this step replayed

    def check(self, model: torch.nn.Module) -> None:
        """Replay needs a model that routes tokens through experts (known once it is built)."""
        if self.mode != "disabled" and not has_moe(model):
            raise ConfigError(f"strategy.router_replay: {self.mode} replays MoE routing, and "
                              "the model has no MoE layer")

    @property
    def records_in_no_grad_forward(self) -> bool:
        """R2: the routing to replay comes from the rollout's no-grad forward, so that
        forward cannot be left to the training forward."""
        return self.mode == "R2"

    @contextmanager
    def no_grad_forward(self, model: torch.nn.Module, rollout: RolloutBatch) -> Iterator[None]:
        """Around the no-grad forward over the whole ``rollout``: R2 records its routing
        into ``rollout.extras``; R3 routes like the sampler did, as the training forwards
        will (the old log-probs then share their routing)."""
        if self.mode == "R2":
            with record_routing(model) as tape:
                yield
            rollout.extras[ROUTED_EXPERTS] = tape.stacked(*rollout.attention_mask().shape)
            return
        experts = rollout.extras.get(ROUTED_EXPERTS)  # the sampler's (R3), if it recorded any
        if experts is None:
            yield
            return
        with replay_routing(model, experts, rollout.attention_mask()):
            yield

    @contextmanager
    def training_forward(self, model: torch.nn.Module, batch: RolloutBatch) -> Iterator[None]:
        """Around a training forward of ``model`` over ``batch``: route its tokens through
        the experts recorded for them, if any, and count the tokens that differed."""
        experts = batch.extras.get(ROUTED_EXPERTS)
        if experts is None or not model.training:
            yield
            return
        with replay_routing(model, experts, batch.attention_mask()) as tape:
            yield
        differing, counted = tape.mismatch()
        self.differing += differing
        self.counted += counted

    def pop_metrics(self) -> dict[str, float]:
        """``router/replay_mismatch`` of the step (when any token was replayed), then a
        fresh count."""
        metrics = {"router/replay_mismatch": self.differing / self.counted} if self.counted \
            else {}
        self.differing = self.counted = 0
        return metrics
