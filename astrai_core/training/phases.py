"""Named phases of a run that its caller may hook.

Whoever runs the trainer may hand it a :data:`PhaseHook`, called as ``hook(phase, step)``
at each named point; the test kit's fault driver (:mod:`astrai_core.testing.faults`)
SIGKILLs the run there to prove that resume is exact. A run without a hook calls nothing.
"""

from __future__ import annotations

from collections.abc import Callable

# The parts of a checkpoint write, in the order they happen inside its staging directory
# (a run killed at any of them leaves only a hidden ``.step_N.tmp-*`` directory, which
# the next run removes; see astrai_core.checkpoints.training_state):
DCP_WRITTEN = "dcp_written"  # every trained module's and optimizer's shards (each rank)
WEIGHTS_WRITTEN = "weights_written"  # config.json and the consolidated weights (rank 0)
TRAINING_STATE_WRITTEN = "training_state_written"  # schedulers, RNG, data positions
MANIFEST_WRITTEN = "manifest_written"  # manifest.json, the last file before the rename
# Checkpoint ``step_N`` is complete on disk (renamed into place), before anything else
# happens in that step.
CHECKPOINT_SAVED = "checkpoint_saved"
PHASES = (DCP_WRITTEN, WEIGHTS_WRITTEN, TRAINING_STATE_WRITTEN, MANIFEST_WRITTEN,
          CHECKPOINT_SAVED)

PhaseHook = Callable[[str, int], None]


def no_hook(phase: str, step: int) -> None:
    """The hook of a run that nobody watches."""
