"""Runs that die, fail or freeze at an exact point, as a crash, an error or a deadlock
would, for tests of exact resume and of what a failure says.

``python -m astrai_core.testing.faults --kill-at PHASE:STEP ARGS...`` is ``astrai ARGS``
whose run SIGKILLs itself when it reaches phase ``PHASE`` (one of
:data:`astrai_core.training.phases.PHASES`, e.g. ``checkpoint_saved``) of step ``STEP``;
no test watches the clock. ``--fail-at`` raises a :class:`CheckpointError` there instead,
and ``--hang-at`` freezes the run there. Each takes ``PHASE[:STEP][@RANK]``: without
``STEP`` any step, with ``RANK`` only that rank of a distributed run. A distributed launch
(``--nproc-per-node``) starts every process through this driver, so each one gets the
same hook.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

from astrai_core.errors import CheckpointError
from astrai_core.training.phases import PHASES, PhaseHook

DRIVER = "astrai_core.testing.faults"


def _at(phase: str, step: int | None, rank: int | None,
        act: Callable[[int, int], None]) -> PhaseHook:
    """A phase hook that calls ``act(rank, step)`` at ``phase`` of ``step`` (any step when
    None) in the process of rank ``rank`` (every one when None)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; known: {', '.join(PHASES)}")

    def hook(reached: str, reached_step: int) -> None:
        me = int(os.environ.get("RANK", "0"))
        if reached == phase and step in (None, reached_step) and rank in (None, me):
            act(me, reached_step)
    return hook


def kill_at(phase: str, step: int | None, rank: int | None = None) -> PhaseHook:
    """A phase hook that SIGKILLs this process at ``phase`` of ``step``."""
    return _at(phase, step, rank, lambda me, at: os.kill(os.getpid(), signal.SIGKILL))


def fail_at(phase: str, step: int | None = None, rank: int | None = None) -> PhaseHook:
    """A phase hook that raises a CheckpointError (an error the run reports in one line)."""
    def fail(me: int, at: int) -> None:
        raise CheckpointError(f"injected failure at {phase} of step {at} on rank {me}")
    return _at(phase, step, rank, fail)


def hang_at(phase: str, step: int | None = None, rank: int | None = None) -> PhaseHook:
    """A phase hook that freezes the process without ending it, as a deadlock would: it
    says so in one ``fault:`` line on stderr, then sleeps for ever. Signals are handled as
    the run handles them: the first SIGINT/SIGTERM only sets the trainer's flag, so the
    sleep goes on; a second one ends the process."""
    def hang(me: int, at: int) -> None:
        # one write with its newline: two ranks' lines never share a line of the pipe
        sys.stderr.write(f"fault: rank {me} hangs at {phase} of step {at}\n")
        sys.stderr.flush()
        while True:
            time.sleep(0.5)
    return _at(phase, step, rank, hang)


HOOKS = {"--kill-at": kill_at, "--fail-at": fail_at, "--hang-at": hang_at}


def _spec(phase: str, step: int | None, rank: int | None) -> str:
    return phase + (f":{step}" if step is not None else "") + \
        (f"@{rank}" if rank is not None else "")


def killed_command(phase: str, step: int, rank: int | None = None) -> list[str]:
    """The command line that runs ``astrai`` (arguments appended) killed at ``phase`` of
    ``step``."""
    return [sys.executable, "-m", DRIVER, "--kill-at", _spec(phase, step, rank)]


def failed_command(phase: str, step: int | None = None, rank: int | None = None) -> list[str]:
    """The command line that runs ``astrai`` (arguments appended) failing at ``phase``."""
    return [sys.executable, "-m", DRIVER, "--fail-at", _spec(phase, step, rank)]


def hung_command(phase: str, step: int | None = None, rank: int | None = None) -> list[str]:
    """The command line that runs ``astrai`` (arguments appended) frozen at ``phase``."""
    return [sys.executable, "-m", DRIVER, "--hang-at", _spec(phase, step, rank)]


def _hook(option: str, spec: str) -> PhaseHook:
    """The hook of ``OPTION PHASE[:STEP][@RANK]``."""
    spec, _, rank = spec.partition("@")
    phase, _, step = spec.partition(":")
    return HOOKS[option](phase, int(step) if step else None, int(rank) if rank else None)


def main(argv: Sequence[str] | None = None) -> None:
    from astrai_core.cli.main import main as astrai

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] not in HOOKS:
        raise SystemExit(f"usage: python -m {DRIVER} {{{','.join(HOOKS)}}} "
                         "PHASE[:STEP][@RANK] ASTRAI_ARGS...")
    astrai(argv[2:], embedding={"phase_hook": _hook(argv[0], argv[1]),
                                "worker_module": (DRIVER, *argv[:2])})


if __name__ == "__main__":
    main()
