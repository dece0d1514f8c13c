"""The transport over real loopback sockets, with an in-process server (and one peer process)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import ssl
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import torch

from compass.config import Limits, Timeouts
from compass.errors import (
    AuthenticationError,
    CompassTimeout,
    ConfigError,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    ProtocolError,
    RemoteError,
    UnknownOperation,
    UnknownWorkflow,
    WorkerUnavailable,
)
from compass.wire.rpc import Router
from compass.wire.transport import (
    Channel,
    ChannelOptions,
    Handler,
    Server,
    connect,
    install_event_loop_policy,
    new_event_loop,
    serve,
)

TOKEN = "cluster-secret"
FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=2.0)


def make_router() -> tuple[Router, list[Any]]:
    router = Router()
    notes: list[Any] = []

    @router.request("echo")
    async def echo(channel: Channel, body: Any) -> Any:
        return body

    @router.request("sleep_echo")
    async def sleep_echo(channel: Channel, body: Any) -> Any:
        await asyncio.sleep(body["delay"])
        return body["value"]

    @router.request("wait")
    async def wait(channel: Channel, body: Any) -> Any:
        await body_events[body].wait()
        return "late"

    @router.request("cancellable")
    async def cancellable(channel: Channel, body: Any) -> Any:
        try:
            await asyncio.sleep(body)
        except asyncio.CancelledError:
            notes.append("cancelled")
            raise
        return "slept"

    @router.request("typed")
    async def typed(channel: Channel, body: Any) -> Any:
        raise UnknownWorkflow(f"no workflow {body!r}", detail={"workflow": body})

    @router.request("crash")
    async def crash(channel: Channel, body: Any) -> Any:
        return 1 // 0

    @router.request("unsendable")
    async def unsendable(channel: Channel, body: Any) -> Any:
        return {"x": object()}

    @router.request("ask_back")
    async def ask_back(channel: Channel, body: Any) -> Any:
        return await channel.request("client_op", body)

    @router.notify("note")
    def note(channel: Channel, body: Any) -> None:
        notes.append(body)

    @router.inline("inline_echo")
    def inline_echo(channel: Channel, body: Any) -> Any:
        return {"echo": body, "peer": channel.peer_name}

    @router.inline("inline_typed")
    def inline_typed(channel: Channel, body: Any) -> Any:
        raise UnknownWorkflow(f"no workflow {body!r}", detail={"workflow": body})

    return router, notes


body_events: dict[str, asyncio.Event] = {}


@contextlib.asynccontextmanager
async def running(
    limits: Limits = Limits(), timeouts: Timeouts = FAST, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[Server, list[Any]]]:
    router, notes = make_router()
    server = await serve(
        "127.0.0.1",
        0,
        ChannelOptions(name="srv", token=TOKEN, limits=limits, timeouts=timeouts, ssl=tls),
        handler=router.handle_request,
        notify_handler=router.handle_notify,
    )
    async with server:
        yield server, notes


async def client(
    server: Server,
    handler: Handler | None = None,
    tls: ssl.SSLContext | None = None,
    limits: Limits = Limits(),
) -> Channel:
    options = ChannelOptions(name="cli", token=TOKEN, limits=limits, timeouts=FAST, ssl=tls)
    return await connect(server.address, options, handler=handler)


@pytest.mark.asyncio
async def test_request_response_and_channel_identity():
    async with running() as (server, _), await client(server) as channel:
        assert await channel.request("echo", {"a": [1, 2.5, "x", b"y", None]}) == {
            "a": [1, 2.5, "x", b"y", None]
        }
        assert (channel.peer_name, channel.peer_role, channel.local_name) == (
            "srv",
            "worker",
            "cli",
        )
        assert channel.peername == server.address
        (accepted,) = server.channels
        assert (accepted.peer_name, accepted.peer_role) == ("cli", "client")


@pytest.mark.asyncio
async def test_concurrent_requests_are_matched_to_their_waiters():
    async with running() as (server, _), await client(server) as channel:
        # later requests finish first, so answers arrive out of order
        delays = [0.002 * ((37 * i) % 11) for i in range(200)]
        answers = await asyncio.gather(
            *(channel.request("sleep_echo", {"delay": d, "value": i}) for i, d in enumerate(delays))
        )
        assert answers == list(range(200))


@pytest.mark.asyncio
async def test_notifies_arrive_in_order():
    async with running() as (server, notes), await client(server) as channel:
        for i in range(2000):
            channel.notify("note", i)
        await channel.drain()
        await channel.request("echo")  # a barrier: the server read everything before it
        assert notes == list(range(2000))


@pytest.mark.asyncio
async def test_remote_errors_are_typed():
    async with running() as (server, _), await client(server) as channel:
        with pytest.raises(UnknownWorkflow, match="no workflow 'vqa'") as typed:
            await channel.request("typed", "vqa")
        assert typed.value.detail == {"workflow": "vqa"}
        with pytest.raises(RemoteError, match="ZeroDivisionError while handling 'crash'") as err:
            await channel.request("crash")
        assert "1 // 0" in err.value.detail["traceback"]
        with pytest.raises(UnknownOperation, match="'srv' has no handler for request 'nope'"):
            await channel.request("nope")
        with pytest.raises(ProtocolError, match="answer to 'unsendable' cannot be sent"):
            await channel.request("unsendable")
        assert await channel.request("echo", 5) == 5  # the channel survived all of that


@pytest.mark.asyncio
async def test_timeout_then_the_late_answer_is_dropped():
    body_events["t1"] = asyncio.Event()
    async with running() as (server, _), await client(server) as channel:
        with pytest.raises(CompassTimeout, match="'wait' to 'srv'"):
            await channel.request("wait", "t1", timeout=0.05)
        body_events["t1"].set()
        # the late answer to the timed-out request must not reach this one
        assert await channel.request("sleep_echo", {"delay": 0.05, "value": "fresh"}) == "fresh"
        assert channel._waiters == {}


@pytest.mark.asyncio
async def test_shorter_timeout_issued_later_expires_first():
    body_events["t5"] = asyncio.Event()
    async with running() as (server, _), await client(server) as channel:
        patient = asyncio.create_task(channel.request("wait", "t5", timeout=10))
        await asyncio.sleep(0.01)
        with pytest.raises(CompassTimeout):
            await channel.request("wait", "t5", timeout=0.05)
        assert not patient.done()
        body_events["t5"].set()
        assert await patient == "late"
        # answered requests do not pile up in the timeout bookkeeping
        for i in range(500):
            assert await channel.request("echo", i) == i
        assert len(channel._deadlines) <= 64 + 1


@pytest.mark.asyncio
async def test_cancelled_request_leaves_no_waiter():
    body_events["t2"] = asyncio.Event()
    async with running() as (server, _), await client(server) as channel:
        task = asyncio.create_task(channel.request("wait", "t2", timeout=None))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert channel._waiters == {}
        body_events["t2"].set()
        assert await channel.request("echo", 1) == 1


PEER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from compass.wire.transport import ChannelOptions, serve

    async def handler(channel, op, body):
        await asyncio.Event().wait()  # never answers

    async def main():
        options = ChannelOptions(name="doomed", token=sys.argv[1])
        server = await serve("127.0.0.1", 0, options, handler=handler)
        print(server.address[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.asyncio
async def test_peer_death_fails_pending_waiters_with_connection_lost():
    peer = subprocess.Popen(  # noqa: ASYNC220 (started once; its pipe is read in a thread)
        [sys.executable, "-c", PEER_SCRIPT, TOKEN], stdout=subprocess.PIPE, text=True
    )
    try:
        assert peer.stdout is not None
        port = int(await asyncio.to_thread(peer.stdout.readline))
        options = ChannelOptions(name="cli", token=TOKEN, timeouts=FAST)
        channel = await connect(("127.0.0.1", port), options)
        ended: list[BaseException | None] = []
        channel.on_close.append(lambda ch, exc: ended.append(exc))
        pending = [asyncio.create_task(channel.request("hang", i)) for i in range(5)]
        await asyncio.sleep(0.05)
        peer.kill()
        for task in pending:
            with pytest.raises(ConnectionLost, match="'doomed'"):
                await task
        await channel.wait_closed()
        assert channel.closed
        assert len(ended) == 1
        assert isinstance(ended[0], ConnectionLost)
        with pytest.raises(ConnectionLost):
            await channel.request("echo")
    finally:
        peer.kill()
        peer.wait(timeout=10)
        if peer.stdout is not None:
            peer.stdout.close()


@pytest.mark.asyncio
async def test_use_after_close_raises_connection_closed():
    body_events["t3"] = asyncio.Event()
    async with running() as (server, _):
        channel = await client(server)
        ended: list[BaseException | None] = []
        channel.on_close.append(lambda ch, exc: ended.append(exc))
        pending = asyncio.create_task(channel.request("wait", "t3"))
        await asyncio.sleep(0.01)
        await channel.aclose()
        await channel.aclose()  # idempotent
        with pytest.raises(ConnectionClosed):
            await pending
        with pytest.raises(ConnectionClosed, match="closed by this side"):
            await channel.request("echo")
        with pytest.raises(ConnectionClosed):
            channel.notify("note")
        assert ended == [None]
        body_events["t3"].set()


@pytest.mark.asyncio
async def test_garbage_loses_only_that_connection(caplog):
    async with running() as (server, _), await client(server) as good:
        with caplog.at_level(logging.WARNING, logger="compass.wire"):
            reader, writer = await asyncio.open_connection(*server.address)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 4)
            # the server says why (a REFUSE naming the limit), then hangs up
            assert b"max_frame_bytes=65536" in await asyncio.wait_for(reader.read(), 5)
            writer.close()
            await writer.wait_closed()
            # an authenticated peer that breaks the framing is dropped too
            bad = await client(server)
            assert bad._transport is not None
            bad._transport.write(b"\xff" * 64)
            with pytest.raises(ConnectionLost):
                await bad.request("sleep_echo", {"delay": 1, "value": 0})
        warnings = [r for r in caplog.records if r.name == "compass.wire"]
        # one line for each connection the server dropped, one where the client was told why
        assert len(warnings) == 3
        assert all(r.levelno == logging.WARNING for r in warnings)
        assert "max_frame_bytes" in warnings[0].getMessage()
        assert "peer 'srv' closed the connection: frame of" in warnings[2].getMessage()
        assert await good.request("echo", "still here") == "still here"
        assert len(server.channels) == 1


@pytest.mark.asyncio
async def test_a_frame_beyond_the_peers_limits_is_refused_before_it_is_sent():
    limits = Limits(max_frame_bytes=1 << 20, max_header_bytes=1 << 16)
    # the client's own limits are the defaults; it learnt the server's in the handshake
    async with running(limits=limits) as (server, _), await client(server) as channel:
        with pytest.raises(ProtocolError, match="the peer's max_frame_bytes=1048576"):
            await channel.request("echo", np.zeros(1 << 18))
        with pytest.raises(ProtocolError, match="the peer's max_header_bytes=65536"):
            await channel.request("echo", "x" * (1 << 17))
        assert await channel.request("echo", 1) == 1  # nothing was sent: still connected


@pytest.mark.asyncio
async def test_a_frame_beyond_the_limits_is_answered_with_the_limit_then_closed(caplog):
    limits = Limits(max_frame_bytes=1 << 20, max_header_bytes=1 << 16)
    async with running(limits=limits) as (server, _):
        channel = await client(server)
        channel._conn.send_limits = Limits()  # a sender that ignores the server's limits
        pending = asyncio.ensure_future(channel.request("sleep_echo", {"delay": 5, "value": 0}))
        await asyncio.sleep(0.05)
        with (
            caplog.at_level(logging.WARNING, logger="compass.wire"),
            pytest.raises(ProtocolError, match="exceeds max_frame_bytes=1048576"),
        ):
            await channel.request("echo", np.zeros(1 << 20))  # 8 MiB
        # the connection closes after telling why: the other request fails with the reason
        with pytest.raises(ConnectionLost, match="max_frame_bytes=1048576"):
            await pending
        assert "exceeds max_frame_bytes=1048576" in caplog.text
        await channel.aclose()
        async with await client(server) as other:
            assert await other.request("echo", 1) == 1


@pytest.mark.asyncio
async def test_64_mib_ndarray_round_trip_is_bit_exact():
    array = np.random.default_rng(7).standard_normal(8 << 20)  # 64 MiB of float64
    tensor = torch.arange(1000, dtype=torch.bfloat16)
    async with running() as (server, _), await client(server) as channel:
        back = await channel.request("echo", {"array": array, "tensor": tensor})
        assert back["array"].dtype == np.float64
        assert back["array"].tobytes() == array.tobytes()
        assert torch.equal(back["tensor"], tensor)
        del back
        # the first answer's receive buffer is free again: the second lands in it
        again = await channel.request("echo", array)
        assert again.tobytes() == array.tobytes()
        assert channel._conn.decoder.payload_buffers_reused >= 1


@pytest.mark.asyncio
async def test_wrong_or_missing_token_fails_the_connect(caplog):
    async with running() as (server, _):
        with caplog.at_level(logging.WARNING, logger="compass.wire"):
            with pytest.raises(AuthenticationError, match="different cluster token"):
                await connect(
                    server.address, ChannelOptions(name="c", token="other", timeouts=FAST)
                )
            with pytest.raises(AuthenticationError, match="this side has none"):
                await connect(server.address, ChannelOptions(name="c", token=None, timeouts=FAST))
            await asyncio.sleep(0.05)
        # and the server side saw the same failures
        assert caplog.text.count("authentication failed") >= 2
        assert server.channels == set()


@pytest.mark.asyncio
async def test_connect_failures():
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with pytest.raises(ConnectFailed, match=f"127.0.0.1:{port}"):
        await connect(f"127.0.0.1:{port}", ChannelOptions(name="c", token=None, timeouts=FAST))

    # a listener that never speaks: the handshake times out
    silent_writers: list[asyncio.StreamWriter] = []
    silent = await asyncio.start_server(lambda r, w: silent_writers.append(w), "127.0.0.1", 0)
    async with silent:
        address = silent.sockets[0].getsockname()[:2]
        timeouts = Timeouts(handshake=0.1, close=0.5)
        with pytest.raises(CompassTimeout, match="handshake"):
            await connect(address, ChannelOptions(name="c", token=None, timeouts=timeouts))
        for writer in silent_writers:
            writer.close()


@pytest.mark.asyncio
async def test_server_drops_peers_that_never_finish_the_handshake():
    async with running(timeouts=Timeouts(handshake=0.1, close=1.0)) as (server, _):
        reader, writer = await asyncio.open_connection(*server.address)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await writer.wait_closed()


@pytest.mark.asyncio
async def test_both_sides_request_over_one_connection():
    async def client_handler(channel: Channel, op: str, body: Any) -> Any:
        return {"op": op, "body": body}

    async with running() as (server, _):
        channel = await client(server, handler=client_handler)
        async with channel:
            assert await channel.request("ask_back", 3) == {"op": "client_op", "body": 3}
            (accepted,) = server.channels
            assert await accepted.request("anything", "x") == {"op": "anything", "body": "x"}
        # a client without a handler answers requests with UnknownOperation
        async with await client(server) as plain:
            with pytest.raises(UnknownOperation, match="serves no requests"):
                await plain.request("ask_back", 1)


@pytest.mark.asyncio
async def test_on_channel_sees_authenticated_channels():
    seen: list[tuple[str, str]] = []
    router, _ = make_router()
    server = await serve(
        "127.0.0.1",
        0,
        ChannelOptions(name="w", token=None, timeouts=FAST),
        handler=router.handle_request,
        on_channel=lambda ch: seen.append((ch.peer_name, ch.peer_role)),
    )
    async with server:
        peer = ChannelOptions(name="peer", token=None)
        async with await connect(server.address, peer, role="worker") as ch:
            assert await ch.request("echo", 1) == 1
        assert seen == [("peer", "worker")]


@pytest.mark.asyncio
async def test_server_close_lets_handlers_finish_then_cancels_late_ones():
    async with running(timeouts=Timeouts(close=0.3)) as (server, _):
        channel = await client(server)
        body_events["t4"] = asyncio.Event()
        quick = asyncio.create_task(channel.request("sleep_echo", {"delay": 0.05, "value": "done"}))
        stuck = asyncio.create_task(channel.request("wait", "t4"))
        await asyncio.sleep(0.02)
        await server.aclose()
        assert await quick == "done"
        with pytest.raises(WorkerUnavailable, match="shutting down"):
            await stuck
        await channel.wait_closed()
        assert channel.closed
        assert server.channels == set()


@pytest.mark.asyncio
async def test_drain_applies_backpressure_and_returns():
    limits = Limits(write_high_water=64 * 1024)
    async with running() as (server, notes), await client(server, limits=limits) as channel:
        chunk = np.ones(256 * 1024, dtype=np.uint8)
        for i in range(16):
            channel.notify("note", {"i": i, "data": chunk})
            await channel.drain()
        await channel.request("echo")
        assert [n["i"] for n in notes] == list(range(16))
        assert all(int(n["data"].sum()) == chunk.size for n in notes)


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for 127.0.0.1: (cert path, key path)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-nodes", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


@pytest.mark.asyncio
async def test_tls_channel(certificate):
    cert, key = certificate
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    client_tls = ssl.create_default_context(cafile=str(cert))
    array = np.arange(1 << 18, dtype=np.float32)
    async with (
        running(tls=server_tls) as (server, _),
        await client(server, tls=client_tls) as channel,
    ):
        assert await channel.request("echo", "over tls") == "over tls"
        assert (await channel.request("echo", array)).tobytes() == array.tobytes()
        with pytest.raises(ConnectionLost, match="TLS on one side only"):
            await connect(server.address, ChannelOptions(name="plain", token=TOKEN, timeouts=FAST))


async def scenario() -> None:
    """The core behaviour, run once on each event loop."""
    async with running() as (server, notes), await client(server) as channel:
        assert await channel.request("echo", [1, "two"]) == [1, "two"]
        answers = await asyncio.gather(
            *(
                channel.request("sleep_echo", {"delay": 0.001 * (i % 5), "value": i})
                for i in range(50)
            )
        )
        assert answers == list(range(50))
        for i in range(100):
            channel.notify("note", i)
        with pytest.raises(UnknownWorkflow):
            await channel.request("typed", "x")
        array = np.arange(4 << 20, dtype=np.int64)  # 32 MiB
        assert (await channel.request("echo", array)).tobytes() == array.tobytes()
        assert notes == list(range(100))
        await channel.aclose()
        with pytest.raises(ConnectionClosed):
            await channel.request("echo")


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_core_behaviour_on_each_event_loop(loop_kind: str):
    factory: Callable[[], asyncio.AbstractEventLoop]
    if loop_kind == "uvloop":
        pytest.importorskip("uvloop")
        factory = new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        if loop_kind == "uvloop":
            assert type(runner.get_loop()).__module__.startswith("uvloop")
        runner.run(scenario())


def test_install_event_loop_policy_selects_uvloop():
    pytest.importorskip("uvloop")
    previous = asyncio.get_event_loop_policy()
    try:
        assert install_event_loop_policy() is True
        loop = asyncio.new_event_loop()
        try:
            assert type(loop).__module__.startswith("uvloop")
        finally:
            loop.close()
    finally:
        asyncio.set_event_loop_policy(previous)


def test_wire_benchmark_quick_run_writes_json(tmp_path):
    from compass._bench import wire

    path = tmp_path / "wire.json"
    result = wire.run(quick=True, json_path=str(path))
    saved = json.loads(path.read_text())
    for key in (
        "rtt_p50_us", "raw_rtt_p50_us", "rtt_p99_us", "raw_rtt_p99_us", "rtt_ratio",
        "pipelined_msgs_per_s", "raw_pipelined_msgs_per_s", "pipelined_ratio",
        "bulk_gbps", "raw_bulk_gbps", "bulk_ratio",
    ):  # fmt: skip
        assert saved[key] == result[key]
        assert result[key] > 0
    assert result["rtt_p50_us"] <= result["rtt_p99_us"]


@pytest.mark.asyncio
async def test_inline_handlers_answer_and_fail_like_async_ones():
    async with running() as (server, _):
        channel = await client(server)
        assert await channel.request("inline_echo", [1, 2]) == {"echo": [1, 2], "peer": "cli"}
        with pytest.raises(UnknownWorkflow, match="nope") as raised:
            await channel.request("inline_typed", "nope")
        assert raised.value.detail == {"workflow": "nope"}
        # a batch of inline and async requests read together: every one matched to its waiter
        answers = await asyncio.gather(
            *(channel.request("inline_echo" if i % 2 else "echo", i) for i in range(200))
        )
        assert answers == [{"echo": i, "peer": "cli"} if i % 2 else i for i in range(200)]
        await channel.aclose()


def test_an_op_has_one_handler_whatever_its_kind():
    router = Router()
    router.inline("x")(lambda channel, body: body)

    async def other(channel: Channel, body: Any) -> Any:
        return body

    with pytest.raises(ConfigError, match="'x'"):
        router.request("x")(other)


@pytest.mark.asyncio
async def test_close_flushes_the_writes_held_for_the_loop_iteration():
    async with running() as (server, notes):
        channel = await client(server)
        body_events["held-a"], body_events["held-b"] = asyncio.Event(), asyncio.Event()
        # two requests in flight: later writes are held until the loop iteration ends
        waiting = [asyncio.ensure_future(channel.request("wait", k)) for k in ("held-a", "held-b")]
        await asyncio.sleep(0.05)
        for i in range(5):
            channel.notify("note", i)
        await channel.aclose()  # in the same iteration: the held notifies must still go out
        for _ in range(200):
            if len(notes) == 5:
                break
            await asyncio.sleep(0.01)
        assert notes == [0, 1, 2, 3, 4]
        for future in waiting:
            with pytest.raises(ConnectionClosed):
                await future


@pytest.mark.asyncio
async def test_a_request_the_caller_gives_up_on_is_cancelled_at_the_peer():
    async with running() as (server, notes), await client(server) as channel:
        # the timeout passes: the handler still working on it is cancelled, not left to run
        with pytest.raises(CompassTimeout):
            await channel.request("cancellable", 30.0, timeout=0.1)
        for _ in range(100):
            if notes == ["cancelled"]:
                break
            await asyncio.sleep(0.01)
        assert notes == ["cancelled"]
        # the caller's own task is cancelled: same
        waiting = asyncio.ensure_future(channel.request("cancellable", 30.0, timeout=None))
        await asyncio.sleep(0.05)
        waiting.cancel()
        for _ in range(100):
            if notes == ["cancelled", "cancelled"]:
                break
            await asyncio.sleep(0.01)
        assert notes == ["cancelled", "cancelled"]
        # an answered request is not disturbed, and the channel keeps working
        assert await channel.request("cancellable", 0.01) == "slept"
        assert await channel.request("echo", 7) == 7
        assert notes == ["cancelled", "cancelled"]
