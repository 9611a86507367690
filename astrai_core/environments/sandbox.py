"""Run untrusted code in a separate, limited process: the ``python`` tool and ``code_tests``.

``Sandbox(SandboxConfig(...)).run_python(code, stdin="")`` runs ``code`` with a fresh
interpreter in a fresh temporary directory and returns a :class:`SandboxResult` (stdout,
stderr, exit status, why it stopped). What holds, checked at run time and reported in
``result.isolation``:

- **time**: a wall-clock limit (the host kills the whole sandbox) and a CPU limit
  (``RLIMIT_CPU``, per process);
- **memory, files, output**: ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``; stdout
  and stderr beyond ``max_output_bytes`` stop the program (``output_limit``); memory for
  the sandbox and all its processes together where a cgroup v2 can be made
  (:mod:`.sandbox_cgroup`), else per process only (``isolation["memory"]``);
- **processes**: as root the program runs as a sandbox user of its own (uid
  from ``uid_base`` on, one per sandbox running at once on the machine), so
  ``RLIMIT_NPROC`` bounds its processes (a fork bomb meets ``EAGAIN``); a new pid
  namespace, whose init exits with the program, kills every process it left, and the
  host kills the process group at the end in any case;
- **network**: a new network namespace (no interface but a loopback that is down);
- **filesystem**: a new mount namespace with a tmpfs over ``/tmp``, ``/var/tmp``,
  ``/dev/shm`` and ``/run/lock``, the work directory in that tmpfs and owned by the
  sandbox user: everything else is root's and not writable by it.

Where the kernel refuses a namespace (an unprivileged container), the step is skipped
and ``isolation`` says so; ``require`` lists the parts a run refuses to go without.
The launcher is a separate interpreter (:mod:`.sandbox_launch`), so nothing here forks
the host process with its threads, and a waiting sandbox holds no GIL: many run at once
from a thread pool (:func:`run_many`).
"""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from astrai_core.environments import sandbox_cgroup
from astrai_core.errors import AstraiError

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launch.py")
ISOLATION_PARTS = ("net", "mount", "pid", "user_drop")
_MiB = 1 << 20
FALLBACK_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")


class SandboxError(AstraiError):
    """The sandbox could not run at all, or lacks an isolation part it requires."""


