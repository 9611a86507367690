"""Partial rollouts (``rollout.partial: true``): long completions carried across steps.

A synchronous rollout waits for its longest completion. Here each draw decodes in
segments of at most ``segment_tokens`` tokens per sequence, keeping ``in_flight`` groups
(prompt x ``group_size`` completions) going, and stops as soon as ``prompts_per_rollout``
groups have every completion finished: those groups are the training rollout. The
unfinished ones are carried to the next draw and continued there under the weights
published since (the sampler recomputes their KV cache from ``prompt + tokens so far``).

With ``overlap`` and an asynchronous sampler (its spec says so: ray), the
sampler does not wait for the trainer: each draw ends by sending the next segment, which
the workers decode while the trainer steps, without a token limit (when the sampler is
``interruptible``; else ``segment_tokens``), and the trainer's next weight push interrupts
it after its current decode step (its sequences come back
``finish_reason="abort"``, as they stand). The next draw collects it, so the weight
update lands between two decode steps of the sequences in flight, which continue under
the new weights. Each segment's tokens are stamped with the version that was published
when it was sent: the push waits for the segment to stop, so no token of it is sampled
by newer weights. How many tokens a segment gets before the interrupt depends on timing,
so such a run is not bit-reproducible (``overlap: false`` is).

Every token records the policy version that sampled it (``RolloutBatch.token_versions``)
next to its behaviour log-prob. When the rollout is drawn, tokens more than
``max_staleness`` versions older than the current policy are masked out of the loss:
they stay in the sequence as context (``context_mask``) but ``response_mask`` drops
them, so they are never trained on. The loss over the others uses the decoupled
objective (strategy.rollout_correction, see docs/throughput.md).

The state (the sequences in flight, with their tokens, log-probs and versions) is part
of the checkpoint, so a resume continues them exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from astrai_core.errors import ConfigError
from astrai_core.rollout.batch import RolloutBatch, pad_rows
from astrai_core.rollout.records import PromptRecord
from astrai_core.sampling.params import Completion


@dataclass
class _Sequence:
    """One completion being sampled: its tokens so far, their log-probs and versions."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # set once finished


@dataclass
class _Group:
    """One prompt's ``group_size`` completions."""

    record: PromptRecord
    index: int  # the group's admission number: seeds its sampling, orders the output
    sequences: list[_Sequence]

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)


@dataclass
class _Segment:
    """A segment sent to the sampler: its sequences, the policy version that samples
    them, and the handle whose ``result()`` gives one completion per sequence."""

    sequences: list[_Sequence]
    version: int
    handle: Any


@dataclass
class _Done:
    """The handle of a segment sampled already (a sampler in the trainer's process)."""

    completions: list[Completion]

    def result(self) -> list[Completion]:
        return self.completions


