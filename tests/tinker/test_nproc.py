"""`astrai tinker --nproc-per-node 2`: the base sharded over two processes (FSDP2, gloo on
CPU) serves the official SDK with the losses, gradients and samples of a one-process
server; a bad request is refused without stalling the processes; a stop or a dead process
ends every process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")
from tinker import types  # noqa: E402

from tests.tinker.conftest import BASE, KEY, live_tinker  # noqa: E402
from tests.tinker.test_sdk_engine import _logprobs, _sdk_rows  # noqa: E402

START_S = 240  # two processes loading and sharding the base on a shared, slow CPU


class ServerProcesses:
    """``astrai tinker --nproc-per-node N`` in a subprocess, on a free loopback port."""

    def __init__(self, hf_dir: Path, tmp: Path, nproc: int = 2) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = (tmp / "server.log").open("w+")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ASTRAI_CACHE_DIR": str(tmp / "cache")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "astrai_core.cli.main", "tinker", "--model", f"{BASE}={hf_dir}",
             "--port", str(self.port), "--api-key", KEY, "--state-dir", str(tmp / "state"),
             "--device", "cpu", "--nproc-per-node", str(nproc)],
            stdout=self.log, stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.monotonic() + START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert self.process.poll() is None and time.monotonic() < deadline, self.output()
                time.sleep(0.5)
        self.ranks = _children(self.process.pid)

    def client(self):
        return tinker.ServiceClient(base_url=self.base_url, api_key=KEY)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        for pid in self.ranks.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.log.close()


def _children(parent: int) -> dict[int, int]:
    """{rank: pid} of the processes torchrun started under ``parent``."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        rank = [line[5:] for line in environ if line.startswith(b"RANK=")]
        if ppid == parent and rank:
            ranks[int(rank[0])] = int(entry.name)
    return ranks


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def two(hf_dir, tmp_path_factory):
    server = ServerProcesses(hf_dir, tmp_path_factory.mktemp("two"))
    yield server
    server.close()


def _train_and_sample(service) -> tuple[list, list, object]:
    """Two steps of one tenant (3 datums: 2 on rank 0, 1 on rank 1), a forward of one datum
    (rank 1's share is empty), then samples with logprobs from its saved weights."""
    trainer = service.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
    outs, metrics = [], []
    for _ in range(2):
        outs.append(trainer.forward_backward(_sdk_rows(0), "cross_entropy").result())
        metrics.append(trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics)
    outs.append(trainer.forward(_sdk_rows(2)[:1], "cross_entropy").result())
    sampler = trainer.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=4)
    sample = sampler.sample(types.ModelInput.from_ints([5, 9, 13, 2]), 2, params,
                            include_prompt_logprobs=True).result()
    return outs, metrics, sample


def _losses(out) -> np.ndarray:
    return np.concatenate([o["elementwise_loss"].to_numpy() for o in out.loss_fn_outputs])


def test_two_processes_equal_one(two, make_engine, tmp_path):
    assert sorted(two.ranks) == [0, 1]
    got_outs, got_metrics, got_sample = _train_and_sample(two.client())
    with live_tinker(make_engine(tmp_path / "one")) as one:
        want_outs, want_metrics, want_sample = _train_and_sample(one.client())
    for got, want in zip(got_outs, want_outs, strict=True):  # after one step, after two
        assert abs(got.metrics["loss:sum"] - want.metrics["loss:sum"]) <= 1e-5
        np.testing.assert_allclose(_logprobs(got), _logprobs(want), rtol=0, atol=1e-5)
        np.testing.assert_allclose(_losses(got), _losses(want), rtol=0, atol=1e-5)
    for got, want in zip(got_metrics, want_metrics, strict=True):
        assert got["grad_norm:mean"] == pytest.approx(want["grad_norm:mean"], rel=1e-5)
    assert got_outs[1].metrics["loss:sum"] < got_outs[0].metrics["loss:sum"]
    for got, want in zip(got_sample.sequences, want_sample.sequences, strict=True):
        assert got.tokens == want.tokens
        np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got_sample.prompt_logprobs[1:], want_sample.prompt_logprobs[1:],
                               rtol=0, atol=1e-5)


def test_bad_requests_are_refused_and_the_processes_go_on(two):
    service = two.client()
    with pytest.raises(tinker.BadRequestError, match="lora rank 999 is out of range"):
        service.create_lora_training_client(base_model=BASE, rank=999).result()
    trainer = service.create_lora_training_client(base_model=BASE, rank=2).result()
    bad = types.Datum(model_input=types.ModelInput.from_ints([1, 999]),
                      loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]})
    with pytest.raises(tinker.BadRequestError, match="datum 0: token id 999 is out of range"):
        trainer.forward_backward([bad], "cross_entropy").result()
    # refused inside the engine, on every process at once: a failed future, nobody waiting
    sampler = service.create_sampling_client(base_model=BASE).result()
    with pytest.raises(tinker.RequestFailedError, match="max_tokens 100000"):
        sampler.sample(types.ModelInput.from_ints([1, 2]), 1,
                       types.SamplingParams(max_tokens=100_000)).result(timeout=60)
    out = trainer.forward_backward(_sdk_rows(1), "cross_entropy").result(timeout=120)
    assert out.metrics["loss:sum"] > 0
    assert trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60)


def test_a_saved_state_loads_on_every_process(two):
    """Rank 1 computes its share of the datums with the adapter it read back itself."""
    service = two.client()
    trainer = service.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
    trainer.forward_backward(_sdk_rows(0), "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = trainer.save_state("state").result().path
    want = trainer.forward(_sdk_rows(1), "cross_entropy").result()
    again = service.create_training_client_from_state_with_optimizer(path).result()
    got = again.forward(_sdk_rows(1), "cross_entropy").result()
    assert got.metrics["loss:sum"] == want.metrics["loss:sum"]
    np.testing.assert_array_equal(_logprobs(got), _logprobs(want))


def test_sigterm_stops_every_process(two):
    """Last in this module: it stops the module's server."""
    ranks = dict(two.ranks)
    two.process.send_signal(signal.SIGTERM)
    two.process.wait(60)
    assert "Traceback" not in two.output(), two.output()
    assert "stopped by SIGTERM: every process of the server was sent it" in two.output()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in ranks.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in ranks.values())


def test_a_dead_process_ends_the_server_with_one_line(hf_dir, tmp_path):
    server = ServerProcesses(hf_dir, tmp_path)
    try:
        os.kill(server.ranks[1], signal.SIGKILL)
        code = server.process.wait(120)
        output = server.output()
        assert code != 0 and "Traceback" not in output, output
        assert "error: the distributed run failed: rank 1" in output, output
        assert not _alive(server.ranks[0])
    finally:
        server.close()


def test_a_process_count_below_one_is_one_line(hf_dir, tmp_path):
    from astrai_core.testing import run_astrai

    result = run_astrai("tinker", "--model", f"{BASE}={hf_dir}", "--nproc-per-node", "0",
                        "--state-dir", str(tmp_path / "state"))
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: --nproc-per-node must be >= 1, got 0"]
    assert not (tmp_path / "state").exists()
