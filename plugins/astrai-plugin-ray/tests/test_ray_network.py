"""The ray sampler with a local Ray listens on loopback only: once the weight-push group
has formed and carried a push, every listening socket of this process and the processes
below it (Ray's GCS, raylet and agents, the rollout workers; the kernel's socket table,
matched by inode) is bound to 127.0.0.1 or ::1. An unauthenticated store or Ray service
reached from another machine would let anyone replace the weights the workers sample."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from astrai_core.testing.net import listeners, process_tree
from astrai_plugin_ray.sampler import RaySampler

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(),
                                reason="reads Linux's socket table")


def _tiny_model() -> torch.nn.Module:
    from astrai_core.api import CausalLM, ModelConfig
    from astrai_core.testing import TINY_MODEL

    torch.manual_seed(0)
    return CausalLM(ModelConfig(vocab_size=32, **TINY_MODEL))


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return "?"


def test_a_run_on_a_local_ray_listens_on_loopback_only():
    import ray

    assert not ray.is_initialized()  # the sampler starts Ray itself
    model = _tiny_model()
    sampler = RaySampler(model=model, workers=2, worker_resources={"CPU": 0.5},
                         weight_transport="collective", init_kwargs={"num_cpus": 1})
    try:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(-1.0)
        sampler.update_weights()
        assert sampler.metrics()["rollout/weight_push_mb"] > 0
        found = listeners(process_tree(os.getpid()))
        commands = {s.pid: _command(s.pid) for s in found}
        # the socket table was read, and Ray's services and the workers are in it
        assert any("gcs_server" in c for c in commands.values()), commands
        assert any("raylet" in c for c in commands.values()), commands
        assert {info["pid"] for info in sampler.worker_info} <= set(commands), commands
        store = sampler._pusher._store.port
        assert [s.pid for s in found if s.port == store] == [os.getpid()]
        exposed = [f"{s.address}:{s.port} ({commands[s.pid][:80]})"
                   for s in found if not s.loopback]
        assert not exposed, f"listening beyond loopback: {exposed}"
        (weights, _) = sampler.worker_weights()
        assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    finally:
        sampler.close()
    assert not ray.is_initialized()


@pytest.mark.parametrize("workers_here", [True, False], ids=["workers-on-this-node",
                                                             "workers-elsewhere"])
def test_the_weight_push_store_listens_on_one_address(ray_session, monkeypatch, workers_here):
    """In a Ray session on the network (this module's, as an existing cluster would be)
    the store listens on 127.0.0.1 when every worker shares the trainer's node, else on
    the node's address in the cluster alone (the workers on other nodes reach it there),
    never on every interface."""
    from astrai_plugin_ray.push import WeightPusher

    if not workers_here:  # as if the placement group had put the workers on other nodes
        monkeypatch.setattr(WeightPusher, "_workers_are_local", lambda self: False)
    sampler = RaySampler(model=_tiny_model(), workers=1, worker_resources={"CPU": 0.5},
                         weight_transport="collective")
    try:
        sampler.update_weights()
        store = sampler._pusher._store.port
        found = [str(s.address) for s in listeners([os.getpid()]) if s.port == store]
        expected = "127.0.0.1" if workers_here else ray_session.util.get_node_ip_address()
        assert found == [expected]
    finally:
        sampler.close()
