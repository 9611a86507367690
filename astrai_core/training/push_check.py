"""``rollout.max_logprob_diff``: a weight push that did not reach the sampler stops the run.

After every optimizer step the trainer publishes the policy's weights to the sampler, and
each rollout's log-probs are compared with the trainer's own for the same tokens
(``rollout/logprob_diff_max``). A sampler that runs the trainer's weights agrees within
float noise; one that kept old weights (a push that silently did not land, a parameter the
engine never reloaded) disagrees by the size of a training step. The check turns the second
case into an error instead of rollouts from a stale policy.
"""

from __future__ import annotations

import math
from typing import Any

from astrai_core.errors import AstraiError

# The mismatch metrics' names after a rollout's metric prefix: ``logprob_diff_max`` and
# ``logprob_diff_mean`` (astrai_core.online.mismatch measures them); the check reads the max.
MISMATCH = "logprob_diff_"
METRIC = f"rollout/{MISMATCH}max"


class SamplerMismatch(AstraiError):
    """The sampler's log-probs disagree with the trainer's beyond rollout.max_logprob_diff."""

    exit_code = 3


def check_logprob_mismatch(metrics: dict[str, Any], limit: float | None, sampler: str,
                           step: int, dist: Any) -> None:
    """Raise :class:`SamplerMismatch` on every rank when some rank's ``metrics`` measured a
    mismatch above ``limit`` on ``step`` (None: no check). Collective when distributed: every
    rank calls it after every step."""
    if limit is None:
        return
    measured = float(metrics.get(METRIC, 0.0))
    # each rank may measure its own share of the rollout's tokens: the largest (or a NaN)
    # decides, the same on every rank
    values = dist.all_gather_object(measured) if dist.enabled else [measured]
    worst = next((v for v in values if math.isnan(v)), max(values))
    if worst <= limit:  # written so that NaN fails the check too
        return
    raise SamplerMismatch(
        f"sampler {sampler!r} disagrees with the trainer at step {step}: its log-probs differ "
        f"by up to {worst:.3g} (rollout.max_logprob_diff: {limit:g}); the policy's weights did "
        "not reach it, so its rollouts come from another policy. Check the sampler's weight "
        "push, or raise rollout.max_logprob_diff if this engine's numerics differ that much")
