"""`astrai tinker` on the command line: light to load, one clear line per mistake."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from astrai_core.cli.serve import PORT_IN_USE_EXIT
from astrai_core.testing import run_astrai


def _errors(result) -> list[str]:
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_help_stays_light():
    result = run_astrai("tinker", "--help")
    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout and "--state-dir" in result.stdout and "--api-key" in result.stdout
    assert result.stderr.strip().endswith("TORCH_NOT_IMPORTED")


@pytest.mark.parametrize(("spec", "message"), [
    ("no-equals-sign", "error: --model 'no-equals-sign': expected NAME=PATH, e.g. Qwen/Qwen3-8B=./qwen3-8b"),
    ("=./x", "error: --model '=./x': expected NAME=PATH, e.g. Qwen/Qwen3-8B=./qwen3-8b"),
])
def test_a_bad_model_spec_is_one_line(spec, message):
    assert _errors(run_astrai("tinker", "--model", spec, "--port", "1")) == [message]


def test_a_missing_model_path_is_named(tmp_path):
    missing = tmp_path / "nope"
    assert _errors(run_astrai("tinker", "--model", f"tiny={missing}", "--port", "1")) == [
        f"error: --model tiny={missing}: {missing} does not exist"]


def test_a_reachable_host_needs_a_key_and_keys_look_like_the_sdks(tmp_path, monkeypatch):
    monkeypatch.delenv("ASTRAI_TINKER_API_KEY", raising=False)
    errors = _errors(run_astrai("tinker", "--model", f"tiny={tmp_path}", "--host", "0.0.0.0", "--port", "1"))
    assert errors == ["error: --host 0.0.0.0 is reachable from other machines: set --api-key "
                      "(or $ASTRAI_TINKER_API_KEY), or bind 127.0.0.1"]
    errors = _errors(run_astrai("tinker", "--model", f"tiny={tmp_path}", "--api-key", "secret", "--port", "1"))
    assert errors == ["error: --api-key must start with 'tml-' (the Tinker SDK refuses other keys)"]


def test_a_busy_port_is_one_line_and_its_own_exit_status(tmp_path):
    pytest.importorskip("fastapi")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_astrai("tinker", "--model", f"tiny={tmp_path}", "--port", str(port),
                            "--state-dir", str(tmp_path / "state"))
    assert result.returncode == PORT_IN_USE_EXIT, result.stderr
    assert _errors(result) == [f"error: --port {port}: cannot listen on 127.0.0.1:{port} (Address "
                               "already in use); pick another --port"]
    assert not (tmp_path / "state").exists()  # nothing written before the server could start


def test_the_vllm_sampler_without_vllm_is_one_line(tmp_path):
    pytest.importorskip("fastapi")
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_astrai("tinker", "--model", f"tiny={tmp_path}", "--sampler", "vllm",
                        "--port", str(port), "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 2
    [error] = _errors(result)
    assert error.startswith("error: unknown sampler 'vllm'") and "pip install vllm" in error
    assert not (tmp_path / "state").exists()  # refused before any model loads


def test_the_vllm_sampler_serves_from_one_process(tmp_path):
    pytest.importorskip("fastapi")
    result = run_astrai("tinker", "--model", f"tiny={tmp_path}", "--sampler", "vllm",
                        "--nproc-per-node", "2", "--port", "1")
    assert result.returncode == 2
    assert _errors(result) == ["error: --sampler vllm serves from one process; leave out "
                               "--nproc-per-node or use --sampler torch"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--sampler-option", "no-equals"], "error: --sampler-option 'no-equals': expected "
                                        "KEY=VALUE, e.g. gpu_memory_utilization=0.4"),
    (["--sampler-option", "enforce_eager=true"],
     "error: --sampler-option: the torch sampler takes no engine options"),
])
def test_sampler_options_are_checked(tmp_path, extra, message):
    assert _errors(run_astrai("tinker", "--model", f"tiny={tmp_path}", "--port", "1",
                              *extra)) == [message]


def test_the_command_serves_the_sdk_on_a_tiny_model(hf_dir, tmp_path):
    """``astrai tinker`` as a user starts it: the SDK creates a client, takes a step, samples."""
    import subprocess
    import sys
    import time

    tinker = pytest.importorskip("tinker")
    pytest.importorskip("fastapi")
    from tinker import types

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "astrai_core.cli.main", "tinker", "--model",
                               f"tiny/llama={hf_dir}", "--port", str(port), "--api-key", "tml-k",
                               "--state-dir", str(tmp_path / "state"), "--device", "cpu"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()
                time.sleep(0.2)
        service = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key="tml-k")
        trainer = service.create_lora_training_client(base_model="tiny/llama", rank=2).result()
        row = types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5]),
                          loss_fn_inputs={"target_tokens": [4, 5, 6], "weights": [1.0, 1.0, 1.0]})
        assert trainer.forward_backward([row], "cross_entropy").result().metrics["loss:sum"] > 0
        trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        sampler = trainer.save_weights_and_get_sampling_client().result()
        sample = sampler.sample(types.ModelInput.from_ints([3, 4]), 1, types.SamplingParams(max_tokens=3)).result()
        assert len(sample.sequences[0].tokens) <= 3 and (tmp_path / "state").is_dir()
        service.close("success").result()
    finally:
        server.terminate()
        server.wait(30)
