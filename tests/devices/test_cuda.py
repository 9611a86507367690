"""The cuda device backend: what needs no GPU runs everywhere; the rest is `gpu`-marked
(skipped without CUDA) and compares CUDA results with CPU float32 references."""

from __future__ import annotations

import contextlib

import pytest
import torch

from astrai_core.plugins import load_plugins
from astrai_core.testing import run_astrai

HAS_CUDA = torch.cuda.is_available()


def test_cuda_backend_is_registered_with_an_availability_probe():
    from astrai_core.devices.cuda import CudaBackend, cuda_available

    spec = load_plugins().get("device_backend", "cuda")
    assert spec.load() is CudaBackend
    assert spec.is_available() is cuda_available() is HAS_CUDA
    backend = CudaBackend()
    assert (backend.type, backend.dist_backend) == ("cuda", "nccl")
    assert backend.device(1) == torch.device("cuda", 1)  # building a device needs no GPU
    assert isinstance(backend.autocast(None), contextlib.nullcontext)
    assert isinstance(backend.autocast(torch.float32), contextlib.nullcontext)


def test_auto_picks_cuda_only_where_it_is_available():
    from astrai_core.devices.select import resolve_device

    assert resolve_device(load_plugins(), "auto").name == ("cuda" if HAS_CUDA else "cpu")


@pytest.mark.skipif(HAS_CUDA, reason="checks the message shown on a machine without CUDA")
def test_cuda_run_without_a_gpu_fails_before_any_work(tmp_path):
    import yaml

    from astrai_core.testing import tiny_run_config, write_arith_prompts

    config = tiny_run_config(tmp_path, write_arith_prompts(tmp_path / "p.jsonl"), {"name": "grpo"})
    config["device"] = {"name": "cuda"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_astrai("train", str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: device 'cuda' is not available on this machine; available: cpu" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ on a real GPU

def _tiny_model(seed: int = 0):
    from astrai_core.model import CausalLM, ModelConfig

    torch.manual_seed(seed)
    model = CausalLM(ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                                 num_layers=2, num_heads=4, num_kv_heads=2,
                                 max_position_embeddings=128))
    model.reset_parameters(std=0.3)  # peaked distributions, as in a trained model
    return model.eval()


@pytest.mark.gpu
def test_cuda_logits_equal_cpu_logits():
    model = _tiny_model()
    ids = torch.randint(0, 96, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids)["logits"]
        on_gpu = model.to("cuda")(ids.to("cuda"))["logits"].cpu()
        bf16 = model.to(torch.bfloat16)(ids.to("cuda"))["logits"].float().cpu()
    torch.testing.assert_close(on_gpu, expected, rtol=1e-4, atol=1e-4)
    scale = expected.abs().max()
    assert (bf16 - expected).abs().max() <= 8 * 2 ** -8 * scale  # within bf16 rounding
    assert (bf16 - expected).abs().max() > 0                     # and really bf16


@pytest.mark.gpu
def test_torch_sampler_logprobs_on_cuda_equal_a_cpu_float32_forward():
    from astrai_core.sampling import SamplingParams

    model = _tiny_model(1)
    sampler = load_plugins().get("sampler", "torch").load()(model=model.to("cuda"))
    prompts = [[5, 9, 12], [7, 3], [1, 2, 3, 4, 5, 6, 7]]
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=8, top_p=0.9, seed=3, n=2)
    completions = sampler.generate(prompts, params)
    cpu_model = model.to("cpu")
    for completion in completions:
        prompt = prompts[completion.prompt_index]
        with torch.no_grad():
            logits = cpu_model(torch.tensor([prompt + completion.token_ids]))["logits"][0]
        logp = torch.log_softmax(logits[len(prompt) - 1:-1].double() / 0.7, dim=-1)
        expected = logp.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(completion.logprobs, dtype=torch.float64),
                                   expected, rtol=0, atol=1e-4)


@pytest.mark.gpu
def test_bf16_training_step_on_cuda_matches_cpu_float32(tmp_path):
    from tests.training.reference import (checkpoint_weights, run, save_start_model,
                                          text_run_config, write_texts)

    start = save_start_model(tmp_path / "start")
    data = write_texts(tmp_path / "docs.jsonl")
    cpu = run(tmp_path, text_run_config(tmp_path, data, start, out="cpu", max_steps=2), "cpu.yaml")
    gpu_config = text_run_config(tmp_path, data, start, out="gpu", max_steps=2,
                                 mixed_precision="bf16")
    gpu_config["device"] = {"name": "cuda"}
    gpu = run(tmp_path, gpu_config, "gpu.yaml")
    assert gpu[0]["loss"] == pytest.approx(cpu[0]["loss"], rel=2e-2)
    assert gpu[0]["grad_norm"] == pytest.approx(cpu[0]["grad_norm"], rel=1e-1)
    assert gpu[0]["loss"] != cpu[0]["loss"]  # autocast ran in bf16
    trained, reference = checkpoint_weights(tmp_path / "gpu", 2), checkpoint_weights(tmp_path / "cpu", 2)
    for name, tensor in trained.items():
        assert tensor.dtype == torch.float32 and torch.isfinite(tensor).all(), name
        # one AdamW step moves a weight by about lr: the runs took the same steps
        assert (tensor - reference[name]).abs().max() < 1e-2, name


def test_gpu_tests_are_skipped_exactly_where_cuda_is_missing(request):
    """The root conftest.py skips `@pytest.mark.gpu` tests without CUDA, in every test tree."""
    gpu_items = [item for item in request.session.items if item.get_closest_marker("gpu")]
    assert any(item.module.__name__.endswith("test_cuda") for item in gpu_items)
    for item in gpu_items:
        skipped = any(mark.name == "skip" for mark in item.iter_markers())
        assert skipped is not HAS_CUDA, item.nodeid
