"""Exact resume of online runs at ANY optimizer step, in the middle of a rollout included.

Each run is SIGKILLed by itself right after a checkpoint (astrai_core.testing.faults),
resumed with --resume, and must end with weights, every trained module (PPO's critic)
and every logged metric bit-identical to an uninterrupted run of the same config. GRPO
and PPO are killed in the middle of a rollout (epochs x mini_batches steps each), so the
checkpoint must hold the rollout itself, its order and the position in it.
"""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts
from tests.training.conftest import astrai, write_config
from tests.training.test_resume import TIMING, killed_after_checkpoint

STEPS = 6
CASES = {
    # strategy section, the checkpoint to kill after, the files that must match
    "grpo, 2 epochs, killed mid-rollout": (
        {"name": "grpo", "group_size": 4, "epochs": 2}, 3, ("model",)),
    "grpo with dynamic sampling": (
        {"name": "grpo", "group_size": 4, "dynamic_sampling": {"max_tries": 3}}, 3, ("model",)),
    "ppo, 2 epochs x 2 mini-batches, killed mid-rollout": (
        {"name": "ppo", "group_size": 4, "epochs": 2, "mini_batches": 2, "critic_lr": 3e-3},
        2, ("model", "critic")),
    "online dpo": (
        {"name": "dpo", "mode": "online", "group_size": 4, "beta": 0.5}, 3, ("model",)),
}


def _run(tmp_path, name: str, strategy: dict) -> dict:
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        write_arith_prompts(prompts)
    config = tiny_run_config(tmp_path, prompts, strategy, max_steps=STEPS, save_every=1,
                             sampler={"max_new_tokens": 4})
    config["data"]["batch_size"] = 4
    config["output_dir"] = str(tmp_path / name)
    return config


def _files(run_dir, names):
    step = run_dir / "checkpoints" / f"step_{STEPS}"
    return {name: load_file(str(step / f"{name}.safetensors")) for name in names}


@pytest.mark.parametrize("strategy,kill_after,files", CASES.values(), ids=CASES.keys())
def test_online_run_resumed_anywhere_equals_the_uninterrupted_run(tmp_path, strategy,
                                                                  kill_after, files):
    reference = _run(tmp_path, "reference", strategy)
    done = astrai("train", str(write_config(tmp_path, reference, "reference.yaml")))
    assert done.returncode == 0, done.stderr

    path = write_config(tmp_path, _run(tmp_path, "interrupted", strategy), "interrupted.yaml")
    killed = killed_after_checkpoint(kill_after, "train", str(path))
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = astrai("train", str(path), "--resume")
    assert resumed.returncode == 0, resumed.stderr

    expected, got = _files(tmp_path / "reference", files), _files(tmp_path / "interrupted", files)
    for name in files:
        assert expected[name].keys() == got[name].keys()
        for key in expected[name]:
            assert (expected[name][key] == got[name][key]).all(), f"{name}: {key} differs"
    strip = lambda r: {k: v for k, v in r.items() if k not in TIMING}  # noqa: E731
    want = [strip(r) for r in read_metrics(tmp_path / "reference")]
    have = [strip(r) for r in read_metrics(tmp_path / "interrupted")]
    assert [r["step"] for r in have] == list(range(1, STEPS + 1))  # every step logged once
    assert have == want


def test_a_mid_rollout_checkpoint_holds_the_rollout(tmp_path):
    """The checkpoint of step 1 of a 2-step rollout carries the rollout's tensors (through
    safetensors) and where the schedule stands; one at a rollout's end carries none."""
    import torch

    config = _run(tmp_path, "run", {"name": "grpo", "group_size": 4, "epochs": 2})
    config["trainer"]["max_steps"] = 2
    assert astrai("train", str(write_config(tmp_path, config))).returncode == 0
    first, second = (tmp_path / "run" / "checkpoints" / f"step_{n}" for n in (1, 2))
    tensors = load_file(str(first / "state_tensors.safetensors"))
    assert {"response_ids", "old_logprobs", "advantages"} <= set(tensors)
    assert tensors["response_ids"].shape[0] == 16  # 4 prompts x 4 completions
    state = torch.load(first / "training_state.pt", weights_only=True)["batches"]
    assert state["position"] == 1 and len(state["order"]) == 2
    assert not (second / "state_tensors.safetensors").exists()
