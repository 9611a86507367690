"""MoE router replay in the training forwards of an online strategy (``router_replay``).

R2 records the experts of the trainer's first (no-grad) forward over each rollout, R3
takes the sampler's; either way the training forwards route each token through its
recorded experts, and the tokens whose own routing differed are counted per optimizer
step (``router/replay_mismatch``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from astrai_core.model.router_replay import ROUTED_EXPERTS, replay_routing
from astrai_core.rollout.batch import RolloutBatch


class RoutingReplay:
    """Replays recorded routing around training forwards and counts the mismatches."""

    def __init__(self) -> None:
        self.differing = 0  # tokens of this step whose own routing differed from the record
        self.counted = 0  # tokens of this step replayed

    @contextmanager
    def replaying(self, model: torch.nn.Module, batch: RolloutBatch) -> Iterator[None]:
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

    @staticmethod
    def sampler_routing(model: torch.nn.Module, rollout: RolloutBatch
                        ) -> AbstractContextManager[Any]:
        """R3: the no-grad forward routes like the sampler did, as the training forwards
        will (its old log-probs then share their routing); else no context."""
        experts = rollout.extras.get(ROUTED_EXPERTS)
        if experts is None:
            return nullcontext()
        return replay_routing(model, experts, rollout.attention_mask())

    def pop_metrics(self) -> dict[str, float]:
        """``router/replay_mismatch`` of the step (when any token was replayed), then a
        fresh count."""
        metrics = {"router/replay_mismatch": self.differing / self.counted} if self.counted \
            else {}
        self.differing = self.counted = 0
        return metrics
