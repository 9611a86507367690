"""Old log-probs from the training forward, for rollouts whose no-grad forward was skipped.

With ``epochs x mini_batches = 1`` each rollout row is trained on exactly once, by the
policy that sampled it, so the strategy's training forward can stand in for the no-grad
trainer forward over the rollout (:mod:`astrai_core.online.prepare`): its detached
log-probs are the old (proximal) policy's (recompute), and it measures what the skipped
forward would have measured, through the same :func:`~astrai_core.online.mismatch.measure`:
the sampler/trainer mismatch and, with ``rollout_correction``, each micro-batch's weights
(``extras["rollout_weights"]``) and their metrics. Rows are whole in a micro-batch
(padded or packed), so per-token and per-sequence weights are those of the whole rollout;
the step's metrics are combined over its micro-batches and ranks.
"""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.distributed.context import SINGLE, DistContext
from astrai_core.online.mismatch import MismatchTotals, measure
from astrai_core.online.routing import RouterReplay
from astrai_core.rl.rollout_correction import RolloutCorrectionConfig
from astrai_core.rollout.batch import RolloutBatch


def may_defer(config: Any, capable: bool, recompute: bool, routing: RouterReplay) -> bool:
    """Whether a rollout's training forward may stand in for its no-grad one, for a strategy
    (``capable``: its loss takes old log-probs through ``old_logprobs_for``) with the online
    options ``config`` and their router replay."""
    if not capable or config.epochs * config.mini_batches != 1:
        return False
    if routing.records_in_no_grad_forward:
        return False
    return not (recompute and config.kl_in_reward_coef)  # shaping reads old log-probs


class DeferredOldLogprobs:
    """What the training forwards do for the current rollout: nothing until :meth:`start`
    (the rollout's no-grad forward was skipped), again nothing after :meth:`stop`.

    ``dist``: the step's metrics are those of every rank's tokens (one collective in
    :meth:`pop_metrics`, which every rank calls once per step).
    """

    def __init__(self, dist: DistContext = SINGLE) -> None:
        self.dist = dist
        self.active = False  # the current rollout's no-grad forward was skipped
        self.recompute = False  # the training forward's log-probs are the old policy's
        self.measure = False  # the rollout has sampler log-probs to measure against
        self.correction: RolloutCorrectionConfig | None = None  # weights per micro-batch
        self.prefix = "rollout/"
        self.totals = MismatchTotals()

    def start(self, *, recompute: bool, measure: bool, prefix: str,
              correction: RolloutCorrectionConfig | None = None) -> None:
        """The current rollout's old log-probs (and, with ``correction``, its rollout
        weights) come from its training forwards."""
        self.active, self.recompute, self.measure, self.prefix = True, recompute, measure, prefix
        self.correction = correction
        self.totals = MismatchTotals()

    def stop(self) -> None:
        """The current rollout carries its old log-probs (its no-grad forward ran)."""
        self.active = False

    def old_logprobs_for(self, batch: RolloutBatch, logprobs: torch.Tensor,
                         training: bool) -> torch.Tensor:
        """The old policy's log-probs for the loss over ``batch``, whose forward gave
        ``logprobs``: the batch's own or, when deferred with recompute, ``logprobs``
        detached. A training forward (``training``) of a deferred rollout also measures the
        sampler/trainer mismatch and, with a correction, sets the micro-batch's
        ``extras["rollout_weights"]`` (as the no-grad forward would have set the rollout's)."""
        if not self.active or not training:
            return batch.old_logprobs
        current = torch.where(batch.response_mask, logprobs.detach(), 0.0)
        if self.measure:  # a correction always measures (it needs the sampler's log-probs)
            weights, tally = measure(current, batch.old_logprobs, batch.response_mask,
                                     self.correction, self.prefix)
            if weights is not None:
                batch.extras["rollout_weights"] = weights
            self.totals.add(tally)
        return current if self.recompute else batch.old_logprobs

    def pop_metrics(self) -> dict[str, float]:
        """The step's ``logprob_diff_max/mean`` and ``rollout_correction/*`` over its
        tokens on every rank, then a fresh count."""
        if not (self.active and self.measure):
            return {}
        self.totals.gather(self.dist)  # every rank measured its own share of the step's rows
        metrics = self.totals.metrics()
        self.totals = MismatchTotals()
        return metrics
