"""The GSM8K recipe as written (vllm sampler; PPO with a LoRA policy and a full critic,
and GRPO) runs 2 steps end to end on CPU: a tiny random Qwen3 imported with `astrai
import`, GSM8K-shaped parquet files, the recipe's transform and reward."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("datasets")

from astrai_core.testing.recipes import gsm8k_smoke_config, gsm8k_workspace, run_gsm8k_smoke  # noqa: E402


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return gsm8k_workspace(tmp_path_factory.mktemp("gsm8k"))


@pytest.mark.parametrize("recipe", ["ppo.yaml", "grpo.yaml"])
def test_the_recipe_runs_two_steps_with_vllm(workspace, recipe):
    config = gsm8k_smoke_config(recipe, report_to=[])
    assert config["sampler"]["name"] == "vllm"
    config["sampler"].update(enforce_eager=True, cpu_kv_cache_gib=1, max_num_seqs=16)
    # checked pushes: float32 on CPU agrees to 1e-5, so a push that did not land stops it
    config["rollout"] = {"max_logprob_diff": 1e-3}
    _, records = run_gsm8k_smoke(workspace, recipe, config)
    assert all(r["rollout/logprob_diff_max"] <= 1e-3 for r in records[1:]), records
