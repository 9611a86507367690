"""The code demo: SFT on tiny functions, then GRPO with the code_tests reward.

Prints the held-out pass rate (greedy; a program passes when every test of its row passes
in the sandbox) after SFT and after GRPO, and writes the numbers to runs/code/summary.json.
Run from the repository root: `python examples/code/demo.py`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from stages import Stage, demo_main  # noqa: E402  (examples/stages.py)

OUT = Path("runs/code")  # the stage configs read and write here (paths relative to the cwd)
METRIC = "eval/reward/code_tests"


def stages(python: str) -> list[Stage]:
    """The data, SFT, then GRPO from the SFT checkpoint."""
    logs = OUT / "logs"
    astrai = [python, "-m", "astrai_core.cli.main", "--log-format", "console", "train"]
    data = [Stage("code/data", [python, str(HERE / "generate.py"), "--out", str(OUT / "data")],
                  logs / "data.log")] if not (OUT / "data" / "sft_train.jsonl").exists() else []
    return data + [
        Stage("code/sft", astrai + [str(HERE / "sft.yaml"), "--overwrite"], logs / "sft.log",
              needs=tuple(s.name for s in data)),
        Stage("code/grpo", astrai + [str(HERE / "grpo.yaml"), "--overwrite"], logs / "grpo.log",
              needs=("code/sft",))]


def pass_rates(run_dir: Path) -> list[tuple[int, float]]:
    """(step, held-out pass rate) of every evaluation in the run's metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r[METRIC]) for r in records if r.get(METRIC) is not None]


def report(seconds: dict[str, float]) -> None:
    """Print the pass rates and write runs/code/summary.json."""
    from rich.console import Console
    from rich.table import Table

    sft, grpo = pass_rates(OUT / "sft"), pass_rates(OUT / "grpo")
    summary = {"sft": sft[-1][1], "grpo": grpo[-1][1], "grpo_curve": grpo,
               "train_seconds": {k: round(v, 1) for k, v in seconds.items()}}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = Table(title="code: held-out pass rate (greedy, all tests pass)")
    for column in ("stage", "pass rate", "train time"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    table.add_row("sft", f"{sft[-1][1]:.3f}", f"{seconds.get('code/sft', 0):.0f}s")
    table.add_row("grpo", f"{grpo[-1][1]:.3f}", f"{seconds.get('code/grpo', 0):.0f}s")
    Console().print(table)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    demo_main(__doc__, stages, report)
