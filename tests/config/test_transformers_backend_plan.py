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


def test_router_replay_is_a_plan_error_naming_the_model_type(mixtral_config):
    mixtral_config["strategy"]["router_replay"] = "R2"
    with pytest.raises(ConfigError, match="strategy.router_replay: R2 replays MoE routing "
                       "through astrai's own router, and model_type 'mixtral' runs on the "
                       "transformers backend"):
        plan_run(RunConfig.model_validate(mixtral_config))


def test_a_from_scratch_model_is_native(tmp_path):
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                             {"name": "grpo"})
    config["model"]["backend"] = "transformers"
    with pytest.raises(ValueError, match="a from-scratch `config` is a native model"):
        RunConfig.model_validate(config)
