"""What the transformers backend does not offer fails at plan time, naming the model type."""

from __future__ import annotations

import pytest

from astrai_core.config.plan import plan_run
from astrai_core.config.schema import RunConfig
from astrai_core.errors import ConfigError
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.testing.hf_models import write_hf_model_dir


@pytest.fixture
def mixtral_config(tmp_path):
    hf = write_hf_model_dir(tmp_path / "hf", "mixtral")
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                             {"name": "grpo"})
    config["model"] = {"path": str(hf)}
    return config


def test_the_plan_says_which_backend_runs_the_model(mixtral_config):
    plan = plan_run(RunConfig.model_validate(mixtral_config))
    assert plan.model_source.backend == "transformers"
    assert plan.model_source.model_type == "mixtral"


@pytest.mark.parametrize("replay, sampler", [("R2", "torch"), ("R3", "vllm")])
def test_router_replay_is_a_plan_error_naming_the_model_type(mixtral_config, replay, sampler):
    if sampler == "vllm":
        pytest.importorskip("vllm")  # the vllm sampler is only registered with vLLM installed
    mixtral_config["sampler"] = {**mixtral_config["sampler"], "name": sampler}
    mixtral_config["strategy"]["router_replay"] = replay
    with pytest.raises(ConfigError, match=f"strategy.router_replay: {replay} replays MoE "
                       "routing through astrai's own router, and model_type 'mixtral' runs "
                       "on the transformers backend"):
        plan_run(RunConfig.model_validate(mixtral_config))


def test_a_from_scratch_model_is_native(tmp_path):
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                             {"name": "grpo"})
    config["model"]["backend"] = "transformers"
    with pytest.raises(ValueError, match="a from-scratch `config` is a native model"):
        RunConfig.model_validate(config)


def test_the_ray_sampler_with_torch_workers_is_planned(mixtral_config):
    pytest.importorskip("astrai_plugin_ray")
    mixtral_config["sampler"] = {**mixtral_config["sampler"], "name": "ray", "workers": 2,
                                 "worker_sampler": {"name": "torch"}}
    plan = plan_run(RunConfig.model_validate(mixtral_config))
    assert plan.sampler.name == "ray"


def test_the_vllm_sampler_is_planned(mixtral_config):
    pytest.importorskip("vllm")  # the vllm sampler is only registered with vLLM installed
    mixtral_config["sampler"] = {**mixtral_config["sampler"], "name": "vllm"}
    plan = plan_run(RunConfig.model_validate(mixtral_config))
    assert plan.sampler.name == "vllm"


def test_a_ray_worker_sampler_that_cannot_take_its_weights_is_one_plan_error(mixtral_config):
    pytest.importorskip("vllm")  # the vllm sampler is only registered with vLLM installed
    pytest.importorskip("astrai_plugin_ray")
    mixtral_config["sampler"] = {**mixtral_config["sampler"], "name": "ray",
                                 "worker_sampler": {"name": "vllm"}}
    with pytest.raises(ConfigError) as caught:
        plan_run(RunConfig.model_validate(mixtral_config))
    message = str(caught.value)
    assert message.startswith("sampler.worker_sampler.name: worker sampler 'vllm' cannot take "
                              "the weights of model_type 'mixtral' on the transformers "
                              "backend"), message
    assert "\n" not in message
