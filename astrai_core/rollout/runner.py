"""The rollout runner: draws rollouts for an online strategy.

Each :meth:`RolloutRunner.draw` takes ``prompts_per_rollout`` prompt records, samples
``group_size`` completions per prompt with the sampler, scores them with the weighted
rewards and returns a :class:`RolloutBatch`. How often a rollout is drawn and how it is
cut into optimizer steps is the rollout source's business (online/source.py), not the
runner's. Weights reach the sampler only through :meth:`publish`, at an optimizer-step
boundary; a lock makes a rollout and a publish exclusive, so a rollout never mixes
policy versions. With ``record_routing`` (``router_replay: R3``) the sampler records the
MoE experts of every token and each training rollout carries them in
``extras["routed_experts"]`` (``[N, MoE layers, P + R, top-k]``, model/router_replay.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from astrai_core.errors import ConfigError, DataError
from astrai_core.model.router_replay import ROUTED_EXPERTS, aligned_routing
from astrai_core.plugins.sampler_capabilities import SamplerCapabilities, sampler_capabilities
from astrai_core.rewards.reward_set import RewardSet
from astrai_core.rollout.batch import RolloutBatch, pad_rows
from astrai_core.rollout.images import rollout_images
from astrai_core.rollout.records import PromptRecord, as_prompt_record
from astrai_core.sampling.params import Completion, SamplingParams


class RecordStream:
    """Prompt records one by one from a loader that yields lists of them (resumable)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield from batch

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


