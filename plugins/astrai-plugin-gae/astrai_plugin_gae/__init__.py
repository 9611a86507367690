"""astrai-plugin-gae: hook implementations (light; the math lives in submodules).

``token_rewards_from_scores`` is re-exported for users of GAE-based strategies; it
lives in the core because every estimator's rollout needs it.
"""

from __future__ import annotations

from typing import Any

from astrai_core import AdvantageEstimatorSpec, hookimpl

__all__ = ["astrai_advantage_estimators", "token_rewards_from_scores"]


def __getattr__(name: str) -> Any:
    # Lazy, so that listing plugins (which imports this module) never imports torch.
    if name == "token_rewards_from_scores":
        from astrai_core.api import token_rewards_from_scores

        return token_rewards_from_scores
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@hookimpl
def astrai_advantage_estimators() -> list[AdvantageEstimatorSpec]:
    return [
        AdvantageEstimatorSpec(
            name="gae",
            target="astrai_plugin_gae.advantage:GAE",
            summary="token-level GAE from a value critic (gamma, lambda, optional whitening)",
        )
    ]
