"""What a run listens on (:mod:`astrai_core.testing.net`), and a client that tries it
from another address of this machine: a private network namespace joined to this one by
a veth pair (addresses the test creates itself and removes after), or else this
machine's own non-loopback address."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from astrai_core.testing.net import Listener, listeners, process_tree

__all__ = ["Listener", "Prober", "listeners", "process_tree", "remote_prober"]


@dataclass(frozen=True)
class Prober:
    """Connects to ``target:port`` from an address other than loopback; ``namespace``:
    the network namespace the client runs in (None: this one); ``interface``: this
    machine's interface that holds ``target``."""

    target: str
    namespace: str | None
    interface: str | None

    def connects(self, port: int) -> bool:
        """Whether a TCP connection to ``port`` is accepted (2 s at most; one attempt)."""
        code = ("import socket, sys\n"
                "try:\n"
                f"    socket.create_connection(({self.target!r}, {port}), timeout=2).close()\n"
                "except OSError:\n"
                "    sys.exit(1)\n")
        prefix = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True,
                              timeout=30).returncode == 0


def _ip(*args: str) -> bool:
    return subprocess.run(["ip", *args], capture_output=True, timeout=30).returncode == 0


@contextlib.contextmanager
def _veth_namespace() -> Iterator[Prober | None]:
    """A namespace ``astrai-probe-<pid>`` with 10.231.<x>.2/30, joined by a veth pair to
    10.231.<x>.1/30 here; None when ``ip netns`` cannot make one (no privilege)."""
    name, link = f"astrai-probe-{os.getpid()}", f"ap{os.getpid() % 100000}"
    octet = os.getpid() % 250 + 1
    host, peer = f"10.231.{octet}.1", f"10.231.{octet}.2"
    made = shutil.which("ip") is not None and _ip("netns", "add", name)
    try:
        made = made and all((
            _ip("link", "add", f"{link}a", "type", "veth", "peer", "name", f"{link}b"),
            _ip("link", "set", f"{link}b", "netns", name),
            _ip("addr", "add", f"{host}/30", "dev", f"{link}a"),
            _ip("link", "set", f"{link}a", "up"),
            _ip("netns", "exec", name, "ip", "addr", "add", f"{peer}/30", "dev", f"{link}b"),
            _ip("netns", "exec", name, "ip", "link", "set", f"{link}b", "up")))
        yield Prober(host, name, f"{link}a") if made else None
    finally:
        _ip("link", "del", f"{link}a")  # removes its peer too
        _ip("netns", "del", name)


def _own_address() -> str | None:
    """This machine's first non-loopback IPv4 address (``hostname -I``), if it has one."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                             timeout=10).stdout.split()
        for word in out:
            with contextlib.suppress(ValueError):
                if isinstance(ipaddress.ip_address(word), ipaddress.IPv4Address) \
                        and not ipaddress.ip_address(word).is_loopback:
                    return word
    return None


@contextlib.contextmanager
def remote_prober() -> Iterator[Prober | None]:
    """A client on another address: a private namespace when this process may make one,
    else this machine's own non-loopback address; None when neither exists."""
    with _veth_namespace() as prober:
        if prober is None:
            own = _own_address()
            prober = Prober(own, None, None) if own else None
        if prober is not None:  # the probe itself works: an any-address listener is reached
            with socket.create_server(("0.0.0.0", 0)) as control:
                assert prober.connects(control.getsockname()[1]), "the probe reaches nothing"
        yield prober
