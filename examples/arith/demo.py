"""The arithmetic demo: SFT from scratch, then GRPO (PPO-clip, GSPO and CISPO policy losses),
PPO and DPO from the SFT checkpoint.

Prints held-out accuracy (greedy, exact numeric match) after each stage and writes the
same numbers to runs/demo/summary.json. Run from the repository root: `make demo`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGES = ("sft", "grpo", "grpo_gspo", "grpo_cispo", "ppo", "dpo")
OUT = Path("runs/demo")  # the stage configs read and write here (paths relative to the cwd)


def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def final_accuracy(run_dir: Path) -> tuple[float, float]:
    """(accuracy at the first evaluation, accuracy at the last) from metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accuracies = [r["eval/accuracy"] for r in records if r.get("eval/accuracy") is not None]
    if not accuracies:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no eval/accuracy")
    return accuracies[0], accuracies[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    args = parser.parse_args()
    out = OUT
    astrai = [sys.executable, "-m", "astrai_core.cli.main"]
    if not (out / "data" / "sft_train.jsonl").exists():
        run([sys.executable, str(HERE / "generate.py"), "--out", str(out / "data")])
    summary: dict[str, float] = {}
    timings: dict[str, float] = {}
    before_sft = None
    for stage in args.stages:
        started = time.perf_counter()
        run(astrai + ["--log-format", "console", "train", str(HERE / f"{stage}.yaml"),
                      "--overwrite"])
        timings[stage] = time.perf_counter() - started
        first, last = final_accuracy(out / stage)
        if stage == "sft":
            before_sft = first
        summary[stage] = last
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary, timings, before_sft)


def print_table(summary: dict[str, float], timings: dict[str, float], before: float | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="arithmetic: held-out accuracy (greedy, exact match)")
    table.add_column("stage")
    table.add_column("accuracy", justify="right")
    table.add_column("vs SFT", justify="right")
    table.add_column("time", justify="right")
    if before is not None:
        table.add_row("untrained model", f"{before:.3f}", "", "")
    sft = summary.get("sft")
    for stage, accuracy in summary.items():
        delta = "" if stage == "sft" or sft is None else f"{accuracy - sft:+.3f}"
        table.add_row(stage, f"{accuracy:.3f}", delta, f"{timings[stage]:.0f}s")
    Console().print(table)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
