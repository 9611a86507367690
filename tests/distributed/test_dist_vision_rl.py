"""GRPO on prompts with images under FSDP2: 2 processes (each sampling its share of the
prompts with their images, the rollout's image tensors gathered with its rows) equal the
1-process run, and the sampler's and trainer's log-probs agree on every rank. Qwen2.5-VL's
prompts here hold images of four sizes, so one rank's rows hold more flattened patches
(and image tokens) than the other's. Prompts with images beside prompts without are
refused over several processes (a rank's forward without images would skip the sharded
vision tower's collectives)."""

from __future__ import annotations

import json
import re

import pytest

from astrai_core.testing import read_metrics, tiny_run_config
from astrai_core.testing.hf_vlms import tiny_image, write_image_prompts, write_vlm_dir
from astrai_core.testing.runs import DIGIT_REWARD
from tests.distributed.conftest import assert_close_weights, ok, train, weights

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 2
SHARED = ("loss", "policy_loss", "grad_norm", "kl", "tokens", "rollout/reward_mean",
          "rollout/advantage_std")
# text rewards: the answer, and a digit (which a random tiny model writes about half the time)
REWARDS = [{"name": "exact_match"}, dict(DIGIT_REWARD)]


def _config(tmp_path, family: str, name: str) -> dict:
    prompts = write_image_prompts(tmp_path / "data", rows=4)
    if family == "qwen2_5_vl":  # 16 patches of 7 x 7 (28 x 28 pixels), 24, 32 and 48:
        for i, size in ((1, (40, 20)), (2, (56, 28)), (3, (56, 42))):  # any two ranks differ
            tiny_image(i, size=size).save(prompts.parent / f"{i}.png")
    strategy = {"name": "grpo", "group_size": 2, "kl_coef": 0.1}  # a reference forward too
    # AdamW's eps above the rounding of a near-zero gradient (as tests/distributed/
    # test_dist_vlm.py): the ranks' other summation order stays at its own size
    config = tiny_run_config(tmp_path, prompts, strategy, max_steps=STEPS, rewards=REWARDS,
                             data={"batch_size": 2}, eps=1e-6)
    config["model"] = {"path": str(write_vlm_dir(tmp_path / "hf", family))}
    config["rollout"] = {"max_logprob_diff": 1e-5}  # stops the run beyond it
    config["output_dir"] = str(tmp_path / name)
    config["parallel"] = {"timeout_seconds": 120}
    return config


@pytest.mark.parametrize("family", ["gemma3", "idefics3", "qwen2_5_vl"])
def test_two_processes_equal_one(tmp_path, family):
    for name, nproc in (("one", 1), ("two", 2)):
        ok(train(_config(tmp_path, family, name), tmp_path, name, nproc))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in two] == list(range(1, STEPS + 1))
    assert all(r["rollout/logprob_diff_max"] <= 1e-5 for r in one + two)
    for a, b in zip(one, two):  # absolute: step 1's loss is float noise around 0
        for name in SHARED:
            assert abs(a[name] - b[name]) <= 1e-5, (a["step"], name, a[name], b[name])
    assert_close_weights(weights(tmp_path / "one", STEPS), weights(tmp_path / "two", STEPS))


def test_prompts_without_images_beside_ones_with_are_refused(tmp_path):
    config = _config(tmp_path, "gemma3", "mixed")
    prompts = config["data"]["sources"][0]["path"]
    with open(prompts, "a") as f:
        f.write(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    result = train(config, tmp_path, "mixed", 2)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]  # the launcher's line, naming a rank
    assert re.match(r"error: the distributed run failed: rank \d exited with status 2: "
                    r"data.sources: some prompts hold images and others none, and over "
                    r"several processes \(2 were started\)", last), result.stderr[-2000:]
    assert not (tmp_path / "mixed" / "metrics.jsonl").exists()
