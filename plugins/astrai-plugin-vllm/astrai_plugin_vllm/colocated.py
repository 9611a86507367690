"""Colocated engines in an N-process run: one vLLM engine per rank, or per group of
``tensor_parallel_size`` ranks, beside the trainer's FSDP shards.

vLLM's ``external_launcher`` executor is made for this: every process of the job (started
by torchrun, its process group already up) runs its own engine core in-process, and vLLM
lays its groups over the same processes (tensor-parallel groups of consecutive ranks,
data-parallel across them). Each data-parallel engine samples the prompts its ranks hold;
the ranks of one tensor-parallel group pool their prompts, since they run one engine
together and must all submit the same requests.

Weights reach the engines bucket by bucket: the trainer's shards are gathered into full
tensors at most ``bucket_bytes`` at a time, converted to Hugging Face names per bucket, and
streamed into vLLM's layerwise reload; no rank holds the whole state.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from astrai_core.api import ConfigError


def world() -> tuple[int, int]:
    """(rank, world size) of the running job; (0, 1) outside torch.distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def launcher_args(world_size: int, tensor_parallel_size: int) -> dict[str, Any]:
    """The engine arguments that lay the engines over a job of ``world_size`` processes."""
    if world_size == 1:
        return {}
    if world_size % tensor_parallel_size:
        raise ConfigError(f"sampler.tensor_parallel_size: {tensor_parallel_size} does not divide "
                          f"the run's {world_size} processes (each group of that many ranks "
                          "drives one vLLM engine)")
    return {"distributed_executor_backend": "external_launcher",
            "data_parallel_size": world_size // tensor_parallel_size}


def hf_stream(importer: Any, config: Any, buckets: Iterable[dict[str, torch.Tensor]],
              moe_layout: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) for the native tensors arriving in ``buckets``.

    A tensor map may need several native tensors (all experts of a layer, say); those
    that arrive before their group is complete wait here, the rest go out at once. A
    native tensor that no map names (a tied head) has no HF tensor of its own."""
    owner = {name: tensor_map for tensor_map in importer.weight_map(config, moe_layout)
             for name in tensor_map.native}
    waiting: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        for name, tensor in bucket.items():
            tensor_map = owner.get(name)
            if tensor_map is None:
                continue
            waiting[name] = tensor
            if all(native in waiting for native in tensor_map.native):
                converted = tensor_map.to_hf([waiting.pop(native) for native in tensor_map.native])
                yield from zip(tensor_map.hf, converted, strict=True)
    if waiting:
        raise RuntimeError(f"weight push incomplete: {sorted(waiting)[:3]} arrived without the "
                           "rest of their tensor group")


# vLLM's CPU shared-memory communicator (tensor/pipeline-parallel groups) names its
# segments after the group alone under the external launcher ("-tp:0-[0-1]-cpushm_0"),
# and a process that exits without vLLM's teardown (torchrun workers leave with os._exit)
# leaves them behind: the next such run on the machine would fail to create them (EEXIST).
CPU_SHM_SEGMENTS = ("/dev/shm/-tp:*-cpushm_*", "/dev/shm/-pp:*-cpushm_*")


def clear_stale_cpu_shm(tensor_parallel_size: int) -> None:
    """Before a CPU tensor-parallel engine starts: rank 0 removes the segments an earlier
    run left (a collective: every rank waits for it)."""
    import glob

    import torch.distributed as dist
    from vllm.platforms import current_platform

    rank, world_size = world()
    if world_size == 1 or tensor_parallel_size == 1 or not current_platform.is_cpu():
        return
    if rank == 0:
        for path in (p for pattern in CPU_SHM_SEGMENTS for p in glob.glob(pattern)):
            os.unlink(path)
    dist.barrier()


class PromptPool:
    """The ranks of one tensor-parallel group submit the same requests to their shared
    engine: each gathers the group's requests, and keeps its own share of the outputs."""

    def __init__(self, tensor_parallel_size: int) -> None:
        import torch.distributed as dist

        rank, world_size = world()
        self.group = None
        self.size = tensor_parallel_size
        if tensor_parallel_size == 1 or world_size == 1:
            return
        # new_group is a collective over every rank: all groups are made by all ranks
        for first in range(0, world_size, tensor_parallel_size):
            ranks = list(range(first, first + tensor_parallel_size))
            group = dist.new_group(ranks, backend="gloo")  # pickled requests: CPU objects
            if rank in ranks:
                self.group = group

    def run(self, prompts: Sequence[Any], params: Sequence[Any], generate: Any) -> list[Any]:
        """``generate(prompts, params)`` on the group's pooled requests; this rank's outputs."""
        if self.group is None:
            return generate(list(prompts), list(params)) if prompts else []
        import torch.distributed as dist

        shares: list[Any] = [None] * self.size
        dist.all_gather_object(shares, (list(prompts), list(params)), group=self.group)
        pooled_prompts = [p for share in shares for p in share[0]]
        pooled_params = [p for share in shares for p in share[1]]
        if not pooled_prompts:  # a split evaluation's rank with nothing left, group-wide
            return []
        outputs = generate(pooled_prompts, pooled_params)
        mine = dist.get_group_rank(self.group, world()[0])
        start = sum(len(share[0]) for share in shares[:mine])
        return outputs[start:start + len(prompts)]
