"""Named phases of a run that its caller may hook.

Whoever runs the trainer may hand it a :data:`PhaseHook`, called as ``hook(phase, step)``
at each named point; the test kit's fault driver (:mod:`astrai_core.testing.faults`)
SIGKILLs the run there to prove that resume is exact. A run without a hook calls nothing.
"""

from __future__ import annotations

from collections.abc import Callable

# The parts of a checkpoint write, in order (astrai_core.checkpoints.write_phases).
from astrai_core.checkpoints.write_phases import (DCP_WRITTEN, MANIFEST_WRITTEN,
                                                  TRAINING_STATE_WRITTEN, WEIGHTS_WRITTEN,
                                                  WRITE_PHASES)

# Checkpoint ``step_N`` is complete on disk (renamed into place), before anything else
# happens in that step.
CHECKPOINT_SAVED = "checkpoint_saved"
PHASES = (*WRITE_PHASES, CHECKPOINT_SAVED)
__all__ = ["CHECKPOINT_SAVED", "DCP_WRITTEN", "MANIFEST_WRITTEN", "PHASES", "PhaseHook",
           "TRAINING_STATE_WRITTEN", "WEIGHTS_WRITTEN", "no_hook"]

PhaseHook = Callable[[str, int], None]


def no_hook(phase: str, step: int) -> None:
    """The hook of a run that nobody watches."""
