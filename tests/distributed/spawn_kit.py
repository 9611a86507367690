"""Checks run on spawned gloo processes: each rank calls ``check(rank, *args)`` inside one
process group, and whatever any rank raised fails the test, with its traceback."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, init: str, world: int, check: Callable[..., None],
            args: tuple[Any, ...], errors: Any) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        check(rank, *args)
    except BaseException:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
    dist.barrier()  # neither rank takes the group down while the other still uses it
    dist.destroy_process_group()
    # torch 2.13's gloo sometimes aborts a process in the interpreter's teardown
    # ("terminate called"), after its work is done: leave without it
    os._exit(0)


def spawn_checks(tmp_path: Path, check: Callable[..., None], *args: Any,
                 world: int = 2) -> None:
    """``check(rank, *args)`` (a module-level function) on ``world`` spawned processes;
    an AssertionError with every failing rank's traceback."""
    errors = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(f"file://{tmp_path / 'store'}", world, check, args, errors),
             nprocs=world)
    problems = []
    while not errors.empty():
        problems.append(errors.get())
    assert not problems, "\n".join(problems)
