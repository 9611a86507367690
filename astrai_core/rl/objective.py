"""The policy objective every online strategy shares: policy loss + KL + entropy, aggregated.

Per token ``policy_loss_t + kl_coef * KL_t - entropy_coef * H_t``, reduced by
``loss_aggregation`` (:func:`astrai_core.rl.functional.aggregate_loss`). The policy loss
is a component (kind ``policy_loss``: ppo_clip, dual_clip, gspo, cispo or a plugin's)
built once by the run wiring and handed to the strategy; KL_t estimates KL(pi || pi_ref)
against the frozen reference. Every aggregation mode is linear in the per-token loss,
so aggregating the sum equals summing the aggregated terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from astrai_core.rl.functional import aggregate_loss, kl_estimate, masked_mean


@dataclass(frozen=True)
class ObjectiveSettings:
    """The strategy-level knobs of :class:`PolicyObjective` (read from its config)."""

    loss_aggregation: str = "token-mean"
    norm_length: int | None = None       # seq-mean-token-sum-norm's constant length
    kl_coef: float = 0.0                 # in-loss KL to the reference
    kl_estimator: str = "k3"             # strategies pass their config's (``of``)
    entropy_coef: float = 0.0

    @classmethod
    def of(cls, config: Any) -> ObjectiveSettings:
        """The settings a strategy config holds: its shared loss options
        (:mod:`astrai_core.rl.options`; ``norm_length`` where it has one)."""
        return cls(loss_aggregation=config.loss_aggregation,
                   norm_length=getattr(config, "norm_length", None), kl_coef=config.kl_coef,
                   kl_estimator=config.kl_estimator, entropy_coef=config.entropy_coef)


class PolicyObjective:
    """``objective(logprobs=, old_logprobs=, advantages=, response_mask=, ...) -> (loss, metrics)``.

    Metrics: the policy loss's own (clip_fraction, ratio_mean, ...), ``policy_loss`` (its
    aggregated value), ``kl`` (token mean of KL_t, when reference log-probs are given) and
    ``entropy`` (token mean, when entropies are given); all detached.
    """

    def __init__(self, policy_loss: Any, settings: ObjectiveSettings) -> None:
        if policy_loss is None:
            raise ValueError("the run built no policy loss (RunComponents.policy_loss is None)")
        self.policy_loss = policy_loss
        self.settings = settings

    def aggregate(self, per_token: Tensor, mask: Tensor) -> Tensor:
        settings = self.settings
        return aggregate_loss(per_token, mask, settings.loss_aggregation, settings.norm_length)

    def __call__(self, *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                 response_mask: Tensor, ref_logprobs: Tensor | None = None,
                 entropy: Tensor | None = None, extras: dict[str, Tensor] | None = None
                 ) -> tuple[Tensor, dict[str, Tensor]]:
        """Scalar loss and detached metrics of one micro-batch ([N, T] tensors).

        ``extras`` (the batch's per-sequence tensors, e.g. ``rollout_weights``) go to the
        policy loss as keyword arguments.
        """
        settings, mask = self.settings, response_mask
        per_token, metrics = self.policy_loss(
            logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
            response_mask=mask, **(extras or {}))
        metrics = dict(metrics)
        metrics["policy_loss"] = self.aggregate(per_token, mask).detach()
        if ref_logprobs is not None:
            # Padding gets log-ratio 0, so garbage there cannot overflow exp() (k3) into NaNs.
            ref = ref_logprobs.where(mask, logprobs.detach())
            kl = kl_estimate(logprobs, ref, settings.kl_estimator)
            metrics["kl"] = masked_mean(kl.detach(), mask)
            if settings.kl_coef:
                per_token = per_token + settings.kl_coef * kl.where(mask, 0.0)
        elif settings.kl_coef:
            raise ValueError("kl_coef > 0 needs the reference model's log-probs")
        if entropy is not None:
            metrics["entropy"] = masked_mean(entropy.detach(), mask)
            if settings.entropy_coef:
                per_token = per_token - settings.entropy_coef * entropy.where(mask, 0.0)
        metrics["loss_weight"] = self.loss_weight(mask)
        return self.aggregate(per_token, mask), metrics

    def loss_weight(self, mask: Tensor) -> Tensor:
        """What the aggregated loss averages over: tokens (token-mean) or sequences; the
        trainer weights accumulated micro-batches by it."""
        if self.settings.loss_aggregation == "token-mean":
            return mask.sum()
        return torch.tensor(float(mask.shape[0]))
