"""In-process registration, ASTRAI_PLUGINS, spec records and the shipped plugins."""

from __future__ import annotations

import importlib.util
import types

import pytest
from pydantic import ValidationError

from astrai_core import ModelImporterSpec, RewardFunctionSpec, StrategySpec, hookimpl
from astrai_core.plugins import load_plugins, register, unregister


def _module_with_reward(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    @hookimpl
    def astrai_reward_functions():
        return [RewardFunctionSpec(name="in_process", target="builtins:len", summary="len")]

    module.astrai_reward_functions = astrai_reward_functions
    return module


def test_register_in_process_object_is_loaded_and_unregistered():
    module = _module_with_reward("my_notebook_plugin")
    register(module)
    try:
        registry = load_plugins()
        assert registry.get("reward_function", "in_process").load() is len
        assert registry.plugin("my_notebook_plugin").distribution == "in-process:my_notebook_plugin"
    finally:
        unregister(module)
    assert not load_plugins().has("reward_function", "in_process")


def test_astrai_plugins_env_imports_modules(tmp_path, monkeypatch):
    (tmp_path / "env_plugin_mod.py").write_text(
        "from astrai_core import hookimpl, StrategySpec\n"
        "@hookimpl\n"
        "def astrai_strategies():\n"
        "    return [StrategySpec(name='envstrat', target='env_plugin_mod:X', summary='s')]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ASTRAI_PLUGINS", "env_plugin_mod, missing_plugin_mod")
    registry = load_plugins()
    assert "envstrat" in registry.names("strategy")
    missing = registry.plugin("missing_plugin_mod")
    assert missing.status == "error" and "missing_plugin_mod" in missing.error


def test_hook_returning_wrong_record_marks_plugin_error():
    module = types.ModuleType("wrong_records")

    @hookimpl
    def astrai_strategies():
        return [RewardFunctionSpec(name="x", target="a:b", summary="wrong kind")]

    module.astrai_strategies = astrai_strategies
    register(module)
    try:
        info = load_plugins().plugin("wrong_records")
    finally:
        unregister(module)
    assert info.status == "error" and "expected StrategySpec" in info.error


@pytest.mark.parametrize("field,value", [("name", "Has Caps"), ("target", "no_colon"),
                                         ("summary", "two\nlines")])
def test_spec_fields_are_validated(field, value):
    fields = {"name": "ok", "target": "pkg.mod:attr", "summary": "one line"}
    fields[field] = value
    with pytest.raises(ValidationError):
        StrategySpec(**fields)


def test_spec_load_imports_target_lazily():
    # A kind without a Protocol: strategies, samplers, estimators and rewards are checked
    # against theirs (test_bad_input_plan.py).
    spec = ModelImporterSpec(name="x", target="json.decoder:JSONDecoder", summary="s")
    import json.decoder

    assert spec.load() is json.decoder.JSONDecoder


SHIPPED = {"grpo", "ppo", "dpo", "rm", "distill", "gae", "vllm", "qwen3", "npu", "rloo", "ray",
           "verifiers"}


def test_shipped_plugins_are_installed_and_ok():
    registry = load_plugins()
    by_name = {p.name: p for p in registry.plugins}
    missing = SHIPPED - set(by_name)
    assert not missing, f"not installed in this environment: {missing}"
    for name in SHIPPED - {"vllm"}:
        assert by_name[name].status == "ok", (name, by_name[name].error)
    # vllm needs vLLM itself: without it the plugin is listed as an error with the install hint
    vllm = by_name["vllm"]
    if importlib.util.find_spec("vllm") is not None:
        assert vllm.status == "ok", vllm.error
    else:
        assert vllm.status == "error" and "pip install vllm" in vllm.error
    assert by_name["builtin"].builtin and by_name["builtin"].status == "ok"
