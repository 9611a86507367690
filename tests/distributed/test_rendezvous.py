"""The `astrai` rendezvous backend's handler: node rank 0 binds the endpoint's address
alone (127.0.0.1 on a free port when none is given), and a wrong address, a missing node
rank or a missing port is one ConfigError naming the option, before any process starts."""

from __future__ import annotations

import socket

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from astrai_core.distributed.rendezvous import BACKEND, create_handler, creator
from astrai_core.errors import ConfigError


def _params(endpoint: str, max_nodes: int = 1, **conf: object) -> RendezvousParameters:
    return RendezvousParameters(BACKEND, endpoint, "run", 1, max_nodes, **conf)


def _bound(handler) -> tuple[str, int]:
    return handler._listener.getsockname()[:2]


def test_one_machine_binds_loopback_on_a_free_port():
    for endpoint in ("", "127.0.0.1:0"):
        handler = create_handler(_params(endpoint))
        host, port = _bound(handler)
        assert host == "127.0.0.1" and port > 0 and handler.master_port == port
        assert handler.get_backend() == BACKEND and handler._listener is not None
        handler._listener.close()
    assert creator() is create_handler  # what torchrun registers from the entry point


def test_the_store_serves_the_socket_bound_and_nothing_else():
    handler = create_handler(_params("127.0.0.1:0"))
    info = handler.next_rendezvous()
    info.store.set("key", b"value")
    assert info.bootstrap_store_info.master_addr == "127.0.0.1"
    assert info.bootstrap_store_info.master_port == handler.master_port
    with socket.create_connection(("127.0.0.1", handler.master_port), timeout=5):
        pass  # served on the port it was bound to


def test_a_node_other_than_rank_0_binds_nothing():
    handler = create_handler(_params("127.0.0.1:29999", max_nodes=2, rank=1))
    assert handler._listener is None and handler.master_port == 29999


@pytest.mark.parametrize("params, says", [
    (_params("192.0.2.250:29500", max_nodes=2, rank=0), "--master-addr 192.0.2.250"),
    (_params("127.0.0.1:29500", max_nodes=2), "--rdzv-conf rank=NODE_RANK"),
    (_params("127.0.0.1:0", max_nodes=2, rank=1), "--master-port"),
])
def test_a_wrong_endpoint_is_one_config_error(params, says):
    with pytest.raises(ConfigError, match=says):
        create_handler(params)


def test_a_name_that_does_not_resolve_is_named(monkeypatch):
    def unknown(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)  # no resolver is asked
    with pytest.raises(ConfigError, match="--master-addr nodes-0: not an address"):
        create_handler(_params("nodes-0:29500", max_nodes=2, rank=0))


def test_a_port_in_use_is_named():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--master-port {port}.*Address already in use"):
            create_handler(_params(f"127.0.0.1:{port}"))


@pytest.mark.slow  # plans a run before the launch fails
def test_the_launcher_says_a_wrong_master_addr_in_one_line(tmp_path):
    from tests.distributed.conftest import train
    from tests.training.conftest import tiny_config

    done = train(tiny_config(tmp_path, max_steps=2, progress=False), tmp_path, "run", 2,
                 "--nnodes", "2", "--master-addr", "192.0.2.250", "--master-port", "29500")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: --master-addr 192.0.2.250 --master-port 29500: the rendezvous cannot listen")
    assert not (tmp_path / "run").exists()  # no process was started
