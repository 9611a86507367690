"""The GSM8K recipe's GRPO and PPO configs run 2 steps on CPU: a tiny random Qwen3
(imported with `astrai import`) and a GSM8K-shaped parquet file (the testing kit's
`recipes` module). The recipe samples with vLLM; here, in an environment without it,
the torch sampler stands in (the vllm sampler's own test,
plugins/astrai-plugin-vllm/tests/test_vllm_gsm8k_recipe.py, runs the configs as written)."""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = pytest.mark.slow
pytest.importorskip("datasets")
pytest.importorskip("tensorboard")

from astrai_core.testing.recipes import gsm8k_smoke_config, gsm8k_workspace, recipe_astrai  # noqa: E402


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return gsm8k_workspace(tmp_path_factory.mktemp("gsm8k"))


@pytest.mark.parametrize("recipe", ["grpo.yaml", "ppo.yaml"])
def test_the_recipe_runs_two_steps_on_a_tiny_qwen3(workspace, recipe):
    config = gsm8k_smoke_config(recipe, report_to=["tensorboard"])
    sampling = {key: config["sampler"][key] for key in ("temperature", "max_new_tokens")}
    config["sampler"] = {"name": "torch", **sampling}
    path = workspace / f"smoke-{recipe}"
    path.write_text(yaml.safe_dump(config))
    recipe_astrai("train", str(path), cwd=workspace)
    run = workspace / "runs" / recipe
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert {"eval/accuracy", "eval/reward/gsm8k"} <= set(records[-1])
    assert "rollout/reward/gsm8k" in records[-1]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    step = run / "checkpoints" / "step_2"
    if recipe == "ppo.yaml":  # a LoRA policy saves its adapter; the critic is whole
        assert (step / "adapter" / "adapter_model.safetensors").is_file()
        assert (step / "critic.safetensors").is_file()
    else:
        assert (step / "model.safetensors").is_file()
