"""Rollout correction: importance weights for the gap between the sampler and the trainer.

The sampler (vLLM in bf16, another kernel, another GPU) and the trainer score the same
tokens slightly differently, so a rollout is not quite on-policy for the trainer. With
``w = pi_old(trainer) / pi_sampler`` on the sampled tokens:

- ``level: token`` weighs every token by its own ``w_t``;
- ``level: sequence`` weighs all tokens of a sequence by the **geometric mean** of its
  token weights, ``exp(mean_t log w_t)``. The product ``prod_t w_t`` is the unbiased
  sequence ratio, but its logarithm is a sum over the response, so its spread grows with
  the length: long responses would be truncated or masked for a mismatch per token that
  short ones pass with, and one threshold C could not suit both. The geometric mean is
  length-normalised (the same choice as GSPO's sequence ratio), so C means "average
  per-token mismatch" at every length.
- ``mode: truncate`` caps the weights at C (truncated importance sampling, TIS);
  ``mode: mask`` keeps the weights inside ``[1/C, C]`` and sets the others to 0 (masked
  importance sampling, MIS), dropping those tokens (or sequences) from the policy loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from astrai_core.rl.functional import broadcast_to_tokens, masked_max, masked_mean

# Log-weights are capped before exp() so that a wild mismatch reads as a huge weight, not inf.
_MAX_LOG_WEIGHT = 20.0


class RolloutCorrectionConfig(BaseModel):
    """The ``rollout_correction:`` option of an online strategy."""

    model_config = ConfigDict(extra="forbid")

    level: Literal["token", "sequence"] = Field(
        "token", description="one weight per token, or per sequence (geometric mean)")
    mode: Literal["truncate", "mask"] = Field(
        "truncate", description="truncate: cap the weights at threshold (TIS); mask: drop "
        "what lies outside [1/threshold, threshold] (MIS)")
    threshold: float = Field(2.0, gt=1, description="C, the cap (truncate) or the range "
                             "bound (mask)")


def correction_weights(trainer_logprobs: Tensor, sampler_logprobs: Tensor,
                       response_mask: Tensor, config: RolloutCorrectionConfig
                       ) -> tuple[Tensor, dict[str, Tensor]]:
    """Weights ``[N, T]`` (0 on padding; no gradient) and their metrics (detached scalars).

    Metrics are taken over the units the level weighs (tokens, or sequences with at least
    one token), before the cap or the mask: ``weight_mean``, ``weight_max``,
    ``truncated_fraction`` or ``masked_fraction``, and ``kl``, the k3 estimate of
    KL(pi_sampler || pi_trainer) per token (``w - 1 - log w`` over the sampled tokens).
    """
    valid = response_mask.to(torch.bool)
    with torch.no_grad():
        log_w = torch.where(valid, trainer_logprobs.float() - sampler_logprobs.float(), 0.0)
        log_w = log_w.clamp(-_MAX_LOG_WEIGHT, _MAX_LOG_WEIGHT)
        if config.level == "sequence":
            units, unit_mask = torch.exp(masked_mean(log_w, valid, dim=-1)), valid.any(-1)
        else:
            units, unit_mask = torch.exp(log_w), valid
        cap = config.threshold
        if config.mode == "truncate":
            outside = units > cap
            kept = units.clamp(max=cap)
        else:
            outside = (units < 1.0 / cap) | (units > cap)
            kept = torch.where(outside, 0.0, units)
        metrics = {
            "weight_mean": masked_mean(units, unit_mask),
            "weight_max": masked_max(units, unit_mask),
            _fraction_name(config): masked_mean(outside.float(), unit_mask),
            "kl": masked_mean(torch.exp(log_w) - 1.0 - log_w, valid),
        }
        if config.level == "sequence":
            kept = broadcast_to_tokens(kept, valid)
        return torch.where(valid, kept, 0.0), metrics


def metric_counts(response_mask: Tensor, config: RolloutCorrectionConfig
                  ) -> dict[str, Tensor]:
    """How many units (a scalar tensor) each mean metric of :func:`correction_weights`
    averages over (``weight_max`` is a maximum): so that the means of batches weighed apart
    (micro-batches, ranks) combine into the mean over all of them."""
    valid = response_mask.to(torch.bool)
    tokens = valid.sum()
    units = valid.any(-1).sum() if config.level == "sequence" else tokens
    return {"weight_mean": units, _fraction_name(config): units, "kl": tokens}


def _fraction_name(config: RolloutCorrectionConfig) -> str:
    """The metric of the weights cut off: truncated (truncate) or masked (mask)."""
    return "truncated_fraction" if config.mode == "truncate" else "masked_fraction"
