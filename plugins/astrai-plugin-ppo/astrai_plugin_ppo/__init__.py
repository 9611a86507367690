"""astrai-plugin-ppo: hook implementations (light; the strategy lives in submodules).

The ``ppo`` strategy uses the ``gae`` advantage estimator by default; it reaches it
through the registry by name (astrai-plugin-gae, a dependency), never by import.
"""

from __future__ import annotations

from astrai_core import StrategySpec, hookimpl


@hookimpl
def astrai_strategies() -> list[StrategySpec]:
    return [
        StrategySpec(
            name="ppo",
            target="astrai_plugin_ppo.strategy:PPO",
            summary="PPO: a policy loss (PPO-clip by default) + value critic (own optimizer), "
                    "GAE advantages",
            default_advantage="gae",
        )
    ]
