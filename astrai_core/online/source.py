"""The online schedule: a drawn rollout, processed once, served as optimizer steps.

:class:`RolloutSource` is the batch source of every online strategy
(:meth:`astrai_core.online.strategy.OnlineStrategy.batch_source`). It draws a rollout
from its drawer (the rollout runner, or a wrapper around it: :mod:`astrai_core.rollout.partial`,
:mod:`astrai_core.rollout.dynamic_sampling`), processes it once (behaviour log-probs,
reference log-probs, values, advantages: :mod:`astrai_core.online.prepare`), shuffles it
afresh for each of ``epochs`` passes, cuts each pass into ``mini_batches`` optimizer steps
and each step into micro-batches (``trainer.grad_accum_steps`` padded ones, or packed
ones of at most ``trainer.micro_batch_tokens`` tokens; ``throughput/padding_fraction``
says how much of them is padding). Its checkpoint state holds the processed rollout
itself (as tensors, saved through safetensors), its order and the position in it, so a
run killed in the middle of a rollout resumes exactly there. With ``max_staleness: k >
0`` it requests rollouts ahead from an asynchronous sampler (``drawer.submit()``) so that
sampling overlaps training, never more than k optimizer steps ahead, and logs
``rollout/staleness``. A checkpoint does not hold the rollouts requested ahead: a resumed
k > 0 run skips their prompts and samples the next ones with the checkpoint's policy
(valid, but not bit-identical to the uninterrupted run; k = 0 resumes exactly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from astrai_core.rollout.batch import RolloutBatch
from astrai_core.rollout.dynamic_sampling import DynamicSampler
from astrai_core.rollout.packing import padding_fraction, token_micro_batches
from astrai_core.rollout.partial import PartialRollouts
from astrai_core.training.batch_sources import TENSORS


class Drawer(Protocol):
    """Something that yields whole rollouts: the rollout runner, or a dataset of them."""

    def draw(self) -> RolloutBatch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


ProcessFn = Callable[[RolloutBatch], tuple[RolloutBatch, dict[str, float]]]


class RolloutSource:
    """The online schedule; see the module docstring.

    ``process`` turns a drawn rollout into a trainable one plus its statistics; ``seed``
    (the trainer's) and the number of rollouts drawn seed each rollout's shuffles.
    """

    def __init__(self, drawer: Drawer, process: ProcessFn, *, epochs: int, mini_batches: int,
                 micro_batches: int, seed: int, device: torch.device | str = "cpu",
                 shuffle: bool = True, max_staleness: int = 0,
                 shard: Callable[[RolloutBatch], RolloutBatch] | None = None,
                 micro_batch_tokens: int | None = None, world: int = 1,
                 share_prompt: bool = False) -> None:
        self.drawer = drawer
        self.process = process
        self.epochs, self.mini_batches, self.micro_batches = epochs, mini_batches, micro_batches
        self.seed, self.device, self.shuffle = seed, device, shuffle
        # Distributed: the rollout is the global one; each rank trains its share of rows
        # of every micro-batch (DistContext.shard_rows).
        self.shard = shard or (lambda batch: batch)
        # trainer.micro_batch_tokens: packed micro-batches of at most this many tokens per
        # rank, in place of `micro_batches` padded ones (rollout/packing.py)
        self.micro_batch_tokens, self.world = micro_batch_tokens, world
        # trainer.share_prompt: every forward over the rollout's rows computes a group's
        # prompt once; a step's rows are ordered group by group, so that its micro-batches
        # (and each rank's share) hold whole groups where they can
        self.share_prompt = share_prompt
        self.stats: dict[str, float] = {}
        self.drawn = 0
        self._rollout: RolloutBatch | None = None
        self._order: list[torch.Tensor] = []
        self._position = 0
        self.max_staleness = max_staleness
        self._ahead: list[Any] = []  # rollouts requested ahead, oldest first

    def next_step(self) -> list[RolloutBatch]:
        if self._rollout is None or self._position == len(self._order):
            drawn = self._ahead.pop(0).result() if self._ahead else self.drawer.draw()
            drawn.share_prompt = self.share_prompt  # the no-grad forwards share it too
            staleness = self._staleness(drawn)
            self._rollout, self.stats = self.process(drawn)
            self.stats.update(staleness)
            self.drawn += 1
            self._order = self._schedule(len(self._rollout))
            self._position = 0
        self._request_ahead()
        rows = self._order[self._position]
        self._position += 1
        if self.share_prompt:
            rows = groups_together(rows, self._rollout.group_ids)
        step = self._rollout.select(rows)
        if self.micro_batch_tokens is None:
            parts = split_micro_batches(step, self.micro_batches)
        else:
            parts = token_micro_batches(step, self.micro_batch_tokens, self.world)
        self.stats["throughput/padding_fraction"] = padding_fraction(parts)
        return [self.shard(part) for part in parts]

    # -- bounded staleness (rollout.max_staleness) ------------------------------------
    def _request_ahead(self) -> None:
        """Before training on this step, request the rollouts that will still be at most
        ``max_staleness`` optimizer steps old when they are trained on: the j-th rollout
        ahead starts training after ``(j + 1) x steps per rollout - position`` more steps
        (the trainer publishes the policy after every step)."""
        steps = len(self._order)
        while (len(self._ahead) + 1) * steps - self._position <= self.max_staleness:
            self._ahead.append(self.drawer.submit())

    def _staleness(self, rollout: RolloutBatch) -> dict[str, float]:
        """Policy versions between the rollout's sampling policy and the trainer's; with
        per-token versions (rollout.partial), their spread over the trained tokens
        (``rollout/staleness`` the largest, ``_min`` and ``_mean``) and the share of the
        sampled tokens masked for being older (``rollout/stale_masked_fraction``)."""
        current = getattr(self.drawer, "policy_version", rollout.policy_version)
        if rollout.token_versions is None:
            return {"rollout/staleness": float(current - rollout.policy_version)}
        trained = rollout.response_mask
        sampled = trained if rollout.context_mask is None else rollout.context_mask
        lag = (current - rollout.token_versions[trained]).float()
        if not lag.numel():
            lag = torch.zeros(1)
        masked = 1.0 - trained.sum().item() / max(1, sampled.sum().item())
        return {"rollout/staleness": lag.max().item(), "rollout/staleness_min": lag.min().item(),
                "rollout/staleness_mean": lag.mean().item(),
                "rollout/stale_masked_fraction": masked}

    def _schedule(self, count: int) -> list[torch.Tensor]:
        """Row indices of each optimizer step: a fresh shuffle per epoch, cut in parts."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.drawn)
        steps: list[torch.Tensor] = []
        for _ in range(self.epochs):
            order = torch.randperm(count, generator=generator) if self.shuffle \
                else torch.arange(count)
            steps += list(order.chunk(self.mini_batches))
        return steps

    # ---------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"drawer": self.drawer.state_dict(), "drawn": self.drawn,
                                 "position": self._position, "stats": dict(self.stats)}
        if self._rollout is not None and self._position < len(self._order):
            state["order"] = [rows.tolist() for rows in self._order]
            state["policy_version"] = self._rollout.policy_version
            state[TENSORS] = self._rollout.tensors()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawer.load_state_dict(state["drawer"])
        self.drawn = int(state["drawn"])
        self.stats = dict(state.get("stats", {}))
        self._ahead = []
        if TENSORS in state:  # stopped inside a rollout: serve the rest of it
            rollout = RolloutBatch.from_tensors(state[TENSORS], int(state["policy_version"]))
            self._rollout = rollout.to(self.device)
            self._rollout.share_prompt = self.share_prompt
            self._order = [torch.tensor(rows, dtype=torch.long) for rows in state["order"]]
            self._position = int(state["position"])
        else:
            self._rollout, self._order, self._position = None, [], 0