class RolloutRunner:
    """Draws rollouts for the trainer; see the module docstring. ``capabilities``: what the
    sampler declares (read from it when not given); ``asynchronous``: its spec's flag, which
    lets partial rollouts overlap training (the run passes both)."""

    def __init__(self, sampler: Any, tokenizer: Any, rewards: RewardSet, sampling_params: SamplingParams,
                 group_size: int, prompt_source: Iterable[Any], prompts_per_rollout: int = 8,
                 pad_token_id: int = 0, seed_offset: int = 0, episodes: Any = None,
                 record_routing: bool = False, capabilities: SamplerCapabilities | None = None,
                 asynchronous: bool = False, prompt_share: tuple[int, int] = (0, 1)) -> None:
        if group_size < 1 or prompts_per_rollout < 1:
            raise ValueError("group_size and prompts_per_rollout must be >= 1")
        if record_routing and episodes is not None:
            raise ConfigError("strategy.router_replay: R3 replays the sampler's routing of "
                              "single-turn rollouts; a multi-turn environment's episodes do "
                              "not record it (use R2)")
        self.record_routing = record_routing  # training rollouts carry the sampler's routing
        self.sampler = sampler
        self.capabilities = (sampler_capabilities(sampler) if capabilities is None
                             else capabilities)
        self.asynchronous = asynchronous
        self.tokenizer = tokenizer
        self.rewards = rewards
        self.sampling_params = sampling_params
        self.group_size = group_size
        self.prompts_per_rollout = prompts_per_rollout
        self.pad_token_id = pad_token_id
        # Distributed: this rank's first prompt's index in the global rollout, so that each
        # prompt gets the seed it gets in a one-process run.
        self.seed_offset = seed_offset
        self.episodes = episodes  # an EpisodeRunner (rollout/episodes.py): multi-turn rollouts
        self._source = prompt_source
        # (index, count): the prompt source yields `count` shares per draw and this process
        # samples the index-th (the ranks of a context group read the same prompts)
        self.prompt_share = prompt_share
        self._prompts: Iterator[Any] = iter(prompt_source)
        self._lock = threading.Lock()
        self.rollouts_drawn = 0
        self.policy_version = 0  # publishes so far: stamps each rollout, survives a resume
        self.sample_log: Any = None  # a RolloutSampleLog (rollout.log_samples), or None

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the behaviour log-probs (1 for greedy sampling)."""
        return self.sampling_params.temperature or 1.0

    # ---------------------------------------------------------------- training rollouts
    def draw(self) -> RolloutBatch:
        """The next training rollout, from the next ``prompts_per_rollout`` prompts."""
        rollout = self.rollout(self.next_prompts(), seed_offset=self.seed_offset,
                               routing=self.record_routing)
        self.rollouts_drawn += 1
        return self._offered(self.rollouts_drawn, rollout)

    def _offered(self, number: int, rollout: RolloutBatch) -> RolloutBatch:
        """``rollout`` (the ``number``-th drawn), its samples logged when they are due."""
        return rollout if self.sample_log is None else self.sample_log.offer(number, rollout)

    # -- requested ahead (rollout.max_staleness > 0) ----------------------------------
    def submit(self) -> PendingRollout:
        """Request the next training rollout without waiting for it (an asynchronous
        sampler's ``generate_async``): it takes the same prompts and seeds as :meth:`draw`
        would, and is sampled by the policy published so far, since the sampler serves
        requests and weight updates in the order they arrive."""
        records = self.next_prompts()
        params = self._per_prompt_params(self.sampling_params, len(records), self.group_size)
        with self._lock:
            version = self.policy_version
            handle = self.sampler.generate_async([r.prompt_ids for r in records], params,
                                                 **self._routing_request(self.record_routing),
                                                 **self._image_request(records))
        self.rollouts_drawn += 1
        number = self.rollouts_drawn
        return PendingRollout(lambda: self._offered(number, self.build(
            records, handle.result(), version, self.record_routing)))

    def publish(self, state_dict: dict[str, torch.Tensor] | None = None) -> int:
        """Hand new policy weights to the sampler (None: the live model changed in place);
        returns the new policy version."""
        with self._lock:
            self.sampler.update_weights(state_dict)
            self.policy_version += 1
            return self.policy_version

    @property
    def lock(self) -> threading.Lock:
        """Held while sampling or publishing: a publish never lands inside a generate call."""
        return self._lock

    def sampler_metrics(self) -> dict[str, float]:
        """The sampler's own metrics since the last call (a ray sampler's push times), when
        it declares ``reports_metrics``."""
        return dict(self.sampler.metrics()) if self.capabilities.reports_metrics else {}

    # ---------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """Where the prompt source stands, how many rollouts were drawn (which seeds the
        sampling of the next one) and the policy version: what an exact resume needs."""
        state: dict[str, Any] = {"rollouts_drawn": self.rollouts_drawn,
                                 "policy_version": self.policy_version}
        if hasattr(self._source, "state_dict"):
            state["prompts"] = self._source.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "prompts" in state:
            self._source.load_state_dict(state["prompts"])
            self._prompts = iter(self._source)
        self.rollouts_drawn = int(state.get("rollouts_drawn", 0))
        self.policy_version = int(state.get("policy_version", 0))

    def publish_from(self, model: torch.nn.Module) -> int:
        """Publish ``model``'s weights as a new policy version (see :meth:`publish`); a
        sampler that declares ``shares_policy`` was built with ``model`` and reads them
        from it itself."""
        return self.publish(self._weights_for_sampler(model))

    def sync_from(self, model: torch.nn.Module) -> None:
        """Give the sampler ``model``'s weights without a new version (after a resume)."""
        weights = self._weights_for_sampler(model)
        if weights is not None:
            with self._lock:
                self.sampler.update_weights(weights)

    def _weights_for_sampler(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """None for a sampler that reads its weights from the policy it was built with
        (it declares ``shares_policy``); else the tensors."""
        if self.capabilities.shares_policy:
            return None
        from astrai_core.model.lora import merged_state_dict

        return merged_state_dict(model)  # a LoRA policy reaches other samplers merged

    # ---------------------------------------------------------------- one rollout
    def rollout(self, records: Sequence[PromptRecord], sampling_params: SamplingParams | None = None,
                group_size: int | None = None, seed_offset: int = 0,
                routing: bool = False) -> RolloutBatch:
        """Sample ``group_size`` completions per record and score them (``routing``: with
        the sampler's MoE routing)."""
        if self.episodes is not None:  # multi-turn: the episode runner plays and scores them
            with self._lock:
                return self.episodes.run(records, sampling_params or self.sampling_params,
                                         group_size or self.group_size, self.policy_version,
                                         seed_offset=self.rollouts_drawn, first_prompt=seed_offset)
        params = self._per_prompt_params(sampling_params or self.sampling_params, len(records),
                                         group_size or self.group_size, seed_offset)
        with self._lock:  # no publish while sampling: one policy version per rollout
            version = self.policy_version
            completions = self.sampler.generate([r.prompt_ids for r in records], params,
                                                **self._routing_request(routing),
                                                **self._image_request(records))
        return self.build(records, completions, version, routing)

    @staticmethod
    def _routing_request(routing: bool) -> dict[str, bool]:
        """The sampler's keyword for routing, given only when asked (other samplers lack it)."""
        return {"record_routing": True} if routing else {}

    def _image_request(self, records: Sequence[PromptRecord]) -> dict[str, Any]:
        """The sampler's ``images`` keyword, given only when a prompt holds images (other
        samplers lack it); a ConfigError when the sampler takes none."""
        if not any(r.images for r in records):
            return {}
        if not self.capabilities.images:
            raise ConfigError(f"the prompts hold images, and the sampler "
                              f"({type(self.sampler).__name__}) takes none; use the torch or "
                              "ray sampler")
        return {"images": [r.images for r in records]}

    def _per_prompt_params(self, params: SamplingParams, count: int, group_size: int,
                           seed_offset: int = 0) -> list[SamplingParams]:
        """G completions per prompt; a seeded run draws fresh (still reproducible) seeds per rollout."""
        grouped = params.model_copy(update={"n": group_size})
        if params.seed is None:
            return [grouped] * count
        base = params.seed + 1_000_003 * self.rollouts_drawn + seed_offset
        return [grouped.model_copy(update={"seed": base + i}) for i in range(count)]

    def next_prompts(self, count: int | None = None) -> list[PromptRecord]:
        """The next ``count`` prompt records (default ``prompts_per_rollout``), restarting
        the prompt source at its end (a new epoch); this process's share of
        ``count`` x the shares the source's records are split into (``prompt_share``)."""
        count = self.prompts_per_rollout if count is None else count
        index, shares = self.prompt_share
        records: list[PromptRecord] = []
        restarted = False
        while len(records) < count * shares:
            try:
                records.append(as_prompt_record(next(self._prompts)))
                restarted = False
            except StopIteration:
                if restarted:
                    raise DataError("the prompt source yields no prompts (an iterator can be read "
                                    "only once: pass a re-iterable source)") from None
                self._prompts, restarted = iter(self._source), True  # a new epoch
        return records[index * count:(index + 1) * count]

    def build(self, records: Sequence[PromptRecord], completions: list[Completion],
              version: int, routing: bool = False) -> RolloutBatch:
        """The scored rollout of ``completions`` (each naming its record by ``prompt_index``)."""
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
        images = rollout_images([r.images for r in rows], prompt_ids.shape[1])
        extras = {}
        if routing:
            if any(c.routed_experts is None for c in completions):
                raise RuntimeError(f"the sampler ({type(self.sampler).__name__}) was asked "
                                   "for its MoE routing and returned none")
            extras[ROUTED_EXPERTS] = aligned_routing(
                [c.routed_experts for c in completions], [len(r.prompt_ids) for r in rows],
                prompt_ids.shape[1], response_ids.shape[1])
        return RolloutBatch(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
            response_mask=response_mask, old_logprobs=old_logprobs,
            rewards=torch.tensor(totals, dtype=torch.float32),
            reward_components={k: torch.tensor(v, dtype=torch.float32) for k, v in components.items()},
            group_ids=torch.tensor([c.prompt_index for c in completions], dtype=torch.long),
            policy_version=version, prompts=prompts, completions=texts, columns=columns,
            finish_reasons=[c.finish_reason for c in completions], extras=extras,
            images=images)

    def _decode(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


class PendingRollout:
    """A rollout requested ahead; :meth:`result` waits for its completions and scores them."""

    def __init__(self, finish: Any) -> None:
        self._finish = finish

    def result(self) -> RolloutBatch:
        return self._finish()


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
