"""Hosts for a benchmark: network namespaces on one bridge, and a cut link between two of them.

The construction of tests/integration/netns.py (which a benchmark cannot import): host i is a
network namespace with the address SUBNET.(i+1)/24 on its ``eth0``, a veth whose other end is
on one bridge that lives in a namespace of its own, so nothing here touches the machine's
network. A cut is a pair of ``unreachable`` routes, one in each host, to the other's address:
an established connection between the two stalls, a new one fails with "No route to host", and
every other host still reaches both. :meth:`Namespaces.enter` moves the calling thread (the
event loop's) into one of the hosts, so the benchmark's clients reach the workers as a client
on a machine of its own would. Needs root and ``ip netns`` (:func:`unavailable` says why not).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import subprocess
import sys

__all__ = ["Namespaces", "unavailable"]

#: setns(2)'s flag for a network namespace
CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here; None where they can (one is made and
    deleted to find out)."""
    if sys.platform != "linux":
        return f"network namespaces are Linux's ({sys.platform} here)"
    if os.geteuid() != 0:
        return "not root: making network namespaces needs root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"cmc-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` failed: {(exc.stderr or '').strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return None


class Namespaces:
    """``count`` hosts, host i at SUBNET.(i+1) on its ``eth0``, all on one bridge in a hub
    namespace. Names carry ``prefix`` and this process's id, so parallel runs never collide;
    :meth:`close` deletes them, which takes their links and routes with them."""

    def __init__(self, count: int, *, subnet: str = "10.207.0", prefix: str = "cmc") -> None:
        tag = f"{os.getpid()}"
        self.subnet = subnet
        self.hub = f"{prefix}-hub-{tag}"
        self.spaces = [f"{prefix}-h{i}-{tag}" for i in range(count)]
        self._made: list[str] = []
        self._home: int | None = None  # the entering thread's own namespace, while entered

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def build(self) -> None:
        """Make the hosts and the bridge; on failure, what was made is deleted."""
        try:
            self._add(self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for i, space in enumerate(self.spaces):
                self._add(space)
                _ip("-n", space, "link", "set", "lo", "up")
                _ip("-n", self.hub, "link", "add", f"v{i}", "type", "veth",
                    "peer", "name", "eth0", "netns", space)  # fmt: skip
                _ip("-n", self.hub, "link", "set", f"v{i}", "master", "br0")
                _ip("-n", self.hub, "link", "set", f"v{i}", "up")
                _ip("-n", space, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                _ip("-n", space, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise

    def _add(self, space: str) -> None:
        _ip("netns", "add", space)
        self._made.append(space)

    def command(self, i: int) -> list[str]:
        """The prefix that runs a command on host ``i`` (``ip netns exec`` execs it, so the
        process is the command itself: a signal to it reaches the command)."""
        return ["ip", "netns", "exec", self.spaces[i]]

    async def cut(self, a: int, b: int) -> None:
        """Partition hosts ``a`` and ``b``: nothing either sends reaches the other."""
        await self._routes("add", a, b)

    async def mend(self, a: int, b: int) -> None:
        """Undo :meth:`cut`."""
        await self._routes("del", a, b)

    async def _routes(self, verb: str, a: int, b: int) -> None:
        for here, there in ((a, b), (b, a)):
            argv = ["ip", "-n", self.spaces[here], "route", verb, "unreachable",
                    f"{self.address(there)}/32"]  # fmt: skip
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            _, err = await process.communicate()
            if process.returncode:
                raise OSError(f"`{' '.join(argv)}` failed: {err.decode().strip()}")

    def enter(self, i: int) -> None:
        """Move the calling thread into host ``i`` (its sockets are made there from now on)
        until :meth:`leave`."""
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        _setns(f"/var/run/netns/{self.spaces[i]}")

    def leave(self) -> None:
        """Move the thread that entered back to its own namespace."""
        if self._home is None:
            return
        try:
            _setns_fd(self._home)
        finally:
            os.close(self._home)
            self._home = None

    def close(self) -> None:
        """Delete the hosts (and the hub); a thread still inside one is moved out first."""
        self.leave()
        for space in reversed(self._made):
            subprocess.run(["ip", "netns", "del", space], capture_output=True, timeout=20)
        self._made.clear()


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _setns_fd(fd)
    finally:
        os.close(fd)


def _setns_fd(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")
