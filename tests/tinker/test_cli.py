"""`astrai tinker` on the command line: light to load, one clear line per mistake."""

from __future__ import annotations

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
