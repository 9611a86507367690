"""A drawn rollout made trainable, once: old log-probs, reference log-probs, values,
advantages, and the rollout's statistics.

:func:`trainable_rollout` reads in the order it works:

1. the behaviour log-probs: the sampler's, or none (then the trainer supplies them);
2. one no-grad trainer forward over the rollout: its log-probs, under the router replay's
   context (R2 records the routing the training forwards replay, R3 replays the
   sampler's). A strategy whose loss takes its old log-probs through ``old_logprobs_for``
   skips it when each row is trained on exactly once, by the policy that sampled it
   (``epochs x mini_batches = 1``, :func:`~astrai_core.online.deferred.may_defer`): its
   training forward supplies them (detached: the ratio is exactly 1);
3. the strategy's per-token tensors (``prepare_rollout``: the reference's log-probs, the
   critic's values), on this rank's rows;
4. distributed: every rank's rows gathered into the global rollout, so that advantages
   (GAE whitening), statistics and the step schedule are the global ones;
5. the sampler/trainer mismatch (``rollout/logprob_diff_*``) and, with
   ``rollout_correction``, the importance weights (``extras["rollout_weights"]``, handed
   to the policy loss), both by :func:`~astrai_core.online.mismatch.measure`; with
   ``recompute_old_logprobs`` (implied by ``rollout_correction``) the trainer's
   log-probs become the old policy's;
6. token rewards (the score on the last response token, optional KL shaping) through the
   run's advantage estimator into ``advantages`` (and ``returns``).

With ``trainer.micro_batch_tokens`` the no-grad forwards run over the rollout in packed
micro-batches, like the training ones (:func:`~astrai_core.rollout.forward.rollout_forward`).
"""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.errors import ConfigError
from astrai_core.online.deferred import may_defer
from astrai_core.online.mismatch import rollout_mismatch
from astrai_core.rl.functional import token_rewards_from_scores
from astrai_core.rl.rollout_correction import RolloutCorrectionConfig
from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.forward import rollout_forward
from astrai_core.rollout.gather import context_group_rollout, gather_rollout
from astrai_core.rollout.metrics import rollout_metrics


def trainable_rollout(strategy: Any, rollout: RolloutBatch, prefix: str = "rollout/",
                      recompute: bool | None = None) -> tuple[RolloutBatch, dict[str, float]]:
    """``rollout`` made trainable by the online ``strategy``, and its statistics; see the
    module docstring. ``recompute``: take the old policy's log-probs from the trainer
    (default: the ``recompute_old_logprobs`` option; offline data has no sampler log-probs)."""
    run, config = strategy.run, strategy.config
    correction = config.rollout_correction
    if recompute is None:
        recompute = config.recompute_old_logprobs or correction is not None
    missing = _behaviour_logprobs_missing(rollout, recompute, correction, run.plan.sampler.name)
    rollout = context_group_rollout(rollout.to(run.device), run.dist)
    strategy.deferred.stop()
    defer = may_defer(config, strategy.defers_old_logprobs, recompute, strategy.routing)
    with torch.no_grad():
        token_tensors = {} if defer else {"logprobs": _no_grad_logprobs(strategy, rollout)}
        strategy.prepare_rollout(rollout)  # this rank's rows: values, reference log-probs
    rollout, tokens = gather_rollout(rollout, run.dist, token_tensors)
    stats = rollout_metrics(rollout, prefix=prefix)
    if defer:  # the training forwards measure and supply the old log-probs
        strategy.deferred.start(recompute=recompute, measure=not missing, prefix=prefix,
                                correction=correction)
        if missing:
            rollout.old_logprobs = None
    else:
        stats.update(_take_old_logprobs(rollout, tokens["logprobs"], missing=missing,
                                        recompute=recompute, correction=correction,
                                        prefix=prefix))
    stats.update(_advantages(strategy, rollout, prefix))
    return rollout, stats


def _behaviour_logprobs_missing(rollout: RolloutBatch, recompute: bool,
                                correction: RolloutCorrectionConfig | None, sampler: str) -> bool:
    """True when the rollout lacks behaviour log-probs and the trainer may supply them."""
    old = rollout.old_logprobs
    if old is not None and tuple(old.shape) == tuple(rollout.response_ids.shape):
        return False
    if not recompute:
        raise ConfigError(
            f"the rollout carries no behaviour log-probs (sampler {sampler!r} returned none "
            "for its tokens), so the old policy is unknown; set "
            "strategy.recompute_old_logprobs: true to compute them with the trainer's model")
    if correction is not None:
        raise ConfigError(f"strategy.rollout_correction needs the sampler's log-probs, and "
                          f"sampler {sampler!r} returned none for its tokens")
    return True


def _no_grad_logprobs(strategy: Any, rollout: RolloutBatch) -> torch.Tensor:
    """The trainer's log-probs of this rank's rows (eval mode), routed as router replay says."""
    run = strategy.run
    model = run.model
    with strategy.routing.no_grad_forward(model, rollout):
        model.eval()
        forward = rollout_forward(model, rollout, run.logprob_temperature,
                                  run.trainer.micro_batch_tokens, dist=run.dist)
        model.train()
    return forward["logprobs"]


def _take_old_logprobs(rollout: RolloutBatch, trainer: torch.Tensor, *, missing: bool,
                       recompute: bool, correction: RolloutCorrectionConfig | None,
                       prefix: str) -> dict[str, float]:
    """The mismatch of the trainer's log-probs with the sampler's and the rollout weights
    (when the sampler gave log-probs); with ``recompute`` the trainer's become the old ones."""
    stats: dict[str, float] = {}
    mask = rollout.response_mask
    if not missing:
        weights, stats = rollout_mismatch(trainer, rollout.old_logprobs, mask, correction,
                                          prefix)
        if weights is not None:
            rollout.extras["rollout_weights"] = weights
    if recompute:
        rollout.old_logprobs = torch.where(mask, trainer, 0.0)
    return stats


def token_rewards(config: Any, rollout: RolloutBatch) -> torch.Tensor:
    """Scalar reward on each last response token, minus the optional KL shaping of the
    online options ``config`` (``kl_in_reward_coef``, against the reference)."""
    shaping = config.kl_in_reward_coef
    if shaping and rollout.ref_logprobs is None:
        raise ConfigError("strategy.kl_in_reward_coef needs a reference model")
    return token_rewards_from_scores(
        rollout.rewards, rollout.response_mask, logp_old=rollout.old_logprobs,
        logp_ref=rollout.ref_logprobs if shaping else None, kl_coef=shaping,
        kl_kind=config.kl_estimator)


def _advantages(strategy: Any, rollout: RolloutBatch, prefix: str) -> dict[str, float]:
    """The advantages (and returns) of the (global) rollout, and their statistics."""
    mask = rollout.response_mask
    with torch.no_grad():
        rollout.advantages, rollout.returns = strategy.run.estimator(
            token_rewards=strategy.token_rewards(rollout), response_mask=mask,
            group_ids=rollout.group_ids, values=rollout.values)
    valid = rollout.advantages[mask]
    return {f"{prefix}advantage_mean": valid.mean().item() if valid.numel() else 0.0,
            f"{prefix}advantage_std": valid.std().item() if valid.numel() > 1 else 0.0}
