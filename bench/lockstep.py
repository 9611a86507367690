"""Peers measured step by step in turn: each in its own process, one step at a time.

A benchmark that runs one peer's whole run after the other's reads a ratio that moves
with the machine's load between the two runs. Here every peer runs in its own process
(neither inherits the other's global torch state) and stops after each step until the
parent lets it go on: the parent lets one peer take a step, then the next, so the steps
of every peer alternate (the first mover alternates too) and the load at any moment
hits them alike. Each step's time is the peer's own measure of that step, taken
between the go-ahead and the step's end, so the wait is never counted.

The child side is :class:`StepGate` (its ``step_done`` prints ``STEP <seconds>`` and
waits for a line on stdin); the parent side is :func:`interleave`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

TAG = "STEP"


class StepGate:
    """The child's half: report each step's seconds, then wait for the go-ahead."""

    def __init__(self, out: IO[str] | None = None, go: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.go = go or sys.stdin

    def step_done(self, seconds: float) -> None:
        print(f"{TAG} {json.dumps(seconds)}", file=self.out, flush=True)
        self.go.readline()  # a line, or end of file once the parent is done measuring


class GateTracker:
    """An astrai tracker (``trainer.report_to: lockstep``) that gates each logged step:
    the trainer calls ``log`` after it has timed the step (``time/step_seconds``), so
    the wait for the go-ahead is outside every step's time."""

    requires = ()
    install = ""

    def __init__(self) -> None:
        self.gate = StepGate()

    def start(self, run: object) -> None:
        pass

    def log(self, metrics: dict[str, float], step: int) -> None:
        if "time/step_seconds" in metrics:
            self.gate.step_done(metrics["time/step_seconds"])

    def close(self, status: str) -> None:
        pass


def register_gate_tracker() -> None:
    """Make ``lockstep`` a tracker name in this process (``trainer.report_to``)."""
    import types

    from astrai_core import TrackerSpec, hookimpl
    from astrai_core.plugins import register

    plugin = types.ModuleType("lockstep_tracker")

    @hookimpl
    def astrai_trackers() -> list[TrackerSpec]:
        return [TrackerSpec(name="lockstep", target=f"{__name__}:GateTracker",
                            summary="gates each step of a benchmark's interleaved peers")]

    plugin.astrai_trackers = astrai_trackers
    register(plugin)


class _Peer:
    """One child process run under the gate; its stderr goes to a file (a pipe nobody
    reads while the other peer steps could fill and stall it)."""

    def __init__(self, name: str, command: list[str], errors: Path) -> None:
        self.name = name
        self.errors = errors
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=errors.open("w"), text=True, bufsize=1)

    def next_step(self) -> float:
        """The seconds of the step the peer reports next (other output is skipped)."""
        for line in self.process.stdout:
            if line.startswith(TAG + " "):
                return float(json.loads(line[len(TAG) + 1:]))
        self.process.wait()
        raise SystemExit(f"the {self.name} run stopped before its step was reported "
                         f"(exit {self.process.returncode}):\n{self.tail()}")

    def go(self) -> None:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self) -> None:
        """Let the peer run to its end; stop the benchmark if it failed."""
        self.process.stdin.close()
        for _ in self.process.stdout:  # drain: a full pipe would block its exit
            pass
        if self.process.wait() != 0:
            raise SystemExit(f"the {self.name} run failed:\n{self.tail()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def tail(self) -> str:
        return self.errors.read_text(errors="replace")[-3000:]


def interleave(commands: dict[str, list[str]], steps: int) -> dict[str, list[float]]:
    """Run each command (a child that calls ``StepGate.step_done`` after each of its
    ``steps`` steps) in lockstep: every peer's first step, then step 2 of each peer in
    turn, step 3 in the opposite order, and so on. Returns each peer's step seconds,
    the first step included (it runs while the other peers start, and pays one-off costs:
    leave it out of figures)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as tmp:
        peers = [_Peer(name, command, Path(tmp) / f"{index}.err")
                 for index, (name, command) in enumerate(commands.items())]
        try:
            for peer in peers:
                times[peer.name].append(peer.next_step())
            for step in range(1, steps):
                for peer in peers if step % 2 else reversed(peers):
                    peer.go()
                    times[peer.name].append(peer.next_step())
            for peer in peers:
                peer.finish()
        finally:
            for peer in peers:
                peer.kill()
    return times


def round_ratios(numerator: list[float], denominator: list[float]) -> list[float]:
    """The ratio of each pair of steps taken in turn (the same step index)."""
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} steps against {len(denominator)}: the peers "
                         "must report the same number of steps")
    return [a / b for a, b in zip(numerator, denominator)]


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median of the per-step ratios: load that changes between rounds hits both
    steps of a round alike, so their ratio is steadier than a ratio of medians."""
    return statistics.median(round_ratios(numerator, denominator))
