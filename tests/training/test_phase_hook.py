"""The trainer calls the phase hook it is given, at each named phase, and nothing else
reads a fault switch: the test kit's fault driver is a hook like any other."""

from __future__ import annotations

import pytest

from astrai_core.config.schema import RunConfig
from astrai_core.testing.faults import kill_at
from astrai_core.training.phases import (CHECKPOINT_SAVED, DCP_WRITTEN, MANIFEST_WRITTEN, PHASES,
                                         TRAINING_STATE_WRITTEN, WEIGHTS_WRITTEN)
from astrai_core.training.run import train
from tests.training.conftest import tiny_config


def test_the_hook_sees_every_checkpoint_once_it_is_in_place(tmp_path):
    config = RunConfig.model_validate(tiny_config(tmp_path, max_steps=4, save_every=2,
                                                  progress=False))
    calls = []

    def hook(phase: str, step: int) -> None:
        checkpoint = tmp_path / "run" / "checkpoints" / f"step_{step}"
        calls.append((phase, step, (checkpoint / "model.safetensors").is_file()))

    train(config, phase_hook=hook)
    # every phase of each save, in order; the checkpoint is in place only at the last
    expected = [(phase, step, phase == CHECKPOINT_SAVED) for step in (2, 4)
                for phase in (DCP_WRITTEN, WEIGHTS_WRITTEN, TRAINING_STATE_WRITTEN,
                              MANIFEST_WRITTEN, CHECKPOINT_SAVED)]
    assert calls == expected
    assert PHASES == tuple(phase for phase, step, _ in expected if step == 2)


def test_the_fault_driver_knows_only_named_phases():
    with pytest.raises(ValueError, match="unknown phase 'model_weights'"):
        kill_at("model_weights", 1)
