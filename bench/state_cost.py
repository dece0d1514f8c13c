"""The CPU a worker spends on one state message, without the kernel: the sender's
:meth:`Heartbeat.to_wire` and framing (:meth:`Connection.send_notify`, as
:meth:`Channel.notify` does, then the bytes taken), the receiver's framing
(:meth:`Connection.receive_data`, :meth:`Connection.next_event`), :meth:`Heartbeat.from_wire`
and :meth:`ClusterView.apply_heartbeat` on a view that holds ``--view`` workers.

Three shapes: a ``heartbeat`` (one state: a push to a watcher, the answer to a watch), a
``rumors`` message of 8 states (a full rumor message) and one of 64 (a sync chunk). Each is
timed in CPU seconds (``time.process_time``) over many messages, several rounds, the best
round kept (other work on the machine only ever makes a round slower). ``encode`` includes
building the :class:`Heartbeat` objects (shown apart too: a stand-in for the sender's
``Gossip.own_state``, which a rumor's sender does not pay). Not included: the event loop, the
socket writes and reads (the kernel), and the worker core's event for a heard state
(``Heard``).

Run: ``python -m compass._bench.state_cost [--view 1000] [--json out.json]``.
"""

from __future__ import annotations

import argparse
from typing import Any

from compass.config import Limits
from compass.sched.heartbeat import Heartbeat
from compass.sched.view import ClusterView
from compass.wire.protocol import Connection, Notify

from .report import best_cpu_us, machine, print_table, write_json

__all__ = ["run"]

GB = 1_000_000_000


def _state(i: int, seq: int) -> Heartbeat:
    """A paper-workload worker's state: a few models resident, one loading, a queue."""
    return Heartbeat(
        name=f"w{i}",
        wait_s=0.0123 * (i % 7),
        models=frozenset({"opus-mt-en-de", "whisper-small", "distilbert-sst2"}),
        free_bytes=3 * GB + i,
        capacity_bytes=16 * GB,
        lanes=1,
        lanes_busy=i % 2,
        seq=seq,
        loading=frozenset({"resnet-50"}) if i % 3 == 0 else frozenset(),
        h2d_bytes_per_s=12.3e9,
        batches={"whisper-small": (2, 0.004)} if i % 4 == 0 else {},
    )


def _pair() -> tuple[Connection, Connection]:
    """Two connected ends, handshake done, in memory."""
    token, limits = "bench", Limits()
    a = Connection("initiator", token=token, name="w0", peer_kind="worker", limits=limits)
    b = Connection("acceptor", token=token, name="w1", peer_kind="worker", limits=limits)

    def shuttle(src: Connection, dst: Connection, data: list[Any]) -> None:
        dst.receive_data(b"".join(bytes(p) for p in data))
        while dst.next_event() is not None:
            pass

    shuttle(a, b, a.initiate())
    shuttle(b, a, b.data_to_send())
    shuttle(a, b, a.data_to_send())
    shuttle(b, a, b.data_to_send())
    return a, b


def _measure(
    shape: str, states: int, view: ClusterView, count: int, rounds: int
) -> dict[str, float]:
    """One shape's figures: ``count`` messages of ``states`` states a round."""
    sender, receiver = _pair()
    peers = len(view.names()) - 1
    pending: list[bytes] = []
    applied = 0

    # state j of message k is of a worker picked in turn, with sequence number above any
    # before it (the view starts at 0), so every one received is applied
    def message(k: int) -> list[Heartbeat]:
        return [_state(1 + (k * states + j) % peers, k + 1) for j in range(states)]

    def encode(k: int) -> None:
        wire = [state.to_wire() for state in message(k)]
        if shape == "heartbeat":
            sender.send_notify("heartbeat", wire[0])
        else:
            sync = {"sync": True} if shape == "sync" else {}
            sender.send_notify("rumors", {"s": wire, **sync})
        pending.append(b"".join(bytes(p) for p in sender.data_to_send()))

    def decode(k: int) -> None:
        nonlocal applied
        receiver.receive_data(pending[k])
        event = receiver.next_event()
        assert isinstance(event, Notify)
        body = event.body
        for data in [body] if event.op == "heartbeat" else body["s"]:
            applied += view.apply_heartbeat(Heartbeat.from_wire(data), 1.0)

    build_us = best_cpu_us(message, count, rounds)
    encode_us = best_cpu_us(encode, count, rounds)
    decode_us = best_cpu_us(decode, count, rounds)
    assert applied == count * rounds * states, "every state received must be applied"
    return {
        "states": states,
        "bytes": sum(len(p) for p in pending) / len(pending),
        "build_us": build_us,
        "encode_us": encode_us,
        "decode_apply_us": decode_us,
        "us": encode_us + decode_us,
        "per_state_us": (encode_us + decode_us) / states,
    }


def run(view_size: int = 1000, count: int = 2000, rounds: int = 7) -> dict[str, Any]:
    """Microseconds per message and per state carried, sending and receiving; each shape on
    a view of ``view_size`` workers of its own."""
    out: dict[str, Any] = {"machine": machine(), "view": view_size, "shapes": {}}
    rows = []
    for shape, states in (("heartbeat", 1), ("rumors", 8), ("sync", 64)):
        view = ClusterView("w0", heartbeat_s=0.01)
        for i in range(1, view_size):
            view.apply_heartbeat(_state(i, 0), 0.0)
        got = _measure(shape, states, view, max(50, count // states), rounds)
        out["shapes"][shape] = got
        rows.append(
            [shape, states, round(got["bytes"]), got["build_us"], got["encode_us"],
             got["decode_apply_us"], got["us"], got["per_state_us"]]
        )  # fmt: skip
    columns = ["message", "states", "bytes", "building them", "encode", "decode + apply"]
    columns += ["encode + decode + apply", "per state"]
    print_table(f"One state message, CPU us (a view of {view_size} workers)", columns, rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--view", type=int, default=1000, help="workers in the receiver's view")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    write_json(args.json, run(args.view))


if __name__ == "__main__":
    main()
