"""Hosts for real-process tests: network namespaces on one bridge, and processes run in them.

Host i is a network namespace with the address SUBNET.(i+1)/24 on its ``eth0``; every host's
``eth0`` is a veth whose other end is on one bridge, which lives in a namespace of its own, so
nothing here touches the machine's network. :func:`hosts` builds them (or skips the test with
the reason where it cannot: it needs root and ``ip netns``), :meth:`Hosts.spawn` starts a
process in one, and :meth:`Hosts.cut` partitions two hosts until :meth:`Hosts.mend`. Leaving
:func:`hosts` kills whatever :meth:`Hosts.spawn` started that still runs, then deletes the
namespaces, which takes their links with them.

A cut is a pair of ``unreachable`` routes, one in each host's namespace, to the other's
address: every packet between the two is dropped where it is sent, so an established TCP
connection stalls (and resumes when the routes go), and a new one fails at once with "No route
to host", as a router that lost the way answers. Each host still reaches every host it is not
cut from, so a client on a third host sees both sides of a partition. (A cut that needs neither
nftables nor iptables, which are not everywhere the tests run; ``unreachable`` and ``blackhole``
routes are in every kernel.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Hosts", "compass_command", "hosts", "ip"]

_names = itertools.count()


def ip(*args: str) -> None:
    """Run ``ip ARGS``; raises :class:`subprocess.CalledProcessError` with its stderr."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def compass_command() -> list[str]:
    """The ``compass`` command of this interpreter's environment."""
    script = Path(sys.executable).with_name("compass")
    return [str(script)] if script.exists() else [sys.executable, "-m", "compass"]


class Hosts:
    """``count`` namespaces, host i at SUBNET.(i+1)/24 on its ``eth0``, all on one bridge in
    a hub namespace. Names carry ``prefix``, this process's id and a counter, so parallel runs
    and other tests' namespaces never collide; links are made inside the namespaces and go
    with them."""

    def __init__(self, count: int, *, subnet: str = "10.201.0", prefix: str = "cmh") -> None:
        tag = f"{os.getpid()}-{next(_names)}"
        self.subnet = subnet
        self.hub = f"{prefix}-hub-{tag}"
        self.spaces = [f"{prefix}-w{i}-{tag}" for i in range(count)]
        self._made: list[str] = []
        self._processes: list[asyncio.subprocess.Process] = []

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def build(self) -> None:
        self._add(self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for i, space in enumerate(self.spaces):
            self._add(space)
            ip("-n", space, "link", "set", "lo", "up")
            hub_end = f"v{i}"
            ip("-n", self.hub, "link", "add", hub_end, "type", "veth",
               "peer", "name", "eth0", "netns", space)  # fmt: skip
            ip("-n", self.hub, "link", "set", hub_end, "master", "br0")
            ip("-n", self.hub, "link", "set", hub_end, "up")
            ip("-n", space, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            ip("-n", space, "link", "set", "eth0", "up")
            # a default route gives a worker bound to 0.0.0.0 a primary address to advertise;
            # it leads only to the bridge, which has no other way out
            ip("-n", space, "route", "add", "default", "dev", "eth0")

    def _add(self, space: str) -> None:
        ip("netns", "add", space)
        self._made.append(space)

    async def spawn(
        self, i: int, argv: Sequence[str], *, env: dict[str, str], **kwargs: Any
    ) -> asyncio.subprocess.Process:
        """``argv`` run on host ``i`` (``asyncio.create_subprocess_exec``'s ``kwargs``). ``ip
        netns exec`` execs it, so the process is the command itself: a signal to it reaches
        the command."""
        process = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", self.spaces[i], *argv, env=env, **kwargs
        )
        self._processes.append(process)
        return process

    def cut(self, a: int, b: int) -> None:
        """Partition hosts ``a`` and ``b``: nothing either sends reaches the other."""
        for here, there in ((a, b), (b, a)):
            ip("-n", self.spaces[here], "route", "add", "unreachable", f"{self.address(there)}/32")

    def mend(self, a: int, b: int) -> None:
        """Undo :meth:`cut`."""
        for here, there in ((a, b), (b, a)):
            ip("-n", self.spaces[here], "route", "del", "unreachable", f"{self.address(there)}/32")

    def close(self) -> None:
        for process in self._processes:  # what its owner did not end (a test that failed)
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
        self._processes.clear()
        for space in reversed(self._made):  # a namespace takes its links and routes with it
            subprocess.run(["ip", "netns", "del", space], capture_output=True, timeout=20)
        self._made.clear()


@contextlib.contextmanager
def hosts(count: int, *, subnet: str = "10.201.0", prefix: str = "cmh") -> Iterator[Hosts]:
    """:class:`Hosts`, built, and closed on the way out; skips the test where namespaces
    cannot be made."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot build network namespaces")
    made = Hosts(count, subnet=subnet, prefix=prefix)
    try:
        try:
            made.build()
        except subprocess.CalledProcessError as exc:
            pytest.skip(
                f"cannot build network namespaces here (`{' '.join(exc.cmd)}`: "
                f"{(exc.stderr or '').strip()}); needs root and `ip netns`"
            )
        yield made
    finally:
        made.close()
