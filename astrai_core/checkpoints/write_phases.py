"""The parts of a checkpoint write, named for the run's phase hook
(:mod:`astrai_core.training.phases`), in the order they happen inside the staging
directory. A run killed at any of them leaves only a hidden ``.step_N.tmp-*`` directory,
which the next run removes."""

from __future__ import annotations

DCP_WRITTEN = "dcp_written"  # every trained module's and optimizer's shards (each rank)
WEIGHTS_WRITTEN = "weights_written"  # config.json and the consolidated weights (rank 0)
TRAINING_STATE_WRITTEN = "training_state_written"  # schedulers, RNG, data positions
MANIFEST_WRITTEN = "manifest_written"  # manifest.json, the last file before the rename
WRITE_PHASES = (DCP_WRITTEN, WEIGHTS_WRITTEN, TRAINING_STATE_WRITTEN, MANIFEST_WRITTEN)
