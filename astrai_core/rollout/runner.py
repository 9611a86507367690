"""The rollout runner: turns a strategy online.

Each rollout takes ``prompts_per_rollout`` prompt records, samples ``group_size``
completions per prompt with the sampler, scores them with the weighted rewards and
returns a :class:`RolloutBatch`. Weights reach the sampler only through :meth:`publish`,
at an optimizer-step boundary; a lock makes a rollout and a publish exclusive, so a
rollout never mixes policy versions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from astrai_core.errors import DataError
from astrai_core.rewards.reward_set import RewardSet
from astrai_core.rollout.batch import RolloutBatch, pad_rows
from astrai_core.rollout.records import PromptRecord, as_prompt_record
from astrai_core.sampling.params import Completion, SamplingParams


class RolloutRunner:
    """Draws rollouts for the trainer; see the module docstring.

    ``rollout_interval`` k: :meth:`next_rollout` serves the same rollout for k calls
    (optimizer steps) before drawing a new one.
    """

    def __init__(self, sampler: Any, tokenizer: Any, rewards: RewardSet, sampling_params: SamplingParams,
                 group_size: int, prompt_source: Iterable[Any], prompts_per_rollout: int = 8,
                 rollout_interval: int = 1, pad_token_id: int = 0) -> None:
        if group_size < 1 or prompts_per_rollout < 1 or rollout_interval < 1:
            raise ValueError("group_size, prompts_per_rollout and rollout_interval must be >= 1")
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.rewards = rewards
        self.sampling_params = sampling_params
        self.group_size = group_size
        self.prompts_per_rollout = prompts_per_rollout
        self.rollout_interval = rollout_interval
        self.pad_token_id = pad_token_id
        self._source = prompt_source
        self._prompts: Iterator[Any] = iter(prompt_source)
        self._lock = threading.Lock()
        self._current: RolloutBatch | None = None
        self._served = 0
        self.rollouts_drawn = 0

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the behaviour log-probs (1 for greedy sampling)."""
        return self.sampling_params.temperature or 1.0

    # ---------------------------------------------------------------- training cadence
    def next_rollout(self) -> RolloutBatch:
        """The rollout for this optimizer step: a new one every ``rollout_interval`` calls."""
        if self._current is None or self._served >= self.rollout_interval:
            self._current = self.rollout(self._next_prompts())
            self.rollouts_drawn += 1
            self._served = 0
        self._served += 1
        return self._current

    def publish(self, state_dict: dict[str, torch.Tensor] | None = None) -> int:
        """Hand new policy weights to the sampler (None: the live model changed in place)."""
        with self._lock:
            return self.sampler.update_weights(state_dict)

    # ---------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """Where the prompt source stands and how many rollouts were drawn (which seeds
        the sampling of the next one): what an exact resume needs."""
        state: dict[str, Any] = {"rollouts_drawn": self.rollouts_drawn}
        if hasattr(self._source, "state_dict"):
            state["prompts"] = self._source.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "prompts" in state:
            self._source.load_state_dict(state["prompts"])
            self._prompts = iter(self._source)
        self.rollouts_drawn = int(state.get("rollouts_drawn", 0))

    def publish_from(self, model: torch.nn.Module) -> int:
        """Publish ``model``'s weights: a sampler that generates with this very model only
        bumps its version; an engine with its own copy receives the tensors."""
        shares_model = getattr(self.sampler, "model", None) is model
        return self.publish(None if shares_model else model.state_dict())

    def validation_rollout(self, prompts: Sequence[Any], sampling_params: SamplingParams | None = None,
                           group_size: int | None = None) -> RolloutBatch:
        """A one-off rollout of ``prompts``; the training rollout and its cadence are untouched."""
        return self.rollout([as_prompt_record(p) for p in prompts], sampling_params, group_size)

    # ---------------------------------------------------------------- one rollout
    def rollout(self, records: Sequence[PromptRecord], sampling_params: SamplingParams | None = None,
                group_size: int | None = None) -> RolloutBatch:
        """Sample ``group_size`` completions per record and score them."""
        params = self._per_prompt_params(sampling_params or self.sampling_params, len(records),
                                         group_size or self.group_size)
        with self._lock:  # no publish while sampling: one policy version per rollout
            version = self.sampler.policy_version
            completions = self.sampler.generate([r.prompt_ids for r in records], params)
        return self._build(records, completions, version)

    def _per_prompt_params(self, params: SamplingParams, count: int, group_size: int
                           ) -> list[SamplingParams]:
        """G completions per prompt; a seeded run draws fresh (still reproducible) seeds per rollout."""
        grouped = params.model_copy(update={"n": group_size})
        if params.seed is None:
            return [grouped] * count
        base = params.seed + 1_000_003 * self.rollouts_drawn
        return [grouped.model_copy(update={"seed": base + i}) for i in range(count)]

    def _next_prompts(self) -> list[PromptRecord]:
        records = []
        restarted = False
        while len(records) < self.prompts_per_rollout:
            try:
                records.append(as_prompt_record(next(self._prompts)))
                restarted = False
            except StopIteration:
                if restarted:
                    raise DataError("the prompt source yields no prompts (an iterator can be read "
                                    "only once: pass a re-iterable source)") from None
                self._prompts, restarted = iter(self._source), True  # a new epoch
        return records

    def _build(self, records: Sequence[PromptRecord], completions: list[Completion],
               version: int) -> RolloutBatch:
        rows = [records[c.prompt_index] for c in completions]
        texts = [c.text if c.text is not None else self._decode(c.token_ids) for c in completions]
        prompts = [r.prompt_text or self._decode(r.prompt_ids) for r in rows]
        columns = [dict(r.columns) for r in rows]
        totals, components = self.rewards.score(prompts, texts, columns,
                                                completion_ids=[c.token_ids for c in completions])
        prompt_ids, prompt_mask = pad_rows([r.prompt_ids for r in rows], left=True,
                                           pad_value=self.pad_token_id, dtype=torch.long)
        response_ids, response_mask = pad_rows([c.token_ids for c in completions], left=False,
                                               pad_value=self.pad_token_id, dtype=torch.long)
        old_logprobs = _behaviour_logprobs(completions)
        return RolloutBatch(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
            response_mask=response_mask, old_logprobs=old_logprobs,
            rewards=torch.tensor(totals, dtype=torch.float32),
            reward_components={k: torch.tensor(v, dtype=torch.float32) for k, v in components.items()},
            group_ids=torch.tensor([c.prompt_index for c in completions], dtype=torch.long),
            policy_version=version, prompts=prompts, completions=texts, columns=columns,
            finish_reasons=[c.finish_reason for c in completions])

    def _decode(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


def _behaviour_logprobs(completions: Sequence[Completion]) -> torch.Tensor | None:
    """[N, R] sampler log-probs, 0 on padding; None unless every completion has one per token.

    A partial set is never padded with zeros: a 0 would read as probability 1 and bias
    every importance ratio, so the strategy must recompute them (or stop with an error).
    """
    rows = [c.logprobs for c in completions]
    if any(row is None or len(row) != len(c.token_ids) for row, c in zip(rows, completions)):
        return None
    values, _ = pad_rows(rows, left=False, pad_value=0.0, dtype=torch.float32)
    return values
