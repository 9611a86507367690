"""Pure tensor functions for RL post-training: masked statistics, log-probs, KL
estimators, the clipped policy loss, loss aggregation and group statistics.

Conventions: ``mask`` / ``response_mask`` is a bool (or 0/1) tensor marking valid
tokens. Masked entries never influence a value, even when they hold NaN or inf
(``torch.where`` is used instead of multiplying by the mask), and finite masked
entries receive zero gradient. A statistic over no valid entries is 0, never NaN. Metrics are returned
as detached 0-dim tensors so callers decide when to synchronise (``.item()``).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

# Log-probs and entropy of full logits are the model head's math (one owner, shared
# with the models that return logits); the RL code takes them from here.
from astrai_core.model.head import entropy_from_logits, token_logprobs

KLKind = Literal["k1", "k2", "k3"]
AggregationMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")
AGGREGATION_MODES: tuple[str, ...] = (
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
)


# ---------------------------------------------------------------- masked statistics

def valid_mask(mask: Tensor, like: Tensor) -> Tensor:
    """``mask`` as booleans, broadcast to ``like``'s shape (a [N, T] mask over [N, T, ...])."""
    return mask.to(torch.bool).expand_as(like)


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` over the entries where ``mask`` is true."""
    kept = torch.where(valid_mask(mask, values), values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_count(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of valid entries (as ``values``' dtype), over all or along ``dim``."""
    valid = valid_mask(mask, values).to(values.dtype)
    return valid.sum() if dim is None else valid.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over valid entries; 0 where there are none."""
    return masked_sum(values, mask, dim) / masked_count(values, mask, dim).clamp_min(1)


def masked_var(
    values: Tensor, mask: Tensor, dim: int | None = None, unbiased: bool = True
) -> Tensor:
    """Variance over valid entries (Bessel-corrected if ``unbiased``); 0 when too few."""
    mean = masked_mean(values, mask, dim)
    centered = values - (mean if dim is None else mean.unsqueeze(dim))
    squares = masked_sum(centered.square(), mask, dim)
    count = masked_count(values, mask, dim)
    denominator = count - 1 if unbiased else count
    return torch.where(denominator > 0, squares / denominator.clamp_min(1), 0.0)


def masked_whiten(
    values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> Tensor:
    """Scale valid entries to std 1 (unbiased) and, if ``shift_mean``, mean 0; masked -> 0."""
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(valid_mask(mask, values), whitened, torch.zeros_like(whitened))


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """Largest valid entry; 0 when there is none."""
    valid = valid_mask(mask, values)
    if values.numel() == 0:
        return values.new_zeros(())
    best = torch.where(valid, values, torch.full_like(values, -torch.inf)).max()
    return torch.where(valid.any(), best, values.new_zeros(()))  # no host sync


# ---------------------------------------------------------------- KL estimators

def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi (Schulman's k1/k2/k3)."""
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {', '.join(KL_KINDS)}")


# ---------------------------------------------------------------- loss aggregation

def aggregate_loss(
    loss_per_token: Tensor, mask: Tensor, mode: str, norm_length: int | None = None
) -> Tensor:
    """Reduce an [N, T] per-token loss to a scalar over valid tokens, as ``mode`` says.

    The seq-mean modes average over the sequences that have at least one valid token;
    "seq-mean-token-sum-norm" divides the sum by the constant N * norm_length (T by default).
    """
    if mode == "token-mean":
        return masked_mean(loss_per_token, mask)
    if mode == "seq-mean-token-sum-norm":
        length = loss_per_token.shape[-1] if norm_length is None else norm_length
        if length <= 0:
            raise ValueError(f"norm_length must be > 0, got {length}")
        return masked_sum(loss_per_token, mask) / (loss_per_token.shape[0] * length)
    has_tokens = masked_count(loss_per_token, mask, dim=-1) > 0
    if mode == "seq-mean-token-mean":
        return masked_mean(masked_mean(loss_per_token, mask, dim=-1), has_tokens)
    if mode == "seq-mean-token-sum":
        return masked_mean(masked_sum(loss_per_token, mask, dim=-1), has_tokens)
    raise ValueError(
        f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATION_MODES)}"
    )


# ---------------------------------------------------------------- policy loss

def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip per-token loss max(-A*r, -A*clip(r, 1-eps_low, 1+eps_high)), 0 where masked.

    Metrics (valid tokens only): clip_fraction (clipping raised the loss), approx_kl
    (k3 estimate of KL(pi_old || pi) = mean of r - 1 - log r), ratio_mean, ratio_max.
    """
    valid = valid_mask(mask, logp)
    # Neutralise padding first, so garbage there can't overflow exp() or leak NaN gradients.
    log_ratio = torch.where(valid, logp - old_logp, torch.zeros_like(logp))
    advantages = torch.where(valid, advantages, torch.zeros_like(advantages))
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = torch.where(valid, per_token, torch.zeros_like(per_token))
    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((clipped > unclipped).to(ratio.dtype), valid),
            # k3 of KL(pi_old || pi) from tokens sampled by pi_old: r - 1 - log r
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, valid),
            "ratio_mean": masked_mean(ratio, valid),
            "ratio_max": masked_max(ratio, valid),
        }
    return loss, metrics


# ---------------------------------------------------------------- rewards, values

def last_valid_index(response_mask: Tensor) -> Tensor:
    """Index of each row's last valid token, -1 for a row without one."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return torch.where(response_mask.to(torch.bool), positions, -1).max(dim=-1).values


def token_rewards_from_scores(
    scores: Tensor,
    response_mask: Tensor,
    logp_old: Tensor | None = None,
    logp_ref: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k1",
) -> Tensor:
    """[N, T] rewards: each score on its row's last valid token, minus kl_coef * KL_t per token.

    KL_t = kl_estimate(logp_old, logp_ref, kl_kind) (tokens were sampled by the old policy).
    A row without valid tokens gets no reward at all. Rewards carry no gradient.
    """
    valid = response_mask.to(torch.bool)
    rewards = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    last = last_valid_index(valid)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = scores.detach().to(rewards)[rows]
    if kl_coef != 0.0:
        if logp_old is None or logp_ref is None:
            raise ValueError("kl_coef != 0 needs both logp_old and logp_ref")
        kl = kl_estimate(logp_old.detach().float(), logp_ref.detach().float(), kl_kind)
        rewards = rewards - kl_coef * torch.where(valid, kl, torch.zeros_like(kl))
    return rewards


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var[returns - values] / Var[returns] over valid tokens; 0 if returns are constant."""
    with torch.no_grad():
        var_returns = masked_var(returns, mask, unbiased=False)
        var_error = masked_var(returns - values, mask, unbiased=False)
        explained = 1.0 - var_error / var_returns.clamp_min(1e-12)
        return torch.where(var_returns > 1e-12, explained, torch.zeros_like(explained))


# ---------------------------------------------------------------- groups of samples

class GroupStats(NamedTuple):
    """Statistics of each sample's group, aligned with the samples ([N] each)."""

    count: Tensor
    sum: Tensor
    mean: Tensor
    std: Tensor  # unbiased (torch.std); 0 for a group of one


def sequence_scores(token_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Per-sequence score: the sum of token rewards over valid tokens ([N, T] -> [N])."""
    return masked_sum(token_rewards, response_mask, dim=-1)


def group_stats(scores: Tensor, group_ids: Tensor) -> GroupStats:
    """Count, sum, mean and unbiased std of the group each score belongs to (same id = group)."""
    unique_ids, group_of = torch.unique(group_ids, return_inverse=True)
    n_groups = unique_ids.numel()

    def per_group_sum(values: Tensor) -> Tensor:
        return values.new_zeros(n_groups).index_add_(0, group_of, values)[group_of]

    count = per_group_sum(torch.ones_like(scores))
    total = per_group_sum(scores)
    mean = total / count
    squares = per_group_sum((scores - mean).square())
    variance = torch.where(count > 1, squares / (count - 1).clamp_min(1), 0.0)
    return GroupStats(count=count, sum=total, mean=mean, std=variance.sqrt())


def broadcast_to_tokens(per_sequence: Tensor, response_mask: Tensor) -> Tensor:
    """[N] -> [N, T]: each row's value on its valid tokens, 0 elsewhere."""
    expanded = per_sequence.unsqueeze(-1).expand(response_mask.shape)
    return torch.where(response_mask.to(torch.bool), expanded, torch.zeros_like(expanded))
