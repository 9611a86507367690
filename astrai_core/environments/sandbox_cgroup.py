"""A memory limit for a sandbox and every process it starts together: a cgroup v2 of its own.

``RLIMIT_AS`` limits each process; six children of 400 MB each pass a 512 MiB limit
that way. Where this process's cgroup (v2) can give a child cgroup the memory controller,
each sandbox gets one with ``memory.max`` = ``memory_mb``, no swap, and
``memory.oom.group`` set (the kernel's OOM killer then stops the whole sandbox at once);
the launcher moves itself into it before it starts anything, so the code and all its
children are counted together (files in the sandbox's tmpfs count too). Where none can
be made (cgroup v1, a cgroup that was not delegated, not root), :func:`create` returns
None and memory stays limited per process; ``result.isolation["memory"]`` says which held.
"""

from __future__ import annotations

import errno
import os
import time
import uuid

_PREFIX = "astrai-sandbox-"


def _read(path: str) -> str:
    with open(path, encoding="ascii") as handle:
        return handle.read()


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


def own_cgroup() -> str | None:
    """The directory of this process's cgroup v2, or None (no unified hierarchy)."""
    try:
        lines = _read("/proc/self/cgroup").splitlines()
        mounts = _read("/proc/self/mountinfo").splitlines()
    except OSError:
        return None
    relative = next((line[3:] for line in lines if line.startswith("0::")), None)
    # mountinfo: "id parent major:minor root mount-point options ... - fstype source ..."
    points = [line.split()[4] for line in mounts
              if " - " in line and line.split(" - ", 1)[1].split()[0] == "cgroup2"]
    if relative is None or not points or relative.startswith("/.."):
        return None
    return os.path.join(points[0], relative.lstrip("/"))


def create(memory_bytes: int, parent: str | None = None) -> str | None:
    """A fresh cgroup under ``parent`` (default: this process's) limited to
    ``memory_bytes`` in all, or None where the kernel or the hierarchy allows none."""
    parent = parent or own_cgroup()
    if not memory_bytes or parent is None:
        return None
    try:
        if "memory" not in _read(os.path.join(parent, "cgroup.controllers")).split():
            return None
        control = os.path.join(parent, "cgroup.subtree_control")
        if "memory" not in _read(control).split():
            _write(control, "+memory")  # refused (EBUSY) where this cgroup holds processes
        path = os.path.join(parent, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.mkdir(path)
    except OSError:
        return None
    try:
        _write(os.path.join(path, "memory.max"), str(memory_bytes))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            if os.path.exists(os.path.join(path, name)):
                _write(os.path.join(path, name), value)
    except OSError:
        remove(path)
        return None
    return path


def remove(path: str) -> None:
    """Kill what is left in the cgroup and delete it (it empties within moments)."""
    kill = os.path.join(path, "cgroup.kill")
    try:
        if os.path.exists(kill):
            _write(kill, "1")
    except OSError:
        pass
    for _ in range(200):
        try:
            os.rmdir(path)
            return
        except OSError as error:
            if error.errno != errno.EBUSY:
                return
            time.sleep(0.01)
