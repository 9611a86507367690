"""Distributed training: torch.distributed process groups, the FSDP2 mesh, rank-sharded
data, global reductions and sharded checkpoints (DESIGN.md, "Scale").

A one-process run uses :data:`SINGLE` and every helper here is then the identity, so the
trainer and the strategies have one code path for 1 and N processes.
"""

from astrai_core.distributed.context import SINGLE, DistContext

__all__ = ["SINGLE", "DistContext"]
