"""The sandbox's launcher: run as its own interpreter (``python -I -S sandbox_launch.py``).

Standard library only, and never imported by astrai: it is the first process of a
sandbox, started by :mod:`astrai_core.environments.sandbox` with one JSON argument and a
status pipe (its descriptor in the JSON). It isolates itself and then runs the program in three processes::

    launcher (P0)   joins the sandbox's cgroup where there is one (memory of all its
      |             processes together); unshare(net, mount, pid, ipc, uts); tmpfs over
      |             the world-writable directories; the work files into a private tmpfs
      +- init (P1)  pid 1 of the new pid namespace: mounts its /proc, reaps, and when the
          |         program exits, exits with its status: the kernel then kills every
          |         process left in the namespace
          +- program (P2)  rlimits, then setgid/setuid to the sandbox user, then exec

Each step that the kernel refuses is skipped and reported on the status pipe (one JSON
object per line), so the host knows what isolation held. Doing this in a fresh process,
not in a ``preexec_fn``, keeps it away from the host's threads (``fork`` in a threaded
process may deadlock in the child).
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 0x1000, 0x4000, 1 << 18
MASKED = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
STATUS_FD = -1  # the status pipe's descriptor, from the config

_libc = ctypes.CDLL(None, use_errno=True)


def report(**facts):
    """One line of facts on the status pipe (ignored when the host stopped reading)."""
    try:
        os.write(STATUS_FD, (json.dumps(facts) + "\n").encode())
    except OSError:
        pass


def unshare(flags):
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def mount(source, target, fstype, flags, data):
    result = _libc.mount(source and source.encode(), target.encode(),
                         fstype and fstype.encode(), ctypes.c_ulong(flags),
                         data and data.encode())
    if result != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}: {os.strerror(ctypes.get_errno())}")


def enter_namespaces(config):
    """Unshare what the kernel allows; without root, first a user namespace mapping our
    own uid (an unprivileged process may create one where the kernel permits it)."""
    done = []
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        try:
            unshare(CLONE_NEWUSER)
            for path, text in (("/proc/self/setgroups", "deny"),
                               ("/proc/self/uid_map", f"{uid} {uid} 1"),
                               ("/proc/self/gid_map", f"{gid} {gid} 1")):
                with open(path, "w") as handle:
                    handle.write(text)
            done.append("user")
        except OSError:
            pass
    wanted = [("net", CLONE_NEWNET, config["network"] == "none"), ("mount", CLONE_NEWNS, True),
              ("pid", CLONE_NEWPID, True), ("ipc", CLONE_NEWIPC, True), ("uts", CLONE_NEWUTS, True)]
    for name, flag, wanted_here in wanted:
        if not wanted_here:
            continue
        try:
            unshare(flag)
            done.append(name)
        except OSError:
            pass
    return done


def private_filesystem(config, files, masked):
    """tmpfs over every world-writable directory, then the work directory in a tmpfs of
    its own size. Appends each masked directory to ``masked`` as it is mounted, so the
    report is true even when a later step fails. The interpreter's directories that a
    mask would hide (a venv under /tmp) are bound back at their own paths."""
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    options = f"size={config['disk_bytes']},mode=1777"
    for directory in MASKED:
        if os.path.isdir(directory) and not os.path.islink(directory):
            hidden = [path for path in config["expose"]
                      if path == directory or path.startswith(directory + "/")]
            handles = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in hidden}
            mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, options)
            masked.append(directory)
            bind_back(handles)
    workdir = config["workdir"]
    os.makedirs(workdir, exist_ok=True)
    if not any(workdir.startswith(directory + "/") for directory in masked):
        mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for name, data in files.items():
        with open(os.path.join(workdir, name), "wb") as handle:
            handle.write(data)
    if config["uid"] is not None:
        expose(config["expose"])


def bind_back(handles):
    """Bind each directory (``{path: O_PATH descriptor}``, opened before a tmpfs hid it)
    back at its path; the directories above it are created in the tmpfs, open to all."""
    for path, handle in handles.items():
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{handle}", path, None, MS_BIND | MS_REC, None)
        os.close(handle)


def _closed_ancestor(path):
    """The topmost directory above ``path`` that others may not enter, or None."""
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        directory = "/" + "/".join(parts[:depth])
        if not os.stat(directory).st_mode & 0o001:
            return directory
    return None


def expose(paths):
    """Make the interpreter's directories reachable by the sandbox user when they sit under
    a directory it may not enter (a Python under /root): a tmpfs hides that directory's
    other contents and the needed directories are bound back at their own paths."""
    closed = {}
    for path in paths:
        ancestor = _closed_ancestor(path)
        if ancestor is not None:
            closed.setdefault(ancestor, []).append(path)
    for ancestor, inside in closed.items():
        handles = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in inside}
        mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        bind_back(handles)


def read_files(workdir):
    """The work directory's files (the program and its data), read before it is hidden."""
    files = {}
    for name in os.listdir(workdir):
        with open(os.path.join(workdir, name), "rb") as handle:
            files[name] = handle.read()
    return files


