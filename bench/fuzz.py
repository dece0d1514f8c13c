"""``compass bench fuzz``: a real worker process under abuse, then whether it still serves.

Three kinds of traffic, from one seeded generator:

- random and mutated frames (bit flips, truncations, lying prefixes, nesting and element bombs,
  bad array descriptors, handshake messages after the handshake, plain noise), each on an
  authenticated client connection, some before authentication;
- malformed peer messages (``task``, ``result``, ``failed``, ``placed``, ``done``,
  ``heartbeat``, ``rumors``, ``watch`` with bodies that are near misses or nonsense) on an
  authenticated ``worker``-role connection, as a peer that holds the token but misbehaves
  would send them;
- idle unauthenticated sockets, many of them, while a real client connects.

After each frame the connection is probed with a ping: answered (the frame was survived),
closed by the worker (dropped), or neither within the socket timeout (hung: a failure). A frame
that announces more bytes than it carries is not probed: its connection is closed by us. The
report says how many frames of each kind went out, how the worker answered, whether it exited,
its RSS before and after, and whether it still answered ping, status and a real job.
"""

from __future__ import annotations

import asyncio
import random
import resource
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
import numpy as np

from compass.cluster import LocalCluster
from compass.config import Limits, parse_address
from compass.errors import CompassError
from compass.wire.codec import encode_message
from compass.wire.frames import PREFIX, FrameDecoder, encode_frame
from compass.wire.protocol import Connection, ErrorResponse, Event, Response, State
from compass.wire.transport import new_event_loop

from .report import machine, print_table, write_json

__all__ = [
    "PEER_OPS",
    "FrameFuzzer",
    "FuzzReport",
    "RawPeer",
    "fuzz_worker",
    "raise_file_limit",
    "rss_bytes",
    "run",
]

#: the app every fuzzed worker runs: its ``noop`` workflow is the real job checked at the end
APP = ("--app", "compass._bench.apps", "--log-level", "error")
#: one-way messages between workers
PEER_OPS = ("task", "result", "failed", "placed", "done", "heartbeat", "rumors", "watch")
#: requests a client or a peer may send
REQUEST_OPS = ("ping", "status", "trace", "submit", "join", "plan", "no-such-op", "$cancel")


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid``, from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise CompassError(f"/proc/{pid}/status has no VmRSS line")


