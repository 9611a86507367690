"""A run whose ``model.path`` is a Hugging Face directory equals the run on its
``astrai import``: the same losses and the same trained weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from astrai_core.testing import read_metrics
from astrai_core.testing.hf_models import write_hf_model_dir
from astrai_core.training.run import train
from astrai_core.config.schema import RunConfig

from .conftest import tiny_config

ASTRAI = str(Path(sys.executable).with_name("astrai"))


def _sft_on(tmp_path: Path, name: str, model_path: Path) -> Path:
    config = tiny_config(tmp_path, max_steps=3, save_every=3, threads=1)
    config["output_dir"] = str(tmp_path / name)
    config["model"] = {"path": str(model_path), "cache_dir": str(tmp_path / "cache")}
    train(RunConfig.model_validate(config))
    return tmp_path / name


def test_model_path_at_hf_dir_equals_astrai_import(tmp_path):
    hf = write_hf_model_dir(tmp_path / "hf", "llama")
    result = subprocess.run([ASTRAI, "import", str(hf), str(tmp_path / "native")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    direct = _sft_on(tmp_path, "direct", hf)
    imported = _sft_on(tmp_path, "imported", tmp_path / "native")
    losses = [[m["loss"] for m in read_metrics(run) if "loss" in m] for run in (direct, imported)]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    weights = [load_file(str(run / "checkpoints" / "step_3" / "model.safetensors"))
               for run in (direct, imported)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    # the run's checkpoint still knows its Hugging Face origin: export is exact
    assert (direct / "checkpoints" / "step_3" / "hf_source.json").is_file()