def own_workdir(config):
    """The work directory and its files belong to the sandbox user: its only writable place."""
    uid, gid = config["uid"], config["gid"]
    if uid is None or os.geteuid() != 0:
        return
    workdir = config["workdir"]
    os.chown(workdir, uid, gid)
    os.chmod(workdir, 0o700)
    for name in os.listdir(workdir):
        os.chown(os.path.join(workdir, name), uid, gid)


def set_limits(config):
    cpu = config["cpu_seconds"]
    limits = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_CORE, 0, 0),
              (resource.RLIMIT_FSIZE, config["file_bytes"], config["file_bytes"]),
              (resource.RLIMIT_NOFILE, config["open_files"], config["open_files"]),
              (resource.RLIMIT_NPROC, config["processes"], config["processes"])]
    if config["memory_bytes"]:
        limits.append((resource.RLIMIT_AS, config["memory_bytes"], config["memory_bytes"]))
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, hard))


def become_program(config):
    """In P2: limits, the sandbox user, the work directory, then exec the program."""
    os.chdir(config["workdir"])
    set_limits(config)
    dropped = False
    if config["uid"] is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(config["gid"])
        os.setuid(config["uid"])
        dropped = True
    report(uid=os.getuid(), dropped=dropped)
    argv = list(config["argv"])
    if not os.access(argv[0], os.X_OK):
        usable = [path for path in config["fallbacks"] if os.access(path, os.X_OK)]
        if not usable:
            raise OSError(f"the sandbox user (uid {os.getuid()}) cannot run {argv[0]}: set "
                          "the sandbox's `python` to an interpreter it may read")
        argv[0] = usable[0]
    report(python=argv[0])
    if "user_drop" in config["require"] and not dropped:
        raise OSError("required isolation missing: user_drop (not running as root)")
    os.close(STATUS_FD)
    os.execve(argv[0], argv, config["env"])


def run_init(config, pid_namespace):
    """P1: pid 1 of the namespace when there is one. Runs the program as its child, reaps
    every orphan, and exits with the program's status once it is gone."""
    if pid_namespace:
        try:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        except OSError:
            pass
    program = os.fork()
    if program == 0:
        try:
            become_program(config)
        except BaseException as exc:  # noqa: BLE001 - reported, then a distinct exit
            report(setup_error=str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}")
            os._exit(127)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(127)
        if pid == program:
            report(wait_status=status)
            os._exit(os.waitstatus_to_exitcode(status) % 256)


def join_cgroup(path):
    """Move this process (and so everything it starts) into the sandbox's cgroup, which
    limits their memory together; reported, and skipped when refused."""
    if not path:
        return
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
        report(cgroup=True)
    except OSError as exc:
        report(cgroup_error=str(exc))


def main():
    global STATUS_FD
    config = json.loads(sys.argv[1])
    STATUS_FD = config["status_fd"]
    join_cgroup(config.get("cgroup"))
    files = read_files(config["workdir"])
    namespaces = enter_namespaces(config)
    masked = []
    if "mount" in namespaces:
        try:
            private_filesystem(config, files, masked)
        except OSError as exc:
            report(mount_error=str(exc))
    own_workdir(config)
    report(namespaces=namespaces, masked=masked)
    held = {"net": "net" in namespaces, "mount": bool(masked), "pid": "pid" in namespaces}
    missing = [part for part in config["require"] if held.get(part) is False]
    if missing:
        report(setup_error=f"required isolation missing: {', '.join(missing)} (the kernel "
               "refused the namespace)")
        os._exit(126)
    # the host kills our process group on timeout; SIGTERM from it must not be ignored
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    init = os.fork()
    if init == 0:
        run_init(config, "pid" in namespaces)
    os.close(STATUS_FD)
    _, status = os.waitpid(init, 0)
    os._exit(os.waitstatus_to_exitcode(status) % 256)


if __name__ == "__main__":
    main()
