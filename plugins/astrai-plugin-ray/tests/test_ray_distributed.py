"""The ray sampler under a distributed (FSDP) trainer: a 2-process GRPO run whose rollouts
come from 2 torch rollout workers equals the 1-process ray run (the same completions,
metrics and, after 3 steps, weights within 1e-4; the evaluation by generation, split
over the ranks, too), for a fully trained policy and for a LoRA policy, whose pushes carry
the adapter only. Rank 0 holds the workers; every rank sends its prompts through it
and gathers the sharded weights bucket by bucket (the tiny model's embedding has an odd
number of rows, so its shards are uneven); for a policy on the transformers backend,
whose pushes carry the family's own names; and for a vision-language policy on prompts
with images."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts

pytestmark = pytest.mark.slow  # 2 trainer processes and 2 Ray workers per run
STEPS = 3
RAY = {"name": "ray", "workers": 2, "worker_sampler": {"name": "torch"},
       "init_kwargs": {"num_cpus": 2}, "bucket_mb": 0.01}  # ~10 KB buckets: many per push
SHARED = ("loss", "policy_loss", "grad_norm", "tokens", "rollout/reward_mean",
          "rollout/advantage_std", "rollout/logprob_diff_max")


LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _train(tmp_path: Path, name: str, nproc: int, lora: bool = False,
           hf: Path | None = None) -> Path:
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 4},
                             sampler=RAY, data={"batch_size": 4}, max_steps=STEPS,
                             save_every=STEPS, lr=2e-3, eps=1e-6, eval_every=STEPS,
                             eval_max_new_tokens=3)
    held_out = write_arith_prompts(tmp_path / "held_out.jsonl", count=5)  # shares of 3 and 2
    config["data"]["eval"] = {"path": str(held_out), "format": "prompt"}
    config["output_dir"] = str(tmp_path / name)
    if hf is not None:  # a Hugging Face directory on the transformers backend
        config["model"] = {"path": str(hf)}
    if lora:
        config["model"]["lora"] = dict(LORA)
    return _launch(config, tmp_path, name, nproc)


def _launch(config: dict, tmp_path: Path, name: str, nproc: int) -> Path:
    """`astrai train` of ``config`` on ``nproc`` processes; its run directory."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    done = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path),
                           *launch], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return tmp_path / name


def _trained_weights(run: Path, lora: bool) -> dict:
    """The full model, or with LoRA the adapter (PEFT's files), of the last checkpoint."""
    from astrai_core.checkpoints.lora_files import ADAPTER_DIR, ADAPTER_WEIGHTS

    step = run / "checkpoints" / f"step_{STEPS}"
    return load_file(str(step / ADAPTER_DIR / ADAPTER_WEIGHTS if lora else step / "model.safetensors"))


@pytest.mark.parametrize("lora, model_type", [(False, None), (True, None), (False, "olmo2")],
                         ids=["full", "lora", "transformers"])
def test_two_trainer_processes_with_ray_workers_equal_one(tmp_path, lora, model_type):
    hf = None
    if model_type is not None:
        from astrai_core.testing.hf_models import write_hf_model_dir

        hf = write_hf_model_dir(tmp_path / "hf", model_type)
    one, two = _train(tmp_path, "one", 1, lora, hf), _train(tmp_path, "two", 2, lora, hf)
    first, second = read_metrics(one), read_metrics(two)
    assert [m["step"] for m in second] == list(range(1, STEPS + 1))
    for a, b in zip(first, second):
        for name in SHARED:
            assert b[name] == pytest.approx(a[name], rel=1e-4, abs=1e-6), (a["step"], name)
        assert b["rollout/weight_push_mb"] == pytest.approx(a["rollout/weight_push_mb"])
    # the evaluation by generation, split over the ranks, scores what one process scores
    assert second[-1]["eval/response_length"] == pytest.approx(first[-1]["eval/response_length"])
    assert second[-1]["eval/reward"] == pytest.approx(first[-1]["eval/reward"])
    weights = [_trained_weights(run, lora) for run in (one, two)]
    if lora:  # a push carries the adapter's tensors and nothing else (16-byte alignment aside)
        adapter_mb = sum(t.numel() * t.element_size() for t in weights[1].values()) / 2**20
        assert second[0]["rollout/weight_push_mb"] == pytest.approx(adapter_mb, rel=0.05)
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert (tensor - weights[1][name]).abs().max().item() <= 1e-4, name


def test_two_trainer_processes_on_image_prompts_equal_one(tmp_path):
    """GRPO on prompts with images of four sizes (Qwen2.5-VL: 16 to 48 patches each): rank
    0 sends every rank's prompts with their images to the workers, and each rank's rows
    keep their images through the trainer's gather, so 2 processes log what 1 logs."""
    from astrai_core.testing.hf_vlms import tiny_image, write_image_prompts, write_vlm_dir
    from astrai_core.testing.runs import DIGIT_REWARD

    hf = write_vlm_dir(tmp_path / "hf", "qwen2_5_vl")
    prompts = write_image_prompts(tmp_path / "data", rows=4)
    for i, size in ((1, (40, 20)), (2, (56, 28)), (3, (56, 42))):
        tiny_image(i, size=size).save(prompts.parent / f"{i}.png")
    runs = []
    for name, nproc in (("one", 1), ("two", 2)):
        config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                                 sampler=RAY, data={"batch_size": 2}, max_steps=2, eps=1e-6,
                                 rewards=[{"name": "exact_match"}, dict(DIGIT_REWARD)])
        config["model"] = {"path": str(hf)}
        config["rollout"] = {"max_logprob_diff": 1e-5}  # stops the run beyond it
        config["output_dir"] = str(tmp_path / name)
        runs.append(read_metrics(_launch(config, tmp_path, name, nproc)))
    first, second = runs
    assert [m["step"] for m in second] == [1, 2]
    for a, b in zip(first, second):
        assert b["rollout/logprob_diff_max"] <= 1e-5
        for name in SHARED[:-1]:  # logprob_diff_max: float noise on each side
            assert b[name] == pytest.approx(a[name], rel=1e-4, abs=1e-5), (a["step"], name)


def test_the_plan_takes_ray_on_several_processes_but_not_multi_turn_episodes(tmp_path,
                                                                             monkeypatch):
    from astrai_core.api import ConfigError, RunConfig
    from astrai_core.config.plan import plan_run

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             sampler=RAY, data={"batch_size": 4})
    monkeypatch.setenv("WORLD_SIZE", "2")
    plan_run(RunConfig.model_validate(config), base_dir=tmp_path)
    config["environment"] = {"name": "tools", "tools": ["math:sqrt"], "max_turns": 2}
    with pytest.raises(ConfigError, match="^environment: multi-turn episodes with sampler 'ray' "
                       "run on one trainer process only"):
        plan_run(RunConfig.model_validate(config), base_dir=tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "1")
    plan_run(RunConfig.model_validate(config), base_dir=tmp_path)
