"""Runs that die at an exact point, as a crash would, for tests of exact resume.

``python -m astrai_core.testing.faults --kill-at PHASE:STEP ARGS...`` is ``astrai ARGS``
whose run SIGKILLs itself when it reaches phase ``PHASE`` (one of
:data:`astrai_core.training.phases.PHASES`, e.g. ``checkpoint_saved``) of step ``STEP``;
no test watches the clock. A distributed launch (``--nproc-per-node``) starts every
process through this driver, so each one is killed at the same point.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from astrai_core.training.phases import PHASES, PhaseHook

DRIVER = "astrai_core.testing.faults"


def kill_at(phase: str, step: int) -> PhaseHook:
    """A phase hook that SIGKILLs this process at ``phase`` of ``step``."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; known: {', '.join(PHASES)}")

    def hook(reached: str, reached_step: int) -> None:
        if reached == phase and reached_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
    return hook


def killed_command(phase: str, step: int) -> list[str]:
    """The command line that runs ``astrai`` (arguments appended) killed at ``phase`` of
    ``step``."""
    return [sys.executable, "-m", DRIVER, "--kill-at", f"{phase}:{step}"]


def main(argv: Sequence[str] | None = None) -> None:
    from astrai_core.cli.main import main as astrai

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "--kill-at" or ":" not in argv[1]:
        raise SystemExit(f"usage: python -m {DRIVER} --kill-at PHASE:STEP ASTRAI_ARGS...")
    phase, step = argv[1].rsplit(":", 1)
    astrai(argv[2:], embedding={"phase_hook": kill_at(phase, int(step)),
                                "worker_module": (DRIVER, *argv[:2])})


if __name__ == "__main__":
    main()
