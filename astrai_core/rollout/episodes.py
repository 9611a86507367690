"""Multi-turn episodes: the model talks to an environment, turn by turn, in batches.

:meth:`EpisodeRunner.run` plays ``group_size`` episodes per prompt record together:

1. every active episode generates an assistant turn (one ``sampler.generate`` call for
   the whole batch), stopping at the end-of-turn token or, with ``stop_at_tool_call``, at
   the end of a complete ``</tool_call>``;
2. the turn is parsed by the serving layer's Hermes parser (:func:`parse_hermes`);
3. every episode's ``env.step(state, turn)`` runs on its own thread, all at once, bounded
   by ``step_timeout``: a slow tool delays the next turn by its own time only, not by the
   sum of all tools, and never blocks the decode of a turn;
4. the environment's messages are rendered by the chat template and their tokens appended;
5. until the environment says ``done``, ``max_turns`` is reached or the token budget is
   spent. Finished episodes leave the batch: later turns generate for the others only.

Rounds are synchronous (every episode's step finishes before the next turn is sampled),
so the batches and seeds of each turn do not depend on thread timing and a seeded run is
reproducible, which an exact resume needs.

The result is one :class:`RolloutBatch` row per episode whose response is every token
after the prompt: the model's turns and the environment's messages, in order.
``context_mask`` marks all of them (the model attends to tool results); ``response_mask``
marks the model's tokens only, so the loss, the behaviour log-probs (0 elsewhere), the
KL terms and the advantages are spent on them alone.

**GAE across environment spans.** Values and advantages live on model tokens only; the
GAE estimator skips masked positions, so for the last model token t before a tool result
and the first model token t' after it, delta_t = r_t + gamma * V(s_t') - V(s_t). V(s_t)
is the value of the state before model token t, i.e. of the whole context so far,
environment messages included: the environment span belongs to the transition from s_t
to s_t', and its tokens are neither actions nor discounted steps.

Failures never stop the run: an unparsable ``<tool_call>`` block, an exception or a
timeout in ``step``, or a malformed result becomes an error message the model sees on
its next turn, counted in ``rollout/tool_error_rate``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from astrai_core.environments.base import AssistantTurn, EnvMessage, EnvStep, ToolCall, error_message
from astrai_core.environments.episode_config import EpisodeConfig
from astrai_core.environments.timeouts import CallTimeout, start_call
from astrai_core.rewards.reward_set import RewardSet
from astrai_core.rollout.batch import RolloutBatch, episode_tensors
from astrai_core.rollout.env_render import MessageRenderer
from astrai_core.rollout.records import PromptRecord
from astrai_core.sampling.params import Completion, SamplingParams
from astrai_core.serving.hermes import END_TAG, START_TAG, parse_hermes

ENV_REWARD = "environment"  # the reward component of rewards returned by the environment
_ROLLOUT_SEED_STRIDE = 1_000_003
_TURN_SEED_STRIDE = 65_537  # seeds: base + stride * turn + episode (episodes < stride)


def episode_turn_seed(seed: int, rollout: int, turn: int, episode: int) -> int:
    """The sampling seed of one turn of a seeded run: a function of the run's ``seed``, the
    ``rollout`` drawn, the ``turn`` and the ``episode``'s index in the rollout (its prompt's
    index times the group size plus its member), never of the order in which episodes ask,
    so that an episode samples the same tokens whatever the concurrency or world size."""
    return seed + _ROLLOUT_SEED_STRIDE * rollout + _TURN_SEED_STRIDE * turn + episode


@dataclass
class _Episode:
    """One episode in progress."""

    record: PromptRecord
    prompt_index: int
    index: int
    state: Any = None
    tokens: list[int] = field(default_factory=list)      # the response so far
    model: list[bool] = field(default_factory=list)      # True: the model wrote it
    logprobs: list[float] | None = field(default_factory=list)
    texts: list[str] = field(default_factory=list)       # the model's turns, decoded
    turn: AssistantTurn | None = None                    # the latest turn
    finish_reason: str | None = None
    reward: float | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    env_seconds: float = 0.0

    @property
    def context(self) -> list[int]:
        return self.record.prompt_ids + self.tokens

    def stats(self) -> dict[str, float]:
        return {"turns": float(len(self.texts)), "tool_calls": float(self.tool_calls),
                "tool_errors": float(self.tool_errors), "env_seconds": self.env_seconds}


class EpisodeRunner:
    """Plays batches of episodes with an environment; see the module docstring."""

    def __init__(self, environment: Any, sampler: Any, tokenizer: Any, rewards: RewardSet,
                 config: EpisodeConfig | None = None, pad_token_id: int = 0) -> None:
        self.environment = environment
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.rewards = rewards
        self.config = config or EpisodeConfig()
        self.pad_token_id = pad_token_id
        self.renderer = MessageRenderer(tokenizer)

    def run(self, records: Sequence[PromptRecord], params: SamplingParams, group_size: int = 1,
            policy_version: int = 0, seed_offset: int = 0, first_prompt: int = 0) -> RolloutBatch:
        """``group_size`` episodes per record, played to the end and scored.
        ``first_prompt``: the index of ``records[0]`` in the global rollout of a distributed
        run, so that each episode's seeds are those of the one-process run."""
        episodes = [_Episode(record, prompt_index=p, index=(first_prompt + p) * group_size + g)
                    for p, record in enumerate(records) for g in range(group_size)]
        for episode in episodes:
            episode.state = self.environment.reset(_row(episode.record))
        budget = self.config.max_tokens or params.max_new_tokens * self.config.max_turns
        for turn in range(self.config.max_turns):
            active = [e for e in episodes if e.finish_reason is None]
            if not active:
                break
            self._generate(active, params, turn, budget, seed_offset)
            self._step([e for e in active if e.finish_reason is None], turn, budget,
                       params.stop_token_ids)
        return self._build(episodes, policy_version)

    # ---------------------------------------------------------------- one turn
    def _generate(self, active: list[_Episode], params: SamplingParams, turn: int, budget: int,
                  seed_offset: int) -> None:
        stops = tuple(params.stop) + ((END_TAG,) if self.config.stop_at_tool_call else ())
        requests = [self._turn_params(params, e, turn, budget, stops, seed_offset) for e in active]
        completions = self.sampler.generate([e.context for e in active], requests)
        for episode, completion in zip(active, completions, strict=True):
            self._record_turn(episode, completion, turn, budget)

    def _turn_params(self, params: SamplingParams, episode: _Episode, turn: int, budget: int,
                     stops: tuple[str, ...], seed_offset: int) -> SamplingParams:
        update: dict[str, Any] = {"n": 1, "stop": stops,
                                  "max_new_tokens": min(params.max_new_tokens,
                                                        budget - len(episode.tokens))}
        if params.seed is not None:
            update["seed"] = episode_turn_seed(params.seed, seed_offset, turn, episode.index)
        return params.model_copy(update=update)

    def _record_turn(self, episode: _Episode, completion: Completion, turn: int,
                     budget: int) -> None:
        ids = list(completion.token_ids)
        episode.tokens += ids
        episode.model += [True] * len(ids)
        if episode.logprobs is not None and completion.logprobs is not None \
                and len(completion.logprobs) == len(ids):
            episode.logprobs += list(completion.logprobs)
        else:
            episode.logprobs = None  # never padded with zeros: see runner._behaviour_logprobs
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        episode.texts.append(text)
        message = parse_hermes(text)
        calls = tuple(ToolCall(c.name, c.arguments, id=f"call_{turn}_{i}")
                      for i, c in enumerate(message.tool_calls))
        episode.turn = AssistantTurn(text=text, content=message.content, tool_calls=calls,
                                     index=turn, finish_reason=completion.finish_reason)
        if completion.finish_reason == "length":
            episode.finish_reason = "length"  # a cut turn: nothing complete to answer

    def _step(self, asking: list[_Episode], turn: int, budget: int,
              stop_ids: Sequence[int]) -> None:
        """Every episode's environment step at once, then their messages appended."""
        started = time.perf_counter()
        pending = {}
        for episode in asking:
            if not episode.turn.tool_calls and START_TAG in episode.turn.content:
                continue  # an unparsable call: answered below without the environment
            pending[episode.index] = start_call(_timed_step, self.environment, episode.state,
                                                episode.turn, name="astrai-env-step")
        for episode in asking:
            step = self._answer(episode, pending.get(episode.index), started)
            self._apply(episode, step, turn == self.config.max_turns - 1, budget, stop_ids)

    def _answer(self, episode: _Episode, call: Any, started: float) -> EnvStep:
        """The environment's step, or the error messages that replace it."""
        turn = episode.turn
        if call is None:
            return EnvStep(messages=(error_message(None, "the tool call could not be parsed: "
                                                   "write <tool_call>{\"name\": ..., "
                                                   "\"arguments\": {...}}</tool_call>"),))
        remaining = max(0.0, started + self.config.step_timeout - time.perf_counter())
        try:
            step, seconds = call.result(remaining)
        except Exception as exc:  # the environment's failure or its timeout: the model sees it
            episode.env_seconds += time.perf_counter() - started
            reason = (f"no result within {self.config.step_timeout:g} s" if isinstance(exc, CallTimeout)
                      else f"{type(exc).__name__}: {exc}")
            calls = turn.tool_calls or (None,)
            return EnvStep(messages=tuple(error_message(c, reason) for c in calls))
        episode.env_seconds += seconds
        if not isinstance(step, EnvStep):
            return EnvStep(messages=(error_message(None, f"the environment returned "
                                                   f"{type(step).__name__}, not an EnvStep"),))
        return step

    def _apply(self, episode: _Episode, step: EnvStep, last_turn: bool, budget: int,
               stop_ids: Sequence[int]) -> None:
        episode.tool_calls += len(episode.turn.tool_calls) or int(START_TAG in episode.turn.content)
        if step.done or not step.messages:
            episode.finish_reason, episode.reward = "stop", step.reward
            return
        episode.tool_errors += sum(m.error for m in step.messages if isinstance(m, EnvMessage))
        if last_turn:
            episode.finish_reason = "max_turns"
            return
        tokens = self.renderer.tokens([m.chat_message() for m in step.messages],
                                      episode.tokens[-1] if episode.tokens else None, stop_ids)
        if len(episode.tokens) + len(tokens) >= budget:
            episode.finish_reason = "length"  # no room left for another turn
            return
        episode.tokens += tokens
        episode.model += [False] * len(tokens)
        if episode.logprobs is not None:
            episode.logprobs += [0.0] * len(tokens)

    # ---------------------------------------------------------------- the batch
    def _build(self, episodes: list[_Episode], version: int) -> RolloutBatch:
        rows = [e.record for e in episodes]
        prompts = [r.prompt_text or self.tokenizer.decode(r.prompt_ids, skip_special_tokens=True)
                   for r in rows]
        texts = ["".join(e.texts) for e in episodes]
        columns = [dict(r.columns) for r in rows]
        model_ids = [[t for t, m in zip(e.tokens, e.model) if m] for e in episodes]
        totals, components = self.rewards.score(prompts, texts, columns, completion_ids=model_ids)
        if any(e.reward is not None for e in episodes):
            env_rewards = [float(e.reward or 0.0) for e in episodes]
            totals = [t + r for t, r in zip(totals, env_rewards)]
            components[ENV_REWARD] = env_rewards
        logprobs = ([e.logprobs for e in episodes] if all(e.logprobs is not None for e in episodes)
                    else None)
        tokens = episode_tensors([r.prompt_ids for r in rows], [e.tokens for e in episodes],
                                 [e.model for e in episodes], logprobs, self.pad_token_id)
        return RolloutBatch(
            **tokens,
            rewards=torch.tensor(totals, dtype=torch.float32),
            reward_components={k: torch.tensor(v, dtype=torch.float32) for k, v in components.items()},
            group_ids=torch.tensor([e.prompt_index for e in episodes], dtype=torch.long),
            policy_version=version, prompts=prompts, completions=texts, columns=columns,
            finish_reasons=[e.finish_reason or "max_turns" for e in episodes],
            episode_stats=[e.stats() for e in episodes])


def _row(record: PromptRecord) -> dict[str, Any]:
    """The prompt row an environment's ``reset`` gets."""
    return {"prompt_ids": list(record.prompt_ids), "prompt_text": record.prompt_text,
            "columns": dict(record.columns)}


def _timed_step(environment: Any, state: Any, turn: AssistantTurn) -> tuple[Any, float]:
    started = time.perf_counter()
    step = environment.step(state, turn)
    return step, time.perf_counter() - started
