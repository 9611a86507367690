"""The plugin system's public names import from where plugin authors and users write them,
and none of them imports torch."""

from __future__ import annotations

import subprocess
import sys

import pluggy

SPEC_NAMES = ("AdvantageEstimatorSpec", "DeviceBackendSpec", "EnvironmentSpec",
              "ModelImporterSpec", "PolicyLossSpec", "RewardFunctionSpec", "SamplerSpec",
              "Spec", "StrategySpec", "TrackerSpec")

PUBLIC_IMPORTS = f"""
import sys
from astrai_core import hookimpl, {", ".join(SPEC_NAMES)}
import astrai_core.hookspecs
from astrai_core.plugins import load_plugins, process_registry, register, unregister
registry = load_plugins()
assert "seq" in registry.names("strategy")
assert "torch" not in sys.modules, "a public plugin-system name imported torch"
"""


def test_public_names_import_without_torch():
    subprocess.run([sys.executable, "-c", PUBLIC_IMPORTS], check=True, timeout=120)


def test_astrai_core_hookspecs_declares_the_same_hooks_to_pluggy():
    import astrai_core
    import astrai_core.hookspecs as public
    from astrai_core.plugins import hookspecs

    assert public.hookimpl is hookspecs.hookimpl is astrai_core.hookimpl
    assert public.HOOK_FOR_KIND == hookspecs.HOOK_FOR_KIND
    declared = {}
    for module in (public, hookspecs):
        manager = pluggy.PluginManager(public.PROJECT)
        manager.add_hookspecs(module)
        declared[module.__name__] = {name for name, caller in vars(manager.hook).items()
                                     if getattr(caller, "spec", None) is not None}
    assert declared["astrai_core.hookspecs"] == set(hookspecs.HOOK_FOR_KIND.values())
    assert declared["astrai_core.hookspecs"] == declared["astrai_core.plugins.hookspecs"]
