"""``astrai train CONFIG --nproc-per-node N [...]``: launch the run through torchrun.

The launcher checks the config once, for the world size it is about to start, then hands
torchrun's own launcher (``torch.distributed.run``) the same ``astrai train`` command for
every process. When a process fails, torchrun stops the others and this names the one
whose failure caused the others' and returns a non-zero status, with that rank's own
error line when it reported one (:mod:`astrai_core.distributed.worker_report`), or the
signal that killed it, or, for a rank that froze (its peers timed out waiting for it),
the progress it had made. SIGINT and SIGTERM reach every rank through torchrun, which
checkpoint at the end of their step; a second one stops them at once. The launcher ends
with one line. Inside each process, :func:`worker_errors` keeps the ranks that merely lost
a peer to one line, so a failure's message appears once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from astrai_core.distributed.rendezvous import BACKEND, LOOPBACK, endpoint
from astrai_core.distributed.worker_report import record_error
from astrai_core.distributed.world import launched_world_size, scoped_env

DEFAULT_PORT = 29500


def launcher_argv(args: argparse.Namespace, log_dir: Path | None = None) -> list[str]:
    """torchrun's own options for ``args`` (``nproc_per_node``, ``nnodes``, ``node_rank``,
    ``master_addr``, ``master_port``); ``log_dir``: where torchrun puts each process's
    error file."""
    argv = [f"--nproc-per-node={args.nproc_per_node}", f"--nnodes={args.nnodes}",
            f"--node-rank={args.node_rank}", "--max-restarts=0"]
    if log_dir is not None:
        argv.append(f"--log-dir={log_dir}")
    # the store listens on the address named (one machine: loopback, on a free port)
    host, port = args.master_addr or LOOPBACK, args.master_port
    if port is None:
        port = DEFAULT_PORT if args.master_addr or args.nnodes > 1 else 0
    argv += [f"--rdzv-backend={BACKEND}", f"--rdzv-endpoint={endpoint(host, port)}",
             f"--rdzv-conf=rank={args.node_rank}"]
    return argv


def command_argv(args: argparse.Namespace, command: list[str]) -> list[str]:
    """What torchrun starts in each process: ``astrai`` (or a wrapping driver) running
    ``command``, with this launcher's log options."""
    worker = getattr(args, "worker_module", ("astrai_core.cli.main",))  # a wrapping driver's
    return ["--module", *worker, f"--log-format={getattr(args, 'log_format', 'auto')}",
            f"--log-level={getattr(args, 'log_level', 'info')}", *command]


def torchrun_argv(args: argparse.Namespace, log_dir: Path | None = None) -> list[str]:
    """torchrun's arguments for ``args`` (the `astrai train` namespace)."""
    command = ["train", args.config, *[f"--set={override}" for override in args.overrides]]
    command += ["--resume"] * args.resume + ["--overwrite"] * args.overwrite
    return launcher_argv(args, log_dir) + command_argv(args, command)


def launch(args: argparse.Namespace, loaded: Any) -> int:
    """Check ``loaded`` for the launch's world size, then run every local process."""
    from astrai_core.errors import ConfigError

    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise ConfigError("--nproc-per-node and --nnodes must be >= 1")
    if not 0 <= args.node_rank < args.nnodes:
        raise ConfigError(f"--node-rank must be in 0..{args.nnodes - 1}")
    from astrai_core.config.plan import plan_run

    with scoped_env({"WORLD_SIZE": str(args.nproc_per_node * args.nnodes)}):
        plan_run(loaded.config, loaded.source)  # a bad config fails here, once
    return run_processes(lambda log_dir: torchrun_argv(args, log_dir), _stopped)


def run_processes(argv_of: Callable[[Path], list[str]], stopped: Callable[[str, bool], str]) -> int:
    """Run torchrun's launcher on ``argv_of(log_dir)`` and wait for every local process;
    a failed process is named in one line, and a stop by signal is ``stopped(signal name,
    whether a second signal came)``'s line; the exit status."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its warning
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import get_args_parser, run

    from astrai_core.distributed.rendezvous import create_handler

    # the same creator torchrun registers from the entry point when the package is installed
    rendezvous_handler_registry.register(BACKEND, create_handler)

    from astrai_core.cli.failed_rank import blame
    from astrai_core.distributed.worker_report import ending_of

    # torchrun's log directory: each process's error file and progress (worker_report)
    log_dir = Path(tempfile.mkdtemp(prefix="astrai-launch-"))
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        run(get_args_parser().parse_args(argv_of(log_dir)))
    except (SignalException, KeyboardInterrupt) as stopped_by:
        for signum in STOP_SIGNALS:  # torchrun's handlers would raise again mid-message
            signal.signal(signum, signal.SIG_IGN)
        signum = int(getattr(stopped_by, "sigval", signal.SIGINT))
        print(f"error: {stopped(signal.Signals(signum).name, _second_signal(stopped_by))}",
              file=sys.stderr)
        return 128 + signum
    except ChildFailedError as failed:
        endings = {rank: ending_of(f, log_dir) for rank, f in failed.failures.items()}
        rank, what = blame(endings)
        print(f"error: the distributed run failed: {what}", file=sys.stderr)
        code = endings[rank].code
        return code if code > 0 else 1
    finally:
        for signum, handler in handlers.items():
            if signal.getsignal(signum) is not signal.SIG_IGN and handler is not None:
                signal.signal(signum, handler)
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _second_signal(stopped: BaseException) -> bool:
    """Whether a second signal came while torchrun was stopping the ranks after the first
    (it then raises again from inside its shutdown, which sends every rank SIGTERM: as
    their second signal, it stops them at once)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return isinstance(stopped.__context__, (SignalException, KeyboardInterrupt))


def _stopped(name: str, at_once: bool) -> str:
    if at_once:
        return (f"stopped at once by a second {name}: every rank was stopped without "
                "finishing the checkpoint it was writing (the next run removes it); "
                "continue with --resume from the previous one")
    # torchrun's agent has already sent the signal on to every rank, which checkpoints
    # at the end of its step (it is killed if that takes over torchrun's 30 s)
    return (f"stopped by {name}: every rank was sent it and saves a checkpoint at the end "
            "of its step; continue with --resume")


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
        line = ("stopped: a collective failed, most likely because another rank failed or "
                f"froze (the launcher names it): {first[:200]}")
        print(f"[rank {os.environ.get('RANK', '?')}] {line}", file=sys.stderr)
        record_error(line, lost_peer=True)
        raise SystemExit(1) from None
