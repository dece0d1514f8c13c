"""Streams on the sans-IO connection: their frames, their credit windows, and what a peer that
breaks them (an item beyond the credit, an unknown stream, credit beyond the window) costs: its
connection, as any malformed frame does. Also how a peer without streams (an older compass) is
treated."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from compass.errors import ConfigError, ProtocolError, VersionMismatch
from compass.wire.flow import (
    MAX_WINDOW,
    StreamCredit,
    StreamEnd,
    StreamFailed,
    StreamItem,
    StreamMisuse,
    StreamOpen,
)
from compass.wire.protocol import Connection, Request, Response, State

from .test_protocol import events, handshake, join, make, raw_frame, ready_pair


def opened(window: int = 3) -> tuple[Connection, Connection, int]:
    """A reader (the initiator) with stream ``op`` open at the producer (the acceptor)."""
    reader, producer = ready_pair()
    stream_id = reader.send_stream_open("op", {"n": 1}, window)
    assert events(producer, join(reader.data_to_send())) == [
        StreamOpen(stream_id, "op", {"n": 1}, window)
    ]
    return reader, producer, stream_id


def test_items_end_and_credit_flow_in_order() -> None:
    reader, producer, sid = opened(window=2)
    array = np.arange(6, dtype=np.float32)
    producer.send_stream_item(sid, "a")
    producer.send_stream_item(sid, array)
    assert producer.streams.credit(sid) == 0
    got = events(reader, join(producer.data_to_send()))
    assert got[0] == StreamItem(sid, "a")
    assert isinstance(got[1], StreamItem) and np.array_equal(got[1].body, array)
    reader.send_credit(sid, 2)
    assert events(producer, join(reader.data_to_send())) == [StreamCredit(sid, 2)]
    assert producer.streams.credit(sid) == 2
    producer.send_stream_item(sid, "c")
    producer.send_stream_end(sid, {"final": True})
    assert events(reader, join(producer.data_to_send())) == [
        StreamItem(sid, "c"),
        StreamEnd(sid, {"final": True}),
    ]
    assert reader.streams.reading == 0 and producer.streams.producing == 0


def test_streams_and_requests_share_one_id_counter_and_interleave() -> None:
    reader, producer = ready_pair()
    first = reader.send_request("ask", 1)
    sid = reader.send_stream_open("op", None, 4)
    second = reader.send_request("ask", 2)
    assert first < sid < second
    got = events(producer, join(reader.data_to_send()))
    assert got == [
        Request(first, "ask", 1),
        StreamOpen(sid, "op", None, 4),
        Request(second, "ask", 2),
    ]
    producer.send_stream_item(sid, 0)
    producer.send_response(first, "one")
    producer.send_stream_error(sid, "unknown_workflow", "no such workflow", {"w": "x"})
    assert events(reader, join(producer.data_to_send())) == [
        StreamItem(sid, 0),
        Response(first, "one"),
        StreamFailed(sid, "unknown_workflow", "no such workflow", {"w": "x"}),
    ]


def test_credit_that_crossed_the_end_is_ignored() -> None:
    reader, producer, sid = opened(window=2)
    producer.send_stream_item(sid, "a")
    assert events(reader, join(producer.data_to_send())) == [StreamItem(sid, "a")]
    producer.send_stream_end(sid, "z")  # meanwhile the reader took "a" and grants one more
    reader.send_credit(sid, 1)
    assert events(producer, join(reader.data_to_send())) == [StreamCredit(sid, 0)]
    assert producer.state is State.READY
    assert events(reader, join(producer.data_to_send())) == [StreamEnd(sid, "z")]
    assert reader.streams.reading == 0


def violation(conn: Connection, message: list[Any], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        events(conn, raw_frame(message))
    assert conn.state is State.FAILED
    # the peer is told why before the connection closes: a REFUSE naming the fault
    assert b"protocol" in join(conn.data_to_send())


def test_an_item_beyond_the_credit_fails_the_connection() -> None:
    reader, producer, sid = opened(window=2)
    for n in range(2):
        producer.send_stream_item(sid, n)
    events(reader, join(producer.data_to_send()))
    violation(reader, [9, sid, "third"], "beyond its credit")


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ([9, 99, "x"], "item for stream 99, which is not open"),
        ([10, 99, None], "END for stream 99"),
        ([11, 99, "internal", "boom", None], "FAIL for stream 99"),
        ([9, "1", "x"], "malformed ITEM"),
        ([10, 1], "malformed END"),
    ],
)
def test_frames_for_a_stream_the_reader_never_opened_fail_the_connection(
    message: list[Any], match: str
) -> None:
    reader, _ = ready_pair()
    violation(reader, message, match)


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ([12, 1, 5], "beyond its window"),  # window 3, all unused
        ([12, 1, 0], "credit of 0 items"),
        ([12, 1, -2], "credit of -2"),
        ([12, 7, 1], "never opened"),
        ([8, 1, "op", None, 3], "already open"),
        ([8, 2, "op", None, 0], "with window 0"),
        ([8, 2, "op", None, MAX_WINDOW + 1], f"with window {MAX_WINDOW + 1}"),
        ([12, 1, "many"], "credit of 'many'"),
    ],
)
def test_a_reader_that_breaks_the_window_fails_the_connection(
    message: list[Any], match: str
) -> None:
    _, producer, sid = opened(window=3)
    assert sid == 1
    violation(producer, message, match)


def test_a_producer_cannot_send_beyond_its_credit_or_on_an_unknown_stream() -> None:
    _, producer, sid = opened(window=1)
    producer.send_stream_item(sid, "only")
    with pytest.raises(StreamMisuse, match="no credit left"):
        producer.send_stream_item(sid, "more")
    with pytest.raises(StreamMisuse, match="not open here"):
        producer.send_stream_item(sid + 5, "x")
    assert len(producer.data_to_send()) == 1  # the refused items queued nothing


def test_an_unsendable_item_keeps_its_credit() -> None:
    _, producer, sid = opened(window=1)
    with pytest.raises(ProtocolError):
        producer.send_stream_item(sid, {"bad": object()})
    assert producer.streams.credit(sid) == 1
    assert producer.data_to_send() == []


def test_a_reader_cannot_grant_beyond_its_window_nor_open_a_bad_one() -> None:
    reader, _, sid = opened(window=3)
    with pytest.raises(StreamMisuse, match="exceed its window of 3"):
        reader.send_credit(sid, 1)
    for window in (0, MAX_WINDOW + 1, 2.5):
        with pytest.raises(ConfigError, match="window"):
            reader.send_stream_open("op", None, window)  # type: ignore[arg-type]
    assert reader.data_to_send() == []


def test_a_peer_without_streams_is_never_sent_one() -> None:
    """An older compass says nothing of streams in its HELLO: requests flow as before, and
    opening a stream to it fails here, with the connection intact."""
    old, new = make("initiator"), make("acceptor")
    fields = old._hello_fields

    def without_streams() -> dict[str, Any]:
        hello = fields()
        del hello["streams"]
        return hello

    old._hello_fields = without_streams  # type: ignore[method-assign]
    handshake(old, new)
    assert not new.peer_streams and old.peer_streams
    with pytest.raises(VersionMismatch, match="without streams"):
        new.send_stream_open("op", None, 4)
    assert new.data_to_send() == [] and new.state is State.READY
    rid = new.send_request("ping", 1)
    assert events(old, join(new.data_to_send())) == [Request(rid, "ping", 1)]
