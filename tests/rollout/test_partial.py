"""Partial rollouts with a scripted sampler: which sequences are carried, the version each
token records, stale tokens masked from the loss, and an exact resume."""

from __future__ import annotations

import json

import pytest
import torch

from astrai_core.api import SamplerCapabilities
from astrai_core.rewards import RewardSet
from astrai_core.rollout import RolloutRunner
from astrai_core.rollout.partial import PartialRollouts
from astrai_core.sampling import Completion, SamplingParams

# completion j of prompt [v] stops after LENGTHS[v][j] tokens in all
LENGTHS = {1: (1, 2), 2: (3, 5), 3: (1, 1), 4: (6, 6), 5: (1, 1), 6: (1, 1)}


class ScriptedSampler:
    """Token k of a completion is 20 + k; its log-prob is -(weights version + 1), so each
    behaviour log-prob tells which weights sampled it."""

    def __init__(self) -> None:
        self.version = 0
        self.calls: list[list[list[int]]] = []

    def update_weights(self, state_dict=None) -> None:
        self.version += 1

    def generate(self, prompts, params, on_token=None):
        self.calls.append([list(p) for p in prompts])
        out = []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            so_far, target = len(prompt) - 1, LENGTHS[prompt[0]][self._which(prompt, i)]
            count = min(p.max_new_tokens, target - so_far)
            out.append(Completion(
                token_ids=[20 + so_far + k for k in range(count)],
                logprobs=[-(self.version + 1.0)] * count,
                finish_reason="stop" if so_far + count == target else "length", prompt_index=i))
        return out

    def _which(self, prompt, index):
        # which completion of its group request `index` continues: scripted by the test
        return self._order[index]

    def expect(self, order):
        self._order = order


