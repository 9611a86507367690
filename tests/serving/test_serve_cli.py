"""`astrai serve` on the command line: registered without heavy imports, clear errors."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

from astrai_core.testing import run_astrai


def test_serve_help_stays_light():
    result = run_astrai("serve", "--help")
    assert result.returncode == 0, result.stderr
    assert "--served-model-name" in result.stdout and "--tool-call-parser" in result.stdout
    assert result.stderr.strip().endswith("TORCH_NOT_IMPORTED")


def test_list_plugins_does_not_import_the_server():
    result = run_astrai("list-plugins")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().endswith("TORCH_NOT_IMPORTED")


def test_missing_model_dir_is_one_clear_error(tmp_path):
    result = run_astrai("serve", str(tmp_path / "nope"), "--port", "1")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "nope" in result.stderr


def test_unknown_sampler_lists_the_available_ones(random_checkpoint):
    result = run_astrai("serve", str(random_checkpoint), "--sampler", "nosuch", "--port", "1")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "torch" in result.stderr


def test_a_registry_sampler_other_than_torch_goes_through_the_adapter(random_checkpoint):
    """The --sampler vllm path, with a stand-in sampler registered in-process under another name."""
    import types

    from astrai_core import SamplerSpec, hookimpl
    from astrai_core.cli.serve import build_engine
    from astrai_core.plugins import load_plugins, register, unregister
    from astrai_core.serving.engine import BatchingEngine
    from astrai_core.serving.sampler_engine import SamplerEngine

    module = types.ModuleType("stand_in_sampler_plugin")

    @hookimpl
    def astrai_samplers():
        return [SamplerSpec(name="stand_in", target="astrai_core.sampling.torch_sampler:TorchSampler",
                            summary="the torch sampler under another name")]

    module.astrai_samplers = astrai_samplers
    register(module)
    try:
        registry = load_plugins()
        adapter = build_engine(registry, "stand_in", random_checkpoint, "cpu", 8)
        native = build_engine(registry, "torch", random_checkpoint, "cpu", 8)
    finally:
        unregister(module)
    try:
        assert isinstance(adapter, SamplerEngine) and isinstance(native, BatchingEngine)
        assert adapter.max_context == native.max_context == 1024
    finally:
        adapter.close()
        native.close()


def test_a_transformers_backend_checkpoint_is_served(tmp_path):
    """A checkpoint of a family without a native importer answers the OpenAI chat API
    (the torch sampler behind the generic engine)."""
    from astrai_core.checkpoints.hf_model import load_transformers_model, write_backend_record
    from astrai_core.checkpoints.manifest import write_manifest
    from astrai_core.serving.sampler_engine import SamplerEngine
    from astrai_core.testing.hf_models import write_hf_model_dir
    from astrai_core.testing.serving import live_server

    directory = write_hf_model_dir(tmp_path / "olmo2", "olmo2")
    write_backend_record(load_transformers_model(directory), directory)
    write_manifest(directory)  # a checkpoint as a run writes it
    with live_server(directory) as live:
        assert isinstance(live.engine, SamplerEngine)
        reply = live.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "1+2="}], max_tokens=4,
            temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens >= 1


def test_the_limit_options_are_listed_and_checked(tmp_path):
    help_text = run_astrai("serve", "--help").stdout
    for flag in ("--max-body-mb", "--max-connections", "--header-timeout", "--body-timeout",
                 "--keep-alive-timeout", "--graceful-shutdown-timeout"):
        assert flag in help_text
    for flag, value in (("--max-body-mb", "0"), ("--header-timeout", "-1"), ("--max-connections", "0")):
        result = run_astrai("serve", str(tmp_path), flag, value, "--port", "1")
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert flag in result.stderr, result.stderr


def test_the_options_become_the_servers_limits():
    import argparse

    from astrai_core.cli.serve import add_arguments, serve_limits
    from astrai_core.serving.limits import ServeLimits

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert serve_limits(parser.parse_args(["m"])) == ServeLimits()  # the defaults agree
    limits = serve_limits(parser.parse_args(["m", "--max-body-mb", "0.5", "--header-timeout", "2",
                                             "--max-connections", "7", "--body-timeout", "3",
                                             "--keep-alive-timeout", "4", "--graceful-shutdown-timeout", "6"]))
    assert limits == ServeLimits(max_body_bytes=524288, header_timeout=2, max_connections=7, body_timeout=3,
                                 keep_alive_timeout=4, graceful_shutdown_timeout=6)


def test_astrai_serve_enforces_its_limits(random_checkpoint):
    """The real command on 127.0.0.1: a 2 KiB body over --max-body-mb is a 413, a client
    that never finishes its headers is closed after --header-timeout."""
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", "import sys; from astrai_core.cli.main import main; "
                               "main(sys.argv[1:])", "serve", str(random_checkpoint), "--port", str(port),
                               "--max-body-mb", "0.001", "--header-timeout", "1", "--threads", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "astrai serve did not start"
                time.sleep(0.2)
        response = httpx.post(f"{base}/v1/completions", content=b"{" + b" " * 2048 + b"}",
                              headers={"Content-Type": "application/json"})
        assert response.status_code == 413
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            started = time.perf_counter()
            assert slow.recv(4096).startswith(b"HTTP/1.1 408")
            assert 0.5 < time.perf_counter() - started < 5
    finally:
        server.terminate()
        server.wait(timeout=60)
