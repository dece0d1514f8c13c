"""The cluster view: heartbeats, counted placements, snapshots."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import msgpack
import numpy as np
import pytest

from compass.errors import ConfigError, ProtocolError
from compass.sched import ClusterView, Heartbeat, ViewSnapshot
from compass.sched.heartbeat import NO_BATCHES, CacheHeld, LaneLoad, Serving
from compass.sched.view import BatchCurve, Placement
from compass.workflow.dag import linear_scale

GB = 1_000_000_000


def state(
    name: str,
    wait: float = 0.0,
    models: tuple[str, ...] = (),
    seq: int = 0,
    free: int = 10 * GB,
    loading: tuple[str, ...] = (),
    batches: dict[str, tuple[int, float]] | None = None,
) -> Heartbeat:
    return Heartbeat(
        name,
        wait,
        frozenset(models),
        free,
        10 * GB,
        seq=seq,
        loading=frozenset(loading),
        batches=batches or {},
    )


def test_worker_state_round_trips_through_msgpack() -> None:
    s = Heartbeat(
        "w1",
        0.25,
        frozenset({"a", "b"}),
        5,
        9,
        lanes=2,
        lanes_busy=1,
        seq=7,
        loading=frozenset({"c"}),
        h2d_bytes_per_s=6.5e9,
    )
    wire = msgpack.unpackb(msgpack.packb(s.to_wire()))
    assert Heartbeat.from_wire(wire) == s
    del wire["h"]  # a peer that does not measure (or predates the field): unknown, 0
    assert Heartbeat.from_wire(wire).h2d_bytes_per_s == 0.0


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"w": "soon"}, "'w' must be a number"),
        ({"s": 1.5}, "'s' must be an integer"),
        ({"m": "abc"}, "'m' must be a list"),
        ({"f": 20}, "free_bytes"),
        ({"w": -1.0}, "wait_s"),
        ({"h": "fast"}, "'h' must be a number"),
        ({"h": -1.0}, "h2d_bytes_per_s"),
    ],
)
def test_malformed_worker_state_is_a_protocol_error(
    change: dict[str, object], problem: str
) -> None:
    wire = state("w1", free=5).to_wire()
    wire["c"] = 10
    wire.update(change)
    with pytest.raises(ProtocolError, match=problem):
        Heartbeat.from_wire(wire)
    del wire["n"]
    with pytest.raises(ProtocolError, match="missing field 'n'"):
        Heartbeat.from_wire(wire)


def test_stale_heartbeats_are_ignored() -> None:
    view = ClusterView("me")
    assert view.apply_heartbeat(state("p", wait=1.0, seq=5), now=0.0)
    assert not view.apply_heartbeat(state("p", wait=9.0, seq=4), now=0.1)
    assert not view.apply_heartbeat(state("p", wait=9.0, seq=5), now=0.1)
    snap = view.snapshot(0.2)
    assert snap.wait_s[snap.index("p")] == 1.0
    assert view.age_s("p", 0.2) == pytest.approx(0.2)
    assert view.apply_heartbeat(state("p", wait=2.0, seq=6, models=("m",)), now=0.3)
    snap = view.snapshot(0.3)
    assert snap.wait_s[snap.index("p")] == 2.0
    assert snap.holds("m").tolist() == [True]
    # a peer cannot speak for this worker
    assert not view.apply_heartbeat(state("me", seq=100), now=0.3)
    assert "me" not in view


def test_placements_count_until_a_later_heartbeat_settles_them() -> None:
    view = ClusterView("me", heartbeat_s=0.01)  # settles after 20 ms
    view.update_self(state("me"))
    view.apply_heartbeat(state("p", seq=1, free=5 * GB), now=0.0)
    view.note_placement("p", Placement(1.0, "m", 2 * GB), now=0.0)
    view.note_placement("p", Placement(0.5, "m", 2 * GB), now=0.0)
    snap = view.snapshot(0.001)
    i = snap.index("p")
    assert snap.wait_s[i] == pytest.approx(1.5)
    assert snap.holds("m")[i]
    assert snap.free_bytes[i] == 3 * GB  # the model's bytes come off once
    # a heartbeat sent before the placement could show in it: still counted
    view.apply_heartbeat(state("p", seq=2, free=5 * GB), now=0.015)
    assert view.snapshot(0.016).wait_s[i] == pytest.approx(1.5)
    # one received long enough after: it reflects the tasks, so they are no longer added
    view.apply_heartbeat(state("p", seq=3, wait=1.4, free=3 * GB, loading=("m",)), now=0.03)
    snap = view.snapshot(0.031)
    assert snap.wait_s[i] == pytest.approx(1.4)
    assert view.pending("p") == 0


def test_a_job_does_not_see_its_own_placements_but_other_jobs_do() -> None:
    view = ClusterView("me", heartbeat_s=0.01)
    view.update_self(state("me"))
    view.apply_heartbeat(state("p", seq=1, free=5 * GB), now=0.0)
    view.note_placement("p", Placement(1.0, "m", 2 * GB, job="j1"), now=0.0)
    view.note_placement("p", Placement(0.5, job="j2"), now=0.0)
    i = view.snapshot(0.001).index("p")
    # j1 re-planned: its task would not wait behind itself, nor find its model coming
    own = view.snapshot(0.001, without="j1")
    assert own.wait_s[i] == pytest.approx(0.5)
    assert not own.holds("m")[i]
    assert own.free_bytes[i] == 5 * GB
    # every other job, and the plain snapshot (cached), count both
    for snap in (view.snapshot(0.001, without="j3"), view.snapshot(0.001)):
        assert snap.wait_s[i] == pytest.approx(1.5)
        assert snap.holds("m")[i]
        assert snap.free_bytes[i] == 3 * GB
    assert view.snapshot(0.001, without="j2").wait_s[i] == pytest.approx(1.0)


def test_placements_expire_when_the_task_would_have_run() -> None:
    view = ClusterView("me", heartbeat_s=10.0)
    view.apply_heartbeat(state("p", seq=1), now=0.0)
    view.note_placement("p", Placement(0.2), now=1.0)
    assert view.snapshot(1.2).wait_s[0] == pytest.approx(0.2)
    assert view.snapshot(1.21).wait_s[0] == 0.0
    assert view.pending("p") == 0


def test_self_placements_clear_on_update_self() -> None:
    view = ClusterView("me")
    view.update_self(state("me"))
    view.note_placement("me", Placement(0.3), now=0.0)
    assert view.snapshot(0.0).wait_s[0] == pytest.approx(0.3)
    view.update_self(state("me", wait=0.3))
    assert view.snapshot(0.0).wait_s[0] == pytest.approx(0.3)
    assert view.age_s("me", 100.0) == 0.0
    with pytest.raises(ConfigError, match="'other'"):
        view.update_self(state("other"))


def test_the_same_own_state_again_keeps_the_snapshot_and_clears_own_placements() -> None:
    view = ClusterView("me")
    view.update_self(state("me", wait=0.3))
    view.apply_heartbeat(state("peer", seq=1), now=0.0)
    first = view.snapshot(0.0)
    view.update_self(state("me", wait=0.3))  # equal, not the same object
    assert view.snapshot(0.0) is first
    view.note_placement("me", Placement(0.5), now=0.0)
    view.note_placement("peer", Placement(0.2), now=0.0)
    assert list(view.snapshot(0.0).wait_s) == pytest.approx([0.8, 0.2])
    view.update_self(state("me", wait=0.3))  # its own queue holds the placement now
    assert list(view.snapshot(0.0).wait_s) == pytest.approx([0.3, 0.2])
    view.update_self(state("me", wait=0.4))
    assert list(view.snapshot(0.0).wait_s) == pytest.approx([0.4, 0.2])


def test_own_state_is_the_checked_state() -> None:
    values: dict[str, Any] = {
        "name": "me", "wait_s": 0.5, "models": frozenset({"a"}), "free_bytes": GB,
        "capacity_bytes": 2 * GB, "lanes": 2, "lanes_busy": 1, "seq": 7,
        "loading": frozenset({"b"}), "h2d_bytes_per_s": 1e9, "incarnation": 3,
        "lifted_s": (0.25, 0.5), "version": "v1", "learned": (("w", "t", 0.25, 3),),
    }  # fmt: skip
    held = CacheHeld(frozenset({"a"}), frozenset({"b"}), GB, 2 * GB, 1e9)
    serving = Serving("v1", (("w", "t", 0.25, 3),))

    def own_state(batches: Mapping[str, tuple[int, float]]) -> Heartbeat:
        load = LaneLoad(0.5, (0.25, 0.5), 2, 1, batches)
        return Heartbeat.own("me", 7, 3, load, held, serving)

    for batches in ({}, {"a": (2, 0.25)}):
        own = own_state(batches)
        checked = Heartbeat(**values, batches=batches)
        assert own == checked
        assert type(own.batches) is type(checked.batches)
        assert [getattr(own, f.name) for f in fields(Heartbeat)] == [
            getattr(checked, f.name) for f in fields(Heartbeat)
        ]
    assert own_state({}).batches is NO_BATCHES


def test_placement_on_unknown_worker_is_ignored() -> None:
    view = ClusterView("me")
    view.update_self(state("me"))
    view.note_placement("ghost", Placement(1.0), now=0.0)
    assert view.snapshot(0.0).names == ("me",)


def test_remove() -> None:
    view = ClusterView("me")
    view.update_self(state("me"))
    for name in ("c", "a", "b"):
        view.apply_heartbeat(state(name, seq=3, models=(name,)), now=0.0)
    assert view.names() == ("a", "b", "c", "me")
    view.note_placement("b", Placement(5.0), now=0.0)
    view.remove("b")
    assert "b" not in view
    snap = view.snapshot(0.0)
    assert snap.names == ("a", "c", "me")
    assert snap.holds("c").tolist() == [False, True, False]
    assert "b" not in snap
    with pytest.raises(ConfigError):
        snap.index("b")
    with pytest.raises(ConfigError):
        view.age_s("b", 0.0)
    with pytest.raises(ConfigError):
        view.remove("me")
    # it comes back with its next heartbeat, sequence numbers starting afresh
    assert view.apply_heartbeat(state("b", seq=0), now=1.0)
    assert view.names() == ("a", "b", "c", "me")
    assert view.pending("b") == 0


def test_snapshots_are_immutable_and_unaffected_by_later_updates() -> None:
    view = ClusterView("me")
    view.update_self(state("me"))
    view.apply_heartbeat(state("p", wait=1.0, seq=1, models=("m",)), now=0.0)
    first = view.snapshot(0.0)
    assert view.snapshot(0.0) is first  # nothing changed: the same object
    with pytest.raises(ValueError, match="read-only"):
        first.wait_s[0] = 5.0
    view.apply_heartbeat(state("p", wait=3.0, seq=2), now=0.1)
    view.update_self(state("me", wait=0.5, models=("m",)))
    second = view.snapshot(0.1)
    assert first.wait_s.tolist() == [0.0, 1.0]
    assert first.holds("m").tolist() == [False, True]
    assert second.wait_s.tolist() == [0.5, 3.0]
    assert second.holds("m").tolist() == [True, False]


def test_a_snapshot_with_other_waits_shares_the_rest_and_leaves_the_first_alone() -> None:
    """What an aged or a priority's snapshot is made with (ViewSnapshot.with_wait)."""
    first = ViewSnapshot.build(
        [state("a", wait=1.0, models=("m",)), state("b", wait=2.0, batches={"m": (2, 0.5)})]
    )
    wait = np.array([5.0, 6.0])
    other = first.with_wait(wait)
    assert other.wait_s.tolist() == [5.0, 6.0] and first.wait_s.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="read-only"):
        wait[0] = 0.0
    for f in fields(ViewSnapshot):
        if f.name != "wait_s":
            assert getattr(other, f.name) is getattr(first, f.name), f.name


