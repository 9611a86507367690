"""`astrai serve` on a port another process holds: one error line naming --port and its
own exit status (4), before the model is loaded (the model directory here does not even
exist), instead of uvicorn's startup failure (status 3, the "loss diverged" status)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from astrai_core.cli.serve import PORT_IN_USE_EXIT


def test_a_busy_port_is_one_line_and_its_own_exit_status(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "astrai_core.cli.main", "serve", str(tmp_path / "no-model"),
             "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert PORT_IN_USE_EXIT == 4 and result.returncode == 4, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --port {port}: cannot listen on 127.0.0.1:{port} (Address "
                      "already in use); pick another --port"], result.stderr
    assert "Traceback" not in result.stderr and "no-model" not in result.stderr
