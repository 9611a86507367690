"""Independent references for a short online run: the rollouts each step trained on (with
the policy that sampled them), GRPO's group advantages by hand, and the token-mean policy
gradient objective from one unpadded float64 forward per row.

A GRPO step (one optimizer step per rollout) starts on-policy: every importance ratio is 1,
so its loss is ``-sum_i A_i n_i / sum_i n_i`` (``n_i`` the response tokens of row i), and
its gradient is minus the gradient of :func:`token_mean_objective`, which the step raises.
"""

from __future__ import annotations

import copy
from typing import Any


def fit_recording_rollouts(strategy: Any, run: Any) -> list[tuple[Any, Any]]:
    """Train ``run`` to its ``trainer.max_steps``; returns, for every rollout drawn, (the
    rollout, a copy of the policy that sampled it: the weights before the step on it)."""
    from astrai_core.training.trainer import Trainer

    drawn: list[tuple[Any, Any]] = []
    draw = run.rollouts.draw

    def recording() -> Any:
        drawn.append((draw(), copy.deepcopy(run.model).eval()))
        return drawn[-1][0]

    run.rollouts.draw = recording
    Trainer(run, strategy).fit()
    return drawn


def group_advantages(rewards: Any, group_ids: Any, eps: float = 1e-6) -> Any:
    """GRPO's advantages in float64: (r - the group's mean) / (its unbiased std + eps);
    a group of one gets 0."""
    import torch

    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    groups = torch.as_tensor(group_ids).tolist()
    advantages = torch.zeros_like(rewards)
    for group in set(groups):
        rows = [i for i, g in enumerate(groups) if g == group]
        if len(rows) > 1:
            values = rewards[rows]
            advantages[rows] = (values - values.mean()) / (values.std() + eps)
    return advantages


def token_mean_objective(model: Any, batch: Any, advantages: Any) -> float:
    """``sum_i A_i * (sum of row i's response log-probs) / (response tokens of the batch)``
    under ``model``, from :func:`~astrai_core.testing.reference_token_logprobs`."""
    from astrai_core.testing.logprobs import reference_token_logprobs

    logps = reference_token_logprobs(model, batch)
    total = sum(len(row) for row in logps)
    return float(sum(float(a) * row.sum().item() for a, row in zip(advantages, logps)) / total)


def grpo_step_references(drawn: list[tuple[Any, Any]], final_policy: Any) -> list[dict[str, float]]:
    """Per step of a GRPO run with one optimizer step per rollout (``drawn`` from
    :func:`fit_recording_rollouts`): its on-policy ``loss`` by hand, the summed
    ``|advantage|``, and :func:`token_mean_objective` on its rollout ``before`` and
    ``after`` the step (the next rollout's sampling policy, or ``final_policy``)."""
    after = [policy for _, policy in drawn[1:]] + [final_policy.eval()]
    references = []
    for (rollout, before), trained in zip(drawn, after):
        advantages = group_advantages(rollout.rewards, rollout.group_ids)
        tokens = rollout.response_mask.sum(-1).double()
        references.append({
            "loss": float(-(advantages * tokens).sum() / tokens.sum()),
            "advantage_abs": float(advantages.abs().sum()),
            "before": token_mean_objective(before, rollout, advantages),
            "after": token_mean_objective(trained, rollout, advantages)})
    return references
