"""The GRPO objective on token log-probs: PPO-clip + optional KL to a reference + entropy bonus."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from astrai_core.api import aggregate_loss, clipped_policy_loss, kl_estimate, masked_mean


@dataclass(frozen=True)
class GRPOLossSettings:
    """The knobs of :func:`grpo_objective` (a strategy builds it from its config)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    loss_aggregation: str = "token-mean"
    norm_length: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0


def grpo_objective(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                   settings: GRPOLossSettings, ref_logprobs: Tensor | None = None,
                   entropy: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar loss and detached metrics of one micro-batch ([N, T] tensors, ``mask`` bool).

    Per token: ``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) + kl_coef * KL_t
    - entropy_coef * H_t`` with ``r = exp(logp - logp_old)`` and ``KL_t`` the chosen
    estimator of KL(pi || pi_ref); the per-token loss is reduced by ``loss_aggregation``.
    """
    per_token, metrics = clipped_policy_loss(logprobs, old_logprobs, advantages, mask,
                                             settings.eps_low, settings.eps_high)
    metrics["policy_loss"] = aggregate_loss(per_token, mask, settings.loss_aggregation,
                                            settings.norm_length).detach()
    if settings.kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference model's log-probs")
        kl = kl_estimate(logprobs, ref_logprobs, settings.kl_estimator)
        per_token = per_token + settings.kl_coef * kl.where(mask, 0.0)
    if ref_logprobs is not None:
        metrics["kl"] = masked_mean(kl_estimate(logprobs.detach(), ref_logprobs,
                                                settings.kl_estimator), mask)
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy.detach(), mask)
        if settings.entropy_coef:
            per_token = per_token - settings.entropy_coef * entropy.where(mask, 0.0)
    loss = aggregate_loss(per_token, mask, settings.loss_aggregation, settings.norm_length)
    return loss, metrics
