"""CPU smoke runs of the recipes in ``examples/`` (a source checkout): a tiny random model
and data files of the recipe's shape, laid out where the recipe's configs look for them.

:func:`gsm8k_smoke_config` is a GSM8K recipe config (``grpo.yaml``, ``ppo.yaml``) as
written, with only what a 2-step CPU run must change; :func:`gsm8k_workspace` builds
``models/qwen3-tiny`` (imported with ``astrai import``) and ``data/gsm8k/*.parquet``;
:func:`run_gsm8k_smoke` trains such a config there and checks what every run must show.
Needs ``datasets`` (the parquet files) and ``transformers`` (the tiny model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from astrai_core.testing.runs import REPO_ROOT

GSM8K_RECIPE = REPO_ROOT / "examples" / "gsm8k"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
# head_dim 32 and max_position_embeddings 256: vLLM's CPU attention needs head_dim >= 32
TINY_QWEN3 = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  max_position_embeddings=256)


def recipe_astrai(*args: str, cwd: Path, recipe: Path = GSM8K_RECIPE
                  ) -> subprocess.CompletedProcess:
    """``astrai ARGS`` in ``cwd`` with the ``recipe`` folder on PYTHONPATH (its transform),
    offline, one CPU thread; fails the caller's test (AssertionError) on a non-zero exit."""
    # the recipe folder first, before the caller's own path (the checkout under test)
    path = os.pathsep.join(filter(None, (str(recipe), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", *args], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def gsm8k_workspace(root: Path) -> Path:
    """``root`` holding models/qwen3-tiny (native) and data/gsm8k/{train,test}.parquet."""
    import datasets
    from transformers import AutoTokenizer

    from astrai_core.testing.parity import save_hf_model, tiny_hf_model

    hf_dir = root / "hf"
    save_hf_model(tiny_hf_model("qwen3", **TINY_QWEN3), hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(hf_dir)
    recipe_astrai("import", str(hf_dir), str(root / "models" / "qwen3-tiny"), cwd=root)
    rows = [{"question": f"w{i} has w{i + 1} apples. How many?",
             "answer": f"w{i} plus w{i + 1}.\n#### {i + 1}"} for i in range(12)]
    (root / "data" / "gsm8k").mkdir(parents=True)
    datasets.Dataset.from_list(rows[:8]).to_parquet(str(root / "data/gsm8k/train.parquet"))
    datasets.Dataset.from_list(rows[8:]).to_parquet(str(root / "data/gsm8k/test.parquet"))
    return root


def gsm8k_smoke_config(recipe: str, report_to: list[str]) -> dict[str, Any]:
    """The recipe's config for 2 steps on CPU: the tiny model in float32, small batches
    and answers, no checkpoints but the last; everything else as the recipe has it."""
    import yaml

    config = yaml.safe_load((GSM8K_RECIPE / recipe).read_text())
    config["output_dir"] = f"runs/{recipe}"
    config["model"].update(path="models/qwen3-tiny", dtype="float32")
    config["data"].update(batch_size=2, eval_batch_size=4, max_prompt_len=64,
                          cache_dir="cache")
    config["sampler"]["max_new_tokens"] = 6
    config["device"] = {"name": "cpu"}
    config["trainer"].update(max_steps=2, warmup_steps=0, mixed_precision="no", eval_every=0,
                             save_every=0, keep_last=None, eval_max_new_tokens=6,
                             progress=False, report_to=report_to)
    return config


def run_gsm8k_smoke(root: Path, recipe: str, config: dict[str, Any]) -> tuple[Path, list[dict]]:
    """Train ``config`` (from :func:`gsm8k_smoke_config`) in the workspace ``root``; check
    the evaluation and rollout metrics of its 2 steps and its last checkpoint (a LoRA
    policy's adapter and its whole critic for PPO); (run directory, metric records)."""
    import yaml

    path = root / f"smoke-{recipe}"
    path.write_text(yaml.safe_dump(config))
    recipe_astrai("train", str(path), cwd=root)
    run = root / "runs" / recipe
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert {"eval/accuracy", "eval/reward/gsm8k"} <= set(records[-1])
    assert "rollout/reward/gsm8k" in records[-1]
    step = run / "checkpoints" / "step_2"
    if config["strategy"]["name"] == "ppo":
        assert (step / "adapter" / "adapter_model.safetensors").is_file()
        assert (step / "critic.safetensors").is_file()
    else:
        assert (step / "model.safetensors").is_file()
    return run, records
