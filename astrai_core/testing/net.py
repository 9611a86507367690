"""What a group of processes listens on, read from the kernel's socket table: every TCP
socket of theirs in the listening state (matched by inode from ``/proc/<pid>/fd`` to
``/proc/net/tcp`` and ``tcp6``), with the address it is bound to. Linux only."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


@dataclass(frozen=True)
class Listener:
    pid: int
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def loopback(self) -> bool:
        address = self.address
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return address.is_loopback


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it (a launcher, its agent and its workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
    return inodes


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in the host's (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listeners(pids: list[int]) -> list[Listener]:
    """Every TCP socket of ``pids`` in the listening state, with the address it is bound to."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in owner:
                host, port = fields[1].split(":")
                found.append(Listener(owner[fields[9]], _address(host), int(port, 16)))
    return found
