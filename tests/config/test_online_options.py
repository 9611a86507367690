"""The online options' rules: one function per option in config/online.py, each called once
by the run plan, for online and offline strategies alike."""

from __future__ import annotations

import inspect

import pytest

from astrai_core.config import online
from astrai_core.config.plan import plan_run
from astrai_core.config.schema import RunConfig
from astrai_core.errors import ConfigError
from astrai_core.testing import tiny_run_config, write_arith_prompts
from astrai_core.testing.hf_models import write_hf_model_dir

RULES = sorted(name for name, fn in inspect.getmembers(online, inspect.isfunction)
               if name.startswith("check_") and name != "check_online_options")


def _count_calls(monkeypatch) -> dict[str, int]:
    calls = dict.fromkeys(RULES, 0)
    for name in RULES:
        rule = getattr(online, name)

        def counted(*args, _name=name, _rule=rule, **kwargs):
            calls[_name] += 1
            return _rule(*args, **kwargs)
        monkeypatch.setattr(online, name, counted)
    return calls


def test_there_is_one_rule_per_option():
    assert RULES == ["check_max_logprob_diff", "check_max_staleness", "check_micro_batch_tokens",
                     "check_mini_batches", "check_online_context_parallel", "check_partial", "check_router_replay",
                     "check_share_prompt"]


def test_the_plan_calls_every_rule_once_for_an_online_strategy(tmp_path, monkeypatch):
    calls = _count_calls(monkeypatch)
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                             {"name": "grpo", "group_size": 2})
    plan_run(RunConfig.model_validate(config))
    assert calls == dict.fromkeys(RULES, 1)


def test_an_offline_strategy_is_refused_an_online_option_once(tmp_path, monkeypatch):
    calls = _count_calls(monkeypatch)
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "1+1=2"}\n')
    config = tiny_run_config(tmp_path, texts, {"name": "seq"}, data_format="text",
                             micro_batch_tokens=64)
    with pytest.raises(ConfigError) as caught:
        plan_run(RunConfig.model_validate(config))
    assert str(caught.value) == (
        "trainer.micro_batch_tokens: packs the rollout rows of online strategies, and strategy "
        "'seq' draws no rollouts (offline data is packed by data.packing)")
    assert calls["check_micro_batch_tokens"] == 1 and calls["check_mini_batches"] == 0


def test_packed_micro_batches_need_a_native_model_before_anything_is_built(tmp_path):
    """Refused by the plan (it used to fail when the run built its batch source)."""
    hf = write_hf_model_dir(tmp_path / "hf", "mixtral")
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                             {"name": "grpo", "group_size": 2}, micro_batch_tokens=64)
    config["model"] = {"path": str(hf)}
    with pytest.raises(ConfigError, match=r"^trainer\.micro_batch_tokens: packs rows into one "
                       r"sequence, which needs a native model \(model.backend: native\)$"):
        plan_run(RunConfig.model_validate(config))


def test_a_shared_prompt_needs_a_native_model_before_anything_is_built(tmp_path):
    hf = write_hf_model_dir(tmp_path / "hf", "mixtral")
    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"),
                             {"name": "grpo", "group_size": 2}, share_prompt=True)
    config["model"] = {"path": str(hf)}
    with pytest.raises(ConfigError, match=r"^trainer\.share_prompt: packs each group's prompt "
                       r"once, which needs a native model \(model.backend: native\)$"):
        plan_run(RunConfig.model_validate(config))
