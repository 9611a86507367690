"""DAPO's dynamic sampling: rollouts made only of informative groups.

A group whose completions all earned the same reward has zero group-normalised
advantage, so it teaches the policy nothing and only dilutes the loss. With
``strategy.dynamic_sampling`` the rollout source draws through a
:class:`DynamicSampler`: it draws rollouts from the runner (each ``data.batch_size``
prompts x ``group_size`` completions), keeps the groups whose rewards differ and draws
again until it holds ``batch_size`` informative groups; a surplus from the last draw is
dropped (those prompts are spent, as in DAPO). It draws at most ``max_tries`` times per
rollout, so it never loops forever. When it gives up it warns and fills the rollout up
with uniform groups from its draws (zero advantage under ``grpo``), so the rollout keeps
the shape the step schedule was checked against (``strategy.mini_batches x
trainer.grad_accum_steps``); the ``rollout/dynamic_sampling_*`` metrics say how often.

Resume stays exact: every draw goes through the runner, whose state (prompt stream
position, rollouts drawn, which seeds each draw) is the only state there is.
"""

from __future__ import annotations

from typing import Any

import torch

from astrai_core.log import get_logger
from astrai_core.model.router_replay import ROUTED_EXPERTS, widened_routing
from astrai_core.rollout.batch import RolloutBatch, pad_rows
from astrai_core.rollout.images import concat_images

log = get_logger("astrai.rollout")


def informative_groups(rollout: RolloutBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The row indices of each group, split into (informative, uniform), in order of
    first appearance. A group is uniform when all its rewards are exactly equal (the
    weighted sum of equal reward values is bit-identical)."""
    informative: list[torch.Tensor] = []
    uniform: list[torch.Tensor] = []
    for group in torch.unique(rollout.group_ids).tolist():
        rows = torch.nonzero(rollout.group_ids == group).flatten()
        rewards = rollout.rewards[rows]
        (informative if bool((rewards != rewards[0]).any()) else uniform).append(rows)
    return informative, uniform


class DynamicSampler:
    """A drawer (online/source.py) over the rollout runner; see the module docstring."""

    def __init__(self, runner: Any, groups: int, max_tries: int) -> None:
        self.runner = runner
        self.groups, self.max_tries = groups, max_tries
        self.stats: dict[str, float] = {}  # of the last draw

    def draw(self) -> RolloutBatch:
        kept: list[RolloutBatch] = []
        spare: list[RolloutBatch] = []
        have, tries, seen = 0, 0, 0
        while have < self.groups and tries < self.max_tries:
            rollout = self.runner.draw()
            tries += 1
            good, uniform = informative_groups(rollout)
            seen += len(good) + len(uniform)
            for rows in good[:self.groups - have]:
                kept.append(rollout.select(rows))
            have = min(self.groups, have + len(good))
            spare += [rollout.select(rows) for rows in uniform]
        if have < self.groups:
            log.warning("dynamic sampling gave up", tries=tries, informative_groups=have,
                        wanted=self.groups, filled_with_uniform=self.groups - have)
            kept += spare[:self.groups - have]
        self.stats = {"rollout/dynamic_sampling_tries": float(tries),
                      "rollout/informative_groups": float(have),
                      "rollout/dynamic_sampling_filled": float(self.groups - have),
                      "rollout/dropped_group_fraction": 1.0 - have / max(seen, 1)}
        return concat_rollouts(kept, getattr(self.runner, "pad_token_id", 0))

    def state_dict(self) -> dict[str, Any]:
        return self.runner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.runner.load_state_dict(state)


def concat_rollouts(parts: list[RolloutBatch], pad_token_id: int = 0) -> RolloutBatch:
    """One rollout of these groups, in order: widths re-padded (prompts left, responses
    right), group ids renumbered 0..groups-1, the oldest policy version kept (a publish
    between two draws makes the rollout as stale as its oldest part)."""
    def rows(name: str, mask_name: str) -> list[list[Any]]:
        return [row[mask].tolist() for part in parts
                for row, mask in zip(getattr(part, name), getattr(part, mask_name))]

    prompt_ids, prompt_mask = pad_rows(rows("prompt_ids", "prompt_mask"), left=True,
                                       pad_value=pad_token_id, dtype=torch.long)
    response_ids, response_mask = pad_rows(rows("response_ids", "response_mask"), left=False,
                                           pad_value=pad_token_id, dtype=torch.long)
    old = None
    if all(part.old_logprobs is not None for part in parts):
        old, _ = pad_rows(rows("old_logprobs", "response_mask"), left=False, pad_value=0.0,
                          dtype=torch.float32)
    groups = torch.cat([torch.full((len(part),), i, dtype=torch.long)
                        for i, part in enumerate(parts)])
    lists = {name: [item for part in parts for item in getattr(part, name)]
             for name in ("prompts", "completions", "columns", "finish_reasons")}
    extras = {}
    if all(ROUTED_EXPERTS in part.extras for part in parts):  # the sampler's routing (R3)
        extras[ROUTED_EXPERTS] = torch.cat([
            widened_routing(part.extras[ROUTED_EXPERTS], part.prompt_ids.shape[1],
                            prompt_ids.shape[1], response_ids.shape[1]) for part in parts])
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
        response_mask=response_mask, old_logprobs=old,
        rewards=torch.cat([part.rewards for part in parts]),
        reward_components={name: torch.cat([part.reward_components[name] for part in parts])
                           for name in parts[0].reward_components},
        group_ids=groups, policy_version=min(part.policy_version for part in parts),
        extras=extras, images=_images(parts, prompt_ids.shape[1]), **lists)


def _images(parts: list[RolloutBatch], prompt_width: int) -> dict[str, torch.Tensor]:
    """The parts' image tensors joined row-wise (rollout/images.py); empty without any."""
    if not any(part.images for part in parts):
        return {}
    return concat_images([part.images for part in parts], [len(p) for p in parts], prompt_width)
