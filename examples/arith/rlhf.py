"""Classic RLHF on the arithmetic problems: SFT, a reward model on preference pairs, then
PPO rewarded by the reward model alone.

Prints the reward model's held-out pair accuracy and the policy's held-out exact-match
accuracy (greedy) before and after PPO; the reward model never sees the true answers of
the PPO prompts, and the policy is never rewarded by them. Writes the same numbers to
runs/demo/rlhf_summary.json. Run from the repository root:
`python examples/arith/rlhf.py` (an SFT checkpoint already in runs/demo/sft is reused).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from stages import Stage, demo_main  # noqa: E402  (examples/stages.py)

OUT = Path("runs/demo")  # the configs read and write here (paths relative to the cwd)
SFT_CHECKPOINT = OUT / "sft" / "checkpoints" / "step_400"


def stages(python: str) -> list[Stage]:
    """Data (when missing), SFT (when missing), the reward model, then PPO on its reward."""
    logs = OUT / "logs"
    astrai = [python, "-m", "astrai_core.cli.main", "--log-format", "console", "train"]
    out: list[Stage] = []
    if not (OUT / "data" / "rm_train.jsonl").exists():
        out.append(Stage("arith/data", [python, str(HERE / "generate.py"), "--out",
                                        str(OUT / "data")], logs / "data.log"))
    if not SFT_CHECKPOINT.is_dir():
        out.append(Stage("arith/sft", astrai + [str(HERE / "sft.yaml"), "--overwrite"],
                         logs / "sft.log", needs=tuple(s.name for s in out)))
    before = tuple(s.name for s in out)
    out.append(Stage("arith/rm", astrai + [str(HERE / "rm.yaml"), "--overwrite"],
                     logs / "rm.log", needs=before))
    out.append(Stage("arith/ppo_rm", astrai + [str(HERE / "ppo_rm.yaml"), "--overwrite"],
                     logs / "ppo_rm.log", needs=("arith/rm",)))
    return out


def evaluations(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    found = [r for r in records if r.get("eval/accuracy") is not None]
    if not found:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no eval/accuracy")
    return found


def report(seconds: dict[str, float]) -> None:
    rm, ppo = evaluations(OUT / "rm"), evaluations(OUT / "ppo_rm")
    summary = {"rm_pair_accuracy": rm[-1]["eval/accuracy"], "rm_eval_loss": rm[-1]["eval/loss"],
               "policy_accuracy_before": ppo[0]["eval/accuracy"],
               "policy_accuracy_after": ppo[-1]["eval/accuracy"],
               "rm_reward_before": ppo[0]["eval/reward/reward_model"],
               "rm_reward_after": ppo[-1]["eval/reward/reward_model"]}
    (OUT / "rlhf_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"reward model: held-out pair accuracy {summary['rm_pair_accuracy']:.3f} "
          f"(eval/loss {summary['rm_eval_loss']:.3f}), {seconds.get('arith/rm', 0):.0f}s")
    print(f"PPO on the reward model: held-out exact match {summary['policy_accuracy_before']:.3f}"
          f" -> {summary['policy_accuracy_after']:.3f}; mean reward-model score "
          f"{summary['rm_reward_before']:.3f} -> {summary['rm_reward_after']:.3f}, "
          f"{seconds.get('arith/ppo_rm', 0):.0f}s")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    demo_main(__doc__, stages, report)
