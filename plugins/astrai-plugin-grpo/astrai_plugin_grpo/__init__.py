"""astrai-plugin-grpo: hook implementations (light; the math lives in submodules)."""

from __future__ import annotations

from astrai_core import AdvantageEstimatorSpec, hookimpl


@hookimpl
def astrai_advantage_estimators() -> list[AdvantageEstimatorSpec]:
    return [
        AdvantageEstimatorSpec(
            name="grpo",
            target="astrai_plugin_grpo.advantage:GRPOAdvantage",
            summary="group-normalized rewards: (r - group mean) / group std "
            "(scale: none = Dr. GRPO)",
        )
    ]
