"""Fault injection for tests of exact resume: make a run die at an exact point, as a
crash would, without any test watching the clock.

``ASTRAI_TEST_KILL_AFTER_CHECKPOINT=N`` makes the process SIGKILL itself the moment
checkpoint ``step_N`` has been renamed into place (before anything else happens in that
step). Unset, it costs one environment lookup per checkpoint.
"""

from __future__ import annotations

import os
import signal

KILL_AFTER_CHECKPOINT = "ASTRAI_TEST_KILL_AFTER_CHECKPOINT"


def after_checkpoint_saved(step: int) -> None:
    """Call right after checkpoint ``step`` is complete on disk (renamed into place)."""
    wanted = os.environ.get(KILL_AFTER_CHECKPOINT)
    if wanted is not None and wanted.strip() == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
