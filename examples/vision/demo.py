"""The vision demo: a tiny random LLaVA learns to count the red squares in a picture.

Writes the pictures and the untrained model, trains it with SFT, then with GRPO from the
SFT checkpoint (reward: the exact count), and prints the held-out greedy exact-match
accuracy of the untrained, the SFT and the GRPO model; writes them to
runs/vision/summary.json. Run from the repository root: `python examples/vision/demo.py`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from stages import Stage, demo_main, eval_stages, eval_summary  # noqa: E402  (examples/stages.py)

OUT = Path("runs/vision")  # the stage configs read and write here (paths relative to the cwd)
STEPS = {"sft": 200, "grpo": 50}  # the configs' max_steps: each run's last checkpoint


def checkpoints(steps: dict[str, int]) -> dict[str, Path]:
    """Each evaluated stage's model: the untrained one, and each training's last checkpoint."""
    return {"base": OUT / "base",
            **{stage: OUT / stage / "checkpoints" / f"step_{n}" for stage, n in steps.items()}}


def stages(python: str, steps: dict[str, int] = STEPS, data_args: tuple[str, ...] = ()
           ) -> list[Stage]:
    """The data, the untrained model, SFT, GRPO from the SFT checkpoint, and the
    evaluation of each model. ``steps`` and ``data_args`` (generate.py's options) shrink
    the demo for a test."""
    logs = OUT / "logs"
    astrai = [python, "-m", "astrai_core.cli.main", "--log-format", "console", "train"]

    def train(stage: str) -> list[str]:
        n = steps[stage]
        return astrai + [str(HERE / f"{stage}.yaml"), "--overwrite",
                         "--set", f"trainer.max_steps={n}", "--set", f"trainer.save_every={n}"]

    sft = checkpoints(steps)["sft"]  # GRPO starts from the SFT run's last checkpoint
    # Always written (seconds): data or a model left by an older version would not fit.
    result = [Stage("vision/data", [python, str(HERE / "generate.py"), "--out", str(OUT / "data"),
                                    *data_args], logs / "data.log"),
              Stage("vision/base", [python, str(HERE / "make_model.py"), str(OUT / "base")],
                    logs / "base.log"),
              Stage("vision/sft", train("sft"), logs / "sft.log",
                    needs=("vision/data", "vision/base")),
              Stage("vision/grpo", train("grpo") + ["--set", f"model.path={sft}"],
                    logs / "grpo.log", needs=("vision/sft",))]
    evals = eval_stages("vision", python, HERE / "evaluate.py", checkpoints(steps), OUT)
    for index, stage in enumerate(evals):  # every evaluation reads the held-out data
        evals[index] = Stage(stage.name, stage.command, stage.log, (*stage.needs, "vision/data"))
    return result + evals


def report(seconds: dict[str, float]) -> None:
    """Print the accuracies and write runs/vision/summary.json."""
    from rich.console import Console
    from rich.table import Table

    summary = eval_summary("vision", list(checkpoints(STEPS)), OUT, seconds)
    table = Table(title="vision: held-out greedy accuracy (how many red squares, 200 pictures)")
    for column in ("model", "accuracy", "train time"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for stage, row in summary.items():
        trained = "-" if stage == "base" else f"{row['train_seconds']:.0f}s"  # base: written
        table.add_row(stage, f"{row['accuracy']:.3f}", trained)
    Console().print(table)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    demo_main(__doc__, stages, report)
