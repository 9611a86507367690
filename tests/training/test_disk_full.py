"""A disk that fills while a checkpoint is written: one error naming the directory and the
bytes the save needs; the earlier checkpoint stays intact and nothing half-written stays."""

from __future__ import annotations

import errno
import re
import shutil
import subprocess

import pytest
import torch

from astrai_core.checkpoints.manifest import verify_manifest
from astrai_core.checkpoints.native_files import directory_bytes
from astrai_core.config.schema import RunConfig
from astrai_core.errors import CheckpointError
from astrai_core.training.run import train
from tests.training.conftest import astrai, tiny_config, write_config


def test_a_full_disk_while_saving_names_the_directory_and_the_bytes(tmp_path, monkeypatch):
    config = RunConfig.model_validate(tiny_config(tmp_path, max_steps=4, save_every=2,
                                                  progress=False))
    real_save = torch.save

    def save(obj, path, *args, **kwargs):  # the disk fills during step 4's checkpoint
        if ".step_4.tmp-" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    import shutil  # and the disk reports what a full one does: little free
    usage = shutil.disk_usage(tmp_path)._replace(free=1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    checkpoints = tmp_path / "run" / "checkpoints"
    with pytest.raises(CheckpointError) as raised:
        train(config)
    message = str(raised.value)
    assert "\n" not in message
    assert f"no space left on the device of {checkpoints} while writing step_4" in message
    needed = int(re.search(r"needs about (\d+) bytes", message).group(1))
    assert needed == directory_bytes(checkpoints / "step_2")  # as large as the last one
    assert f"needs about {needed} bytes, 1000 are free;" in message
    assert [p.name for p in checkpoints.iterdir()] == ["step_2"]  # no staging left
    verify_manifest(checkpoints / "step_2", hashes=True)  # intact


@pytest.fixture
def small_disk(tmp_path):
    """A mount point of a tmpfs of the given bytes (root only; skipped elsewhere)."""
    mounted = []

    def mount(size: int):
        point = tmp_path / "disk"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(point)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def test_a_real_full_disk_is_one_error_line(tmp_path, small_disk):
    measure = tiny_config(tmp_path, max_steps=2, save_every=2, progress=False)
    measure["output_dir"] = str(tmp_path / "measure")
    train(RunConfig.model_validate(measure))
    size = directory_bytes(tmp_path / "measure" / "checkpoints" / "step_2")
    disk = small_disk(size * 3 // 2 + 64 * 1024)  # room for one checkpoint, not two
    config = tiny_config(tmp_path, max_steps=4, save_every=2, progress=False)
    config["output_dir"] = str(disk / "run")
    done = astrai("train", str(write_config(tmp_path, config)))
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    checkpoints = disk / "run" / "checkpoints"
    assert f"no space left on the device of {checkpoints} while writing step_4" in errors[0]
    assert [p.name for p in checkpoints.iterdir()] == ["step_2"]
    verify_manifest(checkpoints / "step_2", hashes=True)


def test_resume_on_a_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path,
                                                                            small_disk):
    config = tiny_config(tmp_path, max_steps=2, save_every=2, progress=False)
    train(RunConfig.model_validate(config))
    size = directory_bytes(tmp_path / "run")
    disk = small_disk(size * 2 + 256 * 1024)
    shutil.copytree(tmp_path / "run", disk / "run")
    metrics = (disk / "run" / "metrics.jsonl").read_bytes()
    with open(disk / "filler", "wb") as filler:  # every byte left taken
        with pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    config["output_dir"] = str(disk / "run")
    config["trainer"]["max_steps"] = 4
    done = astrai("train", str(write_config(tmp_path, config)), "--resume")
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"no space left on the device of {disk / 'run'}" in errors[0]
    assert sorted(p.name for p in (disk / "run").iterdir()) == ["checkpoints", "metrics.jsonl"]
    assert (disk / "run" / "metrics.jsonl").read_bytes() == metrics  # whole, unchanged
    assert [p.name for p in (disk / "run" / "checkpoints").iterdir()] == ["step_2"]


@pytest.mark.parametrize("expected", [0, 10_000])
def test_the_bytes_needed_and_free_are_two_different_true_numbers(tmp_path, monkeypatch, expected):
    import shutil

    from astrai_core.checkpoints import native_files

    usage = shutil.disk_usage(tmp_path)._replace(free=4096)  # after the partial write is gone
    monkeypatch.setattr(native_files.shutil, "disk_usage", lambda path: usage)
    with pytest.raises(CheckpointError) as raised:
        with native_files.atomic_directory(tmp_path / "step_1", lambda: expected) as staging:
            (staging / "part").write_bytes(b"x" * 4096)  # all there was room for
            raise OSError(errno.ENOSPC, "No space left on device")
    message = str(raised.value)
    if expected:
        assert "it needs about 10000 bytes, 4096 are free;" in message
    else:  # the write ran out: it needed more than there was
        assert "it needs more than the 4096 bytes that are free;" in message
    assert not list(tmp_path.iterdir())
