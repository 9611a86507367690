"""LoRA SFT on 2 processes (FSDP2 over gloo) equals LoRA SFT on 1: the same losses and
adapter weights (within reduction order), the frozen base bit-identical to the start,
the adapter written once by rank 0 in PEFT's format with Hugging Face names, the sharded
state holding only the adapter, and a 2-process resume from that checkpoint equal to the
uninterrupted run; a bfloat16 base trains its float32 adapter too."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from astrai_core.checkpoints.lora_files import ADAPTER_DIR
from astrai_core.checkpoints.sharded import read_sharded
from astrai_core.testing import read_metrics
from tests.distributed.conftest import (adapter, assert_close_metrics, assert_close_weights,
                                        copy_checkpoint, ok, train, weights, without_timing)
from tests.training.conftest import tiny_config
from tests.training.reference import save_start_model

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun
STEPS = 6
LOSSES = ("loss", "lm_loss", "grad_norm", "tokens")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: run dir} of the LoRA SFT runs every test here compares, and the start."""
    tmp = tmp_path_factory.mktemp("dist_lora")
    start = save_start_model(tmp / "start")
    base = tiny_config(tmp, max_steps=STEPS, warmup_steps=2, save_every=3, progress=False,
                       eps=1e-6)
    # save_base: every checkpoint also holds the live base, gathered from its shards
    base["model"] = {"path": str(start), "lora": {"r": 4, "alpha": 8.0, "save_base": True}}

    def config(name: str) -> dict:
        return dict(base, output_dir=str(tmp / name))

    ok(train(config("one"), tmp, "one"))
    ok(train(config("two"), tmp, "two", 2))
    copy_checkpoint(tmp / "two", tmp / "resumed", 3)
    ok(train(config("resumed"), tmp, "resumed", 2, "--resume"))
    bf16 = config("bf16")  # a bfloat16 base under bf16 autocast, the adapter float32
    bf16["model"] = dict(base["model"], dtype="bfloat16")
    bf16["trainer"] = dict(base["trainer"], mixed_precision="bf16", max_steps=2, save_every=2)
    ok(train(bf16, tmp, "bf16", 2))
    return {name: tmp / name for name in ("one", "two", "resumed", "start", "bf16")}


def test_two_processes_equal_one(runs):
    one, two = read_metrics(runs["one"]), read_metrics(runs["two"])
    assert len(two) == STEPS
    assert_close_metrics(one, two, LOSSES)
    for step in (3, STEPS):
        assert_close_weights(adapter(runs["one"], step), adapter(runs["two"], step))
    assert any(t.abs().max() > 0 for n, t in adapter(runs["two"], STEPS).items()
               if "lora_B" in n)  # B starts at 0: the adapter trained


def test_base_stays_bit_identical_to_the_start(runs):
    start = load_file(str(runs["start"] / "model.safetensors"))
    for run in ("one", "two"):
        saved = weights(runs[run], STEPS)
        assert saved.keys() == start.keys()
        for name, tensor in start.items():
            assert saved[name].equal(tensor), f"{run}: {name}"


def test_bf16_base_trains_a_float32_adapter(runs):
    """FSDP2 shards a unit holding bf16 frozen and float32 trained tensors side by side."""
    start = load_file(str(runs["start"] / "model.safetensors"))
    saved = weights(runs["bf16"], 2)
    for name, tensor in start.items():
        assert saved[name].dtype == torch.bfloat16 and saved[name].equal(tensor.bfloat16()), name
    trained = adapter(runs["bf16"], 2)
    assert {t.dtype for t in trained.values()} == {torch.float32}
    assert any(t.abs().max() > 0 for n, t in trained.items() if "lora_B" in n)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in read_metrics(runs["bf16"]))


def test_adapter_is_peft_format_with_hf_names(runs):
    directory = runs["two"] / "checkpoints" / f"step_{STEPS}" / ADAPTER_DIR
    config = json.loads((directory / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4
    names = sorted(adapter(runs["two"], STEPS))
    assert names and all(n.startswith("base_model.model.model.layers.") for n in names)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names


def test_sharded_state_holds_only_the_adapter(runs):
    """dcp/ has the adapter and its AdamW moments, not a second copy of the base."""
    state = read_sharded(runs["two"] / "checkpoints" / f"step_{STEPS}")
    params = state["modules"]["policy"]
    assert params and all("lora_" in name for name in params), sorted(params)[:5]
    moments = state["optimizers"]["policy"]["state"]
    assert set(moments) == set(params)


def test_two_process_resume_equals_the_uninterrupted_run(runs):
    reference, resumed = read_metrics(runs["two"]), read_metrics(runs["resumed"])
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    assert [without_timing(r) for r in resumed] == [without_timing(r) for r in reference]
    for name, tensor in adapter(runs["two"], STEPS).items():
        assert tensor.equal(adapter(runs["resumed"], STEPS)[name]), name
