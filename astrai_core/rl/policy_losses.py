"""The built-in policy losses: ppo_clip, dual_clip, gspo and cispo.

Each is a class built with its ``policy_loss:`` options (validated by its ``Config``) and
called as ``loss(logprobs=, old_logprobs=, advantages=, response_mask=, **extras)``; it
returns the per-token loss ``[N, T]`` (0 on padding) and detached scalar metrics. The
strategy's objective (:mod:`astrai_core.rl.objective`) adds the KL and entropy terms
and aggregates. ``extras["rollout_weights"]`` (rollout correction, no gradient)
multiplies the per-token loss when present.

Padding is neutralised before any ``exp``, so garbage there can neither overflow nor
leak NaN gradients.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from astrai_core.rl.functional import clipped_policy_loss, masked_max, masked_mean, valid_mask

# log-ratios are capped here before exp(): a ratio of e^20 already means "clipped".
_MAX_LOG_RATIO = 20.0


class _ClipConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eps_low: float = Field(0.2, ge=0, lt=1, description="ratio clipped below at 1 - eps_low")
    eps_high: float = Field(0.2, ge=0, description="ratio clipped above at 1 + eps_high "
                            "(DAPO's clip-higher: 0.28)")


def apply_rollout_weights(per_token: Tensor, mask: Tensor, extras: dict[str, Any]) -> Tensor:
    """``per_token`` times the rollout-correction weights (when given), 0 on padding."""
    weights = extras.get("rollout_weights")
    valid = valid_mask(mask, per_token)
    if weights is not None:
        weights = torch.where(valid, weights.detach().to(per_token.dtype), 0.0)
        per_token = per_token * weights
    return torch.where(valid, per_token, torch.zeros_like(per_token))


def _masked_inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                   mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(valid mask, log-ratio, advantages) with padding set to 0 in both."""
    valid = valid_mask(mask, logprobs)
    zero = torch.zeros_like(logprobs)
    log_ratio = torch.where(valid, logprobs - old_logprobs.to(logprobs.dtype), zero)
    return valid, log_ratio.clamp(max=_MAX_LOG_RATIO), torch.where(valid, advantages, zero)


class PPOClip:
    """``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` per token, r = pi/pi_old.

    Asymmetric bounds are DAPO's clip-higher (``eps_high: 0.28``).
    """

    Config: ClassVar[type[BaseModel]] = _ClipConfig

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2) -> None:
        self.eps_low, self.eps_high = eps_low, eps_high

    def __call__(self, *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                 response_mask: Tensor, **extras: Any) -> tuple[Tensor, dict[str, Tensor]]:
        per_token, metrics = clipped_policy_loss(logprobs, old_logprobs, advantages,
                                                 response_mask, self.eps_low, self.eps_high)
        return apply_rollout_weights(per_token, response_mask, extras), metrics


class _DualClipConfig(_ClipConfig):
    c: float = Field(3.0, gt=1, description="lower bound of the loss of negative advantages: "
                     "-A r is capped at -A c")


class DualClip(PPOClip):
    """PPO-clip whose loss for a negative advantage is capped at ``-A c`` (Ye et al., 2020).

    With ``A < 0`` a very large ratio would otherwise make ``-A r`` unbounded: per token
    ``min(max(-A r, -A clip(r)), -A c)`` for ``A < 0``, plain PPO-clip for ``A >= 0``.
    """

    Config: ClassVar[type[BaseModel]] = _DualClipConfig

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2, c: float = 3.0) -> None:
        super().__init__(eps_low, eps_high)
        self.c = c

    def __call__(self, *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                 response_mask: Tensor, **extras: Any) -> tuple[Tensor, dict[str, Tensor]]:
        clipped, metrics = clipped_policy_loss(logprobs, old_logprobs, advantages,
                                               response_mask, self.eps_low, self.eps_high)
        valid = valid_mask(response_mask, logprobs)
        advantages = torch.where(valid, advantages, torch.zeros_like(advantages))
        bound = -advantages * self.c
        negative = advantages < 0
        per_token = torch.where(negative, torch.minimum(clipped, bound), clipped)
        with torch.no_grad():
            metrics["dual_clip_fraction"] = masked_mean(
                (negative & (clipped > bound)).to(logprobs.dtype), valid)
        return apply_rollout_weights(per_token, response_mask, extras), metrics


class _GSPOConfig(_ClipConfig):
    eps_low: float = Field(3e-4, ge=0, lt=1, description="sequence ratio clipped below "
                           "at 1 - eps_low (GSPO's paper: 3e-4)")
    eps_high: float = Field(4e-4, ge=0, description="sequence ratio clipped above at "
                            "1 + eps_high (GSPO's paper: 4e-4)")