def test_build_snapshot_directly() -> None:
    snap = ViewSnapshot.build(
        [state("b", wait=2.0, models=("x",)), state("a", wait=1.0, loading=("x", "y"))]
    )
    assert snap.names == ("a", "b")
    assert snap.index("b") == 1
    assert snap.wait_s.tolist() == [1.0, 2.0]
    assert snap.holds("x").tolist() == [True, True]
    assert snap.holds("y").tolist() == [True, False]
    assert snap.holds("never").tolist() == [False, False]
    assert snap.capacity_bytes.dtype == np.int64
    assert snap.min_capacity_bytes == 10 * GB
    with pytest.raises(ConfigError, match="twice"):
        ViewSnapshot.build([state("a"), state("a")])


def batching(
    name: str, seq: int, batches: dict[str, tuple[int, float]], wait: float = 1.0
) -> Heartbeat:
    return Heartbeat(name, wait, frozenset(), 5, 10, seq=seq, batches=batches)


def test_batches_round_trip_and_are_optional_on_the_wire() -> None:
    s = batching("w1", 3, {"opt": (3, 0.25), "mt5": (1, 0.0)})
    wire = msgpack.unpackb(msgpack.packb(s.to_wire()))
    back = Heartbeat.from_wire(wire)
    assert back == s
    assert dict(back.batches) == {"opt": (3, 0.25), "mt5": (1, 0.0)}
    # nothing batchable queued: the key is left out, and a peer that predates it sends none
    plain = batching("w1", 3, {})
    assert "q" not in plain.to_wire()
    assert Heartbeat.from_wire(plain.to_wire()).batches == {}
    assert s != plain
    assert hash(s) == hash(plain)  # batches are compared, not hashed


