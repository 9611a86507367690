"""The arithmetic demo: SFT from scratch, then GRPO (PPO-clip, GSPO and CISPO policy losses),
PPO and DPO from the SFT checkpoint.

Prints held-out accuracy (greedy, exact numeric match) after each stage and writes the
same numbers to runs/demo/summary.json. Run from the repository root: `make demo`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from stages import Stage, demo_main  # noqa: E402  (examples/stages.py)

STAGES = ("sft", "grpo", "grpo_gspo", "grpo_cispo", "ppo", "dpo")  # the table's order
# The order they start in: SFT, then the RL stages longest first, so that with a core
# per stage the last ones end together.
START_ORDER = ("sft", "ppo", "grpo_cispo", "grpo", "dpo", "grpo_gspo")
OUT = Path("runs/demo")  # the stage configs read and write here (paths relative to the cwd)


def stages(python: str) -> list[Stage]:
    """The demo's stages: the data, SFT, then every RL stage from the SFT checkpoint."""
    logs = OUT / "logs"
    astrai = [python, "-m", "astrai_core.cli.main", "--log-format", "console", "train"]
    data = [Stage("arith/data", [python, str(HERE / "generate.py"), "--out", str(OUT / "data")],
                  logs / "data.log")] if not (OUT / "data" / "sft_train.jsonl").exists() else []
    trained = [Stage(f"arith/{stage}", astrai + [str(HERE / f"{stage}.yaml"), "--overwrite"],
                     logs / f"{stage}.log",
                     needs=tuple(s.name for s in data) if stage == "sft" else ("arith/sft",))
               for stage in START_ORDER]
    return data + trained


def final_accuracy(run_dir: Path) -> tuple[float, float]:
    """(accuracy at the first evaluation, accuracy at the last) from metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accuracies = [r["eval/accuracy"] for r in records if r.get("eval/accuracy") is not None]
    if not accuracies:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no eval/accuracy")
    return accuracies[0], accuracies[-1]


def report(seconds: dict[str, float]) -> None:
    """Print the accuracy table and write runs/demo/summary.json."""
    summary = {stage: final_accuracy(OUT / stage)[1] for stage in STAGES}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    timings = {stage: seconds.get(f"arith/{stage}", 0.0) for stage in STAGES}
    print_table(summary, timings, final_accuracy(OUT / "sft")[0])


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
    demo_main(__doc__, stages, report)
