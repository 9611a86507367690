"""docs/config-reference.md covers every key of every run-config model, and nothing else.

The keys come from the models themselves (RunConfig and every model its fields hold, plus
the models that validate the sections RunConfig keeps as mappings), so a new field fails
here until the doc is regenerated with `make docs` and the field has a meaning.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from astrai_core.cli import config_reference as ref


def test_every_field_is_documented_and_every_documented_field_exists():
    documented = ref.parse(ref.DOC.read_text())
    expected = ref.expected_rows()
    undocumented = sorted(set(expected) - set(documented))
    gone = sorted(set(documented) - set(expected))
    assert not undocumented, f"undocumented config keys (run `make docs`): {undocumented}"
    assert not gone, f"documented keys that no longer exist (run `make docs`): {gone}"


def test_types_defaults_and_meanings_agree_with_the_models():
    documented = ref.parse(ref.DOC.read_text())
    for key, option in ref.expected_rows().items():
        row = documented[key]
        assert row["default"] == f"`{option.default}`", key
        assert row["type"] == option.type, key
        assert row["meaning"], f"{key} has no meaning: give the field a description"
        if option.description:
            assert row["meaning"] == option.description.replace("\n", " "), key


def test_the_doc_is_exactly_what_the_generator_writes():
    assert ref.DOC.read_text() == ref.render(ref.current_meanings()), "run `make docs`"


def test_known_keys_with_their_model_defaults():
    from astrai_core.data.config import DataConfig
    from astrai_core.config.trainer import TrainerConfig

    rows = ref.expected_rows()
    assert rows["trainer.lr"].default == str(TrainerConfig.model_fields["lr"].default)
    assert rows["trainer.max_steps"].required
    assert rows["data.sources[].format"].required
    assert rows["data.seq_len"].default == str(DataConfig.model_fields["seq_len"].default)
    assert rows["device"].default == '{"name": "auto"}'
    assert "model.config.num_kv_heads" in rows and "rewards[].weight" in rows


class _Leaf(BaseModel):
    size: int = Field(3, ge=1, description="how many")
    mode: Literal["a", "b"] = "a"
    """the mode, from a docstring"""


class _Mapped(BaseModel):
    rate: float = 0.5


class _Root(BaseModel):
    leaf: _Leaf
    leaves: list[_Leaf] = []
    maybe: _Leaf | None = None
    mapped: dict[str, Any] = {}
    plain: str = "x"


def test_the_walk_follows_nested_lists_optionals_and_mapped_sections():
    tables = list(ref._walk(_Root, "", "Top level", {"mapped": _Mapped}, set()))
    assert [t.path for t in tables] == ["", "leaf", "leaves[]", "maybe", "mapped"]
    rows = {key: option for table in tables for key, option in table.rows}
    assert rows["leaf"].type == "section" and rows["leaves"].type == "list[section]"
    assert rows["maybe"].type == "section | null" and rows["mapped"].type == "section"
    assert rows["leaves[].size"].type == "int (>= 1)" and rows["leaves[].size"].default == "3"
    assert rows["leaf.mode"].description == "the mode, from a docstring"
    assert rows["mapped.rate"].default == "0.5" and rows["plain"].default == '"x"'


def test_every_registered_component_has_its_options_in_the_reference():
    """Each component of this repository's installed distributions has a table (or a "no
    options" line) under its SECTION[NAME] heading, with a row for each of its options."""
    from astrai_core.cli.describe import component_options
    from astrai_core.plugins import load_plugins

    text = ref.DOC.read_text()
    documented = ref.parse(text)
    registry = load_plugins()
    seen = 0
    for kind, section in ref.COMPONENT_SECTIONS.items():
        for spec in registry.specs(kind):
            if not registry.provider(kind, spec.name).distribution.startswith(
                    ref.SHIPPED_PREFIXES):
                continue
            path = f"{section or kind}[{spec.name}]"
            assert f"\n### `{path}`\n" in text, f"{path} is not in the reference"
            options, _ = component_options(kind, spec.load())
            for option in options:
                assert f"{path}.{option.name}" in documented, f"{path}.{option.name}"
            seen += 1
    names = {(k, s.name) for k in ref.COMPONENT_SECTIONS for s in registry.specs(k)}
    for new in [("strategy", "distill"), ("strategy", "rm"), ("strategy", "kto"),
                ("strategy", "orpo"), ("advantage_estimator", "reinforce_pp"),
                ("reward_function", "reward_model"), ("reward_function", "judge")]:
        assert new in names
    assert seen == len(names) - sum(
        not registry.provider(k, n).distribution.startswith(ref.SHIPPED_PREFIXES)
        for k, n in names)
    # options come from each component's own model, with their descriptions
    assert documented["strategy[distill].on_policy_fraction"]["default"] == "`0.5`"
    assert "simpo" in documented["strategy[dpo].loss_type"]["type"]
    assert documented["rewards[judge].base_url"]["default"] == "`required`"
    assert documented["advantage[reinforce_pp].gamma"]["meaning"]


def test_a_component_registered_outside_this_repository_is_not_documented(
        tmp_path, monkeypatch):
    """The reference documents what this repository ships, not the user's own plugins."""
    (tmp_path / "outside_plugin.py").write_text(
        "from astrai_core import hookimpl, AdvantageEstimatorSpec\n"
        "class Mine:\n    needs_values = False\n"
        "@hookimpl\ndef astrai_advantage_estimators():\n"
        "    return [AdvantageEstimatorSpec(name='mine', target='outside_plugin:Mine',"
        " summary='mine')]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ASTRAI_PLUGINS", "outside_plugin")
    from astrai_core.plugins import load_plugins

    assert "mine" in load_plugins().names("advantage_estimator")
    paths = {table.path for table in ref.component_tables()}
    assert "advantage[mine]" not in paths and "advantage[gae]" in paths
