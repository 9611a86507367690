"""When one rank of `astrai train --nproc-per-node 2` fails, the launcher's last line names
that rank: with the one-line error it reported, or the signal that killed it (and then
never "its error is printed above"), or, for a rank that froze while its peer went on,
that it stopped making progress (its peer, which timed out waiting for it, fails first)."""

from __future__ import annotations

import pytest

from astrai_core.cli.failed_rank import blame
from astrai_core.distributed.worker_report import Ending
from astrai_core.testing.faults import failed_command, hung_command, killed_command
from astrai_core.training.phases import CHECKPOINT_SAVED, DCP_WRITTEN
from tests.distributed.conftest import train
from tests.training.conftest import tiny_config

pytestmark = pytest.mark.slow  # runs of 2 processes under torchrun


def _last_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error: the distributed")]
    assert len(errors) == 1, stderr[-4000:]
    assert "Traceback" not in stderr, stderr[-4000:]
    return errors[0]


def _config(tmp_path, **parallel):
    config = tiny_config(tmp_path, max_steps=4, save_every=1, progress=False)
    config["parallel"] = parallel
    return config


def test_a_rank_that_fails_is_named_with_its_own_error_line(tmp_path):
    done = train(_config(tmp_path), tmp_path, "failed", 2,
                 command=failed_command(DCP_WRITTEN, 2, rank=1))
    assert done.returncode == 2, done.stderr[-4000:]
    assert _last_error(done.stderr) == (
        "error: the distributed run failed: rank 1 exited with status 2: injected failure "
        "at dcp_written of step 2 on rank 1")


def test_a_rank_killed_by_a_signal_is_not_said_to_have_printed_an_error(tmp_path):
    done = train(_config(tmp_path), tmp_path, "killed", 2,
                 command=killed_command(CHECKPOINT_SAVED, 2, rank=1))
    assert done.returncode == 1, done.stderr[-4000:]
    line = _last_error(done.stderr)
    assert line.startswith("error: the distributed run failed: rank 1 was killed by SIGKILL "
                           "(signal 9) and could print no error of its own"), line
    assert "printed above" not in done.stderr


def test_a_frozen_rank_is_named_not_the_peer_that_timed_out_waiting(tmp_path):
    # rank 1 freezes once step_1 is saved; rank 0 begins step 2 and its first collective
    # times out after parallel.timeout_seconds; torchrun then kills rank 1 (after 30 s)
    done = train(_config(tmp_path, timeout_seconds=15), tmp_path, "frozen", 2,
                 command=hung_command(CHECKPOINT_SAVED, 1, rank=1))
    assert done.returncode == 1, done.stderr[-4000:]
    assert "fault: rank 1 hangs at checkpoint_saved of step 1" in done.stderr
    assert "[rank 0] stopped: a collective failed" in done.stderr  # rank 0 did fail first
    assert _last_error(done.stderr) == (
        "error: the distributed run failed: rank 1 stopped making progress in step 1 and the "
        "others timed out waiting for it (parallel.timeout_seconds); it was then stopped "
        "with SIGKILL")


def _ending(code, stamp, **more):
    return Ending(code, stamp, **more)


def test_blame_reads_errors_progress_and_how_each_rank_ended():
    lost = {"error": "stopped: a collective failed ...", "lost_peer": True}
    # a frozen rank: its peer timed out waiting (and reported that), then it was stopped;
    # by SIGTERM or, ignoring it, by SIGKILL 30 s later
    for code, stamp in ((-15, 100), (-9, 130)):
        rank, what = blame({0: _ending(1, 100, **lost, progress=3, where="in step 2"),
                            1: _ending(code, stamp, progress=2, where="after step 1")})
        assert rank == 1 and what.startswith("rank 1 stopped making progress after step 1")
    # of 3 ranks stopped by torchrun, the one whose progress is behind
    rank, what = blame({0: _ending(1, 100, **lost, progress=5), 1: _ending(-15, 100, progress=5),
                        2: _ending(-15, 100, progress=4, where="in step 2")})
    assert (rank, what.split(" and ")[0]) == (2, "rank 2 stopped making progress in step 2")
    # without progress to tell them apart: both candidates are named
    rank, what = blame({0: _ending(1, 100, **lost), 1: _ending(-15, 100),
                        2: _ending(-15, 100)})
    assert what.startswith("one of ranks 1, 2 stopped making progress")
    # an error of its own wins over a peer that is behind: it did not freeze, it failed
    rank, what = blame({0: _ending(2, 100, error="data.sources[0].path: not found",
                                   progress=3),
                        1: _ending(-15, 100, progress=2)})
    assert (rank, what) == (0, "rank 0 exited with status 2: data.sources[0].path: not found")
    # killed from outside (out of memory) at the moment its peer lost it: not a freeze
    rank, what = blame({0: _ending(1, 100, **lost, progress=3), 1: _ending(-9, 100, progress=2)})
    assert rank == 1 and "killed by SIGKILL (signal 9) and could print no error" in what
    # an error exit without a report says so, and never that its error is printed above
    rank, what = blame({0: _ending(3, 100), 1: _ending(-15, 100)})
    assert what == ("rank 0 exited with status 3 without reporting an error (any output "
                    "of its own is above)")
    # a rank that reported its own error and was still exiting when its peer aborted (its
    # gloo sockets closed) and torchrun sent it SIGTERM: it failed first, with its error
    rank, what = blame({0: _ending(-6, 100, **lost), 1: _ending(-15, 101, error="bad reward")})
    assert (rank, what) == (1, "rank 1 failed (SIGTERM while it exited): bad reward")