@pytest.mark.parametrize(
    ("batches", "problem"),
    [
        ([["m", 1, 0.5]], "'q' must map model names"),
        ({"m": [0, 0.5]}, r"batches\['m'\] must be \(count >= 1"),
        ({"m": [1.0, 0.5]}, r"batches\['m'\]"),
        ({"m": [True, 0.5]}, r"batches\['m'\]"),
        ({"m": [1, -0.1]}, r"seconds >= 0"),
        ({"m": [1, float("inf")]}, r"batches\['m'\]"),
        ({"m": [1, "soon"]}, r"batches\['m'\]"),
        ({"m": [1]}, r"batches\['m'\]"),
        ({"m": 3}, r"batches\['m'\]"),
        ({"": [1, 0.5]}, "a batches key must be a model name"),
        ({7: [1, 0.5]}, "a batches key must be a model name"),
    ],
)
def test_malformed_batches_are_a_protocol_error(batches: object, problem: str) -> None:
    wire = batching("w1", 1, {}).to_wire()
    wire["q"] = batches
    with pytest.raises(ProtocolError, match=problem):
        Heartbeat.from_wire(wire)


def test_snapshot_has_batch_arrays_only_for_models_some_worker_reports() -> None:
    view = ClusterView("me")
    view.update_self(batching("me", 1, {}))
    view.apply_heartbeat(batching("p", 1, {}), now=0.0)
    view.apply_heartbeat(batching("q", 1, {}), now=0.0)
    quiet = view.snapshot(0.0)
    assert not quiet.batches
    assert quiet.batched("m") is None
    view.apply_heartbeat(batching("q", 2, {"m": (2, 0.3)}), now=0.1)
    view.update_self(batching("me", 2, {"m": (1, 0.1), "n": (4, 0.0)}))
    snap = view.snapshot(0.1)
    rows = snap.batched("m")
    assert rows is not None
    assert rows[0].tolist() == [1, 0, 2]  # me, p, q
    assert rows[1].tolist() == [0.1, 0.0, 0.3]
    with pytest.raises(ValueError, match="read-only"):
        rows[0][1] = 5
    n_rows = snap.batched("n")
    assert n_rows is not None
    assert n_rows[0].tolist() == [4, 0, 0]
    # placements counted on a peer leave its batches alone (they queue behind them)
    view.note_placement("q", Placement(0.5, "m", 0), now=0.1)
    placed = view.snapshot(0.11)
    assert placed.wait_s[2] == pytest.approx(1.5)
    assert placed.batched("m") is not None
    # batches start and leave: a model no worker reports any more has no arrays
    view.apply_heartbeat(batching("q", 3, {}), now=0.2)
    view.update_self(batching("me", 3, {"n": (5, 0.2)}))
    later = view.snapshot(0.2)
    assert later.batched("m") is None
    later_n = later.batched("n")
    assert later_n is not None
    assert later_n[0].tolist() == [5, 0, 0]
    # the earlier snapshot kept what it showed (copy on write)
    assert rows[0].tolist() == [1, 0, 2]
    assert n_rows[0].tolist() == [4, 0, 0]
    # a worker that joins (or is removed) rebuilds the rows
    view.apply_heartbeat(batching("a", 1, {"m": (1, 0.4)}), now=0.3)
    rebuilt = view.snapshot(0.3).batched("m")
    assert rebuilt is not None
    assert rebuilt[0].tolist() == [1, 0, 0, 0]  # a, me, p, q
    view.remove("a")
    assert view.snapshot(0.3).batched("m") is None


