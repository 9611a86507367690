"""The CPU backend: always available; distributed runs use gloo."""

from __future__ import annotations

import os

from astrai_core.devices.base import DeviceBackend


class CpuBackend(DeviceBackend):
    name = "cpu"
    type = "cpu"
    dist_backend = "gloo"

    def available_memory(self) -> int | None:
        # MemAvailable: what the kernel can give without swapping (page cache included)
        try:
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    def memory_stats(self) -> dict[str, float]:
        # Resident set size of this process: the closest CPU analogue of "allocated".
        try:
            with open(f"/proc/{os.getpid()}/statm") as statm:
                resident_pages = int(statm.read().split()[1])
            return {"rss_bytes": float(resident_pages * os.sysconf("SC_PAGE_SIZE"))}
        except (OSError, ValueError, IndexError):
            return {}
