"""torchrun's rendezvous backend ``astrai``: a store that listens on one address only.

Every rendezvous torch ships (``static``, ``c10d``, ``--standalone``) starts torch's
TCPStore, which listens on every interface whatever host it is given, answers anyone
without authentication, and (``c10d``) unpickles what it reads back from it. This backend
is torch's static rendezvous with one change: the store's socket is bound here, to the
endpoint's address alone, before the store takes it over (TCPStore's
``master_listen_fd``): on one machine 127.0.0.1 on a free port, on several machines the
node-rank-0 machine's ``--master-addr``. The ranks' process groups use this same store
(torchrun's agent store), so nothing else of the run listens for one.

``astrai train --nproc-per-node`` selects it; a hand launch names it
(``torchrun --rdzv-backend astrai ...``), which torchrun finds through the package's
``torchrun.handlers`` entry point (:func:`creator`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from astrai_core.distributed.loopback import LOOPBACK, listen_socket
from astrai_core.errors import ConfigError

BACKEND = "astrai"
DEFAULT_TIMEOUT_S = 600  # torch's static rendezvous's default


def endpoint(host: str, port: int) -> str:
    """``host:port`` as torchrun's ``--rdzv-endpoint`` reads it (an IPv6 host bracketed)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def creator() -> Callable[[Any], Any]:
    """The ``torchrun.handlers`` entry point: torchrun registers what this returns under
    the entry point's name. Nothing of torch is imported here, since torchrun loads it
    while its own rendezvous package is still importing."""
    return create_handler


def create_handler(params: Any) -> Any:
    """The handler for torchrun's ``RendezvousParameters``: node rank 0 binds its
    listening socket now, so a wrong address fails before any process starts."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    from astrai_core.distributed.bound_store import BoundStoreRendezvous

    host, port = parse_rendezvous_endpoint(params.endpoint.strip() or endpoint(LOOPBACK, 0),
                                           default_port=0)
    rank = params.get_as_int("rank", 0 if params.max_nodes == 1 else None)
    if rank is None:
        raise ConfigError(f"the {BACKEND} rendezvous of a multi-node run needs the node's "
                          "rank: --rdzv-conf rank=NODE_RANK (0 on the --rdzv-endpoint machine)")
    if rank != 0 and port == 0:
        raise ConfigError(f"the {BACKEND} rendezvous of a multi-node run needs a fixed port: "
                          "--master-port (or --rdzv-endpoint HOST:PORT)")
    listener = bind(host, port) if rank == 0 else None
    if listener is not None:
        port = listener.getsockname()[1]
    return BoundStoreRendezvous(BACKEND, listener, host, port, rank, params.max_nodes,
                                params.run_id, params.get_as_int("timeout", DEFAULT_TIMEOUT_S))


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one), on that address only."""
    try:
        return listen_socket(host, port)
    except socket.gaierror as error:
        raise ConfigError(f"--master-addr {host}: not an address this machine can resolve "
                          f"({error.strerror})") from None
    except OSError as error:
        raise ConfigError(
            f"--master-addr {host} --master-port {port}: the rendezvous cannot listen there "
            f"({error.strerror}); node rank 0 listens on that address alone, so it must be one "
            "of this machine's own addresses and the port a free one") from None
