"""Whether the Hugging Face hub can be reached, asked once and quickly.

Without a network, ``huggingface_hub`` retries each request with back-off (tens of
seconds of "Retrying in 8s" lines) before it gives up; astrai probes the hub endpoint
first (one TCP connection, :data:`PROBE_SECONDS`) and, when it does not answer, reads
the local cache only, as ``HF_HUB_OFFLINE=1`` would.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

PROBE_SECONDS = 2.0
_TRUE = {"1", "ON", "YES", "TRUE"}


def offline_by_environment() -> bool:
    """``HF_HUB_OFFLINE`` as set now (huggingface_hub reads it once, at its import)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE")
    if value is None:
        return bool(constants.HF_HUB_OFFLINE)
    return value.strip().upper() in _TRUE


def hub_reachable() -> bool:
    """True when the hub endpoint (``HF_ENDPOINT``, default huggingface.co) accepts a TCP
    connection within :data:`PROBE_SECONDS`."""
    parts = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), PROBE_SECONDS).close()
    except OSError:
        return False
    return True


@contextmanager
def offline_unless_reachable() -> Iterator[str | None]:
    """Inside the block, hub reads are offline when ``HF_HUB_OFFLINE`` says so or the hub
    does not answer; yields why they are offline ("HF_HUB_OFFLINE=1", "the hub was
    unreachable"), or None when they go to the hub."""
    if offline_by_environment():
        yield "HF_HUB_OFFLINE=1"
        return
    if hub_reachable():
        yield None
        return
    from huggingface_hub import constants

    modules = [constants]
    try:
        import datasets.config

        modules.append(datasets.config)
    except ImportError:  # pragma: no cover - a core dependency
        pass
    saved = [module.HF_HUB_OFFLINE for module in modules]
    for module in modules:
        module.HF_HUB_OFFLINE = True
    try:
        yield "the hub was unreachable"
    finally:
        for module, value in zip(modules, saved):
            module.HF_HUB_OFFLINE = value
