"""A reward model's score: a linear head on the final hidden state of the last real token.

The pooled position is chosen exactly as Hugging Face's ``*ForSequenceClassification``
chooses it: the rightmost position whose token is not the pad token
(``config.pad_token_id``). astrai also skips positions its attention mask marks as padding
(padding is told apart by the mask, whatever id fills it), which changes nothing on
sequences padded with the pad token. So a sequence ending in the pad token is scored at
the token before it (e.g. when the pad token is the EOS token), in astrai as in
``transformers``, and an exported reward model scores what it scored here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from astrai_core.api import ConfigError, context_split, gather_shards, splits_rows

SCORE_HEAD = "score"  # the trained module's name: <checkpoint>/score.safetensors


def reward_pad_id(tokenizer: Any) -> int | None:
    """The pad id a reward model pools by: the tokenizer's pad token, else its EOS token
    (what Hugging Face users pad with when a tokenizer has no pad token)."""
    pad = tokenizer.pad_token_id
    return pad if pad is not None else tokenizer.eos_token_id


def pooled_positions(input_ids: Tensor, attention_mask: Tensor | None,
                     pad_id: int | None) -> Tensor:
    """[B] index of the last token that is attended and not ``pad_id`` (0 when none is)."""
    real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None \
        else attention_mask.bool()
    if pad_id is not None:
        real = real & (input_ids != pad_id)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    return (positions * real).argmax(-1)


def new_score_head(hidden_size: int, init_std: float, like: Tensor) -> nn.Linear:
    """The score head (no bias, as in Hugging Face's classifiers), normal(0, init_std)
    initialised, on ``like``'s device and dtype."""
    head = nn.Linear(hidden_size, 1, bias=False)
    with torch.no_grad():
        head.weight.normal_(0.0, init_std)
    return head.to(device=like.device, dtype=like.dtype)


def sequence_rewards(backbone: nn.Module, head: nn.Module, input_ids: Tensor,
                     attention_mask: Tensor | None, pad_id: int | None,
                     position_ids: Tensor | None = None, dist: Any = None,
                     images: Mapping[str, Tensor] | None = None) -> tuple[Tensor, Any]:
    """(rewards [B] float32, the MoE aux loss) of right-padded sequences. ``dist`` (the
    run's): with ``parallel.context_parallel``, the rows' tokens split over the ranks of
    a context group, each of which gets the whole rows' rewards. ``images``: a
    vision-language model's image inputs for the rows' image tokens (the model's
    forward puts the images' features there, so the last token's state sees them)."""
    if splits_rows(dist):
        if images:
            raise ConfigError("parallel.context_parallel does not split rows with images "
                              "(an rm run's pairs); leave it out for this data")
        return _context_rewards(backbone, head, input_ids, attention_mask, pad_id,
                                position_ids, dist)
    # logits_to_keep=1: the LM head's logits are not needed, only the hidden states
    out = backbone(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   return_hidden_states=True, logits_to_keep=1,
                   **({"images": images} if images else {}))
    hidden = out["hidden_states"]
    index = pooled_positions(input_ids, attention_mask, pad_id)
    pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), index]
    return head(pooled).squeeze(-1).float(), out.get("aux_loss")


def _context_rewards(backbone: nn.Module, head: nn.Module, input_ids: Tensor,
                     attention_mask: Tensor | None, pad_id: int | None,
                     position_ids: Tensor | None, dist: Any) -> tuple[Tensor, Any]:
    """:func:`sequence_rewards` of rows split over a context group: each rank scores every
    position of its shard (a [H] -> 1 head: cheap), and the group's scores are gathered
    ([B, S] floats, not the hidden states) before each row's pooled position is read."""
    local, shard = context_split(input_ids, dist, attention_mask=attention_mask,
                                 position_ids=position_ids)
    out = backbone(local, context_shard=shard, return_hidden_states=True,
                   head=lambda hidden, weight: {})  # no LM logits
    local_scores = head(out["hidden_states"]).squeeze(-1)
    scores = gather_shards(local_scores, dist)[:, :input_ids.shape[1]]
    index = pooled_positions(input_ids, attention_mask, pad_id)
    rows = torch.arange(scores.shape[0], device=scores.device)
    return scores[rows, index].float(), out.get("aux_loss")


class RewardModel(nn.Module):
    """A native backbone and its score head, loaded from a reward-model checkpoint."""

    def __init__(self, backbone: nn.Module, score: nn.Linear, pad_id: int | None) -> None:
        super().__init__()
        self.backbone, self.score, self.pad_id = backbone, score, pad_id

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                images: Mapping[str, Tensor] | None = None) -> Tensor:
        """[B] rewards of right-padded sequences (``images``: a vision-language model's
        image inputs of the rows)."""
        return sequence_rewards(self.backbone, self.score, input_ids, attention_mask,
                                self.pad_id, images=images)[0]