def test_build_and_from_arrays_carry_batches() -> None:
    snap = ViewSnapshot.build([batching("b", 1, {"m": (2, 0.5)}), batching("a", 1, {})])
    rows = snap.batched("m")
    assert rows is not None
    assert rows[0].tolist() == [0, 2]
    assert rows[1].tolist() == [0.0, 0.5]
    cap = np.full(2, 10, dtype=np.int64)
    bad = {"m": (np.zeros(3, dtype=np.int64), np.zeros(3))}
    with pytest.raises(ConfigError, match=r"batches\['m'\]"):
        ViewSnapshot.from_arrays(("a", "b"), np.zeros(2), cap.copy(), cap, {}, batches=bad)


def test_a_placed_batchable_task_joins_a_batch_waiting_there_or_leads_the_next() -> None:
    curve = BatchCurve(linear_scale(0.15, 8), 3)  # each extra item: 0.15 of a run, at most 3
    view = ClusterView("me", heartbeat_s=0.01)
    view.update_self(state("me"))
    view.apply_heartbeat(state("p", wait=2.0, seq=1, models=("m",), batches={"m": (1, 0.5)}),
                         now=0.0)  # fmt: skip
    view.apply_heartbeat(state("q", wait=1.0, seq=1), now=0.0)
    view.note_placement("p", Placement(0.4, "m", GB, job="j1", curve=curve), now=0.0)
    view.note_placement("q", Placement(0.4, "m", GB, job="j1", curve=curve), now=0.0)
    snap = view.snapshot(0.001)
    p, q = snap.index("p"), snap.index("q")
    counts, starts = snap.batched("m") or ((), ())
    # on p it joins the queued batch: the queue grows by its share of the batch only
    assert counts[p] == 2 and starts[p] == 0.5
    assert snap.wait_s[p] == pytest.approx(2.0 + 0.4 * 0.15)
    # on q nothing of m waits: it leads the next batch, from the end of q's queue
    assert counts[q] == 1 and starts[q] == pytest.approx(1.0)
    assert snap.wait_s[q] == pytest.approx(1.4)
    # a third on p fills the batch; a fourth would wait for the next one: a whole run
    view.note_placement("p", Placement(0.4, "m", GB, job="j2", curve=curve), now=0.0)
    view.note_placement("p", Placement(0.4, "m", GB, job="j3", curve=curve), now=0.0)
    snap = view.snapshot(0.001)
    assert (snap.batched("m") or ((),))[0][p] == 4
    assert snap.wait_s[p] == pytest.approx(2.0 + 2 * 0.4 * 0.15 + 0.4)
    # without a curve (a task that does not batch, or a batch-blind policy): a whole run
    view.note_placement("q", Placement(0.4, "m", GB, job="j4"), now=0.0)
    assert view.snapshot(0.001).wait_s[q] == pytest.approx(1.8)
    # the heartbeat's own rows are left as they were
    assert (view.snapshot(0.001, without="j1").batched("m") or ((),))[0][p] == 3


