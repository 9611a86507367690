"""astrai-plugin-verifiers: hook implementations (light; the targets live in submodules).

- environment ``verifiers``: a ``verifiers`` environment (its taskset and rubric) plays
  the episodes; its harness talks to astrai's policy through the serving engine, and the
  rubric's score is the reward.
"""

from __future__ import annotations

from astrai_core import EnvironmentSpec, hookimpl


@hookimpl
def astrai_environments() -> list[EnvironmentSpec]:
    return [
        EnvironmentSpec(
            name="verifiers",
            target="astrai_plugin_verifiers.environment:VerifiersEnvironment",
            summary="a verifiers environment (installed id or module:function); its rubric "
                    "is the reward, the sampled tokens are trained on",
        )
    ]
