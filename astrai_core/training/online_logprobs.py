"""Old log-probs from the training forward, for rollouts whose no-grad forward was skipped.

With ``epochs x mini_batches = 1`` each rollout row is trained on exactly once, by the
policy that sampled it, so the strategy's training forward can stand in for the no-grad
trainer forward over the rollout (see :mod:`astrai_core.training.online`): its detached
log-probs are the old (proximal) policy's (recompute), it measures the sampler/trainer
mismatch (``logprob_diff_max/mean``) the skipped forward would have measured, and with
``rollout_correction`` it weighs each micro-batch's tokens against the sampler's
log-probs (``extras["rollout_weights"]``) and gathers the ``rollout_correction/*``
metrics. Rows are whole in a micro-batch (padded or packed), so per-token and
per-sequence weights are those of the whole rollout; the step's metrics are combined
over its micro-batches and ranks.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from astrai_core.distributed.context import SINGLE, DistContext
from astrai_core.rl.functional import masked_max, masked_sum
from astrai_core.rl.rollout_correction import (
    RolloutCorrectionConfig,
    correction_weights,
    metric_counts,
)
from astrai_core.rollout.batch import RolloutBatch

CORRECTION = "rollout_correction/"


def may_defer(config: Any, capable: bool, recompute: bool) -> bool:
    """Whether a rollout's training forward may stand in for its no-grad one, for a strategy
    (``capable``: its loss takes old log-probs through ``old_logprobs_for``) with the online
    options ``config``."""
    if not capable or config.epochs * config.mini_batches != 1:
        return False
    if config.router_replay == "R2":
        return False  # the routing to replay is recorded by the no-grad forward
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
        self._reset()

    def start(self, *, recompute: bool, measure: bool, prefix: str,
              correction: RolloutCorrectionConfig | None = None) -> None:
        """The current rollout's old log-probs (and, with ``correction``, its rollout
        weights) come from its training forwards."""
        self.active, self.recompute, self.measure, self.prefix = True, recompute, measure, prefix
        self.correction = correction
        self._reset()

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
        self._tally(self._measured(batch, current))
        return current if self.recompute else batch.old_logprobs

    def _measured(self, batch: RolloutBatch, current: torch.Tensor
                  ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """The micro-batch's metrics against the sampler's log-probs, by name: (its sum and
        count) for a mean, (its maximum, None) for a maximum; with a correction, it sets
        the batch's rollout weights."""
        mask, sampler = batch.response_mask, batch.old_logprobs
        tally: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        if self.measure:
            diff = (current - sampler).abs()
            name = f"{self.prefix}logprob_diff_"
            tally[name + "mean"] = (masked_sum(diff, mask), mask.sum())
            tally[name + "max"] = (masked_max(diff, mask), None)
        if self.correction is not None:
            weights, metrics = correction_weights(current, sampler, mask, self.correction)
            batch.extras["rollout_weights"] = weights
            counts = metric_counts(mask, self.correction)  # weight_max has none: a maximum
            for key, value in metrics.items():
                count = counts.get(key)
                tally[CORRECTION + key] = (value, None) if count is None else \
                    (value * count, count)
        return tally

    def _tally(self, tally: dict[str, tuple[torch.Tensor, torch.Tensor | None]]) -> None:
        """Add a micro-batch's sums and maxima to the step's, in one host transfer."""
        if not tally:
            return
        numbers = iter(torch.stack([part.float() for pair in tally.values() for part in pair
                                    if part is not None]).tolist())
        for key, (_, count) in tally.items():
            if count is None:
                self._largest(key, next(numbers))
            else:
                self._add(key, next(numbers), round(next(numbers)))

    def pop_metrics(self) -> dict[str, float]:
        """The step's ``logprob_diff_max/mean`` and ``rollout_correction/*`` over its
        tokens on every rank, then a fresh count."""
        if not (self.active and self.measure):  # a correction always measures
            return {}
        if self.dist.enabled:  # every rank measured its own share of the step's rows
            shares = self.dist.all_gather_object((self._totals, self._maxima))
            self._reset()
            for totals, maxima in shares:
                for key, (total, count) in totals.items():
                    self._add(key, total, count)
                for key, value in maxima.items():
                    self._largest(key, value)
        # no token at all: 0, as the no-grad forward and correction_weights report it
        metrics = {key: total / max(count, 1) for key, (total, count) in self._totals.items()}
        metrics.update(self._maxima)
        self._reset()
        return metrics

    def _reset(self) -> None:
        self._totals: dict[str, tuple[float, int]] = {}  # a mean's (sum, count) so far
        self._maxima: dict[str, float] = {}  # weights and differences are >= 0

    def _add(self, key: str, total: float, count: int) -> None:
        old_total, old_count = self._totals.get(key, (0.0, 0))
        self._totals[key] = (old_total + total, old_count + count)

    def _largest(self, key: str, value: float) -> None:
        current = self._maxima.get(key, 0.0)  # a NaN stays (rollout.max_logprob_diff fails)
        self._maxima[key] = value if math.isnan(value) or value > current else current
