"""`astrai tinker --nproc-per-node N`: the server over N local processes.

The launcher checks the options and the port once, then starts N processes through
torchrun's launcher, as `astrai train --nproc-per-node` does (astrai's loopback
rendezvous; one line naming a process that failed). Each runs `astrai tinker` without
``--nproc-per-node``; with torchrun's ``WORLD_SIZE`` > 1 it joins the others
(:mod:`astrai_core.tinker.ranks`): rank 0 serves HTTP through a
:class:`~astrai_core.tinker.lockstep.LockstepEngine`, the others run its calls in step.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astrai_core.errors import AstraiError


def rank_command(args: argparse.Namespace) -> list[str]:
    """The `astrai tinker` command each process runs (the key travels in the environment,
    not on a command line other users can read)."""
    command = ["tinker", *[f"--model={spec}" for spec in args.model], f"--host={args.host}",
               f"--port={args.port}", f"--state-dir={args.state_dir}",
               f"--max-adapters={args.max_adapters}", f"--max-datums={args.max_datums}",
               f"--max-body-mb={args.max_body_mb}", f"--device={args.device}"]
    if args.max_datum_tokens is not None:
        command.append(f"--max-datum-tokens={args.max_datum_tokens}")
    return command


def launch(args: argparse.Namespace, state_dir: Path, env: dict[str, str]) -> int:
    """Start the server's processes on this machine, with ``env`` added to their
    environment, and wait for them."""
    from astrai_core.cli.launch import command_argv, launcher_argv, run_processes
    from astrai_core.cli.serve import check_port_free

    if args.nproc_per_node < 1:
        raise AstraiError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    check_port_free(args.host, args.port)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(env)  # torchrun's processes inherit it
    one_machine = argparse.Namespace(nproc_per_node=args.nproc_per_node, nnodes=1, node_rank=0,
                                     master_addr=None, master_port=None)
    return run_processes(
        lambda log_dir: launcher_argv(one_machine, log_dir) + command_argv(args, rank_command(args)),
        _stopped)


def _stopped(name: str, at_once: bool) -> str:
    how = "at once" if at_once else "after the calls in progress"
    return f"stopped by {name}: every process of the server was sent it and stopped {how}"


def serve_rank(backend: Any, build_engine: Callable[[Any], Any],
               http_server: Callable[[Any], Any]) -> int:
    """One of the server's processes: join the others on ``backend``, load and shard the
    bases (``build_engine(device)``), then serve ``http_server(engine)`` (rank 0) or run
    rank 0's calls."""
    from astrai_core.cli.launch import worker_errors
    from astrai_core.tinker.lockstep import leave_stopping_to_rank_0, serve_calls
    from astrai_core.tinker.ranks import join_ranks, shard_bases

    with worker_errors():
        context, channel = join_ranks(backend)
        if not context.is_main:
            leave_stopping_to_rank_0()
        engine = build_engine(context.device)
        shard_bases(engine, context)
        engine.dist = context  # each rank runs its share of a request's datums
        if context.is_main:
            _serve_http(engine, channel, http_server)
        else:
            serve_calls(engine, channel)
        context.finish()
    return 0


def _serve_http(engine: Any, channel: Any, http_server: Callable[[Any], Any]) -> None:
    """Rank 0: the HTTP server on the lockstep engine; once it stops, the other ranks stop.
    When the ranks lost each other, the server stops and this raises, naming why."""
    from astrai_core.tinker.lockstep import LockstepEngine

    lockstep = LockstepEngine(engine, channel)
    server = http_server(lockstep)
    lockstep.on_broken = lambda: setattr(server, "should_exit", True)
    # uvicorn raises the signal that stopped it again once it is done, to the handler in
    # place before it ran: a no-op here, so that the other ranks are stopped below
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)
    try:
        server.run()
    finally:
        lockstep.stop()
    if lockstep.broken is not None:
        raise AstraiError(f"the server stopped: {lockstep.broken}")
