"""Where the run's torch.distributed sockets listen: torch's TCPStore served on one interface
only, and gloo's device on loopback when the group's host is loopback.

What torch 2.13's TCPStore allows (read in its bindings and TCPStore.hpp, and checked on this
machine): its server, libuv or legacy, listens on every interface (`::`, dual-stack) whatever host
it is given; it has no authentication of any kind; and any client that reaches the port may
`set`, `get`, `add`, `compare_set`, `delete_key`, `num_keys` and `list_keys` (LIST_KEYS in its
protocol), so a key prefix hides nothing from a client that can connect. What it does allow is
`master_listen_fd`: a socket already bound and listening. rlrun binds that socket itself on the
host it is given — loopback with world=local, the cluster interface under Ray — so nothing off
that interface can connect, and prefixes its keys per run (`run_prefix`), which keeps apart the
stores of two runs or of two formations of one group, not a local user who wants in.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import socket

LOOPBACK = ("127.0.0.1", "localhost", "::1")  # the host names that never leave this machine
BACKLOG = 128


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port` (0: any free port) and listening: `host` only, never the
    wildcard address. SO_REUSEADDR: a restarted process takes its port back at once."""
    family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def serve_store(host: str, port: int, world_size: int, timeout_s: float):
    """A TCPStore server (and client) listening on `host`:`port` only; it runs until the returned
    store is dropped. `port` 0: a free one (the store's `.port`)."""
    import torch.distributed as dist

    sock = listening_socket(host, port)
    bound_port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the descriptor from here on
    try:
        return dist.TCPStore(
            host,
            bound_port,
            world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            master_listen_fd=fd,
        )
    except BaseException:
        os.close(fd)
        raise


def interface_of(address: str) -> str | None:
    """The network interface holding `address` ("lo" for 127.0.0.1 on Linux), None if none does:
    GLOO_SOCKET_IFNAME for ranks whose group meets on loopback (gloo's default device is the one of
    the machine's host name, which may be any interface)."""
    import psutil

    try:
        wanted = {info[4][0] for info in socket.getaddrinfo(address, None)}
    except socket.gaierror:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] in wanted for a in addresses):
            return name
    return None


def run_prefix(secret: str) -> str:
    """The run's key prefix in its stores, derived from a run secret (never the secret itself)."""
    return "run-" + hashlib.sha256(b"rlrun tcp store\0" + secret.encode()).hexdigest()[:16] + "/"
