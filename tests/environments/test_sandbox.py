"""The sandbox contains what untrusted code does: time, memory, processes, files, network,
output. Each test runs a hostile program and checks both the report and the host."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from astrai_core.environments.sandbox import Sandbox, SandboxConfig, SandboxError, run_many

FAST = dict(timeout=2.0, cpu_seconds=1, memory_mb=256, processes=16)


@pytest.fixture(scope="module")
def box():
    return Sandbox(**FAST)


@pytest.fixture(scope="module")
def isolation(box):
    return box.run_python("pass").isolation


def _live_pids_of_uid(uid: int) -> list[int]:
    """Processes (not zombies) whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields and int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def _pids_of_uid(uid: int) -> list[int]:
    """The live processes of ``uid`` after they had 2 s to die."""
    deadline = time.monotonic() + 2
    while (pids := _live_pids_of_uid(uid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def test_a_correct_program_runs_and_reports_its_output(box):
    result = box.run_python("import sys\nprint(input() * 2)\nprint('warn', file=sys.stderr)",
                            stdin="ab\n")
    assert (result.status, result.exit_code) == ("ok", 0)
    assert result.stdout == "abab\n" and result.stderr == "warn\n"


def test_a_failing_program_reports_its_exit_status_and_traceback(box):
    result = box.run_python("raise SystemExit(3)")
    assert (result.status, result.exit_code) == ("error", 3)
    result = box.run_python("1/0")
    assert result.exit_code == 1 and "ZeroDivisionError" in result.stderr


def test_an_infinite_loop_is_killed_at_the_time_limit(box):
    start = time.monotonic()
    result = Sandbox(**{**FAST, "cpu_seconds": 30, "timeout": 1.0}).run_python("while True: pass")
    assert result.status == "timeout" and result.exit_code is None
    assert time.monotonic() - start < 5
    # the CPU limit alone stops a busy loop too (SIGXCPU, then SIGKILL)
    result = box.run_python("while True: pass")
    assert result.status in ("error", "timeout")


def test_a_sleeping_program_and_its_children_are_killed_at_the_wall_limit(box):
    # one child in the process group, one that left it (setsid)
    code = ("import os, subprocess, time\nsubprocess.Popen(['sleep', '60'])\n"
            "if os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\ntime.sleep(60)")
    result = Sandbox(**{**FAST, "timeout": 1.0}).run_python(code)
    assert result.status == "timeout"
    if result.isolation["uid"] is not None:   # this sandbox's own user
        assert _pids_of_uid(result.isolation["uid"]) == []


def test_a_memory_bomb_fails_inside_the_sandbox(box):
    result = box.run_python("x = bytearray(2 * 1024 ** 3)\nprint('allocated')")
    assert result.status == "error" and "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


def test_a_fork_bomb_is_bounded_and_leaves_no_process(box, isolation):
    if not isolation["user_drop"]:
        pytest.skip("the sandbox user cannot be dropped here (not root): RLIMIT_NPROC "
                    "would count the whole user's processes")
    code = ("import os, time\ncount = 0\n"
            "for _ in range(10000):\n"
            "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
            "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
            "    count += 1\n"
            "print(count, flush=True)\n")
    start = time.monotonic()
    result = box.run_python(code)
    assert time.monotonic() - start < 5
    assert result.status == "ok"
    assert 0 < int(result.stdout) < FAST["processes"]  # fork met EAGAIN at the limit
    assert _pids_of_uid(result.isolation["uid"]) == []   # the sleepers died with the sandbox
    # a real bomb (every child forks on) is stopped by the time limit, and cleaned up
    bomb = Sandbox(**{**FAST, "timeout": 1.0}).run_python(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert bomb.status == "timeout" and bomb.isolation["uid"] is not None
    assert _pids_of_uid(bomb.isolation["uid"]) == []
    assert box.run_python("print('alive')").stdout == "alive\n"


def test_writes_outside_the_work_directory_fail_or_stay_private(box, isolation, tmp_path):
    target = tmp_path / "escaped.txt"
    shared_tmp = Path(f"/tmp/astrai-escaped-{os.getpid()}")
    os.chmod(tmp_path, 0o777)   # even a world-writable host directory must stay untouched
    repo_file = Path(__file__).with_name("escaped.txt")
    code = (f"import os\nopen('inside.txt', 'w').write('ok')\n"
            f"for path in [{str(target)!r}, {str(repo_file)!r}, '/etc/astrai-escaped', {str(shared_tmp)!r}]:\n"
            f"    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
            f"    except OSError as exc:\n        print('refused', path, type(exc).__name__)\n"
            f"print(os.listdir('.'))")
    result = box.run_python(code)
    assert result.ok, result.stderr
    assert "inside.txt" in result.stdout
    assert not target.exists() and not repo_file.exists()
    assert not Path("/etc/astrai-escaped").exists()
    if isolation["mount"]:   # without a mount namespace /tmp stays writable (documented)
        assert not shared_tmp.exists()
    shared_tmp.unlink(missing_ok=True)
    if isolation["user_drop"]:
        assert f"refused {Path('/etc/astrai-escaped')}" in result.stdout
        assert f"refused {repo_file}" in result.stdout


def test_the_work_directory_is_removed_afterwards(box):
    result = box.run_python("import os\nprint(os.getcwd())")
    assert result.ok and not Path(result.stdout.strip()).exists()


def test_a_connection_to_a_host_server_fails(isolation):
    if not isolation["net"]:
        pytest.skip("the kernel refuses a network namespace here")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = (f"import socket\ns = socket.socket()\ns.settimeout(1)\n"
            f"try:\n    s.connect(('127.0.0.1', {port}))\n    print('connected')\n"
            f"except OSError as exc:\n    print('refused', type(exc).__name__)")
    result = Sandbox(**FAST).run_python(code)
    server.setblocking(False)
    with pytest.raises(BlockingIOError):   # nothing is waiting to be accepted
        server.accept()
    server.close()
    assert result.ok and result.stdout.startswith("refused")
    # the same program without the network namespace does connect (the test can fail)
    server = socket.socket()
    server.bind(("127.0.0.1", port))
    server.listen()
    host_net = Sandbox(**FAST, network="host").run_python(code)
    server.close()
    assert host_net.stdout == "connected\n"


def test_huge_output_stops_the_program_and_is_cut(box):
    small = Sandbox(**{**FAST, "max_output_bytes": 1000})
    start = time.monotonic()
    result = small.run_python("while True: print('x' * 100)")
    assert result.status == "output_limit"
    assert len(result.stdout) + len(result.stderr) <= 1000
    assert time.monotonic() - start < 3
    assert "over the output limit" in result.summary(300) and len(result.summary(300)) <= 300


def test_sandboxes_run_in_parallel_from_a_thread_pool():
    box = Sandbox(**FAST)
    start = time.monotonic()
    results = run_many(lambda i: box.run_python(f"import time\ntime.sleep(0.5)\nprint({i})"),
                       range(6), max_workers=6)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert time.monotonic() - start < 6 * 0.5   # not one after the other


def test_a_required_isolation_part_is_enforced(isolation):
    parts = [name for name in ("net", "mount", "pid", "user_drop") if not isolation[name]]
    if not parts:
        assert Sandbox(**FAST, require=("net", "mount", "pid", "user_drop")).run_python("pass").ok
        return
    with pytest.raises(SandboxError, match=parts[0]):
        Sandbox(**FAST, require=(parts[0],)).run_python("pass")


def test_bad_file_names_are_refused(box):
    with pytest.raises(SandboxError, match="plain names"):
        box.run_python("pass", files={"../x": ""})
    assert SandboxConfig().network == "none"


def test_sandboxes_of_two_processes_get_different_users(isolation):
    """While another process (another rank) holds a sandbox uid, this one takes another,
    so their RLIMIT_NPROC budgets and the kill-by-uid fallback stay apart."""
    if not isolation["user_drop"]:
        pytest.skip("no sandbox user when not root")
    import subprocess
    import sys

    holder = ("import sys\nfrom astrai_core.environments.sandbox import _SLOTS\n"
              "print(_SLOTS.take(64000), flush=True)\nsys.stdin.read()")
    other = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        theirs = int(other.stdout.readline())
        results = run_many(lambda _: Sandbox(**FAST).run_python("import os\nprint(os.getuid())"),
                           range(3), max_workers=3)
    finally:
        other.stdin.close()
        other.wait(timeout=30)
    uids = [int(r.stdout) for r in results]
    assert theirs not in uids and len(set(uids)) == 3
    assert uids == [r.isolation["uid"] for r in results]


def test_the_mount_report_is_true_with_the_venv_under_a_masked_directory(tmp_path, isolation):
    """A venv under /tmp (which the sandbox hides under a tmpfs) is bound back, the code
    runs with it, and the report says the masks were mounted."""
    if not isolation["mount"]:
        pytest.skip("no mount namespace here")
    import json
    import subprocess
    import sys
    import sysconfig

    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip("the test's directory is not under /tmp")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    imports = os.pathsep.join([*filter(None, sys.path), sysconfig.get_paths()["purelib"]])
    host = ("import json, sys\nfrom astrai_core.environments.sandbox import Sandbox\n"
            "r = Sandbox(timeout=10).run_python('import sys; print(sys.prefix)')\n"
            "print(json.dumps([r.status, r.stdout, r.stderr, r.isolation]))")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", host], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": imports})
    assert done.returncode == 0, done.stderr[-3000:]
    status, stdout, stderr, report = json.loads(done.stdout.splitlines()[-1])
    assert report["mount"] is True, report
    assert status == "ok", stderr
    assert stdout.strip() == str(venv)  # the venv's interpreter, seen inside the sandbox


_CHILDREN = """
import subprocess, sys
child = "b = bytearray(150 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(1); print('held')"
procs = [subprocess.Popen([sys.executable, "-I", "-c", child], stdout=subprocess.PIPE, text=True)
         for _ in range(4)]
print(sum(p.communicate()[0].strip() == "held" for p in procs))
"""


def test_children_together_are_held_to_memory_mb_or_the_report_says_per_process():
    """Four children of 150 MB each, under a 256 MiB limit: each is under it, together
    they are over it. With a cgroup the sandbox is stopped; without one the report says
    that memory is limited per process, as it then is."""
    from astrai_core.environments import sandbox_cgroup

    cgroup = sandbox_cgroup.create(256 * 2**20)
    if cgroup is not None:
        sandbox_cgroup.remove(cgroup)
    result = Sandbox(timeout=20, cpu_seconds=10, memory_mb=256, processes=16).run_python(
        _CHILDREN)
    if cgroup is None:
        assert result.isolation["memory"] == "per_process"
        assert result.ok and result.stdout.strip() == "4"  # all held: per process only
    else:
        assert result.isolation["memory"] == "sandbox"
        assert not (result.ok and result.stdout.strip() == "4"), result.summary()
