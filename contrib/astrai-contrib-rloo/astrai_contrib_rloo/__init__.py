"""astrai-contrib-rloo: registers the ``rloo`` advantage estimator with astrai.

This module is what the ``astrai`` entry point names; it stays light (no torch) so
that ``astrai list-plugins`` is fast. The estimator lives in ``advantage.py``.
"""

from __future__ import annotations

from astrai_core import AdvantageEstimatorSpec, hookimpl


@hookimpl
def astrai_advantage_estimators() -> list[AdvantageEstimatorSpec]:
    return [
        AdvantageEstimatorSpec(
            name="rloo",
            target="astrai_contrib_rloo.advantage:RLOOAdvantage",
            summary="REINFORCE leave-one-out: score minus the mean of the other samples "
            "of its group",
        )
    ]
