"""`astrai describe`: kinds, a kind's names, a component's options against its own model."""

from __future__ import annotations

import json
import textwrap

import pytest

from astrai_core.plugins import load_plugins
from astrai_core.plugins.specs import KINDS
from astrai_core.testing import run_astrai


def _describe(*args: str):
    return run_astrai("describe", *args, timeout=120)


def _json(*args: str):
    result = _describe(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_kinds_and_names_list_without_importing_torch():
    kinds, stderr = _json()
    assert "TORCH_NOT_IMPORTED" in stderr
    registry = load_plugins()
    assert [k["kind"] for k in kinds] == list(KINDS)
    assert {k["kind"]: k["names"] for k in kinds} == {k: registry.names(k) for k in KINDS}
    names, stderr = _json("strategy")
    assert "TORCH_NOT_IMPORTED" in stderr
    assert {(n["name"], n["summary"]) for n in names} == {
        (s.name, s.summary) for s in registry.specs("strategy")}
    assert _json("advantage")[0] == _json("advantage_estimator")[0]  # the section's name works


def test_pydantic_options_match_the_component_config():
    from astrai_plugin_ppo.strategy import PPOConfig

    info, _ = _json("strategy", "ppo")
    assert info["distribution"] == "astrai-plugin-ppo" and info["spec"]["default_advantage"] == "gae"
    options = {o["name"]: o for o in info["options"]}
    assert list(options) == list(PPOConfig.model_fields)
    for name, field in PPOConfig.model_fields.items():
        assert options[name]["default"] == json.dumps(field.default), name
        assert options[name]["description"] == (field.description or ""), name
    assert options["eps_low"]["type"] == "float (>= 0, < 1)"
    assert options["critic_init"]["type"] == '"policy" | "random"'
    assert options["aux_loss_coef"]["type"] == "float | null (>= 0)"


def test_required_options_and_table_output():
    info, stderr = _json("reward_function", "format_regex")
    assert "TORCH_NOT_IMPORTED" in stderr  # the reward's module does not need torch
    options = {o["name"]: o for o in info["options"]}
    assert options["pattern"]["required"] and options["pattern"]["default"] == "required"
    assert options["mode"]["default"] == '"search"'
    assert options["dotall"]["description"] == "'.' also matches newlines"
    table = _describe("reward", "format_regex")
    assert table.returncode == 0, table.stderr
    assert "reward_function format_regex" in table.stdout
    assert "rewards: [{name: format_regex, weight: 1.0, ...}]" in table.stdout
    assert any(line.split()[:3] == ["pattern", "str", "required"] for line in table.stdout.splitlines())


def test_a_reward_function_without_options_names_the_columns_it_reads():
    info, _ = _json("reward_function", "exact_match")
    assert info["options"] == [] and info["reads"] == ["answer"]


def test_keyword_options_when_the_component_has_no_config(tmp_path, monkeypatch):
    (tmp_path / "kw_plugin.py").write_text(textwrap.dedent('''
        from astrai_core import hookimpl, AdvantageEstimatorSpec

        class Scaled:
            """Scaled rewards as advantages."""
            needs_values = False
            def __init__(self, scale: float = 2.0, *, center: bool = True, label: str) -> None:
                pass

        @hookimpl
        def astrai_advantage_estimators():
            return [AdvantageEstimatorSpec(name="scaled", target="kw_plugin:Scaled",
                                           summary="scaled rewards")]
    '''))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("ASTRAI_PLUGINS", "kw_plugin")
    info, stderr = _json("advantage_estimator", "scaled")
    assert "TORCH_NOT_IMPORTED" in stderr
    assert info["options_from"] == "keyword arguments" and info["doc"] == "Scaled rewards as advantages."
    assert [(o["name"], o["type"], o["default"]) for o in info["options"]] == [
        ("scale", "float", "2.0"), ("center", "bool", "true"), ("label", "str", "required")]


@pytest.mark.parametrize("args, message", [
    (("nonsense",), "unknown component kind 'nonsense'; kinds are: strategy,"),
    (("strategy", "nope"), "unknown strategy 'nope'; available: "),
])
def test_unknown_kind_or_name_is_one_clear_error(args, message):
    result = _describe(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
