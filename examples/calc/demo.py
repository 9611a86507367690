"""The calc demo: SFT on calculator demonstrations, then GRPO with the tools environment.

Prints held-out accuracy (greedy, exact match) after SFT and after GRPO, with the
calculator and without it, and writes the numbers to runs/calc/summary.json. Run from the
repository root: `make demo` (beside the arithmetic demo) or `python examples/calc/demo.py`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from stages import Stage, demo_main, eval_stages, eval_summary  # noqa: E402  (examples/stages.py)

OUT = Path("runs/calc")  # the stage configs read and write here (paths relative to the cwd)
CHECKPOINTS = {"sft": OUT / "sft/checkpoints/step_300", "grpo": OUT / "grpo/checkpoints/step_40"}


def stages(python: str) -> list[Stage]:
    """The data, SFT, GRPO from the SFT checkpoint, and the evaluation of each checkpoint."""
    logs = OUT / "logs"
    astrai = [python, "-m", "astrai_core.cli.main", "--log-format", "console", "train"]
    data = [Stage("calc/data", [python, str(HERE / "generate.py"), "--out", str(OUT / "data")],
                  logs / "data.log")] if not (OUT / "data" / "sft_train.jsonl").exists() else []
    result = [Stage("calc/sft", astrai + [str(HERE / "sft.yaml"), "--overwrite"], logs / "sft.log",
                    needs=tuple(s.name for s in data)),
              Stage("calc/grpo", astrai + [str(HERE / "grpo.yaml"), "--overwrite"], logs / "grpo.log",
                    needs=("calc/sft",))]
    return data + result + eval_stages("calc", python, HERE / "evaluate.py", CHECKPOINTS, OUT)


def report(seconds: dict[str, float]) -> None:
    """Print the accuracy table and write runs/calc/summary.json."""
    print_table(eval_summary("calc", list(CHECKPOINTS), OUT, seconds))


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
    demo_main(__doc__, stages, report)
