"""bench/bench_rl_partial.py does not rot: its length plan carries unfinished sequences
(a segment's end, an interrupted call) with their targets, its ray variant forces
the lengths inside the Ray worker (the bench checks that and stops otherwise), and its
ceiling is (S + T) / max(S, T) of the synchronous step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from astrai_core.sampling.params import Completion
from astrai_core.testing import REPO_ROOT

BENCH = REPO_ROOT / "bench"


@pytest.fixture
def forced_lengths(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import forced_lengths

    return forced_lengths


def _completion(tokens: list[int], reason: str, prompt_index: int) -> Completion:
    return Completion(token_ids=tokens, logprobs=[0.0] * len(tokens), finish_reason=reason,
                      prompt_index=prompt_index)


def test_unfinished_sequences_keep_their_target_and_new_ones_take_the_next(forced_lengths):
    stream = forced_lengths.planned(64)
    lengths = forced_lengths.Lengths(64)
    prompt = [5, 6]
    plan = lengths.for_requests([prompt], [3])
    assert plan == [(stream[0], 0), (stream[1], 0), (stream[2], 0)]
    # a segment's end after 2 tokens, an interrupted call after 1 and after none
    lengths.carry([prompt], [_completion([1, 2], "length", 0), _completion([3], "abort", 0),
                             _completion([], "abort", 0)], plan)
    assert lengths.stats["carried"] == 3 and lengths.stats["aborted"] == 2
    # continued from prompt + tokens so far (the aborted-before-any-token one: the prompt),
    # next to a fresh sequence of another prompt
    requests = [prompt + [1, 2], prompt + [3], prompt, [7]]
    assert lengths.for_requests(requests, [1, 1, 1, 1]) == [
        (stream[0], 2), (stream[1], 1), (stream[2], 0), (stream[3], 0)]
    assert not any(lengths.carried.values())


def test_a_finished_sequence_counts_at_or_off_its_target(forced_lengths):
    lengths = forced_lengths.Lengths(64)
    plan = [(3, 1), (4, 0)]
    lengths.carry([[9], [8]], [_completion([1, 2], "stop", 0), _completion([1], "stop", 1)],
                  plan)
    assert lengths.stats["at_target"] == 1 and lengths.stats["off_target"] == 1
    assert not lengths.carried


def test_a_report_that_is_missing_or_off_target_stops_the_bench(forced_lengths, tmp_path):
    with pytest.raises(SystemExit, match="never ran"):
        forced_lengths.read_report(tmp_path / "none.json")
    (tmp_path / "off.json").write_text('{"at_target": 3, "off_target": 1}')
    with pytest.raises(SystemExit, match="did not act"):
        forced_lengths.read_report(tmp_path / "off.json")


@pytest.mark.slow
def test_the_ray_variant_forces_lengths_in_the_worker():
    pytest.importorskip("ray")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RAY_ADDRESS", None)  # a local Ray of its own
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_rl_partial.py"), "--sampler", "ray", "--peers",
         "sync,partial", "--steps", "2", "--prompts", "2", "--group", "2", "--max-tokens", "64",
         "--partial-tokens", "8"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "ray sampler: 1 Ray worker" in out and "partial / sync throughput" in out
    # the synchronous run's trained lengths were checked against the plan by the bench;
    # every one of its 2 x 4 completions finished at its planned length in the worker
    sync = next(line for line in out.splitlines() if line.strip().startswith("sync "))
    assert "(8 completions at their planned length" in sync
    assert "of the ceiling" in out and "prefill" in out  # the ceiling and the profile


def test_the_ceiling_is_the_synchronous_step_over_its_longer_part(monkeypatch):
    """S: the trainer's mean wait per step; T: the rest of the mean step."""
    monkeypatch.syspath_prepend(str(BENCH))
    from bench_rl_partial import ceiling

    sampling, training, bound = ceiling({"wait": [0.2, 0.4], "seconds": [0.5, 0.9]})
    assert (sampling, training) == pytest.approx((0.3, 0.4))
    assert bound == pytest.approx(0.7 / 0.4)
    assert ceiling({"wait": [0.6], "seconds": [0.8]})[2] == pytest.approx(0.8 / 0.6)
