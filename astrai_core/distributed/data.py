"""Rank-sharded training data.

Every rank reads the same global stream of batches (same shuffle, same packing) and keeps
its contiguous share of each batch's rows. So the N ranks together see exactly the rows
the one-process run sees in each step, and the loader's position is a global one: a
checkpoint resumes on any number of ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from astrai_core.distributed.context import DistContext


class RankShardedLoader:
    """``loader``'s batches cut to this rank's rows; position and state are the global ones."""

    def __init__(self, loader: Any, dist: DistContext) -> None:
        self.loader, self.dist = loader, dist

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.dist.shard_rows(next(self.loader))

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:  # kind, epoch, batch_size...
        return getattr(self.loader, name)


def shard_loader(loader: Any, dist: DistContext) -> Any:
    """``loader`` itself in a one-process run, else its rank-sharded view."""
    return RankShardedLoader(loader, dist) if dist.enabled else loader