def test_a_snapshot_at_a_priority_shows_the_waits_that_level_sees() -> None:
    view = ClusterView("me", heartbeat_s=0.01)
    view.update_self(Heartbeat("me", 3.0, frozenset(), GB, GB, lifted_s=(0.5,)))
    # p: 4 s queued in all, 1 s of it at level 1 and above, 0.25 s at level 2 and above
    view.apply_heartbeat(
        Heartbeat("p", 4.0, frozenset(), GB, GB, seq=1, lifted_s=(1.0, 0.25)), now=0.0
    )
    view.apply_heartbeat(state("old", wait=2.0, seq=1), now=0.0)  # predates lifted waits
    names = view.snapshot(0.0).names
    me, p, old = (names.index(n) for n in ("me", "p", "old"))
    assert list(view.snapshot(0.0).wait_s[[me, p, old]]) == [3.0, 4.0, 2.0]
    assert list(view.snapshot(0.0, priority=1).wait_s[[me, p, old]]) == [0.5, 1.0, 2.0]
    assert list(view.snapshot(0.0, priority=7).wait_s[[me, p, old]]) == [0.5, 0.25, 2.0]
    # a placement counts in the waits of its own level and those below, not above
    view.note_placement("p", Placement(2.0, job="j", priority=1), now=0.0)
    assert view.snapshot(0.001).wait_s[p] == 6.0
    assert view.snapshot(0.001, priority=1).wait_s[p] == 3.0
    assert view.snapshot(0.001, priority=2).wait_s[p] == 0.25
    assert view.snapshot(0.001, without="j", priority=1).wait_s[p] == 1.0
    # a newer heartbeat replaces the level waits
    view.apply_heartbeat(Heartbeat("p", 4.0, frozenset(), GB, GB, seq=2, lifted_s=(3.5,)), now=0.1)
    assert view.snapshot(0.1, priority=2).wait_s[p] == 3.5


