"""Episodes of a verifiers environment, played by verifiers and trained on by astrai.

Per rollout: ``len(records)`` tasks of the taskset (in order, cycling), ``group_size``
episodes each, all run at once by verifiers (``Env.run_episode``). verifiers' interception
server asks :class:`~astrai_plugin_verifiers.client.EngineClient` for every turn, so the
policy answers through astrai's serving engine and each turn's prompt ids, sampled ids and
sampler log-probs land in the episode's trace. A trace's branch (verifiers' training view:
its token ids, which of them were sampled, and their log-probs) becomes one row: the
tokens before the first sampled one are the prompt, the rest the response, in which only
the sampled tokens are trained on (``response_mask``) and the environment's tokens (tool
results, user turns, template scaffolding) are context. The reward is the rubric's score
(``trace.reward``: its weighted rewards), plus the run's reward functions if any.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import verifiers.v1 as vf
from verifiers.v1.interception import server as interception_server

from astrai_core.api import AstraiError, RolloutBatch, SamplerEngine, episode_tensors
from astrai_plugin_verifiers.client import EngineClient

REWARD = "verifiers"  # the reward component of the rubric's score


class VerifiersEpisodes:
    """The episode runner of the ``verifiers`` environment; see the module docstring."""

    def __init__(self, env: vf.Env, sampler: Any, tokenizer: Any, rewards: Any, config: Any, *,
                 pad_token_id: int = 0, timeout: float = 600.0) -> None:
        self.env, self.sampler, self.tokenizer, self.rewards = env, sampler, tokenizer, rewards
        self.config, self.pad_token_id, self.timeout = config, pad_token_id, timeout
        self._tasks = self._cycle()
        self.last_client: EngineClient | None = None  # the latest rollout's (tests read them)
        self.last_episodes: list[Any] = []

    def _cycle(self) -> Iterator[Any]:
        while True:
            empty = True
            for task in self.env.taskset:
                empty = False
                yield task
            if empty:
                raise AstraiError("the verifiers taskset has no tasks")

    def run(self, records: Sequence[Any], params: Any, group_size: int = 1,
            policy_version: int = 0, seed_offset: int = 0, first_prompt: int = 0) -> RolloutBatch:
        if first_prompt:  # another rank's share: each rank would replay the same tasks
            raise AstraiError("the verifiers environment trains in one process (no "
                              "--nproc-per-node)")
        tasks = list(itertools.islice(self._tasks, len(records)))
        budget = self.config.max_tokens or params.max_new_tokens * self.config.max_turns
        # max_context only bounds what the HTTP app admits; the budget bounds an episode here
        engine = SamplerEngine(self.sampler, self.tokenizer, max_context=1 << 30,
                               vocab_size=len(self.tokenizer))
        client = EngineClient(engine, self.tokenizer, params, max_tokens=budget,
                              stop_at_tool_call=self.config.stop_at_tool_call, rollout=seed_offset)
        self.last_client = client
        try:
            episodes = asyncio.run(self._play(tasks, group_size, client))
        finally:
            engine.close()
        self.last_episodes = episodes
        return self._build(tasks, episodes, group_size, client, policy_version)

    async def _play(self, tasks: list[Any], group_size: int, client: EngineClient) -> list[Any]:
        endpoint = vf.TrainClientConfig(base_url=f"http://astrai-policy.invalid/{uuid.uuid4().hex}",
                                        api_key_var="ASTRAI_VERIFIERS_UNUSED_KEY")
        ctx = vf.ModelContext(model="astrai-policy", client=endpoint)
        with _serving_client(endpoint, client):
            async with self.env.serving():
                # episode i's traces (a retry mints a new one) take episode i's seeds
                runs = [self.env.run_episode(task, ctx, on_trace=_following(client, i))
                        for i, task in enumerate(t for t in tasks for _ in range(group_size))]
                return await asyncio.wait_for(asyncio.gather(*runs), self.timeout)

    # ---------------------------------------------------------------- the batch
    def _build(self, tasks: list[Any], episodes: list[Any], group_size: int,
               client: EngineClient, version: int) -> RolloutBatch:
        rows = [_row(episode, client) for episode in episodes]
        prompts = [self.tokenizer.decode(r["prompt"], skip_special_tokens=True) for r in rows]
        texts = [self.tokenizer.decode([t for t, m in zip(r["response"], r["mask"]) if m],
                                       skip_special_tokens=True) for r in rows]
        columns = [{"task": t.data.model_dump(mode="json")} for t in tasks for _ in range(group_size)]
        model_ids = [[t for t, m in zip(r["response"], r["mask"]) if m] for r in rows]
        totals, components = self.rewards.score(prompts, texts, columns, completion_ids=model_ids)
        rubric = [r["reward"] for r in rows]
        totals = [t + s for t, s in zip(totals, rubric)]
        components[REWARD] = rubric
        for name in sorted({n for r in rows for n in r["rewards"]}):
            components[f"{REWARD}/{name}"] = [r["rewards"].get(name, 0.0) for r in rows]
        logprobs = [r["logprobs"] for r in rows]
        tokens = episode_tensors([r["prompt"] for r in rows], [r["response"] for r in rows],
                                 [r["mask"] for r in rows],
                                 None if None in logprobs else logprobs, self.pad_token_id)
        return RolloutBatch(
            **tokens,
            rewards=torch.tensor(totals, dtype=torch.float32),
            reward_components={k: torch.tensor(v, dtype=torch.float32) for k, v in components.items()},
            group_ids=torch.tensor([i // group_size for i in range(len(rows))], dtype=torch.long),
            policy_version=version, prompts=prompts, completions=texts, columns=columns,
            finish_reasons=[r["finish"] for r in rows], episode_stats=[r["stats"] for r in rows])


def _following(client: EngineClient, episode: int) -> Any:
    """verifiers' ``on_trace``: called as an episode's trace is minted, before any request."""
    return lambda trace: client.follow(trace.id, episode)


def _row(episode: Any, client: EngineClient) -> dict[str, Any]:
    """One episode's training row, from its trace's one trainable branch."""
    trace = _trace(episode)
    branches = [b for b in trace.branches if b.trainable and any(b.sampled_mask)]
    if len(branches) != 1:
        raise AstraiError(f"a verifiers episode has {len(branches)} trainable token branches; "
                          "astrai trains on episodes whose turns extend one conversation")
    branch = branches[0]
    ids, mask, logprobs = branch.token_ids, branch.sampled_mask, branch.logprobs
    first = mask.index(True)
    samples = client.streams[trace.id].samples
    calls = sum(len(m.tool_calls or []) for m in branch.messages if m.role == "assistant")
    return {
        "prompt": ids[:first], "response": ids[first:], "mask": mask[first:],
        "logprobs": None if any(s.logprobs is None for s in samples) else logprobs[first:],
        "reward": float(trace.reward),
        "rewards": {n: r.score for n, r in trace.rewards.items() if r is not None},
        "finish": "length" if samples[-1].finish_reason == "length" else "stop",
        "stats": {"turns": float(len(samples)), "tool_calls": float(calls), "tool_errors": 0.0,
                  "env_seconds": 0.0},
    }


def _trace(episode: Any) -> Any:
    traces = [t for t in episode.traces if t.ok] or list(episode.traces)
    if not traces or not episode.ok:
        errors = [f"{e.type}: {e.message}" for e in (episode.errors or [])]
        errors += [f"{e.type}: {e.message}" for t in episode.traces for e in (t.errors or [])]
        raise AstraiError("a verifiers episode failed: " + ("; ".join(errors) or "no trace"))
    if len(traces) != 1:
        raise AstraiError(f"a verifiers episode has {len(traces)} agent traces; astrai trains "
                          "single-agent episodes")
    return traces[0]


@contextlib.contextmanager
def _serving_client(endpoint: Any, client: EngineClient) -> Iterator[None]:
    """verifiers' interception server builds each endpoint's model client with
    ``resolve_client``; for the rollout, ``endpoint`` resolves to ``client``."""
    original = interception_server.resolve_client

    def resolve(config: Any) -> Any:
        return client if config is endpoint or config == endpoint else original(config)

    interception_server.resolve_client = resolve
    try:
        yield
    finally:
        interception_server.resolve_client = original


