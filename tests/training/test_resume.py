"""Resume is exact: kill a run after a checkpoint, resume it, and end bit-identical to an
uninterrupted run of the same config, with every step logged exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file

from astrai_core.testing import read_metrics
from tests.training.conftest import astrai, tiny_config, write_config


def _weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors"))


def test_killed_and_resumed_run_equals_uninterrupted_run(tmp_path):
    steps = 12
    reference_cfg = tiny_config(tmp_path, max_steps=steps)
    reference_cfg["output_dir"] = str(tmp_path / "reference")
    reference = astrai("train", str(write_config(tmp_path, reference_cfg, "reference.yaml")))
    assert reference.returncode == 0, reference.stderr

    interrupted_cfg = dict(reference_cfg, output_dir=str(tmp_path / "interrupted"))
    config_path = write_config(tmp_path, interrupted_cfg, "interrupted.yaml")
    run_dir = tmp_path / "interrupted"
    process = subprocess.Popen([sys.executable, "-m", "astrai_core.cli.main", "train",
                                str(config_path)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not (run_dir / "checkpoints" / "step_4").exists():
        assert process.poll() is None, "the run ended before it could be interrupted"
        assert time.time() < deadline
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (run_dir / "checkpoints" / f"step_{steps}").exists(), "killed too late"

    resumed = astrai("train", str(config_path), "--resume")
    assert resumed.returncode == 0, resumed.stderr

    expected, got = _weights(tmp_path / "reference", steps), _weights(run_dir, steps)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs after resume"
    logged = [record["step"] for record in read_metrics(run_dir)]
    assert logged == list(range(1, steps + 1)), logged
    reference_losses = [r["loss"] for r in read_metrics(tmp_path / "reference")]
    assert [r["loss"] for r in read_metrics(run_dir)] == reference_losses


def test_checkpoint_is_a_loadable_model_with_tokenizer(tmp_path):
    config = tiny_config(tmp_path, max_steps=4)
    result = astrai("train", str(write_config(tmp_path, config)))
    assert result.returncode == 0, result.stderr
    from astrai_core.data.tokenizer import load_tokenizer
    from astrai_core.model import load_pretrained

    checkpoint = tmp_path / "run" / "checkpoints" / "step_4"
    model = load_pretrained(checkpoint)
    tokenizer = load_tokenizer(checkpoint)
    ids = torch.tensor([tokenizer.encode("12+3=")])
    saved = _weights(tmp_path / "run", 4)
    assert torch.equal(model.state_dict()["embed.weight"], saved["embed.weight"])
    assert model(ids)["logits"].shape == (1, ids.shape[1], model.config.vocab_size)
    # no staging directories are left behind
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step_4"]