def raise_file_limit(wanted: int) -> int:
    """Raise this process's soft limit on open files towards ``wanted`` (at most the hard
    limit); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return int(soft)


class RawPeer:
    """A compass peer on a plain blocking socket, driving the sans-IO
    :class:`~compass.wire.protocol.Connection` by hand: it can send what a
    :class:`~compass.wire.channel.Channel` never would, and need not read what it is sent."""

    def __init__(
        self,
        address: str,
        token: str | None,
        *,
        role: str = "client",
        name: str = "raw",
        timeout: float = 10.0,
    ) -> None:
        self.sock = socket.create_connection(parse_address(address), timeout=timeout)
        self.conn = Connection("initiator", token=token, name=name, peer_kind=role, limits=Limits())

    def handshake(self) -> RawPeer:
        """Authenticate (raises the typed error of a REFUSE, ``ConnectionError`` at EOF)."""
        self.send(b"".join(self.conn.initiate()))
        while self.conn.state is not State.READY:
            self.receive()
        return self

    def send(self, data: bytes | bytearray | memoryview) -> None:
        self.sock.sendall(data)

    def receive(self) -> list[Event]:
        """The events in what was received, waiting for bytes (up to the socket's timeout) if
        there are none yet.

        Raises ``ConnectionError`` when the peer closed, ``TimeoutError`` when nothing came,
        and the typed error of a REFUSE (after the events received before it).
        """
        events = self._events()
        if events:
            return events
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionResetError("the peer closed the connection")
        self.conn.receive_data(data)
        return self._events()

    def _events(self) -> list[Event]:
        events: list[Event] = []
        try:
            while (event := self.conn.next_event()) is not None:
                events.append(event)
        except CompassError:
            if not events:
                raise
            # the events before the error first; the connection raises it again next time
        out = self.conn.data_to_send()
        if out:
            self.send(b"".join(out))
        return events

    def request(self, op: str, body: Any = None) -> int:
        """Send request ``op``; returns its id (see :meth:`answer`)."""
        request_id = self.conn.send_request(op, body)
        self.send(b"".join(self.conn.data_to_send()))
        return request_id

    def notify(self, op: str, body: Any = None) -> None:
        self.conn.send_notify(op, body)
        self.send(b"".join(self.conn.data_to_send()))

    def answer(self, request_id: int) -> Response | ErrorResponse:
        """Read until the answer to ``request_id`` arrives."""
        while True:
            for event in self.receive():
                if isinstance(event, Response | ErrorResponse) and event.id == request_id:
                    return event

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- what to send ----------------------------------------------------------------------------


def _frame(message: Any) -> bytes:
    header, buffers = encode_message(message)
    return b"".join(encode_frame(header, buffers))


def _raw_frame(header: bytes, nbuf_lengths: tuple[int, ...] = (), payload: bytes = b"") -> bytes:
    """A frame around ``header`` whose prefix tells the truth about what follows."""
    lengths = struct.pack(f"<{len(nbuf_lengths)}Q", *nbuf_lengths)
    total = PREFIX.size + len(lengths) + len(header) + len(payload)
    return PREFIX.pack(total, len(header), len(nbuf_lengths)) + lengths + header + payload


@dataclass
class FrameFuzzer:
    """Seeded generator of hostile frames and peer messages."""

    seed: int
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def value(self, depth: int = 0) -> Any:
        """A random msgpack-able value, arrays included."""
        rng = self.rng
        kind = rng.randrange(12 if depth < 3 else 8)
        if kind == 0:
            return None
        if kind == 1:
            return rng.random() < 0.5
        if kind == 2:
            return rng.choice([0, -1, 1, 2**31, -(2**63), 2**64 - 1, rng.randrange(-1000, 1000)])
        if kind == 3:
            return rng.choice([0.0, -1.5, float("nan"), float("inf"), rng.random()])
        if kind == 4:
            return "".join(rng.choice("ab\u00e9\u4e2d\x00 ") for _ in range(rng.randrange(12)))
        if kind == 5:
            return rng.randbytes(rng.randrange(24))
        if kind == 6:
            return rng.choice(["", "noop", "w0", "t", "x", "chain_10", "job-1"])
        if kind == 7:
            dtype = rng.choice(["uint8", "float32", "int64", "bool", "complex64"])
            return np.zeros(rng.choice([(0,), (3,), (2, 2)]), dtype=dtype)
        if kind in (8, 9):
            return [self.value(depth + 1) for _ in range(rng.randrange(5))]
        return {self.key(): self.value(depth + 1) for _ in range(rng.randrange(5))}

    def key(self) -> Any:
        return self.rng.choice(
            ["job", "att", "wf", "task", "from", "value", "plan", "ingress", "sent", "t0",
             "worker", "message", "code", "n", "w", "m", "x", 0, 1.5, b"k", ""]
        )  # fmt: skip

    def peer_body(self, op: str) -> Any:
        """A body for peer message ``op``: a near miss of a real one, or nonsense."""
        rng = self.rng
        if rng.random() < 0.25:
            return self.value()
        body: dict[Any, Any] = {
            "job": rng.choice(["w0-1", "", "nope", "w9-99"]),
            "att": rng.choice([0, 1, -1, 2**40]),
            "task": rng.choice(["t", "nothing", "", "t0"]),
        }
        if op == "task":
            body.update(
                wf=rng.choice(["noop", "chain_10", "missing"]),
                value={"x": self.value()} if rng.random() < 0.5 else self.value(),
                plan=rng.choice([{"nothing": "w0"}, {}, {"t0": "ghost"}, {"a": 1}]),
                ingress=rng.choice(["w0", "ghost", ""]),
                sent=time.time(),
                t0=rng.choice([time.time(), -1.0, 1e300]),
                **{"from": rng.choice(["", "t", "nothing"])},
            )
        elif op == "result":
            body["value"] = self.value()
        elif op == "failed":
            body.update(worker="ghost", message="boom", code=rng.choice(["job_failed", "?", 3]))
        elif op == "placed":
            body["worker"] = rng.choice(["w0", "ghost", ""])
        elif op == "rumors":
            many = rng.choice([0, 1, 3, 65])
            body = {"s": [self.peer_body("heartbeat") for _ in range(many)]}
            if rng.random() < 0.5:
                body["sync"] = rng.choice([True, 1, "yes"])
        elif op == "watch":
            body = {"for_ms": rng.choice([2000.0, 0, -1.0, float("nan"), 1e300, "x", True])}
        elif op == "heartbeat":
            body = {
                "n": rng.choice(["ghost", "w0", "", "raw"]),
                "w": rng.choice([0.0, -1.0, float("nan"), 1e9, "x"]),
                "m": rng.choice([[], ["m"], "m", [1]]),
                "f": rng.choice([0, -5, 2**62]),
                "c": rng.choice([0, 1 << 30]),
                "l": rng.choice([0, 1, -1]),
                "b": rng.choice([0, 5]),
                "s": rng.choice([0, 1, 2**63 - 1]),
                "ld": rng.choice([[], ["m"]]),
            }
        for _ in range(rng.randrange(3)):  # then break a few fields
            if body:
                key = rng.choice(list(body))
                if rng.random() < 0.3:
                    del body[key]
                else:
                    body[key] = self.value()
        return body

    def message(self) -> list[Any]:
        """A well-formed envelope around random content."""
        rng = self.rng
        kind = rng.choice([4, 4, 4, 5, 6, 7, 7, 0, 1, 2, 3, 8, -1])
        if kind == 4:
            return [4, rng.randrange(1, 1 << 20), rng.choice(REQUEST_OPS), self.value()]
        if kind == 5:
            return [5, rng.randrange(1 << 20), self.value()]
        if kind == 6:
            return [6, rng.randrange(1 << 20), "protocol", "x", self.value()]
        if kind == 7:
            return [7, rng.choice([*PEER_OPS, "$cancel", "unknown"]), self.value()]
        return [kind, *(self.value() for _ in range(rng.randrange(4)))]

    def frame(self) -> bytes:
        """One hostile frame (or a few bytes that are not one)."""
        rng = self.rng
        base = _frame(self.message())
        choice = rng.randrange(10)
        if choice == 0:  # flip bytes anywhere
            data = bytearray(base)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            return bytes(data)
        if choice == 1:  # flip bytes in the header, keep the prefix true
            flipped = bytearray(base[PREFIX.size :])
            for _ in range(rng.randrange(1, 4)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            return _raw_frame(bytes(flipped))
        if choice == 2:  # truncate or extend the header, keep the prefix true
            original = base[PREFIX.size :]
            cut = rng.randrange(1, len(original) + 1)
            return _raw_frame(original[:cut] + rng.randbytes(rng.randrange(4)))
        if choice == 3:  # a lying prefix
            total, hlen, nbuf = PREFIX.unpack_from(base)
            total = rng.choice([total - 1, total + 7, 0, 2**64 - 1, 1 << 29, 1 << 31])
            hlen = rng.choice([hlen, 0, 2**32 - 1, 1 << 21])
            nbuf = rng.choice([nbuf, 1, 5000, 2**32 - 1])
            return PREFIX.pack(total, hlen, nbuf) + base[PREFIX.size :]
        if choice == 4:  # nesting past max_depth
            depth = rng.choice([65, 200, 5000])
            return _raw_frame(b"\x94\x04\x01\xa4ping" + b"\x91" * depth + b"\xc0")
        if choice == 5:  # many objects: empty arrays, maps, short strings
            count = rng.choice([1 << 16, 1 << 18, (1 << 20) - 64])
            filler = rng.choice([b"\x90", b"\x80", b"\xa1a"])
            body = b"\xdd" + struct.pack(">I", count) + filler * count
            header = b"\x94\x04" + bytes([rng.randrange(1, 100)]) + b"\xa4echo" + body
            return _raw_frame(header[: (1 << 20) - 64] if rng.random() < 0.8 else header)
        if choice == 6:  # array descriptors that lie about their buffers
            meta = msgpack.packb(
                [rng.choice([0, 1, -1, 7]), rng.choice(["uint8", "float64", "bogus", 3]),
                 rng.choice([[4], [-1], [2**40], "x", [1] * 40])]
            )  # fmt: skip
            ext = msgpack.ExtType(rng.choice([1, 2, 9]), meta)
            header = msgpack.packb([4, 1, "ping", [ext] * rng.randrange(1, 4)])
            lengths = tuple(rng.choice([0, 4, 8]) for _ in range(rng.randrange(3)))
            payload = bytearray()
            for length in lengths:
                payload += bytes(-len(payload) % 64) + bytes(length)
            return _raw_frame(header, lengths, bytes(payload))
        if choice == 7:  # noise
            return rng.randbytes(rng.randrange(1, 64))
        return base  # well framed, random content


# -- running it -----------------------------------------------------------------------------


@dataclass
class FuzzReport:
    """What :func:`fuzz_worker` sent and how the worker answered."""

    frames: int = 0
    peer_messages: int = 0
    survived: int = 0  # connections that answered a ping after a fuzzed frame
    peer_probes_answered: int = 0  # pings answered after malformed peer messages
    dropped: int = 0  # connections the worker closed after a fuzzed frame
    dropped_peer: int = 0  # worker-role connections closed after a malformed peer message
    unprobed: int = 0  # frames announcing more bytes than they carry: closed by us
    hung: int = 0  # probes with no answer and no close within the timeout
    health_checks: int = 0
    health_failures: int = 0
    notes: list[str] = field(default_factory=list)


def _classify(frame: bytes) -> str:
    """How the worker's framer will take ``frame``: ``"error"``, ``"complete"``, ``"partial"``."""
    decoder = FrameDecoder(Limits())
    decoder.receive_data(frame)
    try:
        while decoder.next_frame() is not None:
            pass
    except CompassError:
        return "error"
    return "complete" if decoder.drained else "partial"


def _probe(peer: RawPeer) -> str:
    """``"answered"`` if ``peer`` still answers a ping, ``"dropped"`` if the worker closed it,
    ``"hung"`` if neither happened within the socket's timeout."""
    try:
        request_id = peer.request("ping", None)
        peer.answer(request_id)
    except TimeoutError:
        return "hung"
    except (OSError, CompassError):
        return "dropped"
    # the answer may have come with the worker's REFUSE right behind it
    return "dropped" if peer.conn.state is State.FAILED else "answered"


def fuzz_worker(
    address: str,
    token: str | None,
    *,
    frames: int,
    seed: int = 0,
    alive: Callable[[], bool] = lambda: True,
    timeout: float = 10.0,
) -> FuzzReport:
    """Send ``frames`` hostile frames and peer messages (about half each) to the worker at
    ``address``; blocking (run it in a thread). Stops early if ``alive()`` turns false."""
    fuzzer = FrameFuzzer(seed)
    rng = fuzzer.rng
    report = FuzzReport()
    client: RawPeer | None = None
    peer: RawPeer | None = None

    def health() -> None:
        report.health_checks += 1
        try:
            with RawPeer(address, token, name="health", timeout=timeout) as checker:
                checker.handshake()
                answer = checker.answer(checker.request("status"))
                if not (isinstance(answer, Response) and isinstance(answer.body, dict)):
                    raise CompassError(f"status answered {answer!r:.200}")
        except (OSError, CompassError) as exc:
            report.health_failures += 1
            report.notes.append(f"health check {report.health_checks} failed: {exc!r:.200}")

    try:
        for index in range(frames):
            if not alive():
                report.notes.append(f"worker exited after {index} frames")
                break
            if index % 200 == 0:
                health()
            if rng.random() < 0.5:
                if peer is not None and peer.conn.state is State.FAILED:
                    report.dropped_peer += 1
                    peer.close()
                    peer = None
                if peer is None:
                    peer = RawPeer(address, token, role="worker", name=f"fuzz-peer-{index}",
                                   timeout=timeout).handshake()  # fmt: skip
                op = rng.choice(PEER_OPS)
                try:
                    peer.notify(op, fuzzer.peer_body(op))
                except CompassError:  # our side refused to encode it: nothing was sent
                    continue
                except OSError:
                    report.dropped_peer += 1
                    peer.close()
                    peer = None
                    continue
                report.peer_messages += 1
                if index % 8 == 0:
                    outcome = _probe(peer)
                    if outcome != "answered":
                        report.dropped_peer += outcome == "dropped"
                        report.hung += outcome == "hung"
                        peer.close()
                        peer = None
                    else:
                        report.peer_probes_answered += 1
                continue
            report.frames += 1
            frame = fuzzer.frame()
            kind = _classify(frame)
            before_auth = rng.random() < 0.1
            if before_auth:
                with socket.create_connection(parse_address(address), timeout=timeout) as raw:
                    raw.sendall(frame)
                continue
            if client is not None and client.conn.state is State.FAILED:
                client.close()
                client = None
            if client is None:
                client = RawPeer(address, token, name=f"fuzz-{index}", timeout=timeout)
                client.handshake()
            try:
                client.send(frame)
            except OSError:
                report.dropped += 1
                client.close()
                client = None
                continue
            if kind == "partial":
                report.unprobed += 1
                client.close()
                client = None
                continue
            outcome = _probe(client)
            if outcome == "answered":
                report.survived += 1
            else:
                report.dropped += outcome == "dropped"
                report.hung += outcome == "hung"
                client.close()
                client = None
        if alive():
            health()
    finally:
        for open_peer in (client, peer):
            if open_peer is not None:
                open_peer.close()
    return report


async def idle_sockets(address: str, count: int) -> list[socket.socket]:
    """Open ``count`` TCP connections to ``address`` that never say anything."""
    loop = asyncio.get_running_loop()
    sockets = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, parse_address(address))
        except OSError:
            sock.close()
            raise
        sockets.append(sock)
    return sockets


