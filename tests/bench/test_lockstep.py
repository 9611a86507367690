"""bench/lockstep.py: peers measured in turn take their steps one at a time, alternately,
and the wait for the go-ahead is not counted in a step (bench/bench_grpo_trl.py's ratio
rests on both)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import pytest

from astrai_core.testing import REPO_ROOT

BENCH = REPO_ROOT / "bench"

# A peer: each step sleeps ``busy`` seconds and records when it ran (wall clock), then
# reports ``busy`` as the step's own time through the gate.
PEER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {bench!r})
    from lockstep import StepGate

    name, steps, busy, log = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    gate = StepGate()
    for step in range(steps):
        start = time.time()
        time.sleep(busy)
        with open(log, "a") as out:
            out.write(json.dumps([name, step, start, time.time()]) + "\\n")
        print("some other output", flush=True)
        gate.step_done(busy)
    if name == "broken":
        sys.exit("broken peer")
""")


@pytest.fixture
def lockstep(monkeypatch):
    spec = importlib.util.spec_from_file_location("lockstep", BENCH / "lockstep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _peer(tmp_path, name: str, steps: int, busy: float) -> list[str]:
    script = tmp_path / "peer.py"
    script.write_text(PEER.format(bench=str(BENCH)))
    return [sys.executable, str(script), name, str(steps), str(busy), str(tmp_path / "log")]


def test_steps_after_the_first_alternate_and_never_overlap(lockstep, tmp_path):
    commands = {"a": _peer(tmp_path, "a", 4, 0.05), "b": _peer(tmp_path, "b", 4, 0.02)}
    times = lockstep.interleave(commands, 4)
    assert times == {"a": [0.05] * 4, "b": [0.02] * 4}  # the peers' own step times
    runs = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    later = sorted((r for r in runs if r[1] > 0), key=lambda r: r[2])
    # step 1 a then b, step 2 b then a (the first mover alternates), step 3 a then b
    assert [(r[0], r[1]) for r in later] == [("a", 1), ("b", 1), ("b", 2), ("a", 2),
                                             ("a", 3), ("b", 3)]
    for before, after in zip(later, later[1:]):
        assert before[3] <= after[2]  # one ended before the next began: no overlap


def test_a_peer_that_fails_stops_the_benchmark_with_its_error(lockstep, tmp_path):
    commands = {"a": _peer(tmp_path, "a", 2, 0.0), "broken": _peer(tmp_path, "broken", 2, 0.0)}
    with pytest.raises(SystemExit, match="(?s)the broken run failed.*broken peer"):
        lockstep.interleave(commands, 2)
    short = {"a": _peer(tmp_path, "a", 3, 0.0), "b": _peer(tmp_path, "b", 1, 0.0)}
    with pytest.raises(SystemExit, match="the b run stopped before its step was reported"):
        lockstep.interleave(short, 3)


def test_the_ratio_is_the_median_of_per_step_ratios(lockstep):
    # a load spike in step 2 doubles both peers' steps: the per-step ratios stay 0.5
    astrai, trl = [1.0, 2.0, 1.0], [2.0, 4.0, 2.0]
    assert lockstep.median_ratio(astrai, trl) == 0.5
    assert lockstep.median_ratio([1.0, 3.0, 2.0], [1.0, 1.0, 1.0]) == 2.0
    with pytest.raises(ValueError, match="2 steps against 3"):
        lockstep.median_ratio([1.0, 1.0], [1.0, 1.0, 1.0])


def test_the_astrai_gate_tracker_waits_after_each_timed_step(lockstep, tmp_path):
    import io

    out, go = io.StringIO(), io.StringIO("go\n")
    tracker = lockstep.GateTracker()
    tracker.gate = lockstep.StepGate(out, go)
    tracker.log({"eval/loss": 1.0}, 0)  # an evaluation: no step, no wait
    tracker.log({"time/step_seconds": 0.25, "loss": 2.0}, 1)
    assert out.getvalue() == "STEP 0.25\n" and go.read() == ""
