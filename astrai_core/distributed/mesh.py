"""The data-parallel DeviceMesh of the ``parallel:`` section and its checks."""

from __future__ import annotations

from typing import Any

from astrai_core.errors import FieldError

REPLICATE, SHARD = "dp_replicate", "dp_shard"


def mesh_shape(world_size: int, parallel: Any) -> tuple[int, int]:
    """(dp_replicate, dp_shard) for ``world_size`` ranks; FieldError when they do not fit."""
    replicate = parallel.dp_replicate
    if world_size % replicate:
        raise FieldError(("parallel", REPLICATE), f"{replicate} replicas do not divide the "
                         f"{world_size} processes of this run")
    shard = world_size // replicate if parallel.dp_shard == -1 else parallel.dp_shard
    if replicate * shard != world_size:
        raise FieldError(("parallel", SHARD), f"dp_replicate={replicate} x dp_shard={shard} "
                         f"is {replicate * shard} ranks, but the run has {world_size} "
                         "processes (dp_shard: -1 fills in the rest)")
    return replicate, shard


def build_mesh(device_type: str, world_size: int, parallel: Any) -> Any:
    """A 1-D (dp_shard,) mesh, or a 2-D (dp_replicate, dp_shard) one for HSDP/DDP-style
    replication."""
    from torch.distributed.device_mesh import init_device_mesh

    replicate, shard = mesh_shape(world_size, parallel)
    if replicate == 1:
        return init_device_mesh(device_type, (shard,), mesh_dim_names=(SHARD,))
    return init_device_mesh(device_type, (replicate, shard), mesh_dim_names=(REPLICATE, SHARD))


def check_parallel(config: Any, world_size: int) -> None:
    """Plan-time checks of a run on ``world_size`` processes (FieldError naming the field):
    the mesh fits, and the global batch splits evenly over the data-parallel ranks."""
    if world_size == 1:
        return
    mesh_shape(world_size, config.parallel)
    batch = config.data.batch_size
    size = config.parallel.context_parallel
    data_ranks = world_size // size if world_size % size == 0 else world_size
    if batch % data_ranks:
        raise FieldError(("data", "batch_size"), f"the global batch of {batch} cannot be split "
                         f"evenly over {data_ranks} data-parallel ranks; make it a multiple "
                         f"of {data_ranks}")