async def _measure(frames: int, seed: int, idle: int) -> dict[str, Any]:
    raise_file_limit(idle + 256)
    async with LocalCluster(1, args=APP) as cluster:
        worker = cluster.workers[0]
        pid = worker.process.pid
        async with cluster.client() as client:
            for i in range(20):  # warm up: imports, caches
                await client.submit("noop", x=i)
            rss_start = rss_bytes(pid)
            # many idle sockets, then a real client
            sockets = await idle_sockets(worker.address, idle)
            await asyncio.sleep(1.0)
            rss_idle = rss_bytes(pid)
            idle_client_ok = True
            try:
                async with cluster.client() as newcomer:
                    await newcomer.ping()
            except CompassError:
                idle_client_ok = False
            for sock in sockets:
                sock.close()
            t0 = time.perf_counter()
            report = await asyncio.to_thread(
                fuzz_worker,
                worker.address,
                cluster.token,
                frames=frames,
                seed=seed,
                alive=lambda: worker.running,
            )
            fuzz_s = time.perf_counter() - t0
            crashed = not worker.running
            serving = False
            if not crashed:
                try:
                    async with cluster.client() as after:
                        await after.ping()
                        await after.status()
                        serving = await after.submit("noop", x=41) == 41
                except CompassError as exc:
                    report.notes.append(f"after the fuzz: {exc!r:.200}")
            rss_end = rss_bytes(pid) if not crashed else 0
        log_text = worker.log_path.read_text(errors="replace")
    return {
        "frames_requested": frames,
        "seed": seed,
        **asdict(report),
        "crashes": int(crashed),
        # the worker logs at ERROR level: a traceback is an exception the wire or the worker
        # did not expect (a peer's garbage is a WARNING at most)
        "worker_tracebacks": log_text.count("Traceback"),
        "kept_serving": serving,
        "fuzz_s": fuzz_s,
        "rss_start_bytes": rss_start,
        "rss_end_bytes": rss_end,
        "idle_sockets": idle,
        "rss_with_idle_sockets_bytes": rss_idle,
        "client_got_in_past_idle_sockets": idle_client_ok,
    }


