"""Old log-probs from the training forward, for rollouts whose no-grad forward was skipped.

With ``epochs x mini_batches = 1`` each rollout row is trained on exactly once, by the
policy that sampled it, so the strategy's training forward can stand in for the no-grad
trainer forward over the rollout (see :mod:`astrai_core.training.online`): its detached
log-probs are the old policy's (recompute), and it measures the sampler/trainer mismatch
(``logprob_diff_max/mean``) the skipped forward would have measured.
"""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.rollout.batch import RolloutBatch


def may_defer(config: Any, capable: bool, recompute: bool) -> bool:
    """Whether a rollout's training forward may stand in for its no-grad one, for a strategy
    (``capable``: its loss takes old log-probs through ``old_logprobs_for``) with the online
    options ``config``."""
    if not capable or config.epochs * config.mini_batches != 1:
        return False
    if config.rollout_correction is not None or config.router_replay == "R2":
        return False  # the weights (the routing to replay) are needed before the loss
    return not (recompute and config.kl_in_reward_coef)  # shaping reads old log-probs


class DeferredOldLogprobs:
    """What the training forwards do for the current rollout: nothing until :meth:`start`
    (the rollout's no-grad forward was skipped), again nothing after :meth:`stop`."""

    def __init__(self) -> None:
        self.active = False  # the current rollout's no-grad forward was skipped
        self.recompute = False  # the training forward's log-probs are the old policy's
        self.measure = False  # the rollout has sampler log-probs to measure against
        self.prefix = "rollout/"
        self.total, self.count, self.largest = 0.0, 0, 0.0  # the step's token differences

    def start(self, *, recompute: bool, measure: bool, prefix: str) -> None:
        """The current rollout's old log-probs come from its training forwards."""
        self.active, self.recompute, self.measure, self.prefix = True, recompute, measure, prefix
        self.total, self.count, self.largest = 0.0, 0, 0.0

    def stop(self) -> None:
        """The current rollout carries its old log-probs (its no-grad forward ran)."""
        self.active = False

    def old_logprobs_for(self, batch: RolloutBatch, logprobs: torch.Tensor,
                         training: bool) -> torch.Tensor:
        """The old policy's log-probs for the loss over ``batch``, whose forward gave
        ``logprobs``: the batch's own or, when deferred with recompute, ``logprobs``
        detached. A training forward (``training``) of a deferred rollout also measures the
        sampler/trainer mismatch."""
        if not self.active or not training:
            return batch.old_logprobs
        mask = batch.response_mask
        current = torch.where(mask, logprobs.detach(), 0.0)
        if self.measure:
            self._add((current - batch.old_logprobs).abs()[mask])
        return current if self.recompute else batch.old_logprobs

    def _add(self, diff: torch.Tensor) -> None:
        if diff.numel():
            self.total += diff.sum().item()
            self.count += diff.numel()
            self.largest = max(self.largest, diff.max().item())

    def pop_metrics(self) -> dict[str, float]:
        """``logprob_diff_max/mean`` over the step's tokens, then a fresh count."""
        if not (self.active and self.measure):
            return {}
        metrics = {f"{self.prefix}logprob_diff_max": self.largest,
                   f"{self.prefix}logprob_diff_mean": self.total / max(self.count, 1)}
        self.total, self.count, self.largest = 0.0, 0, 0.0
        return metrics
