"""SIGTERM to `astrai train --nproc-per-node 2`: the launcher forwards it to every rank,
which checkpoint at the end of their step; it exits 143 without a traceback. A second
Ctrl-C during that save stops every rank at once: 130, one line. A one-machine launch
reaches its peers over loopback."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from astrai_core.checkpoints.manifest import verify_manifest
from astrai_core.checkpoints.training_state import list_checkpoints
from astrai_core.cli.failed_rank import _failure, culprit
from astrai_core.cli.launch import torchrun_argv
from astrai_core.testing.faults import hung_command
from astrai_core.training.phases import DCP_WRITTEN
from tests.training.conftest import Watched, tiny_config, write_config


def _launch_args(**given):
    return argparse.Namespace(**{"nproc_per_node": 2, "nnodes": 1, "node_rank": 0,
                                 "master_addr": None, "master_port": None, "config": "run.yaml",
                                 "overrides": [], "resume": False, "overwrite": False, **given})


def test_one_machine_binds_the_rendezvous_to_loopback():
    argv = torchrun_argv(_launch_args())
    assert "--rdzv-backend=astrai" in argv and "--rdzv-endpoint=127.0.0.1:0" in argv
    assert not any(arg.startswith(("--standalone", "--master-addr")) for arg in argv)


def test_several_machines_bind_the_rendezvous_to_the_address_named():
    argv = torchrun_argv(_launch_args(nnodes=2, node_rank=1, master_addr="10.0.0.1"))
    assert {"--rdzv-backend=astrai", "--rdzv-endpoint=10.0.0.1:29500",
            "--rdzv-conf=rank=1"} <= set(argv)
    argv = torchrun_argv(_launch_args(nnodes=2, master_addr="fd00::1", master_port=7000))
    assert "--rdzv-endpoint=[fd00::1]:7000" in argv


def test_sigterm_to_the_launcher_checkpoints_every_rank_and_exits_143(tmp_path):
    config = tiny_config(tmp_path, max_steps=10_000, save_every=0, progress=False)
    path = write_config(tmp_path, config)
    run = subprocess.Popen([sys.executable, "-m", "astrai_core.cli.main", "--log-format",
                            "json", "train", str(path), "--nproc-per-node", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 400
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.5)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "error: stopped by SIGTERM: every rank was sent it" in stderr
    kept = list_checkpoints(tmp_path / "run")
    assert kept, stderr[-3000:]
    verify_manifest(kept[-1][1], hashes=True)


def test_the_rank_killed_by_a_signal_is_named_not_its_peers():
    # rank 1 SIGKILLed; rank 0 then failed on a lost collective in the same second
    assert culprit({0: (1, 100), 1: (-9, 100)}) == (1, -9)
    assert culprit({0: (1, 101), 1: (2, 100)}) == (1, 2)  # otherwise the earliest
    assert culprit({0: (1, 100), 1: (1, 100)}) == (0, 1)
    # a peer's abort (gloo losing the failed rank) or torchrun's SIGTERM to the survivors
    # is a consequence: the rank that raised is named, even when it stopped later
    assert culprit({0: (-6, 100), 1: (1, 100)}) == (1, 1)
    assert culprit({0: (-15, 100), 1: (-6, 100)}) == (1, -6)
    assert culprit({0: (-15, 100), 1: (1, 101)}) == (1, 1)
    assert "rank 1 was killed by SIGKILL (signal 9) and could print no error" in \
        _failure(1, -9)
    # a rank that exited with an error but reported none: nothing is claimed about it
    assert _failure(0, 1) == ("rank 0 exited with status 1 without reporting an error (any "
                              "output of its own is above)")


def test_a_second_ctrl_c_during_the_save_stops_every_rank_at_once_in_one_line(tmp_path):
    # Ctrl-C, as a terminal sends it, to the launcher's process group, twice: the first
    # reaches every rank (torchrun forwards it), which saves at the end of its step and
    # is held inside that save by the fault driver's hook; the second stops them at once
    config = tiny_config(tmp_path, max_steps=10_000, save_every=0, progress=False)
    path = write_config(tmp_path, config)
    run = Watched([*hung_command(DCP_WRITTEN), "--log-format", "json", "train", str(path),
                   "--nproc-per-node", "2"])
    metrics = tmp_path / "run" / "metrics.jsonl"
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        run.running()
        time.sleep(0.5)
    run.signal_group(signal.SIGINT)
    run.wait_for(f"hangs at {DCP_WRITTEN}", count=2)  # both ranks are inside the save
    run.signal_group(signal.SIGINT)
    assert run.finish() == 130, run.stderr[-4000:]
    assert "Traceback" not in run.stderr, run.stderr[-4000:]
    errors = [line for line in run.lines if line.startswith("error:")]
    assert errors == ["error: stopped at once by a second SIGINT: every rank was stopped "
                      "without finishing the checkpoint it was writing (the next run removes "
                      "it); continue with --resume from the previous one"], run.stderr[-4000:]
    left = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    assert len(left) == 1 and left[0].startswith(".step_"), left
