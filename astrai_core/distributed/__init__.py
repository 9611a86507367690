"""Distributed training: torch.distributed process groups, the FSDP2 mesh, rank-sharded
data, global reductions and sharded checkpoints (docs/distributed.md says how a run scales).

A one-process run uses :data:`SINGLE` and every helper here is then the identity, so the
trainer and the strategies have one code path for 1 and N processes. (Nothing is
imported here: the run plan reads the world size without importing torch.)
"""
