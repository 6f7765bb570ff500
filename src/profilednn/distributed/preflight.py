"""Checks made before a distributed job starts: a free port, whether an address is this
machine's loopback, and whether the rendezvous master can work (bindable on node rank 0,
reachable from the others)."""

from __future__ import annotations

import errno
import ipaddress
import socket
import time

from .plan import PlanError


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``addr`` right now (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def resolve_address(addr: str) -> str:
    """``addr``'s IPv4 address; PlanError when it does not resolve."""
    try:
        return socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        raise PlanError(f"master address {addr!r} does not resolve: {exc.strerror}") from exc


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` resolves to a loopback address (False when it does not resolve)."""
    try:
        return ipaddress.ip_address(resolve_address(addr)).is_loopback
    except PlanError:
        return False


def check_master(addr: str, port: int, node_rank: int, *, connect_timeout: float = 60.0) -> None:
    """Fail before anything starts when the rendezvous master cannot work.

    Node rank 0 hosts the rendezvous store, so ``addr:port`` must be bindable here (an
    address of this machine, a free port). Other nodes must reach it: they retry
    connecting for up to ``connect_timeout`` seconds, since node 0 may still be starting.
    """
    if not 0 < port < 65536:
        raise PlanError(f"--master-port must be in 1..65535, not {port}")
    ip = resolve_address(addr)
    if node_rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PlanError(f"master port {port} is already in use on {addr}; pick another "
                                    "--master-port") from exc
                raise PlanError(f"node rank 0 hosts the rendezvous but cannot bind {addr}:{port} "
                                f"({exc.strerror}); --master-addr must be an address of this "
                                "machine") from exc
        return
    deadline = time.monotonic() + connect_timeout
    last: OSError | None = None
    while True:
        try:
            with socket.create_connection((ip, port), timeout=min(5.0, connect_timeout)):
                return
        except OSError as exc:
            last = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    raise PlanError(f"cannot reach the master {addr}:{port} from node rank {node_rank} within "
                    f"{connect_timeout:g} s ({getattr(last, 'strerror', None) or last}); start node "
                    "rank 0 first and check --master-addr/--master-port")


__all__ = ["check_master", "free_port", "is_loopback", "resolve_address"]
