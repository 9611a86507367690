"""The code demo: SFT on tiny functions, then GRPO with the code_tests reward.

Prints the held-out pass rates (a program passes when every test of its row passes in
the sandbox), greedy and sampled, of the SFT and the GRPO checkpoints, and writes them to
runs/code/summary.json. Run from the repository root: `python examples/code/demo.py`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from stages import Stage, demo_main, eval_stages, eval_summary  # noqa: E402  (examples/stages.py)

OUT = Path("runs/code")  # the stage configs read and write here (paths relative to the cwd)
CHECKPOINTS = {"sft": OUT / "sft/checkpoints/step_300", "grpo": OUT / "grpo/checkpoints/step_20"}


def stages(python: str) -> list[Stage]:
    """The data, SFT, GRPO from the SFT checkpoint, and the evaluation of each checkpoint."""
    logs = OUT / "logs"
    astrai = [python, "-m", "astrai_core.cli.main", "--log-format", "console", "train"]
    # Always written (a second): data left by an older version of this example would not fit.
    result = [Stage("code/data", [python, str(HERE / "generate.py"), "--out", str(OUT / "data")],
                    logs / "data.log"),
              Stage("code/sft", astrai + [str(HERE / "sft.yaml"), "--overwrite"], logs / "sft.log",
                    needs=("code/data",)),
              Stage("code/grpo", astrai + [str(HERE / "grpo.yaml"), "--overwrite"], logs / "grpo.log",
                    needs=("code/sft",))]
    return result + eval_stages("code", python, HERE / "evaluate.py", CHECKPOINTS, OUT)


def report(seconds: dict[str, float]) -> None:
    """Print the pass rates and write runs/code/summary.json."""
    from rich.console import Console
    from rich.table import Table

    summary = eval_summary("code", list(CHECKPOINTS), OUT, seconds)
    table = Table(title="code: held-out pass rate (all tests pass, 150 functions)")
    for column in ("stage", "greedy", "sampled (T=1)", "pass@4", "train time"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for stage, row in summary.items():
        table.add_row(stage, f"{row['greedy']:.3f}", f"{row['sampled']:.3f}", f"{row['pass@4']:.3f}",
                      f"{row['train_seconds']:.0f}s")
    Console().print(table)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    demo_main(__doc__, stages, report)
