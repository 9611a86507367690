"""Run a demo's stages as subprocesses, as many at once as the machine has cores.

Every stage trains on one thread (``trainer.threads: 1``), so on a 2-core machine two
independent stages side by side take half the wall time and change no number: each
stage computes exactly what it computes alone. A stage starts once the stages it needs
have finished; its output goes to its own log file, and the console gets one line when
it starts and one when it ends. A failed stage stops the demo: the tail of its log is
printed, the stages still running are stopped, and the exit status is non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

POLL_SECONDS = 0.2
LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class Stage:
    """One command of a demo; ``needs`` names the stages that must finish first."""

    name: str
    command: list[str]
    log: Path
    needs: tuple[str, ...] = field(default=())


def default_jobs() -> int:
    """The cores this process may use (each stage takes one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def run_stages(stages: Sequence[Stage], jobs: int | None = None) -> dict[str, float]:
    """Run ``stages`` (earlier ones first when several are ready); returns seconds per stage."""
    names = {stage.name for stage in stages}
    for stage in stages:
        unknown = set(stage.needs) - names
        if unknown:
            raise ValueError(f"stage {stage.name!r} needs unknown stages {sorted(unknown)}")
    jobs = jobs or default_jobs()
    pending = list(stages)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    seconds: dict[str, float] = {}
    try:
        while pending or running:
            for stage in [s for s in pending if set(s.needs) <= seconds.keys()]:
                if len(running) >= jobs:
                    break
                pending.remove(stage)
                running[stage.name] = (_start(stage), time.perf_counter())
            if not running:
                raise RuntimeError(f"stages {[s.name for s in pending]} can never start")
            time.sleep(POLL_SECONDS)
            for name, (process, started) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[name]
                stage = next(s for s in stages if s.name == name)
                if process.returncode != 0:
                    _fail(stage, process.returncode)
                seconds[name] = time.perf_counter() - started
                print(f"  done     {name} in {seconds[name]:.0f}s", flush=True)
    finally:
        for process, _ in running.values():
            process.terminate()
        for process, _ in running.values():
            process.wait()
    return seconds


def eval_stages(demo: str, python: str, script: Path, checkpoints: dict[str, Path],
                out: Path) -> list[Stage]:
    """One stage per checkpoint, ``script CHECKPOINT --json OUT/eval-<stage>.json``, once the
    stage ``<demo>/<stage>`` that trains it has finished."""
    return [Stage(f"{demo}/eval-{stage}", [python, str(script), str(checkpoint),
                                           "--json", str(out / f"eval-{stage}.json")],
                  out / "logs" / f"eval-{stage}.log", needs=(f"{demo}/{stage}",))
            for stage, checkpoint in checkpoints.items()]


def eval_summary(demo: str, stages: Sequence[str], out: Path,
                 seconds: dict[str, float]) -> dict[str, dict[str, float]]:
    """The numbers of :func:`eval_stages` with each stage's training time, also written to
    OUT/summary.json."""
    summary = {stage: {**json.loads((out / f"eval-{stage}.json").read_text()),
                       "train_seconds": round(seconds.get(f"{demo}/{stage}", 0.0), 1)}
               for stage in stages}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def demo_main(description: str, stages: Callable[[str], list[Stage]],
              report: Callable[[dict[str, float]], None]) -> None:
    """A demo script's command line: ``--jobs``, then its stages, then its report."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--jobs", type=int, default=None,
                        help="stages run at once (default: the number of cores)")
    args = parser.parse_args()
    report(run_stages(stages(sys.executable), args.jobs))


def _start(stage: Stage) -> subprocess.Popen:
    stage.log.parent.mkdir(parents=True, exist_ok=True)
    print(f"  started  {stage.name}   (log: {stage.log})", flush=True)
    with stage.log.open("w") as log:  # the child keeps its own copy of the descriptor
        log.write("$ " + " ".join(stage.command) + "\n")
        log.flush()
        return subprocess.Popen(stage.command, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _fail(stage: Stage, returncode: int) -> None:
    tail = stage.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    print(f"\nstage {stage.name} failed (exit status {returncode}); the end of {stage.log}:",
          file=sys.stderr)
    print("\n".join(tail), file=sys.stderr)
    raise SystemExit(1)
