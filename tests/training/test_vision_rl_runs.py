"""Online RL on prompts with images, from a run config: GRPO, PPO (its critic's forward
takes the images too) and RLOO on tiny vision-language models, with a text reward
(exact match), the sampler's and trainer's log-probs equal; the options that cannot
carry images are refused before training, and a missing image stops the CLI with one
line and exit code 2."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.config.schema import RunConfig
from astrai_core.errors import ConfigError
from astrai_core.plugins.sampler_capabilities import NO_CAPABILITIES
from astrai_core.rollout.images import check_image_prompts
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.testing import read_metrics, tiny_run_config
from astrai_core.testing.hf_vlms import write_image_prompts, write_vlm_dir
from astrai_core.testing.runs import DIGIT_REWARD
from astrai_core.training.run import train
from tests.training.conftest import assert_a_missing_image_stops_the_run

pytestmark = pytest.mark.slow  # whole runs of two steps
# text rewards: the answer, and a digit (which a random tiny model writes about half the time)
REWARDS = [{"name": "exact_match"}, dict(DIGIT_REWARD)]


def _config(tmp_path, family, strategy, **extra):
    hf = write_vlm_dir(tmp_path / "hf", family)
    prompts = write_image_prompts(tmp_path / "data", rows=4)
    config = tiny_run_config(tmp_path, prompts, strategy, max_steps=2, threads=1,
                             rewards=REWARDS, data={"batch_size": 2})
    config["model"] = {"path": str(hf)}
    config["rollout"] = {"max_logprob_diff": 1e-5}  # stops the run beyond it
    config.update(extra)
    return config


def _two_finite_steps(run_dir: Path) -> list[dict]:
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["rollout/logprob_diff_max"] <= 1e-5
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float))
    return records


def test_grpo_on_image_prompts_runs_two_steps(tmp_path):
    strategy = {"name": "grpo", "kl_coef": 0.1}  # with a reference and its forward
    train(RunConfig.model_validate(_config(tmp_path, "gemma3", strategy)))
    records = _two_finite_steps(tmp_path / "run")
    # the first step's policy is the reference: both forwards take the images, so no KL
    assert abs(records[0]["kl"]) <= 1e-6 and records[0]["grad_norm"] > 0


@pytest.mark.parametrize("family", ["gemma3", "llava"])
def test_ppo_on_image_prompts_trains_its_critic(tmp_path, family):
    train(RunConfig.model_validate(_config(tmp_path, family, {"name": "ppo"})))
    records = _two_finite_steps(tmp_path / "run")
    assert records[-1]["critic/grad_norm"] > 0
    # Gemma 3 ties its head to its embedding: the critic's checkpoint holds both names
    saved = load_file(str(tmp_path / "run" / "checkpoints" / "step_2" / "critic.safetensors"))
    assert all(not torch.isnan(tensor).any() for tensor in saved.values())


def test_rloo_on_image_prompts_runs_two_steps(tmp_path):
    config = _config(tmp_path, "idefics3", {"name": "grpo"}, advantage={"name": "rloo"})
    train(RunConfig.model_validate(config))
    _two_finite_steps(tmp_path / "run")


def test_options_that_cannot_carry_images_are_refused(tmp_path):
    config = RunConfig.model_validate(_config(tmp_path, "gemma3", {"name": "grpo"}))
    check_image_prompts(config, TorchSampler.capabilities)  # the torch sampler takes them
    with pytest.raises(ConfigError, match="sampler.name: the prompts hold images, and the "
                                          "torch sampler takes none"):
        check_image_prompts(config, NO_CAPABILITIES)
    # several processes take prompts with images when every prompt holds them
    check_image_prompts(config, TorchSampler.capabilities, world=2)
    check_image_prompts(config, TorchSampler.capabilities, mixed=True)  # one process
    with pytest.raises(ConfigError, match="data.sources: some prompts hold images and "
                                          "others none, and over several processes"):
        check_image_prompts(config, TorchSampler.capabilities, world=2, mixed=True)
    with pytest.raises(ConfigError, match="multi-turn episodes"):
        check_image_prompts(config, TorchSampler.capabilities, multi_turn=True)
    partial = config.model_copy(update={"rollout": config.rollout.model_copy(
        update={"partial": True})})
    with pytest.raises(ConfigError, match="rollout.partial: the prompts hold images"):
        check_image_prompts(partial, TorchSampler.capabilities)


def test_a_missing_image_is_one_line_and_exit_code_2(tmp_path):
    config = _config(tmp_path, "gemma3", {"name": "grpo"})
    prompts = Path(config["data"]["sources"][0]["path"])
    assert_a_missing_image_stops_the_run(tmp_path, config, prompts)
