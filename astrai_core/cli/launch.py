"""``astrai train CONFIG --nproc-per-node N [...]``: launch the run through torchrun.

The launcher checks the config once, for the world size it is about to start, then hands
torchrun's own launcher (``torch.distributed.run``) the same ``astrai train`` command for
every process. When a process fails, torchrun stops the others and this names it and
returns a non-zero status (a failed rank printed its own error; one killed by a signal
could not, and the line says so). SIGINT and SIGTERM reach every rank through torchrun,
which checkpoint at the end of their step; the launcher then ends with one line. Inside each process,
:func:`worker_errors` keeps the ranks that merely lost a peer to one line, so a failure's
message appears once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
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
    else:  # one machine: a free port, found by torchrun; peers reached over loopback
        argv += ["--standalone", "--local-addr=127.0.0.1"]
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

    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        run(get_args_parser().parse_args(torchrun_argv(args)))
    except (SignalException, KeyboardInterrupt) as stopped:
        # torchrun's agent has already sent the signal on to every rank, which checkpoints
        # at the end of its step (it is killed if that takes over torchrun's 30 s)
        signum = int(getattr(stopped, "sigval", signal.SIGINT))
        print(f"error: stopped by {signal.Signals(signum).name}: every rank was sent it and "
              "saves a checkpoint at the end of its step; continue with --resume",
              file=sys.stderr)
        return 128 + signum
    except ChildFailedError as failed:
        rank, code = culprit({r: (f.exitcode, f.timestamp) for r, f in failed.failures.items()})
        print(f"error: the distributed run failed: {_failure(rank, code)}", file=sys.stderr)
        return code if code > 0 else 1
    return 0


# How a process ended, most likely the cause first: killed by a signal from outside (or a
# crash); an error it raised and printed; an abort (gloo's threads abort a process whose
# peer went away); SIGTERM, which torchrun sends the survivors once one process failed.
_CONSEQUENCES = {-signal.SIGABRT: 2, -signal.SIGTERM: 3}


def culprit(failures: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(rank, exit code) of the process whose failure caused the others', from ``{rank:
    (exit code, timestamp)}``: by how it ended (see ``_CONSEQUENCES``), then the earliest
    (torchrun's timestamps are whole seconds, so a cause and its consequences often tie),
    then the lowest rank."""
    def order(rank: int) -> tuple[int, int, int]:
        code, stamp = failures[rank]
        kind = _CONSEQUENCES.get(code, 0 if code < 0 else 1)
        return kind, stamp, rank

    rank = min(failures, key=order)
    return rank, failures[rank][0]


def _failure(rank: int, code: int) -> str:
    """What happened to the failed ``rank``: an error it printed, or a signal it could not
    report (SIGKILL: out of memory, or killed from outside)."""
    if code >= 0:
        return f"rank {rank} exited with status {code} (its error is printed above)"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return (f"rank {rank} was killed by {name} (signal {-code}) and could print no error "
            "of its own (out of memory, or killed from outside?)")


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