def run(
    frames: int = 2000, seed: int = 0, idle: int = 3000, json_path: str | None = None
) -> dict[str, Any]:
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(_measure(frames, seed, idle))
    finally:
        loop.close()
    mb = 1e6
    print_table(
        f"fuzz: {frames} frames and peer messages (seed {seed}) against one worker process",
        ["what", "value"],
        [
            ["random / mutated frames sent", result["frames"]],
            ["malformed peer messages sent", result["peer_messages"]],
            ["connections that survived a frame", result["survived"]],
            ["pings answered after peer messages", result["peer_probes_answered"]],
            ["connections dropped by the worker (frames)", result["dropped"]],
            ["connections dropped by the worker (peer messages)", result["dropped_peer"]],
            ["frames left incomplete (closed by us)", result["unprobed"]],
            ["probes hung", result["hung"]],
            ["health checks failed", f"{result['health_failures']} / {result['health_checks']}"],
            ["worker crashes (exit)", result["crashes"]],
            ["tracebacks in the worker's log", result["worker_tracebacks"]],
            ["kept serving (ping, status, a job)", str(result["kept_serving"])],
            ["RSS before / after fuzz (MB)",
             f"{result['rss_start_bytes'] / mb:.1f} / {result['rss_end_bytes'] / mb:.1f}"],
            [f"RSS with {idle} idle sockets (MB)", result["rss_with_idle_sockets_bytes"] / mb],
            ["a client got in past them", str(result["client_got_in_past_idle_sockets"])],
            ["fuzz seconds", result["fuzz_s"]],
        ],
    )  # fmt: skip
    for note in result["notes"]:
        print(note)
    result["machine"] = machine()
    write_json(json_path, result)
    return result
