"""The plugin as users meet it: list-plugins, describe, and the hint when it is missing."""

from __future__ import annotations

import json

from astrai_core.plugins.registry import Registry
from astrai_core.testing import run_astrai


def test_list_plugins_shows_what_it_provides():
    result = run_astrai("list-plugins", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "TORCH_NOT_IMPORTED" in result.stderr
    rm = next(p for p in json.loads(result.stdout) if p["name"] == "rm")
    assert rm["status"] == "ok", rm["error"]
    assert rm["provides"]["strategy"] == ["rm"]
    assert sorted(rm["provides"]["reward_function"]) == ["judge", "reward_model"]


def test_describe_shows_the_options():
    strategy = run_astrai("describe", "strategy", "rm", "--json", timeout=120)
    assert strategy.returncode == 0, strategy.stderr
    options = {o["name"] for o in json.loads(strategy.stdout)["options"]}
    assert {"center_rewards_coefficient", "head_lr", "head_init_std"} <= options
    for name, expected in (("judge", {"base_url", "prompt_template", "score_pattern", "scale",
                                      "max_concurrency", "timeout", "max_retries"}),
                           ("reward_model", {"path", "batch_size", "render", "device"})):
        result = run_astrai("describe", "reward_function", name, "--json", timeout=120)
        assert result.returncode == 0, result.stderr
        assert "TORCH_NOT_IMPORTED" in result.stderr  # the reward modules import torch lazily
        assert expected <= {o["name"] for o in json.loads(result.stdout)["options"]}


def test_unknown_names_point_at_the_distribution():
    registry = Registry()  # as if the plugin were not installed
    for kind, name in (("strategy", "rm"), ("reward_function", "reward_model"),
                       ("reward_function", "judge")):
        assert "pip install astrai-plugin-rm" in registry.unknown_message(kind, name)
