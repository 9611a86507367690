"""RolloutBatch: sampled completions with their prompts, masks, behaviour log-probs and rewards.

Layout of one row: ``prompt_ids`` is LEFT-padded and ``response_ids`` RIGHT-padded, so
``[prompt | response]`` keeps every real token contiguous:
``pad pad p p p r r r pad``. Padding is described by the masks only, never by a token id.

A multi-turn episode (rollout/episodes.py) interleaves the model's turns with environment
messages in the response: ``context_mask`` marks every real response token (what the
model attends to) and ``response_mask`` only the model's own (what the loss, the
log-probs and the advantages cover). Without ``context_mask`` the two are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from astrai_core.model.masks import positions_from_attention_mask


@dataclass
class RolloutBatch:
    """N sequences (G completions for each of N/G prompts)."""

    prompt_ids: Tensor                   # [N, P] long, left-padded
    prompt_mask: Tensor                  # [N, P] bool
    response_ids: Tensor                 # [N, R] long, right-padded
    response_mask: Tensor                # [N, R] bool: the model's tokens (the loss covers them)
    old_logprobs: Tensor | None          # [N, R] float32 behaviour log-probs, 0 on padding;
                                         # None when the sampler gave none for some row
    rewards: Tensor                      # [N] float32 weighted sum of the reward functions
    reward_components: dict[str, Tensor]  # {reward name: [N]} raw values
    group_ids: Tensor                    # [N] long: same id = same prompt
    policy_version: int = 0              # sampler weights version that produced the batch
    prompts: list[str] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    columns: list[dict[str, Any]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    # Filled per rollout before training ([N, R] float32, 0 on padding):
    advantages: Tensor | None = None     # from the advantage estimator
    returns: Tensor | None = None        # the estimator's value targets (GAE), or None
    values: Tensor | None = None         # the critic's V(s_t) when the rollout was drawn
    ref_logprobs: Tensor | None = None   # the frozen reference's log-probs (KL terms)
    # Further per-sequence tensors a plugin attaches: leading dimension N; they follow
    # select/split/to like the fields above.
    extras: dict[str, Tensor] = field(default_factory=dict)
    # A vision-language model's image inputs of each row's prompt (rollout/images.py):
    # leading dimension N, following select/split/to; empty for prompts without images.
    images: dict[str, Tensor] = field(default_factory=dict)
    # Multi-turn episodes: every real response token, environment messages included
    # ([N, R] bool; None: the same as response_mask), and per-row episode statistics
    # (turns, tool_calls, tool_errors, env_seconds).
    context_mask: Tensor | None = None
    episode_stats: list[dict[str, float]] = field(default_factory=list)
    # Trained without padding (trainer.micro_batch_tokens): policy_forward runs the rows
    # as one packed sequence (rollout/packing.py); the tensors above keep their layout.
    packed: bool = False
    # Rows with the same prompt compute it once (trainer.share_prompt): policy_forward packs
    # the batch with each group's prompt once (rollout/packing.py); the layout stays.
    share_prompt: bool = False
    # Partial rollouts (rollout.partial): the policy version that sampled each response
    # token ([N, R] long; None: every token by ``policy_version``).
    token_versions: Tensor | None = None

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    # ---------------------------------------------------------------- the model's view
    def input_ids(self) -> Tensor:
        """[N, P + R] prompt then response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    def attention_mask(self) -> Tensor:
        """[N, P + R] long, 1 = real token (environment tokens included)."""
        context = self.response_mask if self.context_mask is None else self.context_mask
        return torch.cat([self.prompt_mask, context], dim=1).long()

    def position_ids(self) -> Tensor:
        """[N, P + R] positions counting real tokens only (0 at each row's first real token)."""
        return positions_from_attention_mask(self.attention_mask())

    def response_lengths(self) -> Tensor:
        """[N] number of the model's response tokens."""
        return self.response_mask.sum(dim=1)

    # ---------------------------------------------------------------- rows
    def select(self, indices: Sequence[int] | Tensor) -> RolloutBatch:
        """A new batch with these rows, in this order (same widths)."""
        rows = torch.as_tensor(indices, dtype=torch.long, device=self.response_ids.device).reshape(-1)
        picked = rows.tolist()
        take = lambda t: t.index_select(0, rows.to(t.device))  # noqa: E731
        return replace(
            self, **{name: _apply(take, getattr(self, name)) for name in _ROW_TENSORS},
            reward_components={k: take(v) for k, v in self.reward_components.items()},
            extras={k: take(v) for k, v in self.extras.items()},
            images={k: take(v) for k, v in self.images.items()},
            **{name: [getattr(self, name)[i] for i in picked] if getattr(self, name) else []
               for name in _ROW_LISTS})

    def split(self, micro_batch_size: int) -> list[RolloutBatch]:
        """Consecutive chunks of at most ``micro_batch_size`` rows."""
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        return [self.select(range(start, min(start + micro_batch_size, len(self))))
                for start in range(0, len(self), micro_batch_size)]

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor field by a flat name, for safetensors (the text lists are left out)."""
        flat = {name: getattr(self, name) for name in _ROW_TENSORS
                if getattr(self, name) is not None}
        flat.update({f"reward_components.{k}": v for k, v in self.reward_components.items()})
        flat.update({f"extras.{k}": v for k, v in self.extras.items()})
        flat.update({f"images.{k}": v for k, v in self.images.items()})
        return {name: tensor.detach().cpu().contiguous() for name, tensor in flat.items()}

    @classmethod
    def from_tensors(cls, flat: dict[str, Tensor], policy_version: int = 0) -> RolloutBatch:
        """The inverse of :meth:`tensors` (with empty text lists)."""
        def group(prefix: str) -> dict[str, Tensor]:
            return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}

        fields = {name: flat.get(name) for name in _ROW_TENSORS}
        return cls(**fields, reward_components=group("reward_components."),
                   extras=group("extras."), images=group("images."),
                   policy_version=policy_version)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """A copy with every tensor on ``device``."""
        return replace(
            self, **{name: _apply(lambda t: t.to(device), getattr(self, name))
                     for name in _ROW_TENSORS},
            reward_components={k: v.to(device) for k, v in self.reward_components.items()},
            extras={k: v.to(device) for k, v in self.extras.items()},
            images={k: v.to(device) for k, v in self.images.items()})


_ROW_TENSORS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "old_logprobs",
                "rewards", "group_ids", "advantages", "returns", "values", "ref_logprobs",
                "context_mask", "token_versions")
_ROW_LISTS = ("prompts", "completions", "columns", "finish_reasons", "episode_stats")


def _apply(function: Any, tensor: Tensor | None) -> Tensor | None:
    """``function(tensor)``, keeping an absent optional field (``old_logprobs``) absent."""
    return None if tensor is None else function(tensor)


def pad_rows(rows: Sequence[Sequence[Any]], *, left: bool, pad_value: Any, dtype: torch.dtype,
             min_width: int = 1) -> tuple[Tensor, Tensor]:
    """Pad lists to one width: (values [N, W] of ``dtype``, mask [N, W] bool)."""
    width = max([min_width, *(len(row) for row in rows)])
    values = torch.full((len(rows), width), pad_value, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        if not row:
            continue
        span = slice(width - len(row), width) if left else slice(0, len(row))
        values[i, span] = torch.tensor(list(row), dtype=dtype)
        mask[i, span] = True
    return values, mask


def episode_tensors(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                    model: Sequence[Sequence[bool]], logprobs: Sequence[Sequence[float]] | None,
                    pad_token_id: int = 0) -> dict[str, Tensor | None]:
    """The token fields of a :class:`RolloutBatch` of multi-turn episodes: per row its prompt
    ids, its response (the model's tokens and the environment's, in order), which response
    tokens the model wrote (``response_mask``; ``context_mask`` marks them all) and the
    behaviour log-probs (0 on the environment's tokens; None when any row has none)."""
    prompt_ids, prompt_mask = pad_rows(prompts, left=True, pad_value=pad_token_id, dtype=torch.long)
    response_ids, context_mask = pad_rows(responses, left=False, pad_value=pad_token_id,
                                          dtype=torch.long)
    response_mask, _ = pad_rows(model, left=False, pad_value=False, dtype=torch.bool)
    old_logprobs = None
    if logprobs is not None:
        old_logprobs, _ = pad_rows(logprobs, left=False, pad_value=0.0, dtype=torch.float32)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "response_ids": response_ids,
            "response_mask": response_mask, "context_mask": context_mask,
            "old_logprobs": old_logprobs}
