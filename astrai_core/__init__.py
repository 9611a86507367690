"""astrai: train and post-train LLMs with reinforcement learning.

Importing this package is cheap and never imports torch: it exposes the hook
marker and the spec records that plugins need.
"""

from astrai_core.errors import AstraiError
from astrai_core.plugins.hookspecs import hookimpl
from astrai_core.plugins.specs import (
    AdvantageEstimatorSpec,
    DeviceBackendSpec,
    EnvironmentSpec,
    ModelImporterSpec,
    PolicyLossSpec,
    RewardFunctionSpec,
    SamplerSpec,
    Spec,
    StrategySpec,
    TrackerSpec,
)
from astrai_core.version import __version__

__all__ = [
    "AdvantageEstimatorSpec",
    "AstraiError",
    "DeviceBackendSpec",
    "EnvironmentSpec",
    "ModelImporterSpec",
    "PolicyLossSpec",
    "RewardFunctionSpec",
    "SamplerSpec",
    "Spec",
    "StrategySpec",
    "TrackerSpec",
    "__version__",
    "hookimpl",
]
