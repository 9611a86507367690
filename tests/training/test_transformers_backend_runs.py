"""Families without a native importer train from YAML with ``model.path`` at their
Hugging Face directory (the transformers backend): SFT, an exact ``--resume``, GRPO, and
checkpoints that are Hugging Face directories (``astrai export`` copies them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts
from astrai_core.testing.hf_models import TINY_FAMILIES, write_hf_model_dir
from astrai_core.testing.parity import load_hf_model
from tests.training.conftest import tiny_config, write_config

pytestmark = pytest.mark.slow  # whole runs of several steps

ASTRAI = str(Path(sys.executable).with_name("astrai"))
FAMILIES = sorted(TINY_FAMILIES)
TIMING = ("time/step_seconds", "throughput/tokens_per_s")


def astrai(*args) -> subprocess.CompletedProcess:
    return subprocess.run([ASTRAI, *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def _records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: {k: v for k, v in r.items() if k not in TIMING}
            for r in read_metrics(run_dir)}


@pytest.mark.parametrize("model_type", FAMILIES)
def test_sft_from_yaml_and_resume_is_exact(tmp_path, model_type):
    hf = write_hf_model_dir(tmp_path / "hf", model_type)
    config = tiny_config(tmp_path, max_steps=4, save_every=2, threads=1)
    config["model"] = {"path": str(hf)}
    config["output_dir"] = str(tmp_path / "reference")
    done = astrai("train", write_config(tmp_path, config, "reference.yaml"))
    assert done.returncode == 0, done.stderr[-3000:]
    reference = tmp_path / "reference"
    final = reference / "checkpoints" / "step_4"
    losses = [r["loss"] for r in read_metrics(reference)]
    assert len(losses) == 4 and losses[-1] < losses[0]

    # resume from step_2 of the same run: it ends bit-identical
    resumed = tmp_path / "resumed"
    shutil.copytree(reference / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    config["output_dir"] = str(resumed)
    done = astrai("train", write_config(tmp_path, config, "resumed.yaml"), "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    expected = load_file(str(final / "model.safetensors"))
    got = load_file(str(resumed / "checkpoints" / "step_4" / "model.safetensors"))
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    records = _records(resumed)
    assert {3, 4} <= records.keys()
    assert all(records[s] == _records(reference)[s] for s in (3, 4))

    # the checkpoint is a Hugging Face directory: transformers loads it, export copies it
    done = astrai("export", final, tmp_path / "exported")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "exported" / "training_state.pt").exists()
    trained = load_hf_model(tmp_path / "exported")
    assert trained.config.model_type == model_type
    names = {k.removeprefix("hf.") for k in expected}
    assert names == set(load_file(str(tmp_path / "exported" / "model.safetensors")))
    ids = torch.arange(1, 9)[None]
    with torch.no_grad():
        from astrai_core.api import load_pretrained

        ours = load_pretrained(final)(ids)["logits"]
        assert (ours - trained(input_ids=ids).logits).abs().max().item() < 1e-5


@pytest.mark.parametrize("model_type", FAMILIES)
def test_grpo_from_yaml_runs_two_steps(tmp_path, model_type):
    hf = write_hf_model_dir(tmp_path / "hf", model_type)
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo"}, max_steps=2, threads=1)
    config["model"] = {"path": str(hf)}
    config["rollout"] = {"max_logprob_diff": 1e-4}  # sampler and trainer agree
    done = astrai("train", write_config(tmp_path, config))
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollout/logprob_diff_max"] < 1e-4 for r in records)


def test_ppo_trains_a_critic_on_the_transformers_backend(tmp_path):
    """The critic's value head sits on the transformers model's final hidden states."""
    from astrai_core.config.schema import RunConfig
    from astrai_core.training.run import train

    hf = write_hf_model_dir(tmp_path / "hf", "mixtral")
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl")
    config = tiny_run_config(tmp_path, prompts, {"name": "ppo"}, max_steps=2, save_every=2,
                             threads=1)
    config["model"] = {"path": str(hf)}
    train(RunConfig.model_validate(config))
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    assert records[-1]["critic/grad_norm"] > 0 and records[-1]["value_mean"] != 0
    assert records[-1]["moe/aux_loss"] > 0  # the family's load-balancing loss
    assert (tmp_path / "run" / "checkpoints" / "step_2" / "critic.safetensors").is_file()
