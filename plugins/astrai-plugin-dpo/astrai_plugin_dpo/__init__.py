"""astrai-plugin-dpo: hook implementations (light; the strategies live in submodules)."""

from __future__ import annotations

from astrai_core import StrategySpec, hookimpl


@hookimpl
def astrai_strategies() -> list[StrategySpec]:
    return [
        StrategySpec(
            name="dpo",
            target="astrai_plugin_dpo.strategy:DPO",
            summary="DPO (sigmoid, IPO, hinge) against a frozen reference, or reference-free "
            "SimPO, from preference data or from rollouts (best vs worst reward)",
        ),
        StrategySpec(
            name="kto",
            target="astrai_plugin_dpo.kto:KTO",
            summary="KTO: desirable/undesirable completions (unpaired data) against a frozen "
            "reference, KL reference point from mismatched pairs",
        ),
        StrategySpec(
            name="orpo",
            target="astrai_plugin_dpo.orpo:ORPO",
            summary="ORPO: chosen NLL plus an odds-ratio preference term, no reference, from "
            "preference data or from rollouts",
        ),
    ]