class PartialRollouts:
    """The drawer of a partial-rollout run, around the run's :class:`RolloutRunner`."""

    def __init__(self, runner: Any, segment_tokens: int, max_staleness: int,
                 in_flight: int | None = None, overlap: bool = False) -> None:
        if segment_tokens < 1:
            raise ValueError("segment_tokens must be >= 1")
        self.runner = runner
        self.segment_tokens = segment_tokens
        self.max_staleness = max_staleness
        self.in_flight = in_flight or 2 * runner.prompts_per_rollout
        self.groups: list[_Group] = []
        self.admitted = 0  # groups ever admitted: the next one's index
        self.segments = 0  # decode segments run so far: seeds each segment's sampling
        # decode while the trainer steps: only a sampler apart from the trainer can
        self.overlap = overlap and runner.asynchronous
        self._pending: _Segment | None = None  # a segment sent and not yet collected

    @property
    def policy_version(self) -> int:
        return self.runner.policy_version

    # ---------------------------------------------------------------- one draw
    def draw(self) -> RolloutBatch:
        """The next ``prompts_per_rollout`` finished groups (oldest first)."""
        wanted = self.runner.prompts_per_rollout
        while sum(g.finished for g in self.groups) < wanted:
            if self._pending is None:
                self._admit()
                self._send(self.segment_tokens)
            self._collect()
        done = [g for g in self.groups if g.finished][:wanted]
        self.groups = [g for g in self.groups if g not in done]
        self.runner.rollouts_drawn += 1
        rollout = self._build(done)
        if self.overlap:  # the sampler decodes on while the trainer steps
            self._admit()
            # until the next push interrupts it; a sampler that cannot be interrupted
            # gets one segment, which the push waits for
            self._send(None if self.runner.capabilities.interruptible else self.segment_tokens)
        return rollout

    def _admit(self) -> None:
        """Top the groups in flight up to ``in_flight`` with the next prompts."""
        missing = self.in_flight - len(self.groups)
        if missing <= 0:
            return
        for record in self.runner.next_prompts(missing):
            sequences = [_Sequence() for _ in range(self.runner.group_size)]
            self.groups.append(_Group(record, self.admitted, sequences))
            self.admitted += 1

    def _send(self, limit: int | None) -> None:
        """Send a segment: at most ``limit`` more tokens (None: as many as are left, until
        interrupted) for every unfinished sequence, sampled by the current policy."""
        runner, params = self.runner, self.runner.sampling_params
        todo = [(g, s) for g in self.groups for s in g.sequences if s.finish_reason is None]
        if not todo:
            return
        requests, per_request = [], []
        for number, (group, sequence) in enumerate(todo):
            left = params.max_new_tokens - len(sequence.tokens)
            update: dict[str, Any] = {"n": 1, "max_new_tokens": min(limit or left, left)}
            if params.seed is not None:  # a fresh, reproducible stream per sequence and segment
                update["seed"] = params.seed + 1_000_003 * self.segments + number
            requests.append(group.record.prompt_ids + sequence.tokens)
            per_request.append(params.model_copy(update=update))
        with runner.lock:  # no publish while a segment is being sent or sampled in-process
            version = runner.policy_version
            if self.overlap:  # the next weight push may cut it short, if it can be
                handle = runner.sampler.generate_async(requests, per_request,
                                                       **self._interruptible())
            else:
                handle = _Done(runner.sampler.generate(requests, per_request))
        self.segments += 1
        self._pending = _Segment([s for _, s in todo], version, handle)

    def _interruptible(self) -> dict[str, bool]:
        """``generate_async``'s keyword for an interruptible call, given only to a sampler
        that declares ``interruptible`` (others need not take it)."""
        return {"interruptible": True} if self.runner.capabilities.interruptible else {}

    def _collect(self) -> None:
        """Wait for the segment sent last and add its tokens to their sequences."""
        segment, self._pending = self._pending, None
        if segment is None:
            return
        limit = self.runner.sampling_params.max_new_tokens
        for sequence, completion in zip(segment.sequences, segment.handle.result(), strict=True):
            _extend(sequence, completion, segment.version, limit)

    # ---------------------------------------------------------------- the rollout
    def _build(self, groups: list[_Group]) -> RolloutBatch:
        """The finished groups as a scored rollout, stale tokens masked from the loss."""
        records = [g.record for g in groups]
        completions = [Completion(token_ids=s.tokens, logprobs=s.logprobs,
                                  finish_reason=s.finish_reason, prompt_index=i)
                       for i, g in enumerate(groups) for s in g.sequences]
        version = self.runner.policy_version
        rollout = self.runner.build(records, completions, version)
        versions, _ = pad_rows([s.versions for g in groups for s in g.sequences], left=False,
                               pad_value=version, dtype=torch.long)
        rollout.token_versions = versions
        fresh = versions >= version - self.max_staleness
        if not bool(fresh[rollout.response_mask].all()):
            rollout.context_mask = rollout.response_mask.clone()
            rollout.response_mask = rollout.response_mask & fresh
        return rollout

    # ---------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        """The runner's state and the sequences in flight (JSON: exact floats), with the
        tokens of a segment still being decoded (collected first: after a weight push it
        has stopped already)."""
        self._collect()
        return {"runner": self.runner.state_dict(), "admitted": self.admitted,
                "segments": self.segments,
                "groups": [{"record": asdict(g.record), "index": g.index,
                            "sequences": [asdict(s) for s in g.sequences]}
                           for g in self.groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.runner.load_state_dict(state["runner"])
        self.admitted, self.segments = int(state["admitted"]), int(state["segments"])
        self.groups = [_Group(PromptRecord(**g["record"]), int(g["index"]),
                              [_Sequence(**s) for s in g["sequences"]])
                       for g in state["groups"]]


def _extend(sequence: _Sequence, completion: Completion, version: int, limit: int) -> None:
    """Append one segment's tokens to ``sequence``; it finishes on a stop or at ``limit``."""
    if completion.logprobs is None:
        raise ConfigError("rollout.partial records each token's behaviour log-prob, and the "
                          "sampler returned none: use a sampler that reports log-probs")
    sequence.tokens += completion.token_ids
    sequence.logprobs += completion.logprobs
    sequence.versions += [version] * len(completion.token_ids)
    if completion.finish_reason == "stop":
        sequence.finish_reason = "stop"
    elif len(sequence.tokens) >= limit:
        sequence.finish_reason = "length"
