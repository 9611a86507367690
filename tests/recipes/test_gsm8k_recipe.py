"""The GSM8K recipe's GRPO and PPO configs run 2 steps on CPU: a tiny random Qwen3
(imported with `astrai import`) and a GSM8K-shaped parquet file (the testing kit's
`recipes` module). The recipe samples with vLLM; here, in an environment without it,
the torch sampler stands in (the vllm sampler's own test,
plugins/astrai-plugin-vllm/tests/test_vllm_gsm8k_recipe.py, runs the configs as written)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("datasets")
pytest.importorskip("tensorboard")

from astrai_core.testing.recipes import gsm8k_smoke_config, gsm8k_workspace, run_gsm8k_smoke  # noqa: E402


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return gsm8k_workspace(tmp_path_factory.mktemp("gsm8k"))


@pytest.mark.parametrize("recipe", ["grpo.yaml", "ppo.yaml"])
def test_the_recipe_runs_two_steps_on_a_tiny_qwen3(workspace, recipe):
    config = gsm8k_smoke_config(recipe, report_to=["tensorboard"])
    sampling = {key: config["sampler"][key] for key in ("temperature", "max_new_tokens")}
    config["sampler"] = {"name": "torch", **sampling}
    run, _ = run_gsm8k_smoke(workspace, recipe, config)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
