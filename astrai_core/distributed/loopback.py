"""Listening on one address only: a store whose socket is bound beforehand, and the
collective library kept on the loopback interface while a group of processes that all
share this machine is created.

torch's TCPStore listens on every interface whatever host it is given, and answers anyone
without authentication; gloo (and NCCL's bootstrap) listen on the address the host name
resolves to. :func:`bound_store` binds the store's socket here, to ``host`` alone, before
the store takes it over (TCPStore's ``master_listen_fd``); :func:`loopback_collectives`
names the loopback interface to the device backend's collective library
(``DeviceBackend.loopback_env``). Nothing of torch is imported at module level: the
``astrai`` rendezvous (:mod:`astrai_core.distributed.rendezvous`) binds with
:func:`listen_socket` while torchrun's own packages are still importing.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from astrai_core.distributed.world import scoped_env

LOOPBACK = "127.0.0.1"


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo``, ``lo0``), if it has one."""
    return next((name for _, name in socket.if_nameindex() if name in ("lo", "lo0")), None)


@contextlib.contextmanager
def loopback_collectives(backend: Any) -> Iterator[None]:
    """While a process group of ranks that all share this machine is created: ``backend``'s
    collective library (gloo, NCCL's bootstrap) listens on the loopback interface, not on
    the address the host name resolves to. Every rank of the group creates it inside."""
    interface = loopback_interface()
    if interface is None:
        yield
        return
    with scoped_env(backend.loopback_env(interface)):
        yield


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one), on that address only, not
    yet listening; ``OSError`` (``socket.gaierror`` for a name that does not resolve)
    when it cannot be bound there."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a previous run's TIME_WAIT
    try:
        listener.bind(address)
    except OSError:
        with contextlib.suppress(OSError):
            listener.close()
        raise
    return listener


def bound_store(host: str, world_size: int, timeout: timedelta) -> Any:
    """A master ``torch.distributed.TCPStore`` for ``world_size`` processes that listens on
    ``host`` alone, on a free port (``store.port``); it returns at once, without waiting
    for the other processes to connect."""
    from torch.distributed import TCPStore

    listener = listen_socket(host, 0)
    port = listener.getsockname()[1]
    # the store owns the descriptor from here (it closes it when it is destroyed)
    return TCPStore(host, port, world_size=world_size, is_master=True, timeout=timeout,
                    wait_for_workers=False, master_listen_fd=listener.detach())
