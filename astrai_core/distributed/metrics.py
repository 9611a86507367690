"""A step's metrics reduced over the ranks, as the one-process run would compute them.

Each rank's micro-batch loss and metrics are means over its share of the rows; weighted
by the share's loss weight (its tokens, when the loss is token-weighted) the global value
is the one-process mean. Counts (``tokens``) are summed. One all-reduce per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from astrai_core.distributed.context import DistContext

SUMMED = frozenset({"tokens"})


@dataclass
class MicroBatchRecord:
    """One micro-batch's loss, its loss weight (None: unweighted) and its metrics."""

    loss: float
    weight: float | None
    metrics: dict[str, Any]


def reduce_micro_batches(records: list[MicroBatchRecord], dist: DistContext
                         ) -> list[MicroBatchRecord]:
    """The global record of each micro-batch (the identity in a one-process run)."""
    if not dist.enabled or not records:
        return records
    names = sorted(records[0].metrics)
    every = dist.all_gather_object([sorted(r.metrics) for r in records])
    if any(rank != every[0] for rank in every):
        raise RuntimeError("the ranks' compute_loss returned different metric names; a "
                           "metric must be reported on every rank")
    flat: list[float] = []
    for record in records:
        weight = 1.0 if record.weight is None else record.weight
        flat += [weight, record.loss * weight]
        flat += [float(record.metrics[n]) * (1.0 if n in SUMMED else weight) for n in names]
    summed = dist.all_reduce_sum(flat)
    width = 2 + len(names)
    reduced = []
    for index, record in enumerate(records):
        row = summed[index * width:(index + 1) * width]
        total = row[0] or 1.0
        metrics = {n: _summed(row[2 + i], record.metrics[n]) if n in SUMMED
                   else row[2 + i] / total for i, n in enumerate(names)}
        reduced.append(MicroBatchRecord(row[1] / total,
                                        None if record.weight is None else row[0], metrics))
    return reduced


def combine_shares(dist: DistContext, count: int, metrics: dict[str, float]) -> dict[str, float]:
    """Means over this rank's share of ``count`` items (``{}`` when it had none) -> the
    means over every rank's items, each rank's weighted by its count (the identity in a
    one-process run)."""
    if not dist.enabled:
        return metrics
    shares = dist.all_gather_object((count, metrics))
    total = sum(n for n, _ in shares)
    names = next((m for _, m in shares if m), {})
    return {name: sum(n * m[name] for n, m in shares if m) / total for name in names}


def _summed(total: float, local: Any) -> Any:
    """A summed count keeps the type it had on one rank (an int stays an int)."""
    return round(total) if isinstance(local, int) else total


class NullMetricsLog:
    """What the ranks other than 0 write: nothing."""

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Discard ``metrics`` (rank 0 writes metrics.jsonl)."""
