"""Wait for a server a benchmark started as a subprocess to answer its health check."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_until_ready(process: subprocess.Popen, health_url: str, name: str, *,
                     log: Path | None = None, timeout: float = 300) -> None:
    """Return once ``health_url`` answers 200; exit with ``name`` (and ``log``'s tail) if not."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = f":\n{log.read_text()[-3000:]}" if log is not None else ""
            raise SystemExit(f"{name} exited during startup{tail}")
        try:
            if httpx.get(health_url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise SystemExit(f"{name} did not start")
