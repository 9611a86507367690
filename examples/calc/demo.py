"""The calc demo: SFT on calculator demonstrations, then GRPO with the tools environment.

Prints held-out accuracy (greedy, exact match) after SFT and after GRPO, with the
calculator and without it, and writes the numbers to runs/calc/summary.json. Run from the
repository root: `make demo` (after the arithmetic demo) or `python examples/calc/demo.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path("runs/calc")  # the stage configs read and write here (paths relative to the cwd)
CHECKPOINTS = {"sft": OUT / "sft/checkpoints/step_300", "grpo": OUT / "grpo/checkpoints/step_40"}


def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def main() -> None:
    sys.path.insert(0, str(HERE))
    from evaluate import accuracies

    astrai = [sys.executable, "-m", "astrai_core.cli.main"]
    if not (OUT / "data" / "sft_train.jsonl").exists():
        run([sys.executable, str(HERE / "generate.py"), "--out", str(OUT / "data")])
    summary: dict[str, dict[str, float]] = {}
    for stage, checkpoint in CHECKPOINTS.items():
        started = time.perf_counter()
        run(astrai + ["--log-format", "console", "train", str(HERE / f"{stage}.yaml"), "--overwrite"])
        trained = time.perf_counter() - started
        summary[stage] = {**accuracies(checkpoint), "train_seconds": round(trained, 1)}
        print(stage, json.dumps(summary[stage]), flush=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary)


def print_table(summary: dict[str, dict[str, float]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="calc: held-out accuracy (greedy, exact match, 200 problems)")
    for column in ("stage", "with the calculator", "without it", "tool calls / episode",
                   "train time"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for stage, row in summary.items():
        table.add_row(stage, f"{row['with_tool']:.3f}", f"{row['without_tool']:.3f}",
                      f"{row['tool_calls_per_episode']:.2f}", f"{row['train_seconds']:.0f}s")
    Console().print(table)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