def test_level_waits_round_trip_and_are_checked() -> None:
    lifted = Heartbeat("p", 4.0, frozenset(), GB, GB, lifted_s=(1.0, 0.25))
    back = Heartbeat.from_wire(msgpack.unpackb(msgpack.packb(lifted.to_wire())))
    assert back.lifted_s == (1.0, 0.25) and back.wait_at(0) == 4.0 and back.wait_at(5) == 0.25
    assert "wl" not in state("q").to_wire()  # left out when there are none
    with pytest.raises(ProtocolError, match="lifted_s"):
        Heartbeat.from_wire({**lifted.to_wire(), "wl": [1.0, -2.0]})
    with pytest.raises(ProtocolError, match="'wl'"):
        Heartbeat.from_wire({**lifted.to_wire(), "wl": 3})
    with pytest.raises(ConfigError, match="lifted_s"):
        Heartbeat("p", 1.0, frozenset(), GB, GB, lifted_s=(0.0,) * 10)


def test_an_aged_snapshot_counts_a_peers_queue_as_run_since_it_was_heard() -> None:
    """A bounded view hears a peer on change only: its wait is what it reported less the time
    since (never below 0); this worker's own and the counted placements are not aged."""
    view = ClusterView("me", heartbeat_s=0.01)
    view.update_self(Heartbeat("me", 3.0, frozenset(), GB, GB))
    view.apply_heartbeat(Heartbeat("p", 4.0, frozenset(), GB, GB, seq=1, lifted_s=(1.0,)), now=0.0)
    view.apply_heartbeat(state("q", wait=0.5, seq=1), now=1.0)
    names = view.snapshot(0.0).names
    me, p, q = (names.index(n) for n in ("me", "p", "q"))
    assert list(view.snapshot(1.5).wait_s[[me, p, q]]) == [3.0, 4.0, 0.5]  # as heard
    assert list(view.snapshot(1.5, aged=True).wait_s[[me, p, q]]) == [3.0, 2.5, 0.0]
    assert view.snapshot(0.5, priority=1, aged=True).wait_s[p] == 0.5
    view.note_placement("p", Placement(2.0, job="j"), now=1.5)
    aged = view.snapshot(1.5, aged=True)
    assert aged.wait_s[p] == 4.5 and not aged.wait_s.flags.writeable
    assert view.snapshot(1.5, without="j", aged=True).wait_s[p] == 2.5
    assert view.snapshot(1.5).wait_s[p] == 6.0  # the plain snapshot is unchanged