class GSPO:
    """Group Sequence Policy Optimization (Zheng et al., 2025): one ratio per sequence.

    ``s_i = exp(mean over the valid tokens of log pi/pi_old)``, clipped per sequence:
    every token of sequence i gets ``max(-A_t s_i, -A_t clip(s_i, 1 - eps_low, 1 + eps_high))``.
    The gradient flows as in GSPO-token: the ratio of token t is ``sg(s_i) pi_t / sg(pi_t)``,
    equal to ``s_i`` in value; with ``loss_aggregation: seq-mean-token-mean`` and a
    constant advantage per sequence it is exactly the gradient of the sequence objective.
    """

    Config: ClassVar[type[BaseModel]] = _GSPOConfig

    def __init__(self, eps_low: float = 3e-4, eps_high: float = 4e-4) -> None:
        self.eps_low, self.eps_high = eps_low, eps_high

    def __call__(self, *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                 response_mask: Tensor, **extras: Any) -> tuple[Tensor, dict[str, Tensor]]:
        valid, log_ratio, advantages = _masked_inputs(logprobs, old_logprobs, advantages,
                                                      response_mask)
        seq_log_ratio = masked_mean(log_ratio, valid, dim=-1)                      # [N]
        safe_logp = torch.where(valid, logprobs, torch.zeros_like(logprobs))
        token_log_ratio = safe_logp - safe_logp.detach() + seq_log_ratio.detach().unsqueeze(-1)
        ratio = torch.exp(token_log_ratio.clamp(max=_MAX_LOG_RATIO))
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - self.eps_low, 1.0 + self.eps_high)
        per_token = torch.maximum(unclipped, clipped)
        with torch.no_grad():
            has_tokens = valid.any(-1)
            seq_ratio = torch.exp(seq_log_ratio)
            metrics = {
                "clip_fraction": masked_mean((clipped > unclipped).to(ratio.dtype), valid),
                "seq_clip_fraction": masked_mean(
                    ((seq_ratio < 1 - self.eps_low) | (seq_ratio > 1 + self.eps_high))
                    .to(ratio.dtype), has_tokens),
                "ratio_mean": masked_mean(seq_ratio, has_tokens),
                "ratio_max": masked_max(seq_ratio, has_tokens),
                "approx_kl": masked_mean(seq_ratio - 1.0 - seq_log_ratio, has_tokens),
            }
        return apply_rollout_weights(per_token, response_mask, extras), metrics


class _CISPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eps_low: float = Field(1.0, ge=0, le=1, description="weight clipped below at "
                           "1 - eps_low (1: no lower bound, as in MiniMax-M1)")
    eps_high: float = Field(0.28, ge=0, description="weight clipped above at 1 + eps_high")

    @model_validator(mode="after")
    def _nonempty(self) -> _CISPOConfig:
        if self.eps_low == 0 and self.eps_high == 0:
            raise ValueError("eps_low and eps_high are both 0: every weight would be 1")
        return self


class CISPO:
    """Clipped IS-weight Policy Optimization (MiniMax-M1, 2025).

    Per token ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi``: the importance weight
    is clipped and carries no gradient, so every token keeps a gradient (PPO-clip zeroes
    the clipped ones) of ``-clip(r) A`` with respect to its log-prob.
    """

    Config: ClassVar[type[BaseModel]] = _CISPOConfig

    def __init__(self, eps_low: float = 1.0, eps_high: float = 0.28) -> None:
        self.eps_low, self.eps_high = eps_low, eps_high

    def __call__(self, *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                 response_mask: Tensor, **extras: Any) -> tuple[Tensor, dict[str, Tensor]]:
        valid, log_ratio, advantages = _masked_inputs(logprobs, old_logprobs, advantages,
                                                      response_mask)
        ratio = torch.exp(log_ratio.detach())
        weight = ratio.clamp(1.0 - self.eps_low, 1.0 + self.eps_high)
        safe_logp = torch.where(valid, logprobs, torch.zeros_like(logprobs))
        per_token = -weight * advantages * safe_logp
        with torch.no_grad():
            metrics = {
                "clip_fraction": masked_mean((weight != ratio).to(ratio.dtype), valid),
                "approx_kl": masked_mean(ratio - 1.0 - log_ratio, valid),
                "ratio_mean": masked_mean(ratio, valid),
                "ratio_max": masked_max(ratio, valid),
            }
        return apply_rollout_weights(per_token, response_mask, extras), metrics
