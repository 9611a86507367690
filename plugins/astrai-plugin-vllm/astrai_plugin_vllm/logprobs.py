"""The contract's log-probabilities for requests whose sampling was truncated.

vLLM reports either raw log-probs (ignoring temperature) or processed ones (after
temperature AND top-k/top-p/min-p, renormalised over the kept tokens). The contract
wants the temperature-scaled distribution BEFORE truncation: vLLM's processed numbers
are exactly that only when no filter is on. For filtered requests the sampler asks the
trainer's own forward (:func:`astrai_core.rollout.forward.policy_forward`) on the policy
it holds, whose weights are the engine's: the numbers then equal the trainer's by
construction.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from astrai_core.api import RolloutBatch, pad_rows
from astrai_core.api import policy_forward
from astrai_core.api import SamplingParams


def is_truncated(params: SamplingParams) -> bool:
    """True when vLLM's processed log-probs differ from the contract's for ``params``."""
    return not params.greedy and (params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0)


def trainer_logprobs(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                     completions: Sequence[Sequence[int]], temperature: float,
                     max_rows: int = 32) -> list[list[float]]:
    """log_softmax(logits / temperature) of each completion token, by the trainer's forward."""
    results: list[list[float]] = []
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(prompts), max_rows):
                rows = slice(start, start + max_rows)
                batch = _batch(prompts[rows], completions[rows]).to(device)
                logprobs = policy_forward(model, batch, temperature)["logprobs"].float().cpu()
                results += [logprobs[i, :len(c)].tolist() for i, c in enumerate(completions[rows])]
    finally:
        model.train(was_training)
    return results


def _batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> RolloutBatch:
    prompt_ids, prompt_mask = pad_rows(prompts, left=True, pad_value=0, dtype=torch.long)
    response_ids, response_mask = pad_rows(completions, left=False, pad_value=0, dtype=torch.long)
    count = len(prompts)
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                        response_mask=response_mask, old_logprobs=torch.zeros(response_ids.shape),
                        rewards=torch.zeros(count), reward_components={},
                        group_ids=torch.arange(count))
