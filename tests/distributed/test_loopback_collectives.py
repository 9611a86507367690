"""A one-machine run forms its process group with the collective library on the loopback
interface (gloo, and NCCL unless the user chose its interface), and puts the environment
back afterwards, so a later group (a weight push to rollout workers on other machines)
is formed as the user's environment says."""

from __future__ import annotations

import os

from astrai_core.devices.cpu import CpuBackend
from astrai_core.devices.cuda import CudaBackend
from astrai_core.distributed.context import _loopback_collectives


def _seen(backend, monkeypatch, local: str, world: str) -> dict[str, str | None]:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    monkeypatch.setenv("WORLD_SIZE", world)
    names = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    with _loopback_collectives(backend):
        inside = {name: os.environ.get(name) for name in names}
    assert os.environ.get("GLOO_SOCKET_IFNAME") == "eth7"  # put back
    return inside


def test_gloo_is_on_loopback_while_a_one_machine_group_forms(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # e.g. a cluster-wide setting
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert _seen(CpuBackend(), monkeypatch, "2", "2") == {
        "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": None}
    assert _seen(CudaBackend(), monkeypatch, "2", "2") == {
        "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert "NCCL_SOCKET_IFNAME" not in os.environ


def test_several_machines_and_a_chosen_nccl_interface_are_left_alone(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    assert _seen(CpuBackend(), monkeypatch, "2", "4") == {
        "GLOO_SOCKET_IFNAME": "eth7", "NCCL_SOCKET_IFNAME": "ib0"}
    assert _seen(CudaBackend(), monkeypatch, "2", "2") == {
        "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "ib0"}
