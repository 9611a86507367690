"""Preference losses on sequence log-probs: DPO (sigmoid, IPO, hinge), SimPO, KTO, ORPO."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from astrai_core.api import masked_sum

DPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "ipo", "hinge")


def sequence_logprobs(token_logps: Tensor, response_mask: Tensor) -> Tensor:
    """Log-prob of each response: the sum of its token log-probs over response tokens."""
    return masked_sum(token_logps, response_mask, dim=-1)


def _smoothed_sigmoid_loss(logits: Tensor, label_smoothing: float) -> Tensor:
    """-log sigmoid(logits), mixed with -log sigmoid(-logits) by the probability
    ``label_smoothing`` that the preference label is flipped."""
    return (-(1.0 - label_smoothing) * F.logsigmoid(logits)
            - label_smoothing * F.logsigmoid(-logits))


def _preference_losses(h: Tensor, beta: float, loss_type: str, label_smoothing: float) -> Tensor:
    """Per-example loss from h = (pi_c - pi_r) - (ref_c - ref_r)."""
    if loss_type == "sigmoid":
        return _smoothed_sigmoid_loss(beta * h, label_smoothing)
    if label_smoothing != 0.0:
        raise ValueError(f"label_smoothing applies to the sigmoid loss only, not {loss_type!r}")
    if loss_type == "ipo":
        return (h - 1.0 / (2.0 * beta)).square()
    if loss_type == "hinge":
        return torch.relu(1.0 - beta * h)
    raise ValueError(f"unknown DPO loss_type {loss_type!r}; choose one of "
                     f"{', '.join(DPO_LOSS_TYPES)}")


def _check_beta_and_smoothing(beta: float, label_smoothing: float = 0.0) -> None:
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")


def _pair_metrics(chosen_rewards: Tensor, rejected_rewards: Tensor) -> dict[str, Tensor]:
    """reward_accuracy (share of pairs with chosen reward > rejected) and margin (mean
    chosen - rejected reward)."""
    return {"reward_accuracy": (chosen_rewards > rejected_rewards).float().mean(),
            "margin": (chosen_rewards - rejected_rewards).mean()}


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    """Per-example preference losses, chosen/rejected implicit rewards and metrics.

    Rewards are beta * (policy - reference) log-probs (detached). Metrics:
    reward_accuracy (fraction with chosen reward > rejected reward) and margin (mean
    chosen - rejected reward).
    """
    _check_beta_and_smoothing(beta, label_smoothing)
    chosen_log_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_log_ratio = policy_rejected_logps - ref_rejected_logps
    losses = _preference_losses(chosen_log_ratio - rejected_log_ratio, beta, loss_type,
                                label_smoothing)
    chosen_rewards = beta * chosen_log_ratio.detach()
    rejected_rewards = beta * rejected_log_ratio.detach()
    return losses, chosen_rewards, rejected_rewards, _pair_metrics(chosen_rewards, rejected_rewards)


def simpo_loss(
    policy_chosen_avg_logps: Tensor,
    policy_rejected_avg_logps: Tensor,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    """SimPO: -log sigmoid(beta * (avg_c - avg_r) - gamma), reference-free.

    ``avg_*`` are length-normalised log-probs (the mean over response tokens); ``gamma``
    is the target reward margin. Rewards are beta * avg (detached); metrics as dpo_loss.
    """
    _check_beta_and_smoothing(beta, label_smoothing)
    logits = beta * (policy_chosen_avg_logps - policy_rejected_avg_logps) - gamma
    losses = _smoothed_sigmoid_loss(logits, label_smoothing)
    chosen_rewards = beta * policy_chosen_avg_logps.detach()
    rejected_rewards = beta * policy_rejected_avg_logps.detach()
    return losses, chosen_rewards, rejected_rewards, _pair_metrics(chosen_rewards, rejected_rewards)


def kto_kl_estimate(policy_mismatched_logps: Tensor, ref_mismatched_logps: Tensor,
                    all_reduce_sum: Callable[[list[float]], list[float]] | None = None
                    ) -> Tensor:
    """KTO's reference point z0: the batch mean of log pi(y'|x) - log ref(y'|x) over
    mismatched (prompt, completion) pairs, clamped at 0 and carrying no gradient.

    ``all_reduce_sum`` (a distributed run's sum over processes) makes the mean the global
    batch's, so that N processes estimate the same z0 as one process with the whole batch.
    """
    diff = (policy_mismatched_logps - ref_mismatched_logps).detach()
    total, count = diff.double().sum().item(), float(diff.numel())
    if all_reduce_sum is not None:
        total, count = all_reduce_sum([total, count])
    return diff.new_tensor(total / max(count, 1.0)).clamp(min=0)


def kto_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    desirable: Tensor,
    kl: Tensor,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """KTO per-example losses and implicit rewards beta * (policy - reference) log-prob.

    With r = policy - reference log-prob of the completion and z0 = ``kl``:
    desirable ``w_d * (1 - sigmoid(beta * (r - z0)))``, undesirable
    ``w_u * (1 - sigmoid(beta * (z0 - r)))``. The loss is the mean over all examples.
    """
    _check_beta_and_smoothing(beta)
    desirable = desirable.to(torch.bool)
    log_ratio = policy_logps - ref_logps
    value = torch.where(desirable, F.sigmoid(beta * (log_ratio - kl)),
                        F.sigmoid(beta * (kl - log_ratio)))
    weight = torch.where(desirable, desirable_weight, undesirable_weight).to(value)
    losses = weight * (1.0 - value)
    rewards = beta * log_ratio.detach()
    zero = rewards.new_zeros(())

    def mean_of(rows: Tensor) -> Tensor:  # 0 for a batch without such rows
        return rewards[rows].mean() if rows.any() else zero

    metrics = {"kl": kl.detach(), "chosen_reward": mean_of(desirable),
               "rejected_reward": mean_of(~desirable),
               "desirable_fraction": desirable.float().mean()}
    return losses, rewards, metrics


# A float32 log-softmax rounds a near-certain token to exactly 0, and log(1 - exp(0)) is
# -inf; average log-probs are kept at most this far below 0.
_MAX_AVG_LOGP = -1e-6


def _log_odds(avg_logps: Tensor) -> Tensor:
    """log(p / (1 - p)) for p = exp(avg_logps), with log(1 - p) computed stably."""
    x = avg_logps.clamp(max=_MAX_AVG_LOGP)
    log1m_p = torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))
    return x - log1m_p


def orpo_loss(
    policy_chosen_avg_logps: Tensor,
    policy_rejected_avg_logps: Tensor,
    beta: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """ORPO's odds-ratio term per pair: ``-beta * log sigmoid(log odds_c - log odds_r)``.

    odds(y) = p / (1 - p) with p the length-normalised probability exp(avg log-prob);
    log odds = avg - log(1 - exp(avg)). The full ORPO loss adds the chosen NLL.
    """
    _check_beta_and_smoothing(beta)
    log_odds = (_log_odds(policy_chosen_avg_logps) - _log_odds(policy_rejected_avg_logps))
    log_sigmoid = F.logsigmoid(log_odds)
    chosen_rewards = beta * policy_chosen_avg_logps.detach()
    rejected_rewards = beta * policy_rejected_avg_logps.detach()
    metrics = {**_pair_metrics(chosen_rewards, rejected_rewards),
               "log_odds_ratio": log_odds.detach().mean(),
               "log_sigmoid_odds_ratio": log_sigmoid.detach().mean()}
    return -beta * log_sigmoid, metrics