class SandboxConfig(BaseModel):
    """Limits of one sandboxed run (the ``python`` tool's and ``code_tests``' options)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float = Field(2.0, gt=0, description="wall-clock seconds before the sandbox is killed")
    cpu_seconds: int = Field(2, ge=1, description="CPU seconds per process (RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=0, description="address space per process, MiB (0: no limit)")
    max_output_bytes: int = Field(65_536, ge=1, description="stdout + stderr kept; beyond it "
                                  "the program is stopped")
    file_mb: int = Field(16, ge=1, description="largest file the program may write, MiB")
    disk_mb: int = Field(64, ge=1, description="size of each private tmpfs (work directory, "
                         "/tmp, ...), MiB")
    open_files: int = Field(64, ge=8, description="open file descriptors (RLIMIT_NOFILE)")
    processes: int = Field(16, ge=1, description="processes and threads of the sandbox user "
                           "(RLIMIT_NPROC; applies when the user is dropped)")
    network: Literal["none", "host"] = Field("none", description="none: a new network namespace")
    uid_base: int = Field(64000, ge=1, description="first uid of the sandbox users (as root)")
    python: str | None = Field(None, description="the interpreter that runs the code (default: "
                               "this one, or the system's python3 when the sandbox user "
                               "cannot reach this one)")
    require: tuple[Literal["net", "mount", "pid", "user_drop"], ...] = Field(
        (), description="isolation parts without which a run is refused (default: run with "
        "what the kernel allows and report it)")


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run produced. ``status``: ``ok`` (exit 0), ``error`` (another exit
    or a signal), ``timeout``, ``output_limit``."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def summary(self, max_chars: int = 2000) -> str:
        """stdout, stderr and the exit status as one text, each part cut to fit."""
        head = {"ok": "exit status 0", "error": f"exit status {self.exit_code}",
                "timeout": f"killed: over the time limit ({self.seconds:.1f} s)",
                "output_limit": "killed: over the output limit"}[self.status]
        budget = max(0, (max_chars - len(head) - 40) // 2)
        parts = [head]
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text:
                cut = text if len(text) <= budget else text[:budget] + f"\n...[{len(text) - budget} more chars]"
                parts.append(f"{name}:\n{cut}")
        return "\n".join(parts)


class _UidSlots:
    """One sandbox user per sandbox running at once on this machine, so that each one's
    RLIMIT_NPROC counts its own processes only (the limit counts every process of a uid)
    and killing a uid's processes kills one sandbox's. In this process a set under a lock
    keeps the uids apart; across processes (two ranks of a run) an ``flock`` on a file
    per uid does, released by the kernel when its holder exits, even when killed."""

    LOCK_DIR = os.path.join(tempfile.gettempdir(), "astrai-sandbox-uids")
    MAX_SLOTS = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}   # uid -> its lock file's descriptor

    def take(self, uid_base: int) -> int:
        """A free uid from ``uid_base`` on, held until :meth:`give`."""
        with self._lock:
            os.makedirs(self.LOCK_DIR, mode=0o700, exist_ok=True)
            for uid in range(uid_base, uid_base + self.MAX_SLOTS):
                if uid in self._held:
                    continue
                fd = os.open(os.path.join(self.LOCK_DIR, str(uid)), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:   # another process's sandbox has it
                    os.close(fd)
                    continue
                self._held[uid] = fd
                return uid
        raise SandboxError(f"no free sandbox uid in {uid_base}..{uid_base + self.MAX_SLOTS - 1}")

    def give(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)   # closing the descriptor releases the flock


_SLOTS = _UidSlots()


class Sandbox:
    """Runs code under a :class:`SandboxConfig`; safe to share between threads."""

    def __init__(self, config: SandboxConfig | None = None, **options: Any) -> None:
        self.config = config or SandboxConfig(**options)

    def run_python(self, code: str, stdin: str = "", files: dict[str, str] | None = None
                   ) -> SandboxResult:
        """Run ``code`` as ``main.py`` with a fresh ``python -I``; ``files`` are written
        beside it (names without ``/``)."""
        return self.run(["{python}", "-I", "main.py"], {"main.py": code, **(files or {})}, stdin)

    def run(self, argv: Sequence[str], files: dict[str, str], stdin: str = "") -> SandboxResult:
        """Run ``argv`` (``{python}`` is the configured interpreter) in a work directory
        holding ``files``."""
        config = self.config
        workdir = tempfile.mkdtemp(prefix="astrai-sandbox-")
        uid = _SLOTS.take(config.uid_base) if os.geteuid() == 0 else None
        cgroup = sandbox_cgroup.create(config.memory_mb * _MiB)
        try:
            for name, text in files.items():
                if "/" in name or name.startswith("."):
                    raise SandboxError(f"sandbox file names are plain names, got {name!r}")
                with open(os.path.join(workdir, name), "w", encoding="utf-8") as handle:
                    handle.write(text)
            stdin_path = os.path.join(workdir, ".stdin")
            with open(stdin_path, "w", encoding="utf-8") as handle:
                handle.write(stdin)
            with open(stdin_path, "rb") as stdin_file:
                os.unlink(stdin_path)   # the program reads it through its fd only
                launch = {**_launch_config(config, workdir, uid, argv), "cgroup": cgroup}
                return _execute(launch, config, stdin_file)
        finally:
            if cgroup is not None:
                sandbox_cgroup.remove(cgroup)
            if uid is not None:
                _SLOTS.give(uid)
            shutil.rmtree(workdir, ignore_errors=True)


def _launch_config(config: SandboxConfig, workdir: str, uid: int | None, argv: Sequence[str]
                   ) -> dict[str, Any]:
    return {
        "workdir": workdir, "uid": uid, "gid": uid,
        "argv": [(config.python or sys.executable) if part == "{python}" else part
                 for part in argv],
        "fallbacks": [] if config.python else list(FALLBACK_PYTHONS),
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
                "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"},
        "network": config.network, "cpu_seconds": config.cpu_seconds,
        "memory_bytes": config.memory_mb * _MiB, "file_bytes": config.file_mb * _MiB,
        "disk_bytes": config.disk_mb * _MiB, "open_files": config.open_files,
        "processes": config.processes, "require": list(config.require),
        "expose": _interpreter_dirs(config.python or sys.executable),
    }


def _interpreter_dirs(python: str) -> list[str]:
    """The directories an interpreter needs: its own installation and, for a venv's
    interpreter, the venv (their real paths)."""
    real = os.path.realpath(python)
    dirs = {os.path.dirname(os.path.dirname(real))}
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        dirs |= {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    return sorted(dirs)


def _execute(launch: dict[str, Any], config: SandboxConfig, stdin_file: Any) -> SandboxResult:
    """Start the launcher, collect its output under the limits, kill its group at the end."""
    status_read, status_write = os.pipe()
    launch = {**launch, "status_fd": status_write}
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", LAUNCHER, json.dumps(launch)], stdin=stdin_file,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            pass_fds=(status_write,), env={})
    finally:
        os.close(status_write)
    try:
        stopped, out, err = _collect(process, start + config.timeout, config.max_output_bytes)
        facts = _read_status(status_read)
    finally:
        _kill_group(process)
        os.close(status_read)
    seconds = time.monotonic() - start
    isolation = _isolation(facts, launch)
    if isolation["user_drop"] and not isolation["pid"]:
        _kill_uid(launch["uid"])   # what left the process group, without a pid namespace
    wait_status = facts.get("wait_status")
    exit_code = None if wait_status is None else os.waitstatus_to_exitcode(wait_status)
    if stopped is None:
        stopped = "ok" if exit_code == 0 else "error"
    if "setup_error" in facts:
        raise SandboxError(f"the sandbox did not run the program: {facts['setup_error']}")
    return SandboxResult(stopped, exit_code, out.decode("utf-8", "replace"),
                         err.decode("utf-8", "replace"), seconds, isolation)


def _collect(process: subprocess.Popen, deadline: float, limit: int) -> tuple[str | None, bytes, bytes]:
    """Read stdout and stderr until the launcher exits (processes it left behind may hold
    the pipes open), the deadline passes or the output exceeds ``limit`` bytes. Returns
    (why it was stopped or None, stdout, stderr)."""
    buffers = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    pidfd = os.pidfd_open(process.pid)   # readable once the launcher exits
    try:
        with selectors.DefaultSelector() as selector:
            for fd in (*buffers, pidfd):
                selector.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout", *_cut(buffers, limit)
                events = selector.select(left)
                for key, _ in events:
                    if key.fd != pidfd:
                        _read_into(buffers, key.fd, selector)
                if sum(len(b) for b in buffers.values()) > limit:
                    return "output_limit", *_cut(buffers, limit)
                if any(key.fd == pidfd for key, _ in events):
                    for fd in list(buffers):   # what was written before the exit
                        os.set_blocking(fd, False)
                        while fd in selector.get_map() and _read_into(buffers, fd, selector):
                            pass
                    process.wait()
                    stopped = "output_limit" if sum(map(len, buffers.values())) > limit else None
                    return stopped, *_cut(buffers, limit)
    finally:
        os.close(pidfd)


def _read_into(buffers: dict[int, bytearray], fd: int, selector: selectors.BaseSelector) -> bool:
    """Read one chunk of ``fd`` into its buffer; False at its end or when nothing is there."""
    try:
        chunk = os.read(fd, 65_536)
    except BlockingIOError:
        return False
    if not chunk:
        selector.unregister(fd)
        return False
    buffers[fd] += chunk
    return True


def _cut(buffers: dict[int, bytearray], limit: int) -> tuple[bytes, bytes]:
    out, err = (bytes(buffer) for buffer in buffers.values())
    return out[:limit], err[:max(0, limit - min(len(out), limit))]


def _read_status(fd: int) -> dict[str, Any]:
    """The launcher's facts (JSON lines on the status pipe); what is there is read."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65_536):
            data += chunk
    except BlockingIOError:
        pass
    facts: dict[str, Any] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            facts.update(json.loads(line))
        except json.JSONDecodeError:
            continue
    return facts


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group (the program and what it started, unless they
    left the group; the pid namespace catches those) and reap the launcher."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    for stream in (process.stdout, process.stderr):
        stream.close()


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of the sandbox user (this sandbox's own uid slot)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                os.kill(int(entry), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            continue


def _isolation(facts: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    namespaces = facts.get("namespaces", [])
    return {"net": "net" in namespaces, "mount": bool(facts.get("masked")),
            "pid": "pid" in namespaces, "user_drop": bool(facts.get("dropped")),
            "memory": "sandbox" if facts.get("cgroup") else "per_process",
            "uid": facts.get("uid"), "network_policy": launch["network"],
            "python": facts.get("python")}


_T = TypeVar("_T")
_R = TypeVar("_R")


def run_many(function: Callable[[_T], _R], items: Iterable[_T], max_workers: int) -> list[_R]:
    """``[function(item) for item in items]`` on at most ``max_workers`` threads, in order.

    Threads suffice: each one waits on a sandbox process (the wait releases the GIL), so
    the host's own work goes on while the cases run in parallel processes.
    """
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items))),
                            thread_name_prefix="astrai-sandbox") as pool:
        return list(pool.map(function, items))
