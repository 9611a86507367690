"""bench/bench_mfu.py does not rot: its smoke mode runs in 1 process and in 2 (FSDP2 +
sharded Muon, gloo), and its FLOP count agrees with the model it measures."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import torch

from astrai_core.model import CausalLM, ModelConfig
from astrai_core.testing import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "bench_mfu.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_mfu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_torchrun(tmp_path, *args: str, nproc: int = 2) -> dict:
    out = tmp_path / "mfu.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([*launch, str(SCRIPT), "--smoke", "--device", "cpu", "--json", str(out),
                           *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tokens/s" in done.stdout
    return json.loads(out.read_text())


def test_smoke_one_process(tmp_path, monkeypatch, capsys):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    load_bench().main(["--smoke", "--device", "cpu", "--json", str(tmp_path / "mfu.json")])
    assert "tokens/s" in capsys.readouterr().out
    result = json.loads((tmp_path / "mfu.json").read_text())
    assert result["world_size"] == 1 and result["tokens_per_second"] > 0
    assert result["mfu"] is None  # no peak known for a CPU
    # SMOKE: 2 layers, hidden 64, 4 heads x 16 (q 64, kv 32), intermediate 128, vocab 256.
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    assert result["flops_per_token"] == 6 * (2 * per_layer + 256 * 64) + 12 * 2 * 4 * 16 * 32
    assert result["final_loss"] < 6.0  # ln(256) = 5.55 at random: the model trained sanely


def test_smoke_two_processes_fsdp_muon_checkpointing(tmp_path):
    result = run_torchrun(tmp_path, "--optimizer", "muon", "--activation-checkpointing",
                          "--peak-tflops", "1.0")
    assert result["world_size"] == 2 and result["activation_checkpointing"]
    assert result["mfu"] == result["achieved_tflops"] / 2.0  # peak 1 TFLOP/s x 2 ranks


def test_flop_count_matches_the_qwen3_0_6b_model_and_the_peak_table():
    bench = load_bench()
    with torch.device("meta"):
        model = CausalLM(ModelConfig(**bench.QWEN3_0_6B))
    matmul = sum(p.numel() for p in model.parameters() if p.ndim == 2)  # tied head once
    assert 590e6 < model.num_parameters() < 600e6  # Qwen3-0.6B: 596M with tied embeddings
    assert bench.flops_per_token(model.config, 2048) == 6 * matmul + 12 * 28 * 16 * 128 * 2048
    assert bench.peak_tflops("NVIDIA H200") == 989.4
    assert bench.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert bench.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert bench.peak_tflops("cpu") is None


def test_smoke_with_the_transformers_peer_on_the_same_shape(tmp_path, monkeypatch, capsys):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    load_bench().main(["--smoke", "--device", "cpu", "--peer", "transformers",
                       "--json", str(tmp_path / "mfu.json")])
    assert "Qwen3ForCausalLM" in capsys.readouterr().out
    result = json.loads((tmp_path / "mfu.json").read_text())
    peer = result["peer"]
    # the same architecture: transformers counts the parameters astrai counts
    assert peer["parameters"] == result["parameters"]
    assert peer["tokens_per_second"] > 0 and peer["mfu"] is None
    assert peer["final_loss"] < 6.0  # ln(256) = 5.55 at random: the peer trained sanely
    assert result["time_ratio"] == result["step_seconds"] / peer["step_seconds"]


def test_the_qwen3_4b_shape_has_qwen3_4b_parameters():
    bench = load_bench()
    with torch.device("meta"):
        model = CausalLM(ModelConfig(**bench.QWEN3_4B))
    assert 4.0e9 < model.num_parameters() < 4.03e9  # Qwen3-4B: 4.02B with tied embeddings
