"""A one-machine 2-process run listens on loopback only, launched by `astrai train
--nproc-per-node 2` or by hand (torchrun with `--rdzv-backend astrai`): while the run is
held after its first checkpoint, every listening socket of the launcher and its processes
(the kernel's socket table, matched by inode) is bound to 127.0.0.1 or ::1, and a client
on another address of this machine cannot connect to any of their ports (an
unauthenticated store reached from there would let anyone replace what the ranks read)."""

from __future__ import annotations

import contextlib
import os
import socket
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from astrai_core.testing.faults import hung_command
from astrai_core.training.phases import CHECKPOINT_SAVED
from tests.distributed.conftest import TIMEOUT
from tests.distributed.net_kit import Listener, listeners, process_tree, remote_prober
from tests.training.conftest import tiny_config, write_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a run of 2 processes under torchrun


def _entry_points(tmp_path: Path) -> str:
    """A directory that declares the package's ``torchrun.handlers`` entry points, read
    from pyproject.toml, as an installed astrai-core does (the test's checkout may be
    importable without being installed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    handlers = project["entry-points"]["torchrun.handlers"]
    info = tmp_path / "entry_points" / "astrai_core_checkout-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: astrai-core-checkout\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[torchrun.handlers]\n" + "".join(f"{k} = {v}\n" for k, v in handlers.items()))
    return str(info.parent)


def _command(tmp_path: Path, by_hand: bool = False, *launch: str) -> list[str]:
    """A run whose ranks freeze once checkpoint 1 is saved (every store and collective
    connection is open by then): `astrai train ... LAUNCH`, or by hand, torchrun with what
    docs/distributed.md says a hand launch adds."""
    path = tmp_path / "run.yaml"
    if not path.exists():
        write_config(tmp_path, tiny_config(tmp_path, max_steps=3, save_every=1,
                                           progress=False))
    astrai = ["--log-format", "json", "train", str(path)]
    hung = hung_command(CHECKPOINT_SAVED, 1)
    if by_hand:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                "--rdzv-backend=astrai", "--module",
                *hung[2:], *astrai]
    return [*hung, *astrai, *launch]


@contextlib.contextmanager
def _held(tmp_path: Path, commands: list[list[str]], env: dict[str, str]
          ) -> Iterator[list[subprocess.Popen]]:
    """``commands`` started (each in a session of its own), until their 2 ranks are held;
    then every process of theirs is killed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    logs = [tmp_path / f"stderr{i}.txt" for i in range(len(commands))]
    runs = []
    for command, log in zip(commands, logs):
        with log.open("w") as err:
            runs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                         env=env, start_new_session=True))
    try:
        deadline = time.monotonic() + TIMEOUT
        while sum(log.read_text().count("fault: rank") for log in logs) < 2:
            text = "".join(log.read_text()[-3000:] for log in logs)
            assert all(run.poll() is None for run in runs), text
            assert time.monotonic() < deadline, "the run never reached checkpoint 1: " + text
            time.sleep(0.5)
        yield runs
    finally:
        # torchrun starts its ranks in sessions of their own: kill every process of the tree
        # found while it stands, not only the launchers' groups, or the held ranks outlive it
        tree = [pid for run in runs for pid in process_tree(run.pid)]
        for run in runs:
            os.killpg(run.pid, signal.SIGKILL)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for run in runs:
            run.wait(timeout=60)


def _listeners_of(runs: list[subprocess.Popen]) -> list[Listener]:
    pids = [pid for run in runs for pid in process_tree(run.pid)]
    assert len(pids) >= 3, pids  # the launchers (torchrun's agents too) and 2 ranks
    found = listeners(pids)
    assert found, "the run listens on nothing: the socket table was not read"
    return found


@pytest.mark.parametrize("by_hand", [False, True], ids=["astrai-launch", "torchrun-by-hand"])
def test_a_one_machine_run_listens_on_loopback_only(tmp_path, by_hand):
    with remote_prober() as prober:
        if prober is None:
            pytest.skip("no address other than loopback can be made on this machine")
        # gloo told to use the interface the client reaches, as a cluster-wide setting (or
        # a host name that resolves to that address) would: a one-machine run keeps off it
        env = {"GLOO_SOCKET_IFNAME": prober.interface} if prober.interface else {}
        if by_hand:
            paths = [_entry_points(tmp_path), os.environ.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        with _held(tmp_path, [_command(tmp_path, by_hand, "--nproc-per-node", "2")],
                   env) as runs:
            found = _listeners_of(runs)
            exposed = [f"pid {s.pid} on {s.address}:{s.port}" for s in found if not s.loopback]
            assert not exposed, f"listening beyond loopback: {exposed}"
            reached = sorted({s.port for s in found if prober.connects(s.port)})
            assert not reached, f"ports reached from {prober.target}: {reached}"


def test_a_multi_node_run_listens_on_the_master_address_alone(tmp_path):
    """Two launches of one process each, as node ranks 0 and 1 on this machine, with
    --master-addr on the probe's network: the store listens on that address only (the
    other nodes must reach it there), not on every interface."""
    with remote_prober() as prober:
        if prober is None:
            pytest.skip("no address other than loopback can be made on this machine")
        with socket.socket() as free:
            free.bind((prober.target, 0))
            port = free.getsockname()[1]
        nodes = [_command(tmp_path, False, "--nproc-per-node", "1", "--nnodes", "2",
                          "--node-rank", str(rank), "--master-addr", prober.target,
                          "--master-port", str(port)) for rank in (0, 1)]
        with _held(tmp_path, nodes, {}) as runs:
            found = _listeners_of(runs)
            stores = [s for s in found if s.port == port]
            assert [str(s.address) for s in stores] == [prober.target], found
            assert stores[0].pid == runs[0].pid  # node rank 0's launcher serves it
            assert prober.connects(port)  # the other nodes' way in
            exposed = [s for s in found if not s.loopback and s.port != port]
            # the ranks' own collective sockets follow gloo's choice (the host name's
            # address here, or GLOO_SOCKET_IFNAME): never an any-address listener
            assert not [s for s in exposed if s.address.is_unspecified], exposed
