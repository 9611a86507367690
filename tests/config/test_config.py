"""Config loading: YAML → pydantic, typed --set overrides, errors naming field and line."""

from __future__ import annotations

import textwrap

import pytest

from astrai_core.config import load_config, parse_overrides, read_config
from astrai_core.config.plan import Resolver
from astrai_core.errors import ConfigError
from astrai_core.plugins import load_plugins

BASE = """\
output_dir: runs/x
model:
  path: ckpt
strategy:
  name: seq
rewards:
  - name: exact_match
    weight: 1.0
trainer:
  max_steps: 3
data: {sources: [{path: d.jsonl, format: text}]}
"""


def _write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_valid_config_loads_with_defaults(tmp_path):
    config = load_config(_write(tmp_path, BASE))
    assert config.output_dir == "runs/x"
    assert config.model.path == "ckpt" and config.model.dtype == "float32"
    assert config.strategy.name == "seq" and config.strategy.params == {}
    assert config.device.name == "auto"
    assert config.rewards[0].weight == 1.0


def test_overrides_are_typed(tmp_path):
    config = load_config(_write(tmp_path, BASE), [
        "rewards.0.weight=2", "strategy.clip_eps=1e-4", "strategy.flags=[1, 2]",
        "strategy.on=true", "device.name=cpu",
    ])
    assert config.rewards[0].weight == 2.0
    assert config.strategy.params == {"clip_eps": 1e-4, "flags": [1, 2], "on": True}
    assert config.device.name == "cpu"


@pytest.mark.parametrize("items", [["no_equals"], ["=3"]])
def test_malformed_override_is_rejected(items):
    with pytest.raises(ConfigError, match="KEY.PATH=VALUE"):
        parse_overrides(items)


def test_wrong_type_names_field_file_and_line(tmp_path):
    path = _write(tmp_path, BASE.replace("weight: 1.0", "weight: heavy"))
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert f"{path}:8: rewards.0.weight:" in str(excinfo.value)


def test_unknown_field_is_named(tmp_path):
    path = _write(tmp_path, BASE + "trainr: {}\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert f"{path}:12: trainr: unknown field" in str(excinfo.value)


def test_missing_section_is_named(tmp_path):
    path = _write(tmp_path, BASE.replace("strategy:\n  name: seq\n", ""))
    with pytest.raises(ConfigError, match="strategy: field required"):
        load_config(path)


def test_bad_override_value_points_at_set(tmp_path):
    with pytest.raises(ConfigError, match=r"--set model.dtype: Input should be"):
        load_config(_write(tmp_path, BASE), ["model.dtype=int8"])


def test_invalid_yaml_reports_line(tmp_path):
    path = _write(tmp_path, "output_dir: x\nmodel: [unclosed\n")
    with pytest.raises(ConfigError, match=r"run.yaml:\d+: invalid YAML"):
        load_config(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_model_needs_exactly_one_source(tmp_path):
    text = BASE.replace("  path: ckpt\n", "  path: ckpt\n  config: {hidden_size: 8}\n")
    with pytest.raises(ConfigError, match="model: Value error, give exactly one"):
        load_config(_write(tmp_path, text))


def test_component_unknown_name_and_bad_option(tmp_path):
    path = _write(tmp_path, BASE.replace("strategy:\n  name: seq",
                                         "strategy:\n  name: seq\ndevice:\n  name: tpu"))
    loaded = read_config(path)
    resolver = Resolver(load_plugins(), loaded.source)
    with pytest.raises(ConfigError) as excinfo:
        resolver.section("device_backend", loaded.config.device, ("device",))
    message = str(excinfo.value)
    assert f"{path}:7: device.name: unknown device backend 'tpu'" in message
    assert "cpu" in message
    with pytest.raises(ConfigError, match="device.speed: unknown field"):
        Resolver(load_plugins()).component("device_backend", "cpu", {"speed": 3}, ("device",))


def test_a_bad_value_inside_an_override_names_the_set_argument_not_line_0(tmp_path):
    path = _write(tmp_path, BASE)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, ["data.sources=[{path: d.jsonl, formt: text}]"])
    message = str(excinfo.value)
    assert "--set data.sources: data.sources.0.formt: unknown field" in message, message
    assert "run.yaml" not in message
    assert ":0" not in message


def test_a_plan_error_below_an_override_names_the_set_argument(tmp_path):
    loaded = read_config(_write(tmp_path, BASE), ["trainer.report_to=[wandbx]"])
    error = Resolver(load_plugins(), loaded.source).error(("trainer", "report_to", 0, "name"),
                                                         "unknown tracker")
    assert str(error) == "--set trainer.report_to: trainer.report_to.0.name: unknown tracker"
