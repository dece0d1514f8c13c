"""Where peers reach this worker: the address it advertises, found from what it bound to, what
it was told (``--advertise-address``) and, for a wildcard bind, the host's route out or name.

The one module of membership that asks the operating system (a routing lookup, the host name):
the member table (:mod:`~compass.membership.table`) and its adapter
(:mod:`~compass.worker.membership`) only carry the address it finds.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket

from compass.config import parse_address
from compass.errors import ConfigError

__all__ = ["advertised_address", "default_worker_name", "join_host_port", "primary_address"]

log = logging.getLogger("compass.worker")

#: addresses that mean "every interface here": peers cannot connect to them
_WILDCARDS = ("0.0.0.0", "::", "")


def join_host_port(host: str, port: int) -> str:
    """``HOST:PORT``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def primary_address(ipv6: bool = False) -> str:
    """This host's primary address: the source address of its route to the outside world (a
    UDP socket's ``connect`` to a documentation address picks the route and sends nothing),
    else what the host name resolves to, else loopback."""
    family, probe = (
        (socket.AF_INET6, ("2001:db8::1", 9)) if ipv6 else (socket.AF_INET, ("192.0.2.1", 9))
    )
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(probe)
        host = str(sock.getsockname()[0])
        if not _is_loopback(host) and host not in _WILDCARDS:
            return host
    if not ipv6:
        with contextlib.suppress(OSError):
            host = socket.gethostbyname(socket.gethostname())
            if not _is_loopback(host):
                return host
    return "::1" if ipv6 else "127.0.0.1"


def default_worker_name(port: int) -> str:
    """A worker started without ``--name`` is ``<host>-<port>``: unique wherever hosts are."""
    return f"{socket.gethostname().split('.')[0] or 'worker'}-{port}"


def advertised_address(bound_host: str, port: int, advertise: str = "") -> str:
    """The ``HOST:PORT`` this worker tells its peers to reach it at.

    ``advertise`` (``HOST`` or ``HOST:PORT``, the bound ``port`` when it has none) wins: a worker
    behind NAT or in a container knows better. Otherwise the bound host, unless it is a wildcard
    (``0.0.0.0``, ``::``), which no peer can connect to: then :func:`primary_address`. A worker
    never advertises a wildcard.
    """
    if advertise:
        host, given = parse_address(advertise, default_port=0)
        if host in _WILDCARDS:
            raise ConfigError(f"advertise address {advertise!r}: peers cannot reach a wildcard")
        return join_host_port(host, given or port)
    if bound_host in _WILDCARDS:
        host = primary_address(ipv6=bound_host == "::")
        if _is_loopback(host):
            log.warning("bound to %s but found no address other hosts can reach (no route out, "
                        "the host name resolves to loopback); advertising %s: give "
                        "--advertise-address", bound_host, host)  # fmt: skip
        return join_host_port(host, port)
    return join_host_port(bound_host, port)
