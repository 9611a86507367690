"""The processes of a multi-process Tinker server: their group, and the bases sharded over it.

torchrun (``astrai tinker --nproc-per-node N``) starts the processes; each joins the
process group on the device backend's collective library, loads every base model, and
shards it with FSDP2, one unit per decoder layer (as training does). Tenants' LoRA
adapters are added later, at run time: peft injects them beside the sharded layers as
plain tensors, whole on every rank.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from astrai_core.distributed.context import DistContext
from astrai_core.tinker.lockstep import CallChannel

COLLECTIVE_TIMEOUT_S = 600.0  # a call's collectives: a rank that waits longer gives up
IDLE_TIMEOUT = datetime.timedelta(days=3650)  # waiting for the next call: a server idles
# peft sizes a LoRA layer from the whole projection when the mesh dimension is "fsdp"
# (storage sharded, computation whole); under any other name it takes the local shard
MESH_DIM = "fsdp"


def join_ranks(backend: Any) -> tuple[DistContext, CallChannel]:
    """This process's place among the server's processes, and the channel of calls."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from astrai_core.config.parallel import ParallelConfig
    from astrai_core.distributed.context import init_distributed
    from astrai_core.distributed.loopback import loopback_collectives

    context = init_distributed(backend, ParallelConfig(timeout_seconds=COLLECTIVE_TIMEOUT_S))
    with loopback_collectives(backend):  # every process is on this machine
        idle = dist.new_group(backend=backend.dist_backend, timeout=IDLE_TIMEOUT)
        mesh = init_device_mesh(context.device.type, (context.world_size,),
                                mesh_dim_names=(MESH_DIM,))
    context = dataclasses.replace(context, mesh=mesh)
    return context, CallChannel(context, idle)


def shard_bases(engine: Any, context: DistContext) -> None:
    """FSDP2 over every base model of ``engine`` (before any adapter is added)."""
    from astrai_core.distributed.fsdp import shard_module

    for base in engine.bases.values():
        shard_module(base.model, context)
