"""parallel.context_parallel with model.backend: transformers, at plan time: the families
astrai's attention runs are accepted, any other is refused in one line naming its
model_type, and query heads that do not divide over the ranks are refused as for the
native decoder."""

from __future__ import annotations

import pytest

from astrai_core.checkpoints.model_source import ModelSource
from astrai_core.config.context_parallel import check_context_parallel
from astrai_core.config.schema import RunConfig
from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.errors import FieldError
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.testing.hf_models import write_hf_model_dir

NEEDS = StrategyNeeds(("prompt",), context_parallel=True)


def _check(tmp_path, model_type: str, **overrides) -> None:
    hf = write_hf_model_dir(tmp_path / "hf", model_type, **overrides)
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                             {"name": "grpo"})
    config["model"] = {"path": str(hf), "backend": "transformers"}
    config["parallel"] = {"context_parallel": 2}
    source = ModelSource(str(hf), hf, False, "transformers", model_type)
    check_context_parallel(RunConfig.model_validate(config), NEEDS, source, 2)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_the_supported_families_are_accepted(tmp_path, model_type):
    _check(tmp_path, model_type)


def test_another_family_is_refused_naming_it(tmp_path):
    with pytest.raises(FieldError) as refused:
        _check(tmp_path, "olmo2")
    message = str(refused.value)
    assert "\n" not in message
    assert message == ("parallel.context_parallel: model_type 'olmo2' runs on the "
                       "transformers backend, where context parallelism supports llama, "
                       "mistral, qwen2, qwen3, gemma3_text; remove context_parallel")


def test_query_heads_that_do_not_divide_are_refused(tmp_path):
    with pytest.raises(FieldError, match="the model's 3 query heads do not divide over 2 ranks"):
        _check(tmp_path, "qwen3", num_attention_heads=3, num_key_value_heads=1)
