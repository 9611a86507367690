"""``astrai train CONFIG --nproc-per-node N [...]``: launch the run through torchrun.

The launcher checks the config once, for the world size it is about to start, then hands
torchrun's own launcher (``torch.distributed.run``) the same ``astrai train`` command for
every process. When a process fails, torchrun stops the others and this returns a
non-zero status; the failed rank printed its own error. Inside each process,
:func:`worker_errors` keeps the ranks that merely lost a peer to one line, so a failure's
message appears once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from astrai_core.distributed.world import launched_world_size

DEFAULT_PORT = 29500


@contextlib.contextmanager
def world_size_env(world_size: int) -> Iterator[None]:
    """``WORLD_SIZE`` set to ``world_size`` while the launcher plans the run for it."""
    saved = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = saved


def torchrun_argv(args: argparse.Namespace) -> list[str]:
    """torchrun's arguments for ``args`` (the `astrai train` namespace)."""
    argv = [f"--nproc-per-node={args.nproc_per_node}", f"--nnodes={args.nnodes}",
            f"--node-rank={args.node_rank}", "--max-restarts=0"]
    if args.master_addr or args.master_port or args.nnodes > 1:
        argv += [f"--master-addr={args.master_addr or '127.0.0.1'}",
                 f"--master-port={args.master_port or DEFAULT_PORT}"]
    else:
        argv.append("--standalone")  # one machine: a free port, found by torchrun
    command = [f"--log-format={getattr(args, 'log_format', 'auto')}",
               f"--log-level={getattr(args, 'log_level', 'info')}", "train", args.config]
    command += [f"--set={override}" for override in args.overrides]
    command += ["--resume"] * args.resume + ["--overwrite"] * args.overwrite
    worker = getattr(args, "worker_module", ("astrai_core.cli.main",))  # a wrapping driver's
    return argv + ["--module", *worker, *command]


def launch(args: argparse.Namespace, loaded: Any) -> int:
    """Check ``loaded`` for the launch's world size, then run every local process."""
    from astrai_core.errors import ConfigError

    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise ConfigError("--nproc-per-node and --nnodes must be >= 1")
    if not 0 <= args.node_rank < args.nnodes:
        raise ConfigError(f"--node-rank must be in 0..{args.nnodes - 1}")
    from astrai_core.config.plan import plan_run

    with world_size_env(args.nproc_per_node * args.nnodes):
        plan_run(loaded.config, loaded.source)  # a bad config fails here, once
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its warning
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    try:
        run(get_args_parser().parse_args(torchrun_argv(args)))
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        code = failure.exitcode
        how = f"signal {-code}" if code < 0 else f"status {code}"
        print(f"error: the distributed run failed: rank {rank} exited with {how} (its error "
              "is printed above)", file=sys.stderr)
        return code if code > 0 else 1
    return 0


def _lost_peer(error: BaseException) -> bool:
    """A collective failed because another rank is gone (or the group timed out)."""
    import torch

    if isinstance(error, getattr(torch.distributed, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        mark in text for mark in ("Connection closed by peer", "Connection reset by peer",
                                  "gloo", "NCCL", "HCCL", "timed out"))


@contextlib.contextmanager
def worker_errors() -> Iterator[None]:
    """In a distributed process: a collective that failed because another rank failed
    ends this one with a single line (the failed rank prints the real error)."""
    try:
        yield
    except Exception as error:
        if launched_world_size() == 1 or not _lost_peer(error):
            raise
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"[rank {os.environ.get('RANK', '?')}] stopped: a collective failed, most likely because another "
              f"rank failed (its error is printed above): {first[:200]}", file=sys.stderr)
        raise SystemExit(1) from None
