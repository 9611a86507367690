"""astrai-contrib-reinforce: registers the ``reinforce`` strategy and its baseline.

This module is what the ``astrai`` entry point names; it stays light (no torch) so that
``astrai list-plugins`` is fast. The strategy lives in ``strategy.py``, the baseline
estimator in ``baseline.py``; both import only ``astrai_core`` and ``astrai_core.api``.
"""

from __future__ import annotations

from astrai_core import AdvantageEstimatorSpec, StrategySpec, hookimpl


@hookimpl
def astrai_advantage_estimators() -> list[AdvantageEstimatorSpec]:
    return [
        AdvantageEstimatorSpec(
            name="reinforce_baseline",
            target="astrai_contrib_reinforce.baseline:MeanBaseline",
            summary="REINFORCE's baseline: score minus the mean score of its group "
            "(or of the whole rollout), no scaling",
        )
    ]


@hookimpl
def astrai_strategies() -> list[StrategySpec]:
    return [
        StrategySpec(
            name="reinforce",
            target="astrai_contrib_reinforce.strategy:Reinforce",
            summary="REINFORCE with a baseline: on-policy -A * log pi(response), "
            "one optimizer step per rollout",
            default_advantage="reinforce_baseline",
        )
    ]
