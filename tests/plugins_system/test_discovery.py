"""Real discovery through entry points: found, listed, loaded; broken, incompatible and
duplicate plugins are isolated and reported."""

from __future__ import annotations

import pytest

from astrai_core.errors import PluginConflictError, UnknownComponentError
from astrai_core.plugins import load_plugins
from tests.plugins_system.fake_dist import (
    BROKEN_PLUGIN,
    DUPLICATE_PLUGIN,
    GOOD_PLUGIN,
    make_distribution,
)


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_installed_distribution_is_found_listed_and_loaded(site):
    make_distribution(site, "astrai-test-good", "astrai_test_good", GOOD_PLUGIN,
                      entry_name="good", requires=["astrai-core>=0.1,<0.2"])
    registry = load_plugins()
    info = registry.plugin("good")
    assert info is not None and info.status == "ok", info
    assert info.distribution == "astrai-test-good"
    assert info.version == "0.1.0"
    assert info.provides == {"advantage_estimator": ["constant"], "reward_function": ["always_one"]}
    estimator_class = registry.get("advantage_estimator", "constant").load()
    assert estimator_class(beta=2).params == {"beta": 2}
    reward = registry.get("reward_function", "always_one").load()
    assert reward(["p", "q"], ["a", "b"]) == [1.0, 1.0]
    assert registry.provider("advantage_estimator", "constant").name == "good"


def test_broken_plugin_is_reported_and_others_keep_working(site):
    make_distribution(site, "astrai-test-good", "astrai_test_good", GOOD_PLUGIN, entry_name="good")
    make_distribution(site, "astrai-test-broken", "astrai_test_broken", BROKEN_PLUGIN,
                      entry_name="broken")
    registry = load_plugins()
    broken = registry.plugin("broken")
    assert broken.status == "error"
    assert "nonexistent_dependency" in broken.error
    assert registry.plugin("good").status == "ok"
    assert "constant" in registry.names("advantage_estimator")
    assert "cpu" in registry.names("device_backend")


def test_incompatible_plugin_is_not_imported(site):
    make_distribution(site, "astrai-test-future", "astrai_test_future",
                      "raise RuntimeError('must not be imported')\n",
                      entry_name="future", requires=["astrai-core>=9.0"])
    info = load_plugins().plugin("future")
    assert info.status == "incompatible"
    assert "astrai-core>=9.0" in info.error and "0.1.0" in info.error


def test_same_name_from_two_distributions_is_an_error_naming_both(site):
    make_distribution(site, "astrai-test-good", "astrai_test_good", GOOD_PLUGIN, entry_name="good")
    make_distribution(site, "astrai-test-dup", "astrai_test_dup", DUPLICATE_PLUGIN,
                      entry_name="zdup")
    registry = load_plugins()
    with pytest.raises(PluginConflictError) as excinfo:
        registry.get("advantage_estimator", "constant")
    message = str(excinfo.value)
    assert "astrai-test-good" in message and "astrai-test-dup" in message
    assert "ASTRAI_DISABLE_PLUGINS" in message
    assert registry.plugin("zdup").status == "error"
    # the rest of the first plugin still works
    assert registry.has("reward_function", "always_one")


def test_disabled_plugin_is_listed_but_not_loaded(site, monkeypatch):
    make_distribution(site, "astrai-test-good", "astrai_test_good", GOOD_PLUGIN, entry_name="good")
    monkeypatch.setenv("ASTRAI_DISABLE_PLUGINS", "good")
    registry = load_plugins()
    assert registry.plugin("good").status == "disabled"
    assert not registry.has("advantage_estimator", "constant")


def test_unknown_name_lists_available_and_the_pip_install(site):
    registry = load_plugins()
    with pytest.raises(UnknownComponentError) as excinfo:
        registry.get("device_backend", "tpu")
    assert "available: " in str(excinfo.value) and "cpu" in str(excinfo.value)
    # a name one of the shipped plugins provides names the distribution to install
    message = registry.unknown_message("device_backend", "npu")
    assert "pip install astrai-plugin-npu" in message
