"""astrai-plugin-ray: the ``ray`` sampler (rollout workers as Ray actors).

This module stays light: it imports neither Ray nor torch. Where Ray is not installed the
hook raises, so ``astrai list-plugins`` shows this plugin with status ``error`` and the
install hint, and a config choosing ``sampler: {name: ray}`` fails with that message.
"""

from __future__ import annotations

import importlib.util

from astrai_core import SamplerSpec, hookimpl

INSTALL_HINT = "Ray is not installed: pip install 'ray>=2.40' (the ray sampler is optional)"


class RayMissingError(ImportError):
    """Ray, which this plugin drives, is not importable in this environment."""


@hookimpl
def astrai_samplers() -> list[SamplerSpec]:
    if importlib.util.find_spec("ray") is None:
        raise RayMissingError(INSTALL_HINT)
    return [
        SamplerSpec(name="ray", target="astrai_plugin_ray.sampler:RaySampler", asynchronous=True,
                    summary="rollout workers as Ray actors, each with its own sampler; "
                    "bucketed weight pushes; rollouts may overlap training"),
    ]
