"""astrai-plugin-dpo: hook implementations (light; the strategy lives in submodules)."""

from __future__ import annotations

from astrai_core import StrategySpec, hookimpl


@hookimpl
def astrai_strategies() -> list[StrategySpec]:
    return [
        StrategySpec(
            name="dpo",
            target="astrai_plugin_dpo.strategy:DPO",
            summary="DPO (sigmoid, IPO, hinge) against a frozen reference, from preference "
            "data or from rollouts (best vs worst reward)",
        )
    ]
