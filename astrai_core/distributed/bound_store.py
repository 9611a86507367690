"""The handler of the ``astrai`` rendezvous (:mod:`astrai_core.distributed.rendezvous`):
torch's static rendezvous whose store serves a socket bound beforehand."""

from __future__ import annotations

import socket

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousInfo
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous


class BoundStoreRendezvous(StaticTCPRendezvous):
    """Node rank 0 serves the store on ``listener`` (bound to ``host:port`` alone); the
    other nodes, and every rank through torchrun's agent store, connect to it."""

    def __init__(self, name: str, listener: socket.socket | None, host: str, port: int,
                 rank: int, world_size: int, run_id: str, timeout: int) -> None:
        super().__init__(host, port, rank, world_size, run_id, timeout)
        self._name = name
        self._listener = listener

    def get_backend(self) -> str:
        return self._name

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            # the store owns the descriptor from here (it closes it when it is destroyed)
            listen_fd = self._listener.detach() if self._listener is not None else None
            self._listener = None
            self._store = TCPStore(self.master_addr, self.master_port, self.world_size,
                                   is_master=listen_fd is not None,
                                   timeout=self.timeout,
                                   master_listen_fd=listen_fd)
        return super().next_rendezvous()
