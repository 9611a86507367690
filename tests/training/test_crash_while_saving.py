"""A run SIGKILLed at any phase of writing a checkpoint leaves the earlier checkpoints
intact and only a hidden staging directory, which the next run removes; --resume then ends
bit-identical to an uninterrupted run (the same comparison as test_resume.py)."""

from __future__ import annotations

import subprocess

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.testing.faults import killed_command
from astrai_core.training.phases import (DCP_WRITTEN, MANIFEST_WRITTEN, TRAINING_STATE_WRITTEN,
                                         WEIGHTS_WRITTEN)
from tests.training.conftest import astrai, tiny_config, write_config

STEPS, KILLED_AT = 8, 8  # the final checkpoint's write is interrupted; step_4 is complete


def _weights(run_dir):
    return load_file(str(run_dir / "checkpoints" / f"step_{STEPS}" / "model.safetensors"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("crash")
    config = tiny_config(tmp_path, max_steps=STEPS, progress=False)
    config["output_dir"] = str(tmp_path / "reference")
    done = astrai("train", str(write_config(tmp_path, config, "reference.yaml")))
    assert done.returncode == 0, done.stderr
    return config, _weights(tmp_path / "reference")


@pytest.mark.parametrize("phase", [DCP_WRITTEN, WEIGHTS_WRITTEN, TRAINING_STATE_WRITTEN,
                                   MANIFEST_WRITTEN])
def test_a_kill_while_saving_resumes_exactly(reference, tmp_path, phase):
    config, expected = reference
    run_dir = tmp_path / "run"
    config_path = write_config(tmp_path, dict(config, output_dir=str(run_dir)))
    killed = subprocess.run([*killed_command(phase, KILLED_AT), "train", str(config_path)],
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert left[0].startswith(f".step_{KILLED_AT}.tmp-") and left[1:] == ["step_4"], left

    resumed = astrai("train", str(config_path), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_4", "step_8"]
    got = _weights(run_dir)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after resume"


def test_resume_skips_a_corrupt_newest_checkpoint_and_names_it(reference, tmp_path):
    config, expected = reference
    run_dir = tmp_path / "run"
    config_path = write_config(tmp_path, dict(config, output_dir=str(run_dir)))
    finished = astrai("train", str(config_path))
    assert finished.returncode == 0, finished.stderr
    state = run_dir / "checkpoints" / f"step_{STEPS}" / "model.safetensors"
    data = bytearray(state.read_bytes())
    data[-1] ^= 0xFF  # same size: only the sha256 tells
    state.write_bytes(bytes(data))
    config_path = write_config(tmp_path, dict(config, output_dir=str(run_dir)))

    resumed = astrai("train", str(config_path), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"--resume skips checkpoint step_{STEPS} (kept as step_{STEPS}.unverified-" \
        in resumed.stderr and "sha256 differs" in resumed.stderr, resumed.stderr[-3000:]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names[:2] == ["step_4", f"step_{STEPS}"]
    assert names[2].startswith(f"step_{STEPS}.unverified-") and len(names) == 3
    got = _weights(run_dir)  # resumed from step_4: the same as never corrupted
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after resume"


def _overwrite_middle(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = b"\xff" * 4096  # same size: only the sha256 tells
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


@pytest.mark.parametrize("where,damage,why", [
    ("dcp/__0_0.distcp", _overwrite_middle, "sha256 differs from the manifest's"),
    ("dcp/__0_0.distcp", _truncate, "is truncated or corrupt"),
    ("model.safetensors", _truncate, "is truncated or corrupt"),
])
def test_resume_skips_a_damaged_shard_or_weight_file_and_names_it(reference, tmp_path,
                                                                    where, damage, why):
    config, expected = reference
    run_dir = tmp_path / "run"
    config_path = write_config(tmp_path, dict(config, output_dir=str(run_dir)))
    assert astrai("train", str(config_path)).returncode == 0
    damaged = run_dir / "checkpoints" / f"step_{STEPS}" / where
    assert damaged.stat().st_size > 8192, damaged.stat().st_size
    damage(damaged)

    resumed = astrai("train", str(config_path), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    skipped = [line for line in resumed.stderr.splitlines()
               if f"--resume skips checkpoint step_{STEPS}" in line]
    assert len(skipped) == 1 and where in skipped[0] and why in skipped[0], resumed.stderr[-3000:]
    got = _weights(run_dir)  # resumed from step_4: the same as never damaged
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after resume"