def groups_together(rows: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``rows`` reordered so that each group's rows follow one another, the groups in the
    order of their first row (the shuffle's), each group's rows in theirs."""
    first: dict[int, int] = {}
    groups = group_ids[rows.to(group_ids.device)].tolist()
    for position, group in enumerate(groups):
        first.setdefault(group, position)
    order = sorted(range(len(groups)), key=lambda i: first[groups[i]])
    return rows[torch.tensor(order, dtype=torch.long, device=rows.device)]


def split_micro_batches(batch: RolloutBatch, count: int) -> list[RolloutBatch]:
    """``batch`` cut into ``count`` consecutive micro-batches (``trainer.grad_accum_steps``)."""
    parts = batch.split(-(-len(batch) // count))  # ceil: at most `count` parts
    if len(parts) != count:
        raise ValueError(f"a mini-batch of {len(batch)} samples cannot be cut into "
                         f"trainer.grad_accum_steps={count} micro-batches")
    return parts


def online_source(run: Any, config: Any, process: ProcessFn) -> RolloutSource:
    """The source of an online strategy's steps (options ``config``): the run's rollout
    runner, behind the drawers its options ask for (partial rollouts, dynamic sampling),
    each drawn rollout made trainable by ``process``."""
    drawer: Any = run.rollouts
    rollout = run.plan.config.rollout
    if rollout.partial:  # carried sequences: the source requests nothing ahead
        drawer = PartialRollouts(drawer, rollout.partial_tokens, rollout.max_staleness,
                                 overlap=rollout.partial_overlap)
    dynamic = config.dynamic
    if dynamic is not None:  # rollouts of informative groups only
        drawer = DynamicSampler(drawer, run.data.batch_size, dynamic.max_tries)
        process = _with_stats(process, drawer)
    return RolloutSource(drawer, process, epochs=config.epochs,
                         mini_batches=config.mini_batches,
                         micro_batches=run.trainer.grad_accum_steps,
                         seed=run.trainer.seed, device=run.device,
                         max_staleness=0 if rollout.partial else rollout.max_staleness,
                         shard=run.dist.shard_rows, micro_batch_tokens=run.trainer.micro_batch_tokens,
                         world=run.dist.data_world, share_prompt=run.trainer.share_prompt)


def _with_stats(process: ProcessFn, drawer: DynamicSampler) -> ProcessFn:
    """``process`` whose statistics also carry the dynamic sampler's of that draw."""
    def processed(rollout: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        rollout, stats = process(rollout)
        return rollout, {**stats, **drawer.stats}
    return processed