class Prompts:
    """A resumable prompt source of records [1], [2], ..."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        while self.position < len(LENGTHS):
            self.position += 1
            yield {"prompt_ids": [self.position], "prompt_text": f"q{self.position}",
                   "columns": {"answer": "x"}}

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _drawer(sampler, source=None, staleness=1, overlap=False):
    """``overlap``: with an asynchronous sampler, as its spec would say."""
    runner = RolloutRunner(sampler, tokenizer=None,
                           rewards=RewardSet.from_config([{"name": "exact_match"}]),
                           sampling_params=SamplingParams(max_new_tokens=8, seed=7),
                           group_size=2, prompts_per_rollout=1,
                           prompt_source=source or Prompts(), asynchronous=overlap)
    return PartialRollouts(runner, segment_tokens=2, max_staleness=staleness, in_flight=2,
                           overlap=overlap)


def _draw(drawer, order):
    drawer.runner.sampler.expect(order)
    return drawer.draw()


def test_carried_sequences_record_each_tokens_version_and_stale_ones_are_masked():
    sampler = ScriptedSampler()
    drawer = _drawer(sampler)
    # draw 1 (version 0): groups [1] and [2] in flight; [1] finishes, [2] is carried
    first = _draw(drawer, [0, 1, 0, 1])
    assert first.prompt_ids[:, -1].tolist() == [1, 1]
    assert first.token_versions.tolist() == [[0, 0], [0, 0]]
    assert sampler.calls[0] == [[1], [1], [2], [2]]
    drawer.runner.publish()
    # draw 2 (version 1): [2] continues from its 2 tokens; [3] is admitted and finishes
    second = _draw(drawer, [0, 1, 0, 1])
    assert sampler.calls[1] == [[2, 20, 21], [2, 20, 21], [3], [3]]
    assert second.prompt_ids[:, -1].tolist() == [3, 3]
    drawer.runner.publish()
    # draw 3 (version 2): [2] finishes; its version-0 tokens are 2 versions old (> k = 1)
    third = _draw(drawer, [1, 0, 1])
    assert sampler.calls[2] == [[2, 20, 21, 22, 23], [4], [4]]  # [2]'s first one had stopped
    assert third.prompt_ids[:, -1].tolist() == [2, 2]
    assert third.response_ids.tolist() == [[20, 21, 22, 0, 0], [20, 21, 22, 23, 24]]
    assert third.token_versions.tolist() == [[0, 0, 1, 2, 2], [0, 0, 1, 1, 2]]
    assert third.old_logprobs.tolist() == [[-1.0, -1.0, -2.0, 0.0, 0.0],
                                           [-1.0, -1.0, -2.0, -2.0, -3.0]]
    assert third.context_mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    assert third.response_mask.tolist() == [[False, False, True, False, False],
                                            [False, False, True, True, True]]


def test_nothing_is_masked_within_the_staleness_bound():
    sampler = ScriptedSampler()
    drawer = _drawer(sampler, staleness=2)
    _draw(drawer, [0, 1, 0, 1])
    drawer.runner.publish()
    _draw(drawer, [0, 1, 0, 1])
    drawer.runner.publish()
    third = _draw(drawer, [1, 0, 1])
    assert third.context_mask is None
    assert third.response_mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5]


def test_resume_continues_the_sequences_in_flight_exactly():
    reference_sampler = ScriptedSampler()
    reference = _drawer(reference_sampler)
    _draw(reference, [0, 1, 0, 1])
    reference.runner.publish()
    state = json.loads(json.dumps(reference.state_dict()))  # as a checkpoint stores it
    expected = _draw(reference, [0, 1, 0, 1])

    resumed_sampler = ScriptedSampler()
    resumed_sampler.version = 1  # the checkpoint's weights
    resumed = _drawer(resumed_sampler)
    resumed.load_state_dict(state)
    got = _draw(resumed, [0, 1, 0, 1])
    assert resumed_sampler.calls == reference_sampler.calls[1:]
    for name in ("prompt_ids", "response_ids", "old_logprobs", "token_versions", "response_mask"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    assert resumed.runner.policy_version == 1 and resumed.admitted == reference.admitted


# ---------------------------------------------------------------- overlapped segments
class InterruptibleSampler(ScriptedSampler):
    """An asynchronous sampler: ``generate_async`` decodes in the background, and a weight
    update cuts an interruptible call in flight after ``cut`` more tokens per sequence
    (``finish_reason="abort"``), before the new weights land."""

    def __init__(self, cut: int) -> None:
        super().__init__()
        self.cut = cut
        self.running: Call | None = None
        self.sent: list[tuple[int, list[int]]] = []  # (version, max_new_tokens) of each call

    capabilities = SamplerCapabilities(interruptible=True)

    def generate_async(self, prompts, params, interruptible=False):
        self.calls.append([list(p) for p in prompts])
        self.sent.append((self.version, [p.max_new_tokens for p in params]))
        self.running = Call(self, prompts, params, self.version, interruptible, self._order)
        return self.running

    def update_weights(self, state_dict=None) -> None:
        if self.running is not None and self.running.interruptible:
            self.running.cut = self.cut
        self.running = None
        self.version += 1


class Call:
    def __init__(self, sampler, prompts, params, version, interruptible, order):
        self.sampler, self.prompts, self.params = sampler, prompts, params
        self.version, self.interruptible, self.order = version, interruptible, order
        self.cut = None

    def result(self):
        out = []
        for i, (prompt, p) in enumerate(zip(self.prompts, self.params, strict=True)):
            so_far, target = len(prompt) - 1, LENGTHS[prompt[0]][self.order[i]]
            count = min(p.max_new_tokens, target - so_far)
            reason = "stop" if so_far + count == target else "length"
            if self.cut is not None and self.cut < count:
                count, reason = self.cut, "abort"
            out.append(Completion(token_ids=[20 + so_far + k for k in range(count)],
                                  logprobs=[-(self.version + 1.0)] * count,
                                  finish_reason=reason, prompt_index=i))
        return out


def test_overlapped_segments_decode_while_the_trainer_steps_and_stop_at_the_update():
    sampler = InterruptibleSampler(cut=1)
    drawer = _drawer(sampler, staleness=2, overlap=True)
    runner = drawer.runner
    # draw 1 (version 0): one waited-on segment of 2 tokens; [1] finishes. Then the next
    # segment is sent at once, without a token limit: [2] continued, [3] admitted.
    first = _draw(drawer, [0, 1, 0, 1])
    assert first.prompt_ids[:, -1].tolist() == [1, 1]
    assert sampler.calls[1] == [[2, 20, 21], [2, 20, 21], [3], [3]]
    assert sampler.sent[1] == (0, [6, 6, 8, 8])  # all that is left of max_new_tokens
    # the trainer steps, then publishes: the update cuts the segment after 1 token each
    runner.publish()
    # a checkpoint now holds the cut segment's tokens (version 0), nothing left pending
    state = drawer.state_dict()
    carried = [s["tokens"] for g in state["groups"] for s in g["sequences"]]
    assert carried == [[20, 21, 22], [20, 21, 22], [20], [20]]
    assert drawer._pending is None
    # draw 2 (version 1): the cut segment is collected; [2]'s second completion was
    # interrupted ("abort") with 3 of its 5 tokens and is continued under version 1
    sampler.expect([1, 0, 1])
    second = drawer.draw()
    assert second.prompt_ids[:, -1].tolist() == [3, 3]
    assert second.token_versions.tolist() == [[0], [0]]
    assert sampler.calls[2] == [[2, 20, 21, 22], [4], [4]]
    assert sampler.sent[2] == (1, [5, 8, 8])
    runner.publish()  # cuts [2] after one more token (version 1), [4] after one
    sampler.expect([1, 0, 1])
    third = drawer.draw()  # waits on a segment of version 2 until [2] finishes
    assert third.prompt_ids[:, -1].tolist() == [2, 2]
    assert third.response_ids.tolist() == [[20, 21, 22, 0, 0], [20, 21, 22, 23, 24]]
    assert third.token_versions.tolist() == [[0, 0, 0, 2, 2], [0, 0, 0, 1, 2]]
    assert third.old_logprobs.tolist() == [[-1.0, -1.0, -1.0, 0.0, 0.0],
                                           [-1.0, -1.0, -1.0, -2.0, -3.0]]
    assert third.finish_reasons == ["stop", "stop"]


def test_without_overlap_an_asynchronous_sampler_samples_only_while_the_trainer_waits():
    sampler = InterruptibleSampler(cut=1)
    drawer = _drawer(sampler)
    _draw(drawer, [0, 1, 0, 1])
    assert len(sampler.calls) == 1  # no segment left running behind the draw
    assert sampler.running is None or not sampler.running.interruptible


class KeywordsRecorded(InterruptibleSampler):
    """Records the keywords each ``generate_async`` gets."""

    def __init__(self, cut: int) -> None:
        super().__init__(cut)
        self.keywords: list[dict] = []

    def generate_async(self, prompts, params, **keywords):
        self.keywords.append(keywords)
        return super().generate_async(prompts, params, **keywords)


class UninterruptibleAsync(KeywordsRecorded):
    """Asynchronous, takes any keyword, and declares no ``interruptible``: it must never
    be asked for an interruptible call."""

    capabilities = SamplerCapabilities()


@pytest.mark.parametrize("declared", [True, False], ids=["interruptible", "not declared"])
def test_overlapped_segments_are_interruptible_only_when_the_sampler_declares_it(declared):
    sampler = (KeywordsRecorded if declared else UninterruptibleAsync)(cut=1)
    drawer = _drawer(sampler, staleness=2, overlap=True)
    _draw(drawer, [0, 1, 0, 1])
    drawer.runner.publish()
    # the segment sent behind the draw: without a token limit, to be interrupted by the
    # push, only for a sampler that declares it; else one segment's worth, run to its end
    assert sampler.keywords == ([{"interruptible": True}] * 2 if declared else [{}, {}])
    assert sampler.sent[1] == ((0, [6, 6, 8, 8]) if declared else (0, [2, 2, 2, 2]))
    state = drawer.state_dict()
    carried = [s["tokens"] for g in state["groups"] for s in g["sequences"]]
    assert carried == ([[20, 21, 22], [20, 21, 22], [20], [20]] if declared
                       else [[20, 21, 22], [20, 21, 22, 23], [20], [20]])
