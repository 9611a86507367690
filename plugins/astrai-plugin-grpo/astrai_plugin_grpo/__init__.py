"""astrai-plugin-grpo: hook implementations (light; the math lives in submodules)."""

from __future__ import annotations

from astrai_core import AdvantageEstimatorSpec, StrategySpec, hookimpl


@hookimpl
def astrai_advantage_estimators() -> list[AdvantageEstimatorSpec]:
    return [
        AdvantageEstimatorSpec(
            name="grpo",
            target="astrai_plugin_grpo.advantage:GRPOAdvantage",
            summary="group-normalized rewards: (r - group mean) / group std "
            "(scale: none = Dr. GRPO)",
        ),
        AdvantageEstimatorSpec(
            name="reinforce_pp",
            target="astrai_plugin_grpo.reinforce_pp:ReinforcePlusPlusAdvantage",
            summary="REINFORCE++: discounted token returns (KL shaping in the token rewards), "
            "whitened over the whole batch",
        ),
    ]


@hookimpl
def astrai_strategies() -> list[StrategySpec]:
    return [
        StrategySpec(
            name="grpo",
            target="astrai_plugin_grpo.strategy:GRPO",
            summary="GRPO: a policy loss (PPO-clip by default) on group-normalized advantages, "
                    "online or offline",
            default_advantage="grpo",
        )
    ]
