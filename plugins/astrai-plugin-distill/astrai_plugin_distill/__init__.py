"""astrai-plugin-distill: hook implementations (light; the math lives in submodules)."""

from __future__ import annotations

from astrai_core import StrategySpec, hookimpl


@hookimpl
def astrai_strategies() -> list[StrategySpec]:
    return [
        StrategySpec(
            name="distill",
            target="astrai_plugin_distill.strategy:Distill",
            summary="knowledge distillation from a frozen teacher checkpoint: reverse KL, "
                    "top-k forward KL or generalized JSD, on student samples and/or chat data",
        )
    ]
