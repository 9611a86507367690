"""Offline GRPO data: prompt-format rows that carry a response and its reward.

A row is a ``prompt``-format JSONL row (``prompt`` or ``messages``) with extra columns::

    {"messages": [{"role": "user", "content": "12+35="}], "response": "47", "reward": 1.0,
     "group": 17}

``response`` (string) is what the policy answered: it is tokenized without special tokens
and ended with the tokenizer's EOS token, as the sampler's completion would be after the
prompt (chat prompts end with the generation prompt). ``reward`` is a number. ``group``
(optional, any JSON value; default: the prompt text) says which rows were sampled for the
same prompt: the advantage estimator normalizes within a group **of the same batch**, so
keep each group's rows together (consecutive rows, ``data.shuffle: false`` and a
``data.batch_size`` that is a multiple of the group size).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch

from astrai_core.api import DataError
from astrai_core.api import RolloutBatch, pad_rows


def _response_ids(tokenizer: Any, response: Any, where: str) -> list[int]:
    if not isinstance(response, str) or not response:
        raise DataError(f"{where}: offline grpo needs a non-empty string column 'response'")
    ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids


def _reward(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataError(f"{where}: offline grpo needs a numeric column 'reward', got {value!r}")
    return float(value)


class OfflineRollouts:
    """Batches of such rows as rollouts, one per :meth:`draw` (a rollout source's drawer)."""

    def __init__(self, loader: Any, tokenizer: Any, pad_token_id: int = 0) -> None:
        self.loader, self.tokenizer, self.pad_token_id = loader, tokenizer, pad_token_id
        self._batches: Any = None

    def draw(self) -> RolloutBatch:
        if self._batches is None:  # made late, so that a resumed position applies
            self._batches = iter(self.loader)
        return offline_rollout(next(self._batches), self.tokenizer, self.pad_token_id)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
        self._batches = None


def offline_rollout(records: Sequence[Any], tokenizer: Any, pad_token_id: int = 0) -> RolloutBatch:
    """A RolloutBatch of dataset rows; ``old_logprobs`` stay None: the policy supplies them
    when the batch is drawn, before any step on it."""
    responses, rewards, group_keys = [], [], []
    for record in records:
        where = f"data.sources row with prompt {record.prompt_text!r}"
        responses.append(_response_ids(tokenizer, record.columns.get("response"), where))
        rewards.append(_reward(record.columns.get("reward"), where))
        group_keys.append(repr(record.columns.get("group", record.prompt_text)))
    numbering: dict[str, int] = {}
    group_ids = [numbering.setdefault(key, len(numbering)) for key in group_keys]
    prompt_ids, prompt_mask = pad_rows([r.prompt_ids for r in records], left=True,
                                       pad_value=pad_token_id, dtype=torch.long)
    response_ids, response_mask = pad_rows(responses, left=False, pad_value=pad_token_id,
                                           dtype=torch.long)
    reward_tensor = torch.tensor(rewards, dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
        response_mask=response_mask, old_logprobs=None,
        rewards=reward_tensor, reward_components={"reward": reward_tensor},
        group_ids=torch.tensor(group_ids, dtype=torch.long),
        prompts=[r.prompt_text for r in records],
        completions=[str(r.columns.get("response")) for r in records],
        columns=[dict(r.columns) for r in records])
