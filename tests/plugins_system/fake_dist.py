"""Build installed-looking distributions (a *.dist-info next to a module) for discovery tests."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_distribution(root: Path, dist_name: str, module: str, source: str, *,
                      entry_name: str, requires: list[str] | None = None,
                      version: str = "0.1.0") -> Path:
    """Write ``module.py`` and ``<dist>-<version>.dist-info`` declaring an astrai entry point."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist_name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    requires_lines = "".join(f"Requires-Dist: {r}\n" for r in (requires or []))
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
        f"Summary: test plugin {dist_name}\n{requires_lines}"
    )
    (info / "entry_points.txt").write_text(f"[astrai]\n{entry_name} = {module}\n")
    return root


GOOD_PLUGIN = '''
    from astrai_core import hookimpl, AdvantageEstimatorSpec, RewardFunctionSpec

    class Constant:
        needs_values = False
        def __init__(self, **params):
            self.params = params

    def always_one(prompts, completions, **columns):
        return [1.0 for _ in completions]

    @hookimpl
    def astrai_advantage_estimators():
        return [AdvantageEstimatorSpec(name="constant", target=__name__ + ":Constant",
                                       summary="test estimator")]

    @hookimpl
    def astrai_reward_functions():
        return [RewardFunctionSpec(name="always_one", target=__name__ + ":always_one",
                                   summary="test reward")]
'''

BROKEN_PLUGIN = '''
    raise ImportError("this plugin needs the package 'nonexistent_dependency'")
'''

DUPLICATE_PLUGIN = '''
    from astrai_core import hookimpl, AdvantageEstimatorSpec

    @hookimpl
    def astrai_advantage_estimators():
        return [AdvantageEstimatorSpec(name="constant", target=__name__ + ":X",
                                       summary="same name as another distribution")]
'''
