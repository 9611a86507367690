"""Response log-probs of sequence batches and preference pairs, and pairs picked from an
online rollout."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from astrai_core.api import both_sides, context_target_logprobs, model_images
from astrai_core.api import (AstraiError, RolloutBatch, RolloutRunner, context_group_rollout,
                             rollout_metrics)
from astrai_core.api import policy_forward
from astrai_plugin_dpo.losses import sequence_logprobs



def _targets(batch: dict[str, Tensor]) -> Tensor:
    """[B, S-1] response targets of a sequence batch: ``loss_mask[b, t]`` says token t is
    a target predicted from position t - 1; padding is known from ``attention_mask``."""
    return batch["loss_mask"][:, 1:].bool() & batch["attention_mask"][:, 1:].bool()


def response_logprobs(model: torch.nn.Module, batch: dict[str, Tensor], dist: Any = None
                      ) -> tuple[Tensor, Any, Tensor]:
    """(log-prob [B] of each row's response, MoE aux loss, response token count) of a
    sequence batch (``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``).

    A response's log-prob is the sum of its target tokens' log-probs; the prompt attends
    but carries no loss. ``dist`` (the run's): with ``parallel.context_parallel``, each
    rank scores its shard of the rows' tokens and gets the whole rows' log-probs. A
    vision-language model's rows carry their images (``image/`` tensors), which the
    forward takes.
    """
    input_ids = batch["input_ids"]
    # every token after the first, scored by the chunked head (no [B, S, V] logits)
    out = context_target_logprobs(model, input_ids, input_ids[:, 1:], dist,
                                  attention_mask=batch["attention_mask"],
                                  position_ids=batch["position_ids"],
                                  images=model_images(model, batch))
    targets = _targets(batch)
    return sequence_logprobs(out["logprobs"], targets), out.get("aux_loss"), targets.sum()


def dataset_pair_logprobs(model: torch.nn.Module, batch: dict[str, Tensor], dist: Any = None
                          ) -> tuple[Tensor, Tensor, Any, Tensor]:
    """(chosen [B], rejected [B], MoE aux loss, response token count) of a preference batch,
    both sides through one forward (see :func:`response_logprobs`)."""
    logps, aux_loss, tokens = response_logprobs(model, both_sides(batch), dist)
    pairs = batch["chosen_input_ids"].shape[0]
    return logps[:pairs], logps[pairs:], aux_loss, tokens


def response_lengths(batch: dict[str, Tensor] | RolloutBatch) -> tuple[Tensor, Tensor]:
    """Response tokens of each pair's chosen and of its rejected side ([B] each), for
    length-normalised log-probs; a preference batch or online pairs."""
    if isinstance(batch, RolloutBatch):
        lengths = batch.response_mask.sum(-1)
    else:
        lengths = _targets(both_sides(batch)).sum(-1)
    half = lengths.shape[0] // 2
    return lengths[:half], lengths[half:]


def rollout_pair_logprobs(model: torch.nn.Module, pairs: RolloutBatch, dist: Any = None
                          ) -> tuple[Tensor, Tensor, Any, Tensor]:
    """The same for online pairs: rows ``[:n]`` chosen, ``[n:]`` rejected (see
    :func:`pair_micro_batches`); log-probs at temperature 1 (the policy's own distribution)."""
    out = policy_forward(model, pairs, temperature=1.0, dist=dist)
    logps = sequence_logprobs(out["logprobs"], pairs.response_mask)
    half = len(pairs) // 2
    return logps[:half], logps[half:], out.get("aux_loss"), pairs.response_mask.sum()


def best_and_worst(rollout: RolloutBatch) -> tuple[list[int], list[int]]:
    """Row indices of each group's highest- and lowest-reward completion.

    Groups whose rewards all tie give no preference and are skipped; among tied best (or
    worst) completions the first is taken.
    """
    chosen, rejected = [], []
    group_ids = rollout.group_ids.tolist()
    for group in dict.fromkeys(group_ids):
        rows = torch.tensor([i for i, g in enumerate(group_ids) if g == group])
        rewards = rollout.rewards[rows]
        if rewards.max() == rewards.min():
            continue
        chosen.append(int(rows[rewards.argmax()]))
        rejected.append(int(rows[rewards.argmin()]))
    return chosen, rejected


def pair_micro_batches(rollout: RolloutBatch, chosen: list[int], rejected: list[int],
                       count: int) -> list[RolloutBatch]:
    """``count`` batches of consecutive pairs (sizes differing by at most one; needs
    ``len(chosen) >= count``), each ``[its chosen rows, its rejected rows]``."""
    if len(chosen) < count:
        raise ValueError(f"{len(chosen)} pairs cannot fill {count} micro-batches")
    batches, start = [], 0
    for index in range(count):
        end = start + len(chosen) // count + (index < len(chosen) % count)
        batches.append(rollout.select(chosen[start:end] + rejected[start:end]))
        start = end
    return batches


class PairSource:
    """Online DPO's batch source: one rollout per optimizer step, cut into preference pairs.

    Rollouts whose groups give fewer pairs than there are micro-batches are skipped; after
    ``max_skipped`` in a row it gives up with an error saying what to change.
    """

    def __init__(self, runner: RolloutRunner, micro_batches: int, *, max_skipped: int,
                 device: torch.device | str = "cpu", dist: Any = None) -> None:
        self.runner, self.micro_batches = runner, micro_batches
        self.max_skipped, self.device, self.dist = max_skipped, device, dist
        self.stats: dict[str, float] = {}

    def next_step(self) -> list[RolloutBatch]:
        for skipped in range(self.max_skipped):
            rollout = self.runner.draw().to(self.device)
            if self.dist is not None:  # the ranks of a context group sampled shares of
                # its prompts; they split the tokens of all of the group's rows
                rollout = context_group_rollout(rollout, self.dist)
            chosen, rejected = best_and_worst(rollout)
            if len(chosen) >= self.micro_batches:
                self.stats = {**rollout_metrics(rollout), "rollout/pairs": len(chosen),
                              "rollout/skipped": skipped}
                return pair_micro_batches(rollout, chosen, rejected, self.micro_batches)
        raise AstraiError(
            f"{self.max_skipped} rollouts in a row gave fewer than trainer.grad_accum_steps="
            f"{self.micro_batches} preference pairs (every completion of a group got the same "
            "reward); raise the sampler temperature or strategy.group_size")

    def state_dict(self) -> dict[str, Any]:
        return {"rollout": self.runner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.runner.load_state_dict(state["rollout"])
