"""The trainer's processes in a distributed run (torchrun): rank 0 drives the rollout
workers; every rank sends its share of the prompts through rank 0 and takes part in the
weight gathers, whose buckets only rank 0 sends on.

Every method is a collective over the trainer's default process group (the identity in a
one-process trainer); the ranks call them in step, as they call ``generate`` and
``update_weights``.
"""

from __future__ import annotations

from typing import Any


class TrainerRanks:
    """This trainer process's rank, and the object collectives the ray sampler needs."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.enabled = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.enabled else 0
        self.world_size = dist.get_world_size() if self.enabled else 1

    @property
    def leader(self) -> bool:
        """Whether this rank holds the workers (rank 0)."""
        return self.rank == 0

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (on every rank)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def scatter(self, parts: list[Any] | None) -> Any:
        """``parts[r]`` (given on rank 0) on rank r."""
        if not self.enabled:
            assert parts is not None
            return parts[0]
        import torch.distributed as dist

        out: list[Any] = [None]
        dist.scatter_object_list(out, parts if self.leader else None, src=0)
        return out[0]
