"""A one-machine 2-process run listens on loopback only, launched by `astrai train
--nproc-per-node 2` or by hand (torchrun with `--rdzv-backend astrai`): while the run is
held after its first checkpoint, every listening socket of the launcher and its processes
(the kernel's socket table, matched by inode) is bound to 127.0.0.1 or ::1, and a client
on another address of this machine cannot connect to any of their ports (an
unauthenticated store reached from there would let anyone replace what the ranks read)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from astrai_core.testing.faults import hung_command
from astrai_core.training.phases import CHECKPOINT_SAVED
from tests.distributed.conftest import TIMEOUT
from tests.distributed.net_kit import listeners, process_tree, remote_prober
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


def _held_run(tmp_path: Path, env: dict[str, str], by_hand: bool
              ) -> tuple[subprocess.Popen, Path]:
    """A 2-process run whose ranks both freeze once checkpoint 1 is saved (every store
    and collective connection is open by then), launched by `astrai train` or by hand
    (torchrun with what docs/distributed.md says a hand launch adds); stderr to a file."""
    config = tiny_config(tmp_path, max_steps=3, save_every=1, progress=False)
    path = write_config(tmp_path, config)
    astrai = ["--log-format", "json", "train", str(path)]
    hung = hung_command(CHECKPOINT_SAVED, 1)
    if by_hand:
        paths = [_entry_points(tmp_path), os.environ.get("PYTHONPATH", "")]
        env = {**env, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                   "--rdzv-backend=astrai", "--rdzv-endpoint=127.0.0.1:0", "--module",
                   *hung[2:], *astrai]
    else:
        command = [*hung, *astrai, "--nproc-per-node", "2"]
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err:
        run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                               env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                               start_new_session=True)
    return run, stderr


def _wait_held(run: subprocess.Popen, stderr: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while stderr.read_text().count("fault: rank") < 2:
        assert run.poll() is None, stderr.read_text()[-4000:]
        assert time.monotonic() < deadline, "the run never reached checkpoint 1"
        time.sleep(0.5)


@pytest.mark.parametrize("by_hand", [False, True], ids=["astrai-launch", "torchrun-by-hand"])
def test_a_one_machine_run_listens_on_loopback_only(tmp_path, by_hand):
    with remote_prober() as prober:
        if prober is None:
            pytest.skip("no address other than loopback can be made on this machine")
        # gloo told to use the interface the client reaches, as a cluster-wide setting (or
        # a host name that resolves to that address) would: a one-machine run keeps off it
        env = {"GLOO_SOCKET_IFNAME": prober.interface} if prober.interface else {}
        run, stderr = _held_run(tmp_path, env, by_hand)
        try:
            _wait_held(run, stderr)
            pids = process_tree(run.pid)
            assert len(pids) >= 3, pids  # the launcher (torchrun's agent too) and 2 ranks
            found = listeners(pids)
            assert found, "the run listens on nothing: the socket table was not read"
            exposed = [f"pid {s.pid} on {s.address}:{s.port}" for s in found if not s.loopback]
            assert not exposed, f"listening beyond loopback: {exposed}"
            reached = sorted({s.port for s in found if prober.connects(s.port)})
            assert not reached, f"ports reached from {prober.target}: {reached}"
        finally:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=60)
