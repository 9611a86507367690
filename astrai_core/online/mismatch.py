"""The sampler/trainer log-prob mismatch and the rollout-correction weights, measured once.

Both ways the loop gets the old policy's log-probs measure through :func:`measure`: the
no-grad forward over the whole rollout (:mod:`astrai_core.online.prepare`), and the
training forwards of a rollout whose no-grad forward was skipped, one micro-batch at a
time (:mod:`astrai_core.online.deferred`). A measurement is a tally, a mean as (its sum,
its count) and a maximum as (its value, None), so that the tallies of micro-batches and
ranks add up to the whole rollout's metrics (:class:`MismatchTotals`):
``rollout/logprob_diff_max`` (read by ``rollout.max_logprob_diff``,
:mod:`astrai_core.training.push_check`) and ``_mean``, and with ``rollout_correction``
the ``rollout_correction/*`` metrics of the weights.
"""

from __future__ import annotations

import math

import torch

from astrai_core.distributed.context import DistContext
from astrai_core.rl.functional import masked_max, masked_sum
from astrai_core.rl.rollout_correction import (
    RolloutCorrectionConfig,
    correction_weights,
    metric_counts,
)
from astrai_core.training.push_check import MISMATCH

CORRECTION = "rollout_correction/"

# metric name -> (a mean's sum and count) or (a maximum, None)
Tally = dict[str, tuple[torch.Tensor, torch.Tensor | None]]


def measure(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor,
            correction: RolloutCorrectionConfig | None, prefix: str = "rollout/"
            ) -> tuple[torch.Tensor | None, Tally]:
    """The trainer's log-probs against the sampler's over the ``mask``-ed tokens: (with a
    ``correction``, the importance weights [N, T], else None; the tally of
    ``{prefix}logprob_diff_max/mean`` and of the weights' ``rollout_correction/*``)."""
    diff = (trainer - sampler).abs()
    name = prefix + MISMATCH
    tally: Tally = {name + "max": (masked_max(diff, mask), None),
                    name + "mean": (masked_sum(diff, mask), mask.sum())}
    if correction is None:
        return None, tally
    weights, metrics = correction_weights(trainer, sampler, mask, correction)
    counts = metric_counts(mask, correction)  # weight_max has none: a maximum
    for key, value in metrics.items():
        count = counts.get(key)
        tally[CORRECTION + key] = (value, None) if count is None else (value * count, count)
    return weights, tally


def rollout_mismatch(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor,
                     correction: RolloutCorrectionConfig | None = None,
                     prefix: str = "rollout/") -> tuple[torch.Tensor | None, dict[str, float]]:
    """:func:`measure` over a whole rollout at once: (the weights, the metrics)."""
    weights, tally = measure(trainer, sampler, mask, correction, prefix)
    totals = MismatchTotals()
    totals.add(tally)
    return weights, totals.metrics()


class MismatchTotals:
    """Tallies added up (micro-batches, ranks) into metrics: means over all their tokens,
    the largest maxima (a NaN stays, so that ``rollout.max_logprob_diff`` stops the run)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, int | None]] = {}

    def add(self, tally: Tally) -> None:
        """Add a tally, in one host transfer."""
        if not tally:
            return
        numbers = iter(torch.stack([part.float() for pair in tally.values() for part in pair
                                    if part is not None]).tolist())
        for key, (_, count) in tally.items():
            self._add(key, next(numbers), None if count is None else round(next(numbers)))

    def gather(self, dist: DistContext) -> None:
        """Every rank's totals combined, on every rank (collective when distributed)."""
        if not dist.enabled:
            return
        shares = dist.all_gather_object(self._entries)
        self._entries = {}
        for entries in shares:
            for key, (value, count) in entries.items():
                self._add(key, value, count)

    def metrics(self) -> dict[str, float]:
        """The metrics so far (no token at all: 0, as :func:`correction_weights` reports)."""
        return {key: value if count is None else value / max(count, 1)
                for key, (value, count) in self._entries.items()}

    def _add(self, key: str, value: float, count: int | None) -> None:
        if count is None:  # weights and differences are >= 0
            current = self._entries.get(key, (0.0, None))[0]
            self._entries[key] = (value if math.isnan(value) or value > current else current,
                                  None)
        else:
            total, counted = self._entries.get(key, (0.0, 0))
            self._entries[key] = (total + value, (counted or 0) + count)
