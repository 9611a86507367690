"""Which process this is in a distributed run, and the few collectives the trainer needs.

torchrun (or ``astrai train --nproc-per-node N``) starts one process per device and sets
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; :func:`init_distributed` then creates the
process group on the device backend's own collective library (gloo, nccl, hccl) with a
timeout, and the data-parallel mesh. HSDP replicates over ``dp_replicate`` and shards over
``dp_shard``; the data is split over the data-parallel ranks: every rank, or, with
``parallel.context_parallel`` N, every group of N consecutive ranks, which split each
row's tokens among them (the parameters stay sharded over all ranks).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from astrai_core.distributed.loopback import loopback_collectives
from astrai_core.distributed.world import launched_world_size
from astrai_core.log import get_logger

log = get_logger("astrai.distributed")


@dataclass(frozen=True)
class DistContext:
    """This process's place in the run; :data:`SINGLE` for a one-process run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    mesh: Any = None                     # a DeviceMesh (dp_replicate, dp_shard) or (dp_shard,)
    # context parallel: consecutive ranks, context_size of them, split each row's tokens
    # (parallel.context_parallel); they read the same rows, a data-parallel rank's
    context_size: int = 1
    context_group: Any = None
    # the process group of the collectives below (None: every process of the run)
    group: Any = None

    @property
    def data_rank(self) -> int:
        """This rank's data-parallel index: which share of each batch's rows it reads."""
        return self.rank // self.context_size

    @property
    def data_world(self) -> int:
        """The data-parallel ranks (every context group is one)."""
        return self.world_size // self.context_size

    @property
    def context_rank(self) -> int:
        """This rank's index in its context group: which shard of each row's tokens."""
        return self.rank % self.context_size

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- collectives (the identity in a one-process run) -------------------------------
    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier(group=self.group)

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over the ranks of a list of floats (float64, one collective)."""
        if not self.enabled or not values:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor, group=self.group)
        return tensor.tolist()

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over the ranks of ``tensor`` (a new tensor, no gradient)."""
        if not self.enabled:
            return tensor.detach()
        total = tensor.detach().clone()
        torch.distributed.all_reduce(total, group=self.group)
        return total

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        if not self.enabled:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        source = 0 if self.group is None else torch.distributed.get_global_rank(self.group, 0)
        torch.distributed.broadcast_object_list(box, src=source, group=self.group)
        return box[0]

    def context_view(self) -> DistContext:
        """This rank's context group as a run of its own: its collectives span the group
        (the ranks that split each row's tokens; the identity without context
        parallelism)."""
        if self.context_size == 1:
            return self
        return DistContext(rank=self.context_rank, world_size=self.context_size,
                           local_rank=self.local_rank, device=self.device,
                           group=self.context_group)

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on some rank."""
        return bool(self.all_reduce_sum([float(flag)])[0]) if self.enabled else flag

    def all_gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` (same shape on each) concatenated along dim 0."""
        if not self.enabled:
            return tensor
        source = tensor.to(self.device)
        cast = source.dtype == torch.bool  # not every collective library moves bools
        if cast:
            source = source.to(torch.uint8)
        parts = [torch.empty_like(source) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, source.contiguous(), group=self.group)
        joined = torch.cat(parts, dim=0)
        return (joined.bool() if cast else joined).to(tensor.device)

    def finish(self) -> None:
        """End a run that completed on every rank: wait for all of them, then take the
        process group down, so that no rank exits while its peers' collectives still run
        (gloo's threads then abort the process at exit: "terminate called")."""
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    # -- data --------------------------------------------------------------------------
    def rank_slice(self, count: int, what: str = "rows") -> slice:
        """This rank's contiguous share of ``count`` items (an uneven split is an error):
        its data-parallel rank's (the ranks of a context group read the same rows)."""
        if count % self.data_world:
            raise ValueError(f"{count} {what} cannot be split evenly over {self.data_world} "
                             "data-parallel ranks")
        share = count // self.data_world
        return slice(self.data_rank * share, (self.data_rank + 1) * share)

    def sampling_slice(self, count: int) -> slice:
        """This process's contiguous share of ``count`` prompts to sample: every rank's,
        a context group's ranks included (they split their data rank's prompts, then
        gather the rollout within the group); an uneven split is an error."""
        if count % self.world_size:
            raise ValueError(f"{count} prompts cannot be split evenly over the "
                             f"{self.world_size} processes that sample them")
        share = count // self.world_size
        return slice(self.rank * share, (self.rank + 1) * share)

    def shard_rows(self, batch: Any) -> Any:
        """This rank's rows of a batch: a dict of tensors, a list, or a RolloutBatch."""
        if not self.enabled:
            return batch
        if isinstance(batch, dict):
            first = next(iter(batch.values()))
            rows = self.rank_slice(first.shape[0])
            return {name: tensor[rows] for name, tensor in batch.items()}
        if isinstance(batch, list):
            return batch[self.rank_slice(len(batch))]
        rows = self.rank_slice(len(batch))
        return batch.select(range(rows.start, rows.stop))


SINGLE = DistContext()


def init_distributed(backend: Any, parallel: Any) -> DistContext:
    """The run's context: :data:`SINGLE` outside torchrun (or with one process), else a
    process group on ``backend.dist_backend`` with ``parallel.timeout_seconds`` and the mesh."""
    world = launched_world_size()
    if world == 1:
        return SINGLE
    import torch.distributed as dist

    from astrai_core.distributed.mesh import build_mesh

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend.set_device(local_rank)
    device = backend.device(local_rank)
    with _loopback_collectives(backend):
        if not dist.is_initialized():
            timeout = datetime.timedelta(seconds=parallel.timeout_seconds)
            dist.init_process_group(backend=backend.dist_backend, timeout=timeout,
                                    device_id=device if device.type != "cpu" else None)
        mesh = build_mesh(device.type, world, parallel)  # its groups are created here too
        size = parallel.context_parallel
        group = _context_group(dist.get_rank(), world, size) if size > 1 else None
    context = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                          local_rank=local_rank, device=device, mesh=mesh,
                          context_size=size, context_group=group)
    quiet_other_ranks(context)
    log.info("distributed", world_size=world, backend=backend.dist_backend,
             mesh=dict(zip(context.mesh.mesh_dim_names, context.mesh.shape)),
             context_parallel=size)
    return context


def _context_group(rank: int, world: int, size: int) -> Any:
    """This rank's context group: ranks [k * size, (k + 1) * size). Every rank creates
    every group, in the same order (torch's rule for new_group)."""
    import torch.distributed as dist

    groups = [dist.new_group(list(range(start, start + size)))
              for start in range(0, world, size)]
    return groups[rank // size]


@contextlib.contextmanager
def _loopback_collectives(backend: Any) -> Iterator[None]:
    """While the run's groups are created: when every rank is on this machine (torchrun's
    ``LOCAL_WORLD_SIZE`` is the world size), the collective library listens on the
    loopback interface, not on the address the host name resolves to. Groups created
    later (a weight-push group to rollout workers elsewhere) are left as they were."""
    if os.environ.get("LOCAL_WORLD_SIZE") != os.environ.get("WORLD_SIZE"):
        yield
        return
    with loopback_collectives(backend):
        yield


def quiet_other_ranks(context: DistContext) -> None:
    """Only rank 0 talks: the other ranks log errors only (their failures still print)."""
    if context.is_main:
        return
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