def test_an_aged_snapshot_ages_each_peer_from_its_latest_state() -> None:
    """A newer state of a known peer restarts its age, and the ages stay with their workers
    when a worker joins or leaves (the view keeps the received times by position)."""
    view = ClusterView("me", heartbeat_s=0.01)
    view.update_self(Heartbeat("me", 3.0, frozenset(), GB, GB))
    view.apply_heartbeat(state("p", wait=4.0, seq=1), now=0.0)
    view.apply_heartbeat(state("r", wait=4.0, seq=1), now=1.0)
    assert list(view.snapshot(2.0, aged=True).wait_s) == [3.0, 2.0, 3.0]  # me, p, r
    view.apply_heartbeat(state("p", wait=4.0, seq=2), now=1.5)
    assert list(view.snapshot(2.0, aged=True).wait_s) == [3.0, 3.5, 3.0]
    view.apply_heartbeat(state("a", wait=4.0, seq=1), now=1.75)  # sorts first: positions move
    assert list(view.snapshot(2.0, aged=True).wait_s) == [3.75, 3.0, 3.5, 3.0]  # a, me, p, r
    view.remove("a")
    view.apply_heartbeat(state("r", wait=1.0, seq=2), now=1.9)
    assert list(view.snapshot(2.0, aged=True).wait_s) == pytest.approx([3.0, 3.5, 0.9])


def test_an_aged_snapshot_of_idle_peers_is_the_heard_one_until_a_peer_waits() -> None:
    """No peer waits: aging changes nothing, so the aged snapshot is the view's own (no copy);
    a peer's state with a wait, heard later, or a peer that joins waiting, is aged again."""
    view = ClusterView("me", heartbeat_s=0.01)
    view.update_self(Heartbeat("me", 3.0, frozenset(), GB, GB))
    view.apply_heartbeat(state("p", wait=0.0, seq=1), now=0.0)
    plain = view.snapshot(2.0)
    aged = view.snapshot(2.0, aged=True)
    assert aged is plain and list(aged.wait_s) == [3.0, 0.0]  # me, p
    view.update_self(Heartbeat("me", 5.0, frozenset(), GB, GB))  # its own is never aged
    assert list(view.snapshot(2.0, aged=True).wait_s) == [5.0, 0.0]
    view.apply_heartbeat(state("p", wait=4.0, seq=2), now=1.0)
    assert list(view.snapshot(2.0, aged=True).wait_s) == [5.0, 3.0]
    view.apply_heartbeat(state("p", wait=0.0, seq=3), now=1.5)
    assert view.snapshot(2.0, aged=True) is view.snapshot(2.0)
    view.apply_heartbeat(state("q", wait=1.0, seq=1), now=1.5)  # joins waiting
    assert list(view.snapshot(2.0, aged=True).wait_s) == [5.0, 0.0, 0.5]  # me, p, q
    view.remove("q")
    assert view.snapshot(2.0, aged=True) is view.snapshot(2.0)


def test_a_counted_view_keeps_the_workers_and_freezes_what_it_is_given() -> None:
    base = ViewSnapshot.build([state("b", 0.5, ("m",)), state("a", 0.1), state("c", free=GB)])
    wait = base.wait_s.copy()
    wait[1] = 2.0
    free = base.free_bytes.copy()
    row = np.array([True, True, False])
    batches = {"m": (np.array([0, 1, 0]), np.array([0.0, 0.3, 0.0]))}
    counted = base.counted(wait, free, {"m": row}, batches)
    assert counted.names == base.names and counted.positions is base.positions
    assert counted.capacity_bytes is base.capacity_bytes
    assert counted.min_capacity_bytes == base.min_capacity_bytes == 10 * GB
    assert counted.members is base.members
    assert counted.wait_s.tolist() == [0.1, 2.0, 0.0]
    assert counted.holds("m").tolist() == [True, True, False]
    found = counted.batched("m")
    assert found is not None and found[0].tolist() == [0, 1, 0]
    for array in (wait, free, row, *batches["m"]):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    assert base.wait_s.tolist() == [0.1, 0.5, 0.0]  # the base view is untouched


@pytest.mark.parametrize("n", [3, 15, 16, 40])
def test_the_least_capacity_is_the_smallest_workers_cache(n: int) -> None:
    """Taken over a list for a few workers, by numpy's reduce for many: the same number."""
    rng = np.random.default_rng(n)
    caps = rng.integers(1, 100, size=n) * GB
    names = tuple(f"w{i:02d}" for i in range(n))
    cap = caps.astype(np.int64)
    view = ViewSnapshot.from_arrays(names, np.zeros(n), cap.copy(), cap, {})
    assert view.min_capacity_bytes == int(caps.min())
    assert isinstance(view.min_capacity_bytes, int)
    assert ViewSnapshot.from_arrays((), np.zeros(0), cap[:0], cap[:0], {}).min_capacity_bytes == 0
