"""Colocated vLLM under torchrun: a 2-process run with `sampler: {name: vllm}` (one engine
per rank, each sampling its own share of the prompts, weights pushed from the FSDP2
shards bucket by bucket) equals the 1-process vllm run: the same completions at every
step (seeded sampling: each completion carries its own vLLM seed), so every push landed,
and the same weights after 3 steps. GRPO with a full policy; PPO with a LoRA policy and a
full-parameter critic. Both also evaluate before the first step, split over the ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts  # noqa: E402

STEPS = 3
# head_dim 32: vLLM's CPU attention needs >= 32
MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2,
         "num_kv_heads": 1, "max_position_embeddings": 64}
ENGINE = {"name": "vllm", "enforce_eager": True, "max_num_seqs": 16, "cpu_kv_cache_gib": 1,
          "weight_bucket_mb": 1}  # small buckets: a push takes several


def _config(tmp: Path, name: str, strategy: dict, model: dict | None = None) -> dict:
    prompts = write_arith_prompts(tmp / "prompts.jsonl", count=16)
    # evaluation before the first step: split over the ranks, each engine its share
    config = tiny_run_config(tmp, prompts, strategy, sampler=ENGINE,
                             data={"batch_size": 4, "eval": {"path": str(prompts), "format": "prompt"},
                                   "eval_batch_size": 8},
                             max_steps=STEPS, save_every=1, lr=2e-3, eps=1e-6,
                             eval_at_start=True, eval_every=0, eval_max_new_tokens=3)
    # eps=1e-6: Adam's first step on a near-zero gradient stays of the gradient's size,
    # so reduction-order noise stays noise (as in the core's distributed tests)
    config["model"] = model or {**config["model"], "config": dict(MODEL)}
    config["output_dir"] = str(tmp / name)
    config["rollout"] = {"max_logprob_diff": 1e-3}  # every push checked, every step
    config["parallel"] = {"timeout_seconds": 300}
    return config


def _train(config: dict, tmp: Path, name: str, nproc: int) -> None:
    import yaml

    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train", str(path), *launch],
                            capture_output=True, text=True, timeout=900,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]


def _one_and_two(tmp: Path, strategy: dict, model: dict | None = None) -> tuple[Path, Path]:
    for name, nproc in (("one", 1), ("two", 2)):
        _train(_config(tmp, name, strategy, model), tmp, name, nproc)
    return tmp / "one", tmp / "two"


def _checkpoint(run: Path, step: int, name: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step_{step}" / name))


def _assert_same_rollouts(one: Path, two: Path) -> None:
    """The rollouts saved mid-rollout (two optimizer steps per rollout): step 1's, and
    step 3's, sampled after two pushes from the shards."""
    import torch

    for step in (1, 3):
        a = _checkpoint(one, step, "state_tensors.safetensors")
        b = _checkpoint(two, step, "state_tensors.safetensors")
        for name in ("prompt_ids", "response_ids", "response_mask", "rewards"):
            assert torch.equal(a[name], b[name]), (step, name)
        assert torch.allclose(a["old_logprobs"], b["old_logprobs"], atol=1e-4), step
    rows = {run: read_metrics(run) for run in (one, two)}
    for run in (one, two):
        assert [r["step"] for r in rows[run]] == list(range(STEPS + 1))
        assert all(r["rollout/logprob_diff_max"] <= 1e-3 for r in rows[run][1:]), rows[run]
    # the split evaluation's result is the one-process evaluation's (the same weights)
    evals = [{k: v for k, v in rows[run][0].items() if k.startswith("eval/")} for run in (one, two)]
    assert evals[0] and evals[0] == pytest.approx(evals[1], abs=1e-6)


def _assert_close(a: dict, b: dict, atol: float = 1e-4) -> None:
    assert a.keys() == b.keys()
    for name in a:
        diff = (a[name].double() - b[name].double()).abs().max().item()
        assert diff <= atol, f"{name}: max |diff| {diff}"


GRPO = {"name": "grpo", "group_size": 4, "mini_batches": 2}


@pytest.fixture(scope="module")
def grpo_one(tmp_path_factory) -> Path:
    """The 1-process GRPO run with the vllm sampler."""
    tmp = tmp_path_factory.mktemp("grpo")
    _train(_config(tmp, "one", GRPO), tmp, "one", 1)
    return tmp / "one"


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_grpo_on_two_processes_equals_one(grpo_one, tmp_path, tensor_parallel_size):
    """One engine per rank (each sampling its own prompts), or one engine over both ranks
    (tensor parallel: the ranks pool their prompts)."""
    config = _config(tmp_path, "two", GRPO)
    config["sampler"]["tensor_parallel_size"] = tensor_parallel_size
    _train(config, tmp_path, "two", 2)
    one, two = grpo_one, tmp_path / "two"
    _assert_same_rollouts(one, two)
    _assert_close(_checkpoint(one, STEPS, "model.safetensors"),
                  _checkpoint(two, STEPS, "model.safetensors"))
    first, last = (_checkpoint(one, s, "model.safetensors") for s in (1, STEPS))
    assert any(not (first[n] == last[n]).all() for n in first)  # the policy moved


def _start_model(directory: Path) -> Path:
    """A tiny random native checkpoint over the arithmetic tokenizer (vLLM-sized heads)."""
    import torch

    from astrai_core.api import CausalLM, ModelConfig, load_tokenizer, save_pretrained
    from astrai_core.testing import ARITH_TOKENIZER

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=len(load_tokenizer(ARITH_TOKENIZER)), **MODEL)
    return save_pretrained(CausalLM(config), directory, tokenizer_dir=ARITH_TOKENIZER)


def test_lora_ppo_on_two_processes_equals_one(tmp_path):
    """The seed recipe's shape: a LoRA policy (pushed merged), a full-parameter critic."""
    from astrai_core.checkpoints.lora_files import ADAPTER_DIR, ADAPTER_WEIGHTS

    start = _start_model(tmp_path / "start")
    strategy = {"name": "ppo", "group_size": 2, "epochs": 1, "mini_batches": 2}
    one, two = _one_and_two(tmp_path, strategy,
                            {"path": str(start), "lora": {"r": 4, "alpha": 8.0}})
    _assert_same_rollouts(one, two)
    adapter = f"{ADAPTER_DIR}/{ADAPTER_WEIGHTS}"
    _assert_close(_checkpoint(one, STEPS, adapter), _checkpoint(two, STEPS, adapter))
    _assert_close(_checkpoint(one, STEPS, "critic.safetensors"),
                  _checkpoint(two, STEPS, "critic.safetensors"))
